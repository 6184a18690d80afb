//! Taking a slot: by the line's order, from the mirror first and from etcd's answer to a
//! refused take after, or by waiting in line until one is handed on.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::attending::{Attending, Phase};
use super::slot::Slot;
use super::{Groups, RETRY};
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::GroupKey;
use crate::coord::session::Session;
use crate::rules::groups::{admit_counted, Admission, Group, Holder, Place};

/// How often a waiting attempt looks at its group again without a change seen: a watch that
/// failed and is being restarted delivers nothing meanwhile.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// How many slots an attempt tries to take in a row, each refused take telling it which are
/// held, before it stands in line.
const TAKE_TRIES: usize = 3;

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

/// One attempt's part in its group: what it writes, and where its place in line is.
struct Attempt<'a> {
    group: &'a Group,
    holder: &'a Holder,
    place: &'a Place,
    /// The holder's value, as its slot and its place hold it.
    value: Vec<u8>,
    /// The key of its place in line.
    line_key: String,
}

/// What a waiting attempt knows of its own writes, from one look to the next.
#[derive(Default)]
struct Standing {
    /// The lease a put of the place was sent on: the place may be in line there even when the
    /// put's reply was lost, and must be taken out whatever comes.
    placed: Option<Session>,
    /// The put was answered: the place is in line, and a take takes it out in the same write.
    in_line: bool,
    /// A take of this slot, on this lease, got no answer: it is read back before the attempt
    /// stands in line, since it may hold the slot already.
    unsure: Option<(u32, i64)>,
    /// The attempt has said that the group is full.
    told: bool,
}

impl Standing {
    /// Forgets what lived on a lease other than `lease`.
    fn follow(&mut self, lease: &Session) {
        if self.placed.as_ref().is_some_and(|on| on.lease() != lease.lease()) {
            // The place was on a lease since lost, and went with it.
            self.placed = None;
            self.in_line = false;
        }
        self.unsure = self.unsure.filter(|(_, on)| *on == lease.lease());
    }
}

impl Groups {
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
        let attempt = Attempt {
            group,
            holder: &holder,
            place: &place,
            value,
            line_key: self.keys.group_waiting(&group.name, &place.segment()),
        };
        let mut standing = Standing::default();
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
            standing.follow(&lease);
            let limit = self.limit_of(&group.name, group.limit);
            let taken = self.look(&attempt, limit, &lease, &standing).await;
            if let Some(slot) = self
                .settle(&attempt, limit, taken, &lease, &attending, &mut standing)
                .await
            {
                let value = attempt.value;
                return Ok(self.slot(&group.name, group.limit, slot, value, &lease, Some(attending)));
            }
            self.wait_in_line(&attempt, limit, &lease, &mut standing).await;
            tokio::select! {
                biased;
                why = &mut give_up => {
                    let unsure = standing.unsure.map(|(slot, _)| slot);
                    self.leave_line(group, &attempt.value, &attempt.line_key, standing.placed.as_ref(), unsure, &lease).await;
                    return Err(GaveUp(why));
                }
                _ = &mut changed => {}
                _ = tokio::time::sleep(LOOK_AGAIN) => {}
                _ = lease.ended().cancelled() => {}
            }
        }
    }

    /// One look for a slot: a take whose reply was lost is read back, else a slot is taken if
    /// the line's order gives the attempt one.
    async fn look(
        self: &Arc<Self>,
        attempt: &Attempt<'_>,
        limit: u32,
        lease: &Session,
        standing: &Standing,
    ) -> Result<Taken, CoordError> {
        match standing.unsure {
            Some((slot, _)) => self.read_back(attempt, slot, lease, limit).await,
            None => {
                let waiting = standing
                    .placed
                    .as_ref()
                    .filter(|_| standing.in_line)
                    .map(|_| attempt.line_key.as_str());
                self.try_take(attempt, limit, lease, waiting).await
            }
        }
    }

    /// Acts on what a look came to: `Some` slot once the attempt holds it, its place out of the
    /// line; else what the attempt is left with goes into `standing`.
    async fn settle(
        self: &Arc<Self>,
        attempt: &Attempt<'_>,
        limit: u32,
        taken: Result<Taken, CoordError>,
        lease: &Session,
        attending: &Attending,
        standing: &mut Standing,
    ) -> Option<u32> {
        let group = attempt.group;
        match taken {
            Ok(Taken::Slot { slot, place_gone }) => {
                attending.set(Phase::Holding(slot));
                if let (Some(on), false) = (&standing.placed, place_gone) {
                    // Handed the slot (the hand-over took the place out), or holding it by a
                    // write whose reply was lost, its place put after: out of the line, so
                    // that no slot is ever handed to it.
                    self.remove_place(&group.name, &attempt.line_key, &attempt.value, on)
                        .await;
                }
                return Some(slot);
            }
            Ok(Taken::PastLimit(slot)) => {
                tracing::info!(group = %group.name, slot, limit, "holding a slot past the group's limit, lowered since: giving it back and waiting");
                self.slot(&group.name, group.limit, slot, attempt.value.clone(), lease, None)
                    .release()
                    .await;
                // The hand-over took the place out of the line: it stands in line again, at
                // the place its due time gives it.
                standing.in_line = false;
            }
            Ok(Taken::Unsure(slot)) => standing.unsure = Some((slot, lease.lease())),
            Ok(Taken::Nothing) => standing.unsure = None,
            Err(err) => tracing::debug!(error = %err, group = %group.name, "cannot take a slot now; trying again"),
        }
        None
    }

    /// Puts the attempt's place in line unless it is there or a take of it may have landed, and
    /// says once that the group is full.
    async fn wait_in_line(&self, attempt: &Attempt<'_>, limit: u32, lease: &Session, standing: &mut Standing) {
        let group = attempt.group;
        if !standing.in_line && standing.unsure.is_none() {
            standing.placed = Some(lease.clone());
            match self.stand_in_line(&attempt.line_key, &attempt.value, lease).await {
                Ok(()) => standing.in_line = true,
                Err(err) => {
                    tracing::debug!(error = %err, group = %group.name, "cannot wait in the group's line now; trying again")
                }
            }
        }
        if standing.in_line && !standing.told {
            standing.told = true;
            let view = self.view(&group.name);
            tracing::info!(group = %group.name, limit, running = view.slots.len(), waiting = view.waiting.len(), holders = %view.holders(10), "the group is full: waiting for a slot");
        }
    }

    /// The slot handed to the attempt, or one it may take by the line's order; `Nothing` if
    /// neither. `waiting`: the key of its place, known to be in line.
    async fn try_take(
        self: &Arc<Self>,
        attempt: &Attempt<'_>,
        limit: u32,
        lease: &Session,
        waiting: Option<&str>,
    ) -> Result<Taken, CoordError> {
        let group = attempt.group;
        let decision = self.decide(
            &group.name,
            limit,
            attempt.holder,
            attempt.place,
            lease.lease(),
            waiting.is_some(),
        );
        let (mut slot, ahead) = match decision {
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
        // The mirror lags behind etcd: a slot it shows free may be taken already. A refused take
        // reads which are held in the same round trip and tries a slot free by that read, so an
        // attempt stands in line only when the group is full, and is then handed a slot (two
        // writes per run) rather than taking one itself (three).
        for _ in 0..TAKE_TRIES {
            let txn = self.take_txn(attempt, slot, lease, waiting);
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
            let held = self.held_in(&response);
            let spread = if waiting.is_some() { 0 } else { spread_of(attempt.place) };
            let beyond = held.range(limit..).count();
            match admit_counted(ahead, |slot| held.contains(&slot), beyond, limit, spread) {
                Admission::Take(free) => slot = free,
                Admission::Wait => return Ok(Taken::Nothing),
            }
        }
        Ok(Taken::Nothing)
    }

    /// A take of `slot` if it is free, the attempt's place out of the line with it if `waiting`;
    /// refused, it reads which slots are held.
    fn take_txn(&self, attempt: &Attempt<'_>, slot: u32, lease: &Session, waiting: Option<&str>) -> Txn {
        let group = attempt.group;
        let slots = self.keys.group_slots_prefix(&group.name);
        let key = self.keys.group_slot(&group.name, slot);
        let mut when = vec![Compare::create_revision(key.as_str(), CompareOp::Equal, 0)];
        let mut then = vec![TxnOp::put(
            key.as_str(),
            attempt.value.to_vec(),
            Some(PutOptions::new().with_lease(lease.lease())),
        )];
        if let Some(place_key) = waiting {
            when.push(Compare::version(place_key, CompareOp::Greater, 0));
            then.push(TxnOp::delete(place_key, None));
        }
        let held_now = TxnOp::get(slots.as_str(), Some(GetOptions::new().with_prefix().with_keys_only()));
        Txn::new().when(when).and_then(then).or_else([held_now])
    }

    /// The slots a refused take read held.
    fn held_in(&self, response: &TxnResponse) -> BTreeSet<u32> {
        response
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
            .collect()
    }

    /// Whether a take of `slot` whose reply was lost landed: the slot holds the attempt's
    /// value on its lease.
    async fn read_back(
        &self,
        attempt: &Attempt<'_>,
        slot: u32,
        lease: &Session,
        limit: u32,
    ) -> Result<Taken, CoordError> {
        let group = attempt.group;
        let key = self.keys.group_slot(&group.name, slot);
        let read = etcd::call(self.client.clone().get(key, None)).await?;
        let mine = read
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == attempt.value.as_slice() && kv.lease() == lease.lease());
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
}
