//! The etcd members one client's calls can go to, each with its own connection and health, and
//! which of them a call goes to now.
//!
//! The probes (`endpoints`) and failed calls (`routing`) report what they see of a member; the
//! pure rules of `health` turn that into each member's state and the order calls try them. A
//! member that turns suspect or down while another is healthy has its waiting calls cut, so
//! none of them waits out its deadline on it.

use std::sync::{Arc, Mutex, MutexGuard};

use http::Uri;
use tokio::sync::{mpsc, watch};
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};

use crate::coord::health::{self, Limits, MemberReply, State};

/// The members of one client. Cheap to clone; clones share the table.
#[derive(Clone)]
pub(crate) struct Members {
    shared: Arc<Shared>,
}

struct Shared {
    limits: Limits,
    table: Mutex<Table>,
}

struct Table {
    slots: Vec<Slot>,
    /// Indices into `slots`, in the order calls try them.
    order: Vec<usize>,
    /// The endpoints etcd-client adds and removes, taken in before each pick.
    changes: Option<mpsc::Receiver<Change<Uri, Endpoint>>>,
    /// The member calls go to first, labelled as metrics are.
    first: watch::Sender<Option<String>>,
}

struct Slot {
    uri: Uri,
    channel: Channel,
    health: health::Member,
    /// Bumped when the member's waiting calls are to be cut.
    cut: watch::Sender<u64>,
}

/// A member chosen for a call: where to send it, and what tells the call to give up on it.
pub(crate) struct Pick {
    pub(crate) uri: Uri,
    pub(crate) channel: Channel,
    pub(crate) cut: watch::Receiver<u64>,
}

impl Members {
    pub(crate) fn new(limits: Limits) -> Members {
        Members {
            shared: Arc::new(Shared {
                limits,
                table: Mutex::new(Table {
                    slots: Vec::new(),
                    order: Vec::new(),
                    changes: None,
                    first: watch::Sender::new(None),
                }),
            }),
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// The channel etcd-client tells the endpoints it is given, and later added or removed.
    pub(crate) fn listen(&self, changes: mpsc::Receiver<Change<Uri, Endpoint>>) {
        self.table().changes = Some(changes);
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        let mut table = self
            .shared
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        table.take_changes();
        table
    }

    /// The member a call should try next, leaving out those it tried: the first of the order.
    /// With every member tried, none.
    pub(crate) fn pick(&self, tried: &[Uri]) -> Option<Pick> {
        let table = self.table();
        table
            .order
            .iter()
            .map(|&index| &table.slots[index])
            .find(|slot| !tried.contains(&slot.uri))
            .map(|slot| Pick {
                uri: slot.uri.clone(),
                channel: slot.channel.clone(),
                cut: slot.cut.subscribe(),
            })
    }

    /// The member calls go to first, as it changes.
    pub(crate) fn first(&self) -> watch::Receiver<Option<String>> {
        self.table().first.subscribe()
    }

    /// Every member's URI, in the order the client was given them.
    pub(crate) fn uris(&self) -> Vec<Uri> {
        self.table().slots.iter().map(|slot| slot.uri.clone()).collect()
    }

    /// Takes in what was seen of the member at `uri`. A member that stops being healthy while
    /// another is has the calls waiting on it cut.
    pub(crate) fn observe(&self, uri: &Uri, seen: MemberReply) {
        let limits = self.shared.limits;
        let mut table = self.table();
        let Some(index) = table.slots.iter().position(|slot| &slot.uri == uri) else {
            return;
        };
        let was = table.slots[index].health.clone();
        let now = health::observe(&was, seen, &limits);
        let (from, to) = (was.state, now.state);
        table.slots[index].health = now;
        let previous_first = table.order.first().copied();
        table.reorder();
        let first = table.order.first().copied();
        let other_healthy = table
            .slots
            .iter()
            .enumerate()
            .any(|(other, slot)| other != index && slot.health.state == State::Healthy);
        if from == State::Healthy && to != State::Healthy && other_healthy {
            table.slots[index].cut.send_modify(|generation| *generation += 1);
        }
        if from != to {
            let to_uri = first.map(|first| endpoint_label(&table.slots[first].uri));
            let member = endpoint_label(uri);
            match to {
                State::Healthy => tracing::info!(member, "etcd member answers in time again"),
                State::Suspect | State::Down => tracing::warn!(
                    member,
                    state = ?to,
                    calls_go_to = to_uri.as_deref().unwrap_or("nowhere else"),
                    "etcd member does not answer in time: its waiting calls are cut and sent elsewhere while another member answers"
                ),
            }
        }
        if first != previous_first {
            if let Some(first) = first {
                tracing::info!(
                    member = endpoint_label(&table.slots[first].uri),
                    "calls go to this etcd member first now"
                );
            }
        }
        table.export();
    }
}

impl Table {
    fn take_changes(&mut self) {
        let Some(changes) = self.changes.as_mut() else {
            return;
        };
        let mut changed = false;
        while let Ok(change) = changes.try_recv() {
            changed = true;
            match change {
                Change::Insert(uri, endpoint) => {
                    if let Some(slot) = self.slots.iter_mut().find(|slot| slot.uri == uri) {
                        slot.channel = endpoint.connect_lazy();
                        continue;
                    }
                    self.slots.push(Slot {
                        uri,
                        channel: endpoint.connect_lazy(),
                        health: health::Member::default(),
                        cut: watch::Sender::new(0),
                    });
                    self.order.push(self.slots.len() - 1);
                }
                Change::Remove(uri) => {
                    if let Some(index) = self.slots.iter().position(|slot| slot.uri == uri) {
                        self.slots[index].cut.send_modify(|generation| *generation += 1);
                        self.slots.remove(index);
                        self.order = self
                            .order
                            .iter()
                            .filter(|&&at| at != index)
                            .map(|&at| if at > index { at - 1 } else { at })
                            .collect();
                    }
                }
            }
        }
        if changed {
            self.reorder();
        }
    }

    /// Each member's state, and which one calls go to first, as metrics.
    fn export(&self) {
        let metrics = crate::metrics::get();
        let first = self.order.first().copied();
        for (index, slot) in self.slots.iter().enumerate() {
            let label = crate::metrics::EndpointLabel {
                endpoint: endpoint_label(&slot.uri),
            };
            let state = match slot.health.state {
                State::Healthy => 0,
                State::Suspect => 1,
                State::Down => 2,
            };
            metrics.etcd_member_state.get_or_create(&label).set(state);
            metrics
                .etcd_member_preferred
                .get_or_create(&label)
                .set(i64::from(Some(index) == first));
        }
    }

    fn reorder(&mut self) {
        let healths: Vec<health::Member> = self.slots.iter().map(|slot| slot.health.clone()).collect();
        self.order = health::order(&healths, &self.order);
        let first = self.order.first().map(|&index| endpoint_label(&self.slots[index].uri));
        self.first.send_if_modified(|was| {
            let changed = *was != first;
            *was = first;
            changed
        });
    }
}

/// A member's scheme, host and port: a URL's userinfo, if it had any, never leaves the node.
pub(crate) fn endpoint_label(uri: &Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("http");
    match (uri.host(), uri.port_u16()) {
        (Some(host), Some(port)) => format!("{scheme}://{host}:{port}"),
        (Some(host), None) => format!("{scheme}://{host}"),
        (None, _) => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn members_of(uris: &[&str]) -> Members {
        let members = Members::new(Limits::for_ttl(Duration::from_secs(5)));
        let (changes, listened) = mpsc::channel(8);
        members.listen(listened);
        for uri in uris {
            let uri: Uri = uri.parse().expect("a URI");
            changes
                .try_send(Change::Insert(uri.clone(), Endpoint::from(uri)))
                .expect("room");
        }
        members
    }

    fn label(pick: &Pick) -> String {
        endpoint_label(&pick.uri)
    }

    #[tokio::test]
    async fn a_member_found_stalled_has_its_waiting_calls_cut_and_the_next_calls_go_elsewhere() {
        let members = members_of(&["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
        let waiting = members.pick(&[]).expect("a member");
        assert_eq!(label(&waiting), "http://10.0.0.1:2379", "the first listed first");
        members.observe(
            &waiting.uri,
            MemberReply::Waiting {
                waited: Duration::from_millis(499),
            },
        );
        assert!(!waiting.cut.has_changed().expect("open"), "not yet a stall");
        members.observe(
            &waiting.uri,
            MemberReply::Waiting {
                waited: Duration::from_millis(500),
            },
        );
        assert!(
            waiting.cut.has_changed().expect("open"),
            "a stall cuts the calls waiting on it"
        );
        let next = members.pick(&[]).expect("a member");
        assert_eq!(label(&next), "http://10.0.0.2:2379");
        assert_eq!(
            members.pick(std::slice::from_ref(&next.uri)).map(|pick| label(&pick)),
            Some("http://10.0.0.1:2379".to_owned()),
            "a read the other member failed still has the stalled one to try"
        );
    }

    #[tokio::test]
    async fn with_no_other_member_healthy_no_call_is_cut() {
        let members = members_of(&["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
        let second: Uri = "http://10.0.0.2:2379".parse().expect("a URI");
        members.observe(&second, MemberReply::Failed);
        let waiting = members.pick(&[]).expect("a member");
        members.observe(
            &waiting.uri,
            MemberReply::Waiting {
                waited: Duration::from_secs(1),
            },
        );
        assert!(
            !waiting.cut.has_changed().expect("open"),
            "every member in trouble is more likely this node's own: calls stay"
        );
    }

    #[test]
    fn a_member_is_labelled_without_the_userinfo_of_its_url() {
        let uri: Uri = "https://root:secret@10.0.0.1:2379".parse().expect("a URI");
        assert_eq!(endpoint_label(&uri), "https://10.0.0.1:2379");
    }
}
