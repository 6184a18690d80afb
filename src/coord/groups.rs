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
use crate::coord::session::Session;
use crate::rules::groups::{admit_counted, within, Admission, Group, Holder, Place};

mod slot_lease;
mod sweep;

use slot_lease::SlotLease;

/// How often a waiting attempt looks at its group again without a change seen: a watch that
/// failed and is being restarted delivers nothing meanwhile.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// How many slots an attempt tries to take in a row, each refused take telling it which are
/// held, before it stands in line.
const TAKE_TRIES: usize = 3;

/// How often a failed etcd call of a waiting or ending attempt is tried again.
const RETRY: Duration = Duration::from_millis(200);

/// A group's limit in the node's config now, by the group's name; `None` for a group the
/// config no longer has.
pub(crate) type CurrentLimit = Box<dyn Fn(&str) -> Option<u32> + Send + Sync>;

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
    /// A slot holds this attempt's value on its lease: handed to it, or taken by a write of its
    /// whose reply was lost.
    Handed(u32),
    /// Take this slot; `ahead` attempts wait ahead in line.
    Take {
        slot: u32,
        ahead: usize,
    },
    Wait,
}

/// What a try to take a slot came to.
enum Taken {
    /// This slot is the attempt's; `place_gone` when the write that took it also took its place
    /// out of the line.
    Slot { slot: u32, place_gone: bool },
    /// A slot past the limit (lowered since it was handed on) is the attempt's: it gives it
    /// back and waits.
    PastLimit(u32),
    /// A take of this slot got no answer: it may have landed.
    Unsure(u32),
    /// No slot for it now.
    Nothing,
}

/// Why an attempt stopped waiting for a slot, as its caller said.
pub(crate) struct GaveUp<W>(pub(crate) W);

/// Where an attempt of this process stands in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Looking for a slot: it may have a place in line, and a slot may be handed to it.
    Waiting,
    /// Holding this slot, until its release has ended.
    Holding(u32),
}

/// An attempt known to the node's groups from before its first write to after its last: the
/// sweep leaves alone what it accounts for, and cleans up what it left once it is gone.
struct Attending {
    groups: Arc<Groups>,
    holder: Holder,
}

impl Attending {
    fn set(&self, phase: Phase) {
        self.groups.attending().insert(self.holder.clone(), phase);
    }
}

impl Drop for Attending {
    fn drop(&mut self) {
        self.groups.attending().remove(&self.holder);
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

    /// `group`'s limit now: by the config the node runs (a reload may have changed it since the
    /// attempt began), else `otherwise`.
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

    fn limit_of(&self, group: &str, otherwise: u32) -> u32 {
        (self.limits)(group).unwrap_or(otherwise)
    }

    fn attend(self: &Arc<Self>, holder: &Holder) -> Attending {
        let attending = Attending {
            groups: Arc::clone(self),
            holder: holder.clone(),
        };
        attending.set(Phase::Waiting);
        attending
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
        let attending = self.attend(&holder);
        let value = match serde_json::to_vec(&holder) {
            Ok(value) => value,
            Err(err) => {
                // A holder is plain data: never seen. No slot is taken under a value not written.
                tracing::error!(error = %err, group = %group.name, "cannot write the attempt's value for its group: it waits as in a full group");
                return Err(GaveUp(give_up.await));
            }
        };
        let line_key = self.keys.group_waiting(&group.name, &place.segment());
        // The lease a put of the place was sent on: the place may be in line there even when the
        // put's reply was lost, and must be taken out whatever comes.
        let mut placed: Option<Session> = None;
        // The put was answered: the place is in line, and a take takes it out in the same write.
        let mut in_line = false;
        // A take of this slot, on this lease, got no answer: it is read back before the attempt
        // stands in line, since it may hold the slot already.
        let mut unsure: Option<(u32, i64)> = None;
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
            if placed.as_ref().is_some_and(|on| on.lease() != lease.lease()) {
                // The place was on a lease since lost, and went with it.
                placed = None;
                in_line = false;
            }
            unsure = unsure.filter(|(_, on)| *on == lease.lease());
            let limit = self.limit_of(&group.name, group.limit);
            let taken = match unsure {
                Some((slot, _)) => self.read_back(group, slot, &value, &lease, limit).await,
                None => {
                    let waiting = placed.as_ref().filter(|_| in_line).map(|_| line_key.as_str());
                    self.try_take(group, limit, &holder, &value, &place, &lease, waiting)
                        .await
                }
            };
            match taken {
                Ok(Taken::Slot { slot, place_gone }) => {
                    attending.set(Phase::Holding(slot));
                    if let (Some(on), false) = (&placed, place_gone) {
                        // Handed the slot (the hand-over took the place out), or holding it by a
                        // write whose reply was lost, its place put after: out of the line, so
                        // that no slot is ever handed to it.
                        self.remove_place(&group.name, &line_key, &value, on).await;
                    }
                    return Ok(self.slot(&group.name, group.limit, slot, value, &lease, Some(attending)));
                }
                Ok(Taken::PastLimit(slot)) => {
                    tracing::info!(group = %group.name, slot, limit, "holding a slot past the group's limit, lowered since: giving it back and waiting");
                    self.slot(&group.name, group.limit, slot, value.clone(), &lease, None)
                        .release()
                        .await;
                    // The hand-over took the place out of the line: it stands in line again, at
                    // the place its due time gives it.
                    in_line = false;
                }
                Ok(Taken::Unsure(slot)) => unsure = Some((slot, lease.lease())),
                Ok(Taken::Nothing) => unsure = None,
                Err(err) => tracing::debug!(error = %err, group = %group.name, "cannot take a slot now; trying again"),
            }
            if !in_line && unsure.is_none() {
                placed = Some(lease.clone());
                match self.stand_in_line(&line_key, &value, &lease).await {
                    Ok(()) => in_line = true,
                    Err(err) => {
                        tracing::debug!(error = %err, group = %group.name, "cannot wait in the group's line now; trying again")
                    }
                }
            }
            if in_line && !told {
                told = true;
                let view = self.view(&group.name);
                tracing::info!(group = %group.name, limit, running = view.slots.len(), waiting = view.waiting.len(), holders = %view.holders(10), "the group is full: waiting for a slot");
            }
            tokio::select! {
                biased;
                why = &mut give_up => {
                    self.leave_line(group, &value, &line_key, placed.as_ref(), unsure.map(|(slot, _)| slot), &lease).await;
                    return Err(GaveUp(why));
                }
                _ = &mut changed => {}
                _ = tokio::time::sleep(LOOK_AGAIN) => {}
                _ = lease.ended().cancelled() => {}
            }
        }
    }

    /// The slot handed to `holder`, or one it may take by the line's order; `Nothing` if
    /// neither. `waiting`: the key of its place, known to be in line.
    #[allow(clippy::too_many_arguments)]
    async fn try_take(
        self: &Arc<Self>,
        group: &Group,
        limit: u32,
        holder: &Holder,
        value: &[u8],
        place: &Place,
        lease: &Session,
        waiting: Option<&str>,
    ) -> Result<Taken, CoordError> {
        let (mut slot, ahead) = match self.decide(&group.name, limit, holder, place, lease.lease(), waiting.is_some()) {
            // Handed on below the limit while slots past it are held (the ender's limit was
            // the old one): given back like a slot past it.
            Decision::Handed(slot) if self.runs_in(&group.name, slot, limit) => {
                return Ok(Taken::Slot {
                    slot,
                    place_gone: false,
                })
            }
            Decision::Handed(slot) => return Ok(Taken::PastLimit(slot)),
            Decision::Take { slot, ahead } => (slot, ahead),
            Decision::Wait => return Ok(Taken::Nothing),
        };
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
                value.to_vec(),
                Some(PutOptions::new().with_lease(lease.lease())),
            )];
            if let Some(place_key) = waiting {
                when.push(Compare::version(place_key, CompareOp::Greater, 0));
                then.push(TxnOp::delete(place_key, None));
            }
            let held_now = TxnOp::get(slots.as_str(), Some(GetOptions::new().with_prefix().with_keys_only()));
            let txn = Txn::new().when(when).and_then(then).or_else([held_now]);
            let response = match etcd::call(self.client.clone().txn(txn)).await {
                Ok(response) => response,
                Err(err) => {
                    tracing::debug!(error = %err, group = %group.name, slot, "no answer to a take of a group slot: reading it back before waiting in line");
                    return Ok(Taken::Unsure(slot));
                }
            };
            if response.succeeded() {
                // A reload may have lowered the limit since the slot was chosen: a run only
                // starts in a slot within the limit as it is once the slot is taken, and while
                // no slot past it is held.
                if !self.runs_in(&group.name, slot, self.limit_of(&group.name, group.limit)) {
                    return Ok(Taken::PastLimit(slot));
                }
                return Ok(Taken::Slot {
                    slot,
                    place_gone: waiting.is_some(),
                });
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
            let beyond = held.range(limit..).count();
            match admit_counted(ahead, |slot| held.contains(&slot), beyond, limit, spread) {
                Admission::Take(free) => slot = free,
                Admission::Wait => return Ok(Taken::Nothing),
            }
        }
        Ok(Taken::Nothing)
    }

    /// Whether a take of `slot` whose reply was lost landed: the slot holds the attempt's
    /// `value` on its lease.
    async fn read_back(
        &self,
        group: &Group,
        slot: u32,
        value: &[u8],
        lease: &Session,
        limit: u32,
    ) -> Result<Taken, CoordError> {
        let key = self.keys.group_slot(&group.name, slot);
        let read = etcd::call(self.client.clone().get(key, None)).await?;
        let mine = read
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == value && kv.lease() == lease.lease());
        Ok(match mine {
            false => Taken::Nothing,
            true if self.runs_in(&group.name, slot, limit) => Taken::Slot {
                slot,
                place_gone: false,
            },
            true => Taken::PastLimit(slot),
        })
    }

    /// What an attempt does now, by the mirror: take the slot handed to it, take a free one by
    /// the line's order, or wait. Counted under the lock without copying the line: every
    /// waiting attempt of the node looks again at each change of the group.
    fn decide(&self, group: &str, limit: u32, holder: &Holder, place: &Place, lease: i64, in_line: bool) -> Decision {
        let spread = if in_line { 0 } else { spread_of(place) };
        let views = self.lock();
        let Some(view) = views.get(group) else {
            return match admit_counted(0, |_| false, 0, limit, spread) {
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
        let ahead = view.waiting.range(..place).take(limit as usize).count();
        let beyond = view.slots.range(limit..).count();
        match admit_counted(ahead, |slot| view.slots.contains_key(&slot), beyond, limit, spread) {
            Admission::Take(slot) => Decision::Take { slot, ahead },
            Admission::Wait => Decision::Wait,
        }
    }

    /// Puts the attempt's place, `key`, in its group's line.
    async fn stand_in_line(&self, key: &str, value: &[u8], lease: &Session) -> Result<(), CoordError> {
        let options = PutOptions::new().with_lease(lease.lease());
        etcd::call(self.client.clone().put(key, value.to_vec(), Some(options))).await?;
        Ok(())
    }

    /// Takes the place `key` holding `value` out of the line, trying until etcd answers or the
    /// lease it is on ends (and the place with it): the lease lives as long as the node, so a
    /// place left would be handed a slot nobody runs. `Some(true)` if it was in line.
    async fn remove_place(&self, group: &str, key: &str, value: &[u8], lease: &Session) -> Option<bool> {
        let txn = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, value.to_vec())])
            .and_then([TxnOp::delete(key, None)]);
        while lease.is_live() {
            match etcd::call(self.client.clone().txn(txn.clone())).await {
                Ok(response) => return Some(response.succeeded()),
                Err(err) => {
                    tracing::debug!(error = %err, group, "cannot take a place out of the group's line yet; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
        None
    }

    /// An attempt that gives up takes its place out of the line, if it may have put one, and
    /// gives back a slot handed to it meanwhile, or taken by a write whose reply was lost
    /// (`unsure`). Each step is tried until etcd answers or the lease ends; anything left
    /// after that is the sweep's.
    async fn leave_line(
        self: &Arc<Self>,
        group: &Group,
        value: &[u8],
        key: &str,
        placed: Option<&Session>,
        unsure: Option<u32>,
        lease: &Session,
    ) {
        let was_in_line = match placed {
            Some(on) => self.remove_place(&group.name, key, value, on).await,
            None => Some(false),
        };
        // Gone from the line without this node taking it out: a slot may have been handed to it.
        let look = match was_in_line {
            Some(true) => unsure.is_some(),
            Some(false) => placed.is_some() || unsure.is_some(),
            None => false,
        };
        if !look {
            return;
        }
        let prefix = self.keys.group_slots_prefix(&group.name);
        let read = loop {
            if !lease.is_live() {
                return;
            }
            match etcd::call(
                self.client
                    .clone()
                    .get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await
            {
                Ok(read) => break read,
                Err(err) => {
                    tracing::debug!(error = %err, group = %group.name, "cannot read the group's slots yet; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        for kv in read.kvs() {
            if kv.value() != value || kv.lease() != lease.lease() {
                continue;
            }
            let slot = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|key| self.keys.parse_group_key(key))
                .and_then(|(_, what)| match what {
                    GroupKey::Slot(slot) => Some(slot),
                    GroupKey::Waiting(_) => None,
                });
            if let Some(slot) = slot {
                self.slot(&group.name, group.limit, slot, value.to_vec(), lease, None)
                    .release()
                    .await;
            }
        }
    }

    fn slot(
        self: &Arc<Self>,
        group: &str,
        limit: u32,
        slot: u32,
        value: Vec<u8>,
        lease: &Session,
        attending: Option<Attending>,
    ) -> Slot {
        Slot {
            held: Some(Held {
                groups: Arc::clone(self),
                group: group.to_string(),
                limit,
                slot,
                value,
                lease: lease.clone(),
                _attending: attending,
            }),
        }
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

/// A slot held by one attempt. Released when the attempt's process group has ended; dropped
/// unreleased (a run cancelled from outside), it is released by a task of its own.
pub(crate) struct Slot {
    held: Option<Held>,
}

struct Held {
    groups: Arc<Groups>,
    group: String,
    /// The group's limit when the slot was taken: the one its release goes by if the config no
    /// longer has the group.
    limit: u32,
    slot: u32,
    /// The slot key's value as this attempt holds it: a release changes the key only while it
    /// still holds this, so a slot that lapsed and went to another attempt is left alone.
    value: Vec<u8>,
    lease: Session,
    /// The attempt holding the slot, known to the sweep until the release has ended.
    _attending: Option<Attending>,
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

    /// One try: hands the slot to the first in line, or frees it (also a slot past the group's
    /// limit now, lowered since it was taken). `false` when the first in line left before the
    /// hand-over: the next try looks again.
    async fn hand_on(&self, key: &str, mine: Compare) -> Result<bool, CoordError> {
        let groups = &self.groups;
        let free = || Txn::new().when([mine.clone()]).and_then([TxnOp::delete(key, None)]);
        let limit = groups.limit_of(&self.group, self.limit);
        if !within(self.slot, limit) {
            etcd::call(groups.client.clone().txn(free())).await?;
            tracing::debug!(group = %self.group, slot = self.slot, "freed a group slot past the group's limit");
            return Ok(true);
        }
        // Slots past a lowered limit still held count against the free ones below it: handed on,
        // this one would start a run beside them past the limit. Freed, the first in line takes
        // it once they have ended.
        if groups.held_past(&self.group, limit) > 0 {
            etcd::call(groups.client.clone().txn(free())).await?;
            tracing::debug!(group = %self.group, slot = self.slot, "freed a group slot instead of handing it on: slots past the group's lowered limit are still held");
            return Ok(true);
        }
        let first = GetOptions::new().with_prefix().with_limit(1);
        let line = groups.keys.group_waiting_prefix(&self.group);
        let read = etcd::call(groups.client.clone().get(line, Some(first))).await?;
        let Some(heir) = read.kvs().first() else {
            etcd::call(groups.client.clone().txn(free())).await?;
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
