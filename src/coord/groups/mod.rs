//! Concurrency groups in etcd: the slots a node's attempts hold and their places in line, by
//! the rules of [`crate::rules::groups`].
//!
//! Slots and places live on a lease of the node's own, not its elections' session: a graceful
//! stop revokes that session at once so other nodes take its shards over, while its runs go on
//! through the shutdown grace, still holding their slots. This lease is kept alive until the
//! node's runs have ended. A node that dies frees its slots within the TTL. A node that loses
//! this lease (etcd out of reach past the TTL by its own clock, or etcd saying it expired)
//! stops the runs holding its slots at once: another node may hold those slots by then.
//!
//! Every node mirrors the groups' keys; an attempt waiting in line wakes on each change.
//!
//! A write whose reply is lost may have landed: a take that got no answer is read back before
//! the attempt stands in line, a place is taken out of the line whenever its attempt gets a slot
//! or gives up (tried again until etcd answers or the lease ends), and every few seconds the node
//! sweeps its own lease for what no attempt of this process accounts for (a place nobody waits
//! at, a slot handed to an attempt that is gone), since that lease lives as long as the node.
//!
//! The limit is the one the node's config has now: after a reload that lowers it, a slot past
//! it is freed rather than handed on, and an attempt handed one gives it back and waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::Client;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::coord::etcd::CoordError;
use crate::coord::keys::Keys;
use crate::coord::mirror::{Mirror, Put};
use crate::coord::session::Session;
use crate::rules::groups::{within, Holder};

mod attending;
mod line;
mod slot;
mod slot_lease;
mod sweep;
mod take;
mod view;

use attending::Phase;
pub(crate) use slot::Slot;
use slot_lease::SlotLease;
pub(crate) use take::GaveUp;
use view::apply_to;
pub(crate) use view::{read_views, GroupView, Kept};

/// How often a failed etcd call of a waiting or ending attempt is tried again.
const RETRY: Duration = Duration::from_millis(200);

/// A group's limit in the node's config now, by the group's name; `None` for a group the
/// config no longer has.
pub(crate) type CurrentLimit = Box<dyn Fn(&str) -> Option<u32> + Send + Sync>;

/// The node's part in every concurrency group.
pub(crate) struct Groups {
    client: Client,
    keys: Keys,
    ttl: Duration,
    views: Mutex<HashMap<String, GroupView>>,
    changed: Notify,
    lease: SlotLease,
    /// Cancelled once the node's runs have ended: the lease of its slots ends with it.
    drained: CancellationToken,
    /// Each group's limit by the config the node runs now.
    limits: CurrentLimit,
    /// The attempts of this process that may have a place or a slot, by their value.
    attending: Mutex<HashMap<Holder, Phase>>,
}

impl Mirror for Groups {
    const WHAT: &'static str = "concurrency groups";

    fn prefix(keys: &Keys) -> String {
        keys.groups_prefix()
    }

    fn clear(&self) {
        self.lock().clear();
    }

    fn apply(&self, keys: &Keys, key: &[u8], put: Option<Put>) {
        apply_to(&mut self.lock(), keys, key, put);
        self.changed.notify_waiters();
    }
}

impl Groups {
    pub(crate) fn new(client: Client, keys: Keys, ttl: Duration, limits: CurrentLimit) -> Groups {
        Groups {
            client,
            keys,
            ttl,
            views: Mutex::default(),
            changed: Notify::new(),
            lease: SlotLease::new(),
            drained: CancellationToken::new(),
            limits,
            attending: Mutex::default(),
        }
    }

    /// Whether a run may start in `slot` of `group`, held now: within `limit`, and no slot past
    /// it held (the limit was lowered while they ran: no run starts beside them).
    fn runs_in(&self, group: &str, slot: u32, limit: u32) -> bool {
        within(slot, limit) && self.held_past(group, limit) == 0
    }

    /// How many slots of `group` at or past `limit` its mirror shows held.
    fn held_past(&self, group: &str, limit: u32) -> usize {
        self.lock()
            .get(group)
            .map_or(0, |view| view.slots.range(limit..).count())
    }

    /// `group`'s limit now: by the config the node runs (a reload may have changed it since the
    /// attempt began), else `otherwise`.
    fn limit_of(&self, group: &str, otherwise: u32) -> u32 {
        (self.limits)(group).unwrap_or(otherwise)
    }

    /// `group` as the mirror shows it now.
    pub(crate) fn view(&self, group: &str) -> GroupView {
        self.lock().get(group).cloned().unwrap_or_default()
    }

    /// Every group the mirror shows, by name.
    pub(crate) fn views(&self) -> HashMap<String, GroupView> {
        self.lock().clone()
    }

    /// The lease slots and places live on: the current one while it holds by this node's
    /// clock, else a new one.
    async fn lease(&self) -> Result<Session, CoordError> {
        self.lease.live_or_open(&self.client, self.ttl, &self.drained).await
    }

    /// The lease now, if the node holds one that is live.
    fn lease_if_live(&self) -> Option<Session> {
        self.lease.live()
    }

    /// The lease now, if the node holds one that is live, without waiting: a run of an
    /// `overlap = "skip"` or `"replace"` job lists it with the run in its record, and is stopped
    /// if it lapses. Without one, a new one is opened for the next run, and this run is listed
    /// by none.
    pub(crate) fn lease_now(self: &Arc<Self>) -> Option<Session> {
        if let Some(session) = self.lease.live() {
            return Some(session);
        }
        let groups = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(err) = groups.lease().await {
                tracing::debug!(error = %err, "cannot open the lease of this node's runs yet");
            }
        });
        None
    }

    /// Cancelled once the node's runs have ended.
    pub(crate) fn runs_ended(&self) -> CancellationToken {
        self.drained.clone()
    }

    /// The client the node's runs share with their groups.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The node's runs have ended: the lease of its slots is revoked.
    pub(crate) async fn close(&self) {
        self.drained.cancel();
        if let Some(session) = self.lease.take().await {
            session.close().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, GroupView>> {
        self.views.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn attending(&self) -> std::sync::MutexGuard<'_, HashMap<Holder, Phase>> {
        self.attending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The holder value of an attempt of `job` on `node`.
pub(crate) fn holder(node: &str, job: &str, tick: DateTime<Utc>, fence: i64) -> Holder {
    Holder {
        node: node.to_string(),
        job: job.to_string(),
        tick,
        fence,
        since: crate::clock::now(),
    }
}
