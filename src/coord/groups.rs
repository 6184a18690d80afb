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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::{GroupKey, Keys};
use crate::coord::mirror::{Mirror, Put};
use crate::coord::session::{Purpose, Session};
use crate::rules::groups::{admit_counted, Admission, Group, Holder, Place};

/// How often a waiting attempt looks at its group again without a change seen: a watch that
/// failed and is being restarted delivers nothing meanwhile.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// How many slots an attempt tries to take in a row, each refused take telling it which are
/// held, before it stands in line.
const TAKE_TRIES: usize = 3;

/// How often a failed etcd call of a waiting or ending attempt is tried again.
const RETRY: Duration = Duration::from_millis(200);

/// The slots held and the attempts in line of every group, as the node's mirror shows them.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupView {
    pub(crate) slots: BTreeMap<u32, Kept>,
    pub(crate) waiting: BTreeMap<Place, Kept>,
}

/// A slot's or a place's value, and the lease it lives on.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) holder: Holder,
    pub(crate) lease: i64,
}

impl GroupView {
    /// Who holds the slots, for a log line: `job@node` each, at most `max` of them.
    pub(crate) fn holders(&self, max: usize) -> String {
        let mut named: Vec<String> = self
            .slots
            .values()
            .take(max)
            .map(|kept| format!("{}@{}", kept.holder.job, kept.holder.node))
            .collect();
        if self.slots.len() > max {
            named.push(format!("and {} more", self.slots.len() - max));
        }
        named.join(", ")
    }
}

/// The node's part in every concurrency group.
pub(crate) struct Groups {
    client: Client,
    keys: Keys,
    ttl: Duration,
    views: Mutex<HashMap<String, GroupView>>,
    changed: Notify,
    lease: tokio::sync::Mutex<Option<Session>>,
    /// Cancelled once the node's runs have ended: the lease of its slots ends with it.
    drained: CancellationToken,
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

/// Puts a key under [`Keys::groups_prefix`] that was put (`Some`) or deleted into `views`.
fn apply_to(views: &mut HashMap<String, GroupView>, keys: &Keys, key: &[u8], put: Option<Put>) {
    let Some((group, what)) = std::str::from_utf8(key).ok().and_then(|key| keys.parse_group_key(key)) else {
        return;
    };
    let kept = put.and_then(|put| {
        let holder = serde_json::from_slice::<Holder>(put.value).ok()?;
        Some(Kept {
            holder,
            lease: put.lease,
        })
    });
    let view = views.entry(group.to_string()).or_default();
    match (what, kept) {
        (GroupKey::Slot(slot), Some(kept)) => {
            view.slots.insert(slot, kept);
        }
        (GroupKey::Slot(slot), None) => {
            view.slots.remove(&slot);
        }
        (GroupKey::Waiting(segment), kept) => {
            if let Some(place) = Place::parse(segment) {
                match kept {
                    Some(kept) => view.waiting.insert(place, kept),
                    None => view.waiting.remove(&place),
                };
            }
        }
    }
    if view.slots.is_empty() && view.waiting.is_empty() {
        views.remove(group);
    }
}

/// Every group's slots and line as etcd holds them now, for `status`.
pub(crate) async fn read_views(client: &Client, keys: &Keys) -> Result<HashMap<String, GroupView>, CoordError> {
    let (read, _) = etcd::read_prefix(client, &keys.groups_prefix()).await?;
    let mut views = HashMap::new();
    for kv in &read {
        let put = Put {
            value: kv.value(),
            lease: kv.lease(),
        };
        apply_to(&mut views, keys, kv.key(), Some(put));
    }
    Ok(views)
}

/// A number of an attempt's own, to pick a free slot others at the same instant do not.
fn spread_of(place: &Place) -> usize {
    seahash::hash(place.segment().as_bytes()) as usize
}

/// What a looking attempt does.
enum Decision {
    Handed(u32),
    /// Take this slot; `ahead` attempts wait ahead in line.
    Take {
        slot: u32,
        ahead: usize,
    },
    Wait,
}

/// Why an attempt stopped waiting for a slot, as its caller said.
pub(crate) struct GaveUp<W>(pub(crate) W);

impl Groups {
    pub(crate) fn new(client: Client, keys: Keys, ttl: Duration) -> Groups {
        Groups {
            client,
            keys,
            ttl,
            views: Mutex::default(),
            changed: Notify::new(),
            lease: tokio::sync::Mutex::new(None),
            drained: CancellationToken::new(),
        }
    }

    /// `group` as the mirror shows it now.
    pub(crate) fn view(&self, group: &str) -> GroupView {
        self.lock().get(group).cloned().unwrap_or_default()
    }

    /// Every group the mirror shows, by name.
    pub(crate) fn views(&self) -> HashMap<String, GroupView> {
        self.lock().clone()
    }

    /// Takes a slot of `group` for the attempt `holder` at `place` in line, waiting in line as
    /// long as it must, or until `give_up` resolves; what it resolved to is then returned.
    pub(crate) async fn acquire<W>(
        self: &Arc<Self>,
        group: &Group,
        holder: Holder,
        place: Place,
        give_up: impl Future<Output = W>,
    ) -> Result<Slot, GaveUp<W>> {
        tokio::pin!(give_up);
        let mut waiting: Option<(Session, String)> = None;
        let mut told = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let lease = match self.lease().await {
                Ok(lease) => lease,
                Err(err) => {
                    tracing::debug!(error = %err, "cannot get a lease for a group slot; trying again");
                    tokio::select! {
                        biased;
                        why = &mut give_up => return Err(GaveUp(why)),
                        _ = tokio::time::sleep(RETRY) => continue,
                    }
                }
            };
            if waiting
                .as_ref()
                .is_some_and(|(held_on, _)| held_on.lease() != lease.lease())
            {
                // The place was on a lease since lost, and went with it.
                waiting = None;
            }
            match self.try_take(group, &holder, &place, &lease, waiting.as_ref()).await {
                Ok(Some(slot)) => return Ok(slot),
                Ok(None) => {}
                Err(err) => tracing::debug!(error = %err, group = %group.name, "cannot take a slot now; trying again"),
            }
            if waiting.is_none() {
                match self.stand_in_line(group, &holder, &place, &lease).await {
                    Ok(key) => waiting = Some((lease.clone(), key)),
                    Err(err) => {
                        tracing::debug!(error = %err, group = %group.name, "cannot wait in the group's line now; trying again")
                    }
                }
            }
            if waiting.is_some() && !told {
                told = true;
                let view = self.view(&group.name);
                tracing::info!(group = %group.name, limit = group.limit, running = view.slots.len(), waiting = view.waiting.len(), holders = %view.holders(10), "the group is full: waiting for a slot");
            }
            tokio::select! {
                biased;
                why = &mut give_up => {
                    if let Some((lease, key)) = waiting {
                        self.leave_line(group, &holder, &lease, &key).await;
                    }
                    return Err(GaveUp(why));
                }
                _ = &mut changed => {}
                _ = tokio::time::sleep(LOOK_AGAIN) => {}
                _ = lease.ended().cancelled() => {}
            }
        }
    }

    /// The slot handed to `holder`, or one it may take by the line's order; `None` if neither.
    async fn try_take(
        self: &Arc<Self>,
        group: &Group,
        holder: &Holder,
        place: &Place,
        lease: &Session,
        waiting: Option<&(Session, String)>,
    ) -> Result<Option<Slot>, CoordError> {
        let (mut slot, ahead) = match self.decide(group, holder, place, lease.lease(), waiting.is_some()) {
            Decision::Handed(slot) => return Ok(Some(self.slot(group, slot, holder, lease)?)),
            Decision::Take { slot, ahead } => (slot, ahead),
            Decision::Wait => return Ok(None),
        };
        let value = serde_json::to_vec(holder).map_err(|err| CoordError::Protocol(err.to_string()))?;
        let slots = self.keys.group_slots_prefix(&group.name);
        // The mirror lags behind etcd: a slot it shows free may be taken already. A refused take
        // reads which are held in the same round trip and tries a slot free by that read, so an
        // attempt stands in line only when the group is full, and is then handed a slot (two
        // writes per run) rather than taking one itself (three).
        for _ in 0..TAKE_TRIES {
            let key = self.keys.group_slot(&group.name, slot);
            let mut when = vec![Compare::create_revision(key.as_str(), CompareOp::Equal, 0)];
            let mut then = vec![TxnOp::put(
                key.as_str(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease.lease())),
            )];
            if let Some((_, place_key)) = waiting {
                when.push(Compare::version(place_key.as_str(), CompareOp::Greater, 0));
                then.push(TxnOp::delete(place_key.as_str(), None));
            }
            let held_now = TxnOp::get(slots.as_str(), Some(GetOptions::new().with_prefix().with_keys_only()));
            let txn = Txn::new().when(when).and_then(then).or_else([held_now]);
            let response = etcd::call(self.client.clone().txn(txn)).await?;
            if response.succeeded() {
                return Ok(Some(self.slot(group, slot, holder, lease)?));
            }
            let held: BTreeSet<u32> = response
                .op_responses()
                .into_iter()
                .filter_map(|answer| match answer {
                    TxnOpResponse::Get(read) => Some(read),
                    _ => None,
                })
                .flat_map(|read| read.kvs().to_vec())
                .filter_map(|kv| {
                    let key = std::str::from_utf8(kv.key()).ok()?;
                    match self.keys.parse_group_key(key)?.1 {
                        GroupKey::Slot(slot) => Some(slot),
                        GroupKey::Waiting(_) => None,
                    }
                })
                .collect();
            let spread = if waiting.is_some() { 0 } else { spread_of(place) };
            match admit_counted(ahead, |slot| held.contains(&slot), group.limit, spread) {
                Admission::Take(free) => slot = free,
                Admission::Wait => return Ok(None),
            }
        }
        Ok(None)
    }

    /// What an attempt does now, by the mirror: take the slot handed to it, take a free one by
    /// the line's order, or wait. Counted under the lock without copying the line: every
    /// waiting attempt of the node looks again at each change of the group.
    fn decide(&self, group: &Group, holder: &Holder, place: &Place, lease: i64, in_line: bool) -> Decision {
        let spread = if in_line { 0 } else { spread_of(place) };
        let views = self.lock();
        let Some(view) = views.get(&group.name) else {
            return match admit_counted(0, |_| false, group.limit, spread) {
                Admission::Take(slot) => Decision::Take { slot, ahead: 0 },
                Admission::Wait => Decision::Wait,
            };
        };
        if let Some((slot, _)) = view
            .slots
            .iter()
            .find(|(_, kept)| kept.holder == *holder && kept.lease == lease)
        {
            return Decision::Handed(*slot);
        }
        let ahead = view.waiting.range(..place).take(group.limit as usize).count();
        match admit_counted(ahead, |slot| view.slots.contains_key(&slot), group.limit, spread) {
            Admission::Take(slot) => Decision::Take { slot, ahead },
            Admission::Wait => Decision::Wait,
        }
    }

    /// Puts `holder`'s place in `group`'s line; returns its key.
    async fn stand_in_line(
        &self,
        group: &Group,
        holder: &Holder,
        place: &Place,
        lease: &Session,
    ) -> Result<String, CoordError> {
        let key = self.keys.group_waiting(&group.name, &place.segment());
        let value = serde_json::to_vec(holder).map_err(|err| CoordError::Protocol(err.to_string()))?;
        let options = PutOptions::new().with_lease(lease.lease());
        etcd::call(self.client.clone().put(key.as_str(), value, Some(options))).await?;
        Ok(key)
    }

    /// Takes `holder`'s place out of the line. A slot handed to it meanwhile is handed on.
    async fn leave_line(self: &Arc<Self>, group: &Group, holder: &Holder, lease: &Session, key: &str) {
        let txn = Txn::new()
            .when([Compare::version(key, CompareOp::Greater, 0)])
            .and_then([TxnOp::delete(key, None)]);
        match etcd::call(self.client.clone().txn(txn)).await {
            Ok(response) if response.succeeded() => return,
            Ok(_) => {}
            // Left in line, the place goes with the lease, or is handed a slot the holder of
            // which then never starts: both end within the TTL.
            Err(err) => {
                tracing::debug!(error = %err, group = %group.name, "cannot leave the group's line; its place ends with the lease");
                return;
            }
        }
        // Gone from the line without this node taking it out: a slot was handed to it.
        let read = etcd::call(self.client.clone().get(
            self.keys.group_slots_prefix(&group.name),
            Some(GetOptions::new().with_prefix()),
        ))
        .await;
        let Ok(read) = read else { return };
        for kv in read.kvs() {
            let handed = serde_json::from_slice::<Holder>(kv.value()).is_ok_and(|held| held == *holder);
            let slot = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|key| self.keys.parse_group_key(key))
                .and_then(|(_, what)| match what {
                    GroupKey::Slot(slot) => Some(slot),
                    GroupKey::Waiting(_) => None,
                });
            if let (true, Some(slot)) = (handed, slot) {
                if let Ok(slot) = self.slot(group, slot, holder, lease) {
                    slot.release().await;
                }
            }
        }
    }

    fn slot(self: &Arc<Self>, group: &Group, slot: u32, holder: &Holder, lease: &Session) -> Result<Slot, CoordError> {
        let value = serde_json::to_vec(holder).map_err(|err| CoordError::Protocol(err.to_string()))?;
        Ok(Slot {
            held: Some(Held {
                groups: Arc::clone(self),
                group: group.name.clone(),
                slot,
                value,
                lease: lease.clone(),
            }),
        })
    }

    /// The lease slots and places live on: the current one while it holds by this node's
    /// clock, else a new one.
    async fn lease(&self) -> Result<Session, CoordError> {
        let mut current = self.lease.lock().await;
        if let Some(session) = current.as_ref().filter(|session| session.is_live()) {
            return Ok(session.clone());
        }
        let session = Session::open_for(&self.client, self.ttl, &self.drained, Purpose::Slots).await?;
        *current = Some(session.clone());
        Ok(session)
    }

    /// The lease now, if the node holds one that is live, without waiting: a run of an
    /// `overlap = "skip"` or `"replace"` job lists it with the run in its record, and is stopped
    /// if it lapses. Without one, a new one is opened for the next run, and this run is listed
    /// by none.
    pub(crate) fn lease_now(self: &Arc<Self>) -> Option<Session> {
        if let Ok(current) = self.lease.try_lock() {
            if let Some(session) = current.as_ref().filter(|session| session.is_live()) {
                return Some(session.clone());
            }
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
        if let Some(session) = self.lease.lock().await.take() {
            session.close().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, GroupView>> {
        self.views.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A slot held by one attempt. Released when the attempt's process group has ended; dropped
/// unreleased (a run cancelled from outside), it is released by a task of its own.
pub(crate) struct Slot {
    held: Option<Held>,
}

struct Held {
    groups: Arc<Groups>,
    group: String,
    slot: u32,
    /// The slot key's value as this attempt holds it: a release changes the key only while it
    /// still holds this, so a slot that lapsed and went to another attempt is left alone.
    value: Vec<u8>,
    lease: Session,
}

impl Slot {
    /// Cancelled when the lease the slot lives on is lost: the attempt must stop, since the
    /// slot may be another's by now.
    pub(crate) fn lapsed(&self) -> CancellationToken {
        self.held
            .as_ref()
            .map_or_else(CancellationToken::new, |held| held.lease.ended().clone())
    }

    /// Hands the slot to the first attempt in line, or frees it if none waits.
    pub(crate) async fn release(mut self) {
        if let Some(held) = self.held.take() {
            held.release().await;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(held.release());
            }
        }
    }
}

impl Held {
    async fn release(self) {
        let groups = &self.groups;
        let key = groups.keys.group_slot(&self.group, self.slot);
        let mine = || Compare::value(key.as_str(), CompareOp::Equal, self.value.clone());
        // While the lease holds: once it is gone, so is the slot.
        while self.lease.is_live() {
            match self.hand_on(&key, mine()).await {
                Ok(true) => return,
                Ok(false) => continue,
                Err(err) => {
                    tracing::debug!(error = %err, group = %self.group, slot = self.slot, "cannot free the group slot yet; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    /// One try: hands the slot to the first in line, or frees it. `false` when the first in
    /// line left before the hand-over: the next try looks again.
    async fn hand_on(&self, key: &str, mine: Compare) -> Result<bool, CoordError> {
        let groups = &self.groups;
        let first = GetOptions::new().with_prefix().with_limit(1);
        let line = groups.keys.group_waiting_prefix(&self.group);
        let read = etcd::call(groups.client.clone().get(line, Some(first))).await?;
        let Some(heir) = read.kvs().first() else {
            let free = Txn::new().when([mine]).and_then([TxnOp::delete(key, None)]);
            etcd::call(groups.client.clone().txn(free)).await?;
            return Ok(true);
        };
        let handed = Txn::new()
            .when([mine.clone(), Compare::version(heir.key(), CompareOp::Greater, 0)])
            .and_then([
                TxnOp::put(key, heir.value(), Some(PutOptions::new().with_lease(heir.lease()))),
                TxnOp::delete(heir.key(), None),
            ]);
        if etcd::call(groups.client.clone().txn(handed)).await?.succeeded() {
            tracing::debug!(group = %self.group, slot = self.slot, heir = %String::from_utf8_lossy(heir.key()), "handed the group slot to the first in line");
            return Ok(true);
        }
        // Either the slot is no longer this attempt's (its lease lapsed) or the heir left.
        let still = etcd::call(groups.client.clone().get(key, None)).await?;
        let held = still
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == self.value.as_slice());
        Ok(!held)
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
