//! The events the jobs' records hold that no live process sends: this node's own from before a
//! restart, and, for the jobs whose shard it leads, those of nodes that left the fleet; when to
//! look for them, and handing them to delivery.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Notifications;
use crate::coord::notifications;
use crate::coord::view::FleetView;
use crate::rules::config::{Job, Loaded};
use crate::rules::notify::Record;

/// How soon a look follows a node leaving the fleet, and how often it looks while eager.
const SOON: Duration = Duration::from_secs(3);
/// How long it stays eager after the session started or a node left.
const WHILE_MOVING: Duration = Duration::from_secs(30);
/// How often it looks otherwise (a write that failed).
const SELDOM: Duration = Duration::from_secs(60);

/// Sends the events the jobs' records hold undelivered that no live process sends: this node's
/// own from before a restart, and, for the jobs whose shard it leads, those of nodes that left
/// the fleet. Each look reads the record of every job of this node's config with `notify`
/// (never other nodes' instances of fanned-out jobs), so it looks when the session starts,
/// every few seconds for a while after a node left the fleet (its shards move to their new
/// leaders meanwhile), and otherwise once a minute (a write that failed), only while some job
/// has `notify`. The records of fanned-out instances whose node is gone go with the node's
/// other records ([`crate::coord::gone_nodes`]).
pub(crate) struct UnsentNotifications {
    notifications: Arc<Notifications>,
    jobs: watch::Receiver<Arc<Loaded>>,
    view: watch::Receiver<FleetView>,
}

/// When the next look is due: the members at the last look, and until when it looks every
/// [`SOON`].
struct Pace {
    members: BTreeSet<String>,
    eager_until: Instant,
}

impl UnsentNotifications {
    /// Sends through `notifications` (whose node id is this node's) for the jobs of `jobs`,
    /// leading as `view` says.
    pub(crate) fn new(
        notifications: Arc<Notifications>,
        jobs: watch::Receiver<Arc<Loaded>>,
        view: watch::Receiver<FleetView>,
    ) -> UnsentNotifications {
        UnsentNotifications {
            notifications,
            jobs,
            view,
        }
    }

    /// Looks at once, then again as [`Pace`] says, until `cancel` (the session's end).
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        let mut pace = Pace {
            members: self.view.borrow().members.keys().cloned().collect(),
            eager_until: Instant::now() + WHILE_MOVING,
        };
        loop {
            self.look().await;
            if !self.wait(&mut pace, &cancel).await {
                return;
            }
        }
    }

    /// Sleeps until the next look: sooner when a member left the fleet meanwhile. `false` when
    /// the view or the session ended.
    async fn wait(&mut self, pace: &mut Pace, cancel: &CancellationToken) -> bool {
        let pause = match Instant::now() < pace.eager_until {
            true => SOON,
            false => SELDOM,
        };
        let wake = tokio::time::sleep(pause);
        tokio::pin!(wake);
        loop {
            tokio::select! {
                _ = &mut wake => return true,
                changed = self.view.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                    let now: BTreeSet<String> = self.view.borrow_and_update().members.keys().cloned().collect();
                    if pace.members.iter().any(|member| !now.contains(member)) {
                        pace.eager_until = Instant::now() + WHILE_MOVING;
                        wake.as_mut().reset(Instant::now() + SOON);
                    }
                    pace.members = now;
                }
                _ = cancel.cancelled() => return false,
            }
        }
    }

    /// Reads the record of each job with `notify` and sends what no live process sends.
    async fn look(&self) {
        let notify_jobs: HashMap<String, Arc<Job>> = self
            .jobs
            .borrow()
            .by_shard
            .iter()
            .flatten()
            .filter(|job| !job.notify.is_empty())
            .map(|job| (job.name.clone(), Arc::clone(job)))
            .collect();
        if notify_jobs.is_empty() {
            return;
        }
        let (client, keys) = self.notifications.etcd();
        let names: Vec<&str> = notify_jobs.keys().map(String::as_str).collect();
        let records = match notifications::with_pending(client, keys, &names).await {
            Ok(records) => records,
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the notification records; trying again shortly");
                return;
            }
        };
        for (name, record) in records {
            let Some(job) = notify_jobs.get(&name) else { continue };
            self.send(job, &name, &record).await;
        }
    }

    /// Sends this node's own events of `record` that it is not sending now and, if this node
    /// leads the job's shard, takes over and sends those of nodes that left the fleet.
    async fn send(&self, job: &Arc<Job>, name: &str, record: &Record) {
        let me = self.notifications.node_id.as_str();
        let (leads, members) = {
            let view = self.view.borrow();
            let leads = view
                .leaders
                .get(job.shard as usize)
                .and_then(Option::as_ref)
                .is_some_and(|(leader, _)| leader == me);
            (leads, Arc::clone(&view.members))
        };
        let mine: Vec<_> = record
            .pending
            .iter()
            .filter(|pending| pending.node == me && !self.notifications.is_sending(name, pending))
            .cloned()
            .collect();
        self.notifications.deliver_all(job, mine);
        if !leads {
            return;
        }
        let gone: BTreeSet<&str> = record
            .pending
            .iter()
            .map(|pending| pending.node.as_str())
            .filter(|owner| *owner != me && !members.contains_key(*owner))
            .collect();
        let (client, keys) = self.notifications.etcd();
        for owner in gone {
            match notifications::adopt(client, keys, name, owner, me).await {
                Ok(adopted) => {
                    tracing::info!(job = %name, node = owner, events = adopted.len(), "sending the notifications of a node that left the fleet");
                    self.notifications.deliver_all(job, adopted);
                }
                Err(err) => {
                    tracing::warn!(job = %name, node = owner, error = %err, "cannot take over a gone node's notifications; trying again shortly")
                }
            }
        }
    }
}
