//! The ticks one leadership owes: claimed, not started yet, each with the fence it starts with.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

/// Per job, the ticks a leadership claimed and has not started, those it is starting, and those
/// that run as redeliveries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Owed {
    /// Per job, the ticks claimed and not started, with the fence of the claim that won each.
    owed: BTreeMap<String, BTreeMap<DateTime<Utc>, i64>>,
    /// Per job, ticks given leave to start whose command has not started yet: still pending.
    starting: BTreeMap<String, BTreeSet<DateTime<Utc>>>,
    /// Owed ticks adopted from an earlier leader that may have started them: they run as
    /// redeliveries when they fire.
    redeliveries: BTreeMap<String, BTreeSet<DateTime<Utc>>>,
    /// Per job, adopted ticks an earlier leader may have started, due or not: while one is
    /// still owed or starting, a last write may not mark the job's ticks released.
    maybe_started: BTreeMap<String, BTreeSet<DateTime<Utc>>>,
}

impl Owed {
    /// After a write of `job`'s record that won with `fence`: these ticks of `job` are owed.
    ///
    /// The write lists every tick still owed as this leadership's, so each of them starts with
    /// its fence: a tick claimed ahead before a redelivery's claim does not start after it with
    /// a lower fence, and a leadership starts a job's ticks in fence order.
    pub(crate) fn owe(&mut self, job: &str, ticks: impl IntoIterator<Item = DateTime<Utc>>, fence: i64) {
        let owed = self.owed.entry(job.to_string()).or_default();
        for owed_fence in owed.values_mut() {
            *owed_fence = (*owed_fence).max(fence);
        }
        owed.extend(ticks.into_iter().map(|tick| (tick, fence)));
    }

    /// Leave to start `tick` of `job`, if it is owed: its fence. It stays listed as pending
    /// until [`Owed::started`] or [`Owed::give_back`].
    pub(crate) fn begin(&mut self, job: &str, tick: DateTime<Utc>) -> Option<i64> {
        let fence = self.owed.get_mut(job).and_then(|ticks| ticks.remove(&tick))?;
        self.starting.entry(job.to_string()).or_default().insert(tick);
        Some(fence)
    }

    /// The command of `tick` was spawned (or failed to be): no longer pending once written.
    pub(crate) fn started(&mut self, job: &str, tick: DateTime<Utc>) {
        remove(&mut self.starting, job, tick);
        remove(&mut self.maybe_started, job, tick);
    }

    /// Leave to start `tick` went unused: it is owed again, with its `fence`.
    pub(crate) fn give_back(&mut self, job: &str, tick: DateTime<Utc>, fence: i64) {
        self.started(job, tick);
        self.owed.entry(job.to_string()).or_default().insert(tick, fence);
    }

    /// `tick` of `job` is settled without a run (skipped, replaced): whether it was owed.
    pub(crate) fn settle(&mut self, job: &str, tick: DateTime<Utc>) -> bool {
        remove(&mut self.maybe_started, job, tick);
        self.owed
            .get_mut(job)
            .is_some_and(|ticks| ticks.remove(&tick).is_some())
    }

    /// The fence of `tick` of `job` if it is owed.
    pub(crate) fn fence(&self, job: &str, tick: DateTime<Utc>) -> Option<i64> {
        self.owed.get(job)?.get(&tick).copied()
    }

    /// The first tick of `job` after `after` that is owed: one claimed ahead.
    pub(crate) fn next_after(&self, job: &str, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let ticks = self.owed.get(job)?;
        ticks.range(after..).map(|(tick, _)| *tick).find(|tick| *tick > after)
    }

    /// The ticks of `job` still owed, oldest first, those about to start included: what its
    /// record lists as pending.
    pub(crate) fn listed(&self, job: &str) -> BTreeSet<DateTime<Utc>> {
        let mut owed: BTreeSet<DateTime<Utc>> = self
            .owed
            .get(job)
            .into_iter()
            .flat_map(|ticks| ticks.keys().copied())
            .collect();
        owed.extend(self.starting.get(job).into_iter().flatten().copied());
        owed
    }

    /// How many ticks of `job` are owed, not counting those starting.
    pub(crate) fn count(&self, job: &str) -> usize {
        self.owed.get(job).map_or(0, BTreeMap::len)
    }

    /// The jobs owing ticks, those about to start included.
    pub(crate) fn owing_jobs(&self) -> Vec<String> {
        let owed = self
            .owed
            .iter()
            .filter(|(_, ticks)| !ticks.is_empty())
            .map(|(job, _)| job);
        let starting = self
            .starting
            .iter()
            .filter(|(_, ticks)| !ticks.is_empty())
            .map(|(job, _)| job);
        let mut jobs: Vec<String> = owed.chain(starting).cloned().collect();
        jobs.sort_unstable();
        jobs.dedup();
        jobs
    }

    /// Whether every tick owed up to `tick` has started or is no longer owed.
    pub(crate) fn all_begun(&self, tick: DateTime<Utc>) -> bool {
        self.owed.values().all(|ticks| ticks.range(..=tick).next().is_none())
            && self
                .starting
                .values()
                .all(|ticks| ticks.range(..=tick).next().is_none())
    }

    /// Whether no leave to start is between its last check and its spawn.
    pub(crate) fn none_starting(&self) -> bool {
        self.starting.values().all(BTreeSet::is_empty)
    }

    /// Whether a leadership's last write may mark `job`'s owed ticks released, never started:
    /// not while it owes one adopted from an earlier leader that may have started it, which a
    /// successor must run as a redelivery.
    pub(crate) fn releasable(&self, job: &str) -> bool {
        self.redeliveries.get(job).is_none_or(BTreeSet::is_empty)
            && self.maybe_started.get(job).is_none_or(|ticks| {
                ticks.iter().all(|tick| {
                    !self.owed.get(job).is_some_and(|owed| owed.contains_key(tick))
                        && !self.starting.get(job).is_some_and(|starting| starting.contains(tick))
                })
            })
    }

    /// `tick` of `job`, owed and not due yet, may have started under an earlier leader: it
    /// fires as a redelivery.
    pub(crate) fn redeliver(&mut self, job: &str, tick: DateTime<Utc>) {
        self.redeliveries.entry(job.to_string()).or_default().insert(tick);
        self.adopted_maybe_started(job, tick);
    }

    /// `tick` of `job`, owed, was adopted from an earlier leader that may have started it: a
    /// due one starts at once as a redelivery, but may wait (for a group slot, for runs on
    /// other nodes) past the end of this leadership, whose last write must then leave it for
    /// the successor to run as a redelivery too, not mark it never started.
    pub(crate) fn adopted_maybe_started(&mut self, job: &str, tick: DateTime<Utc>) {
        self.maybe_started.entry(job.to_string()).or_default().insert(tick);
    }

    /// Whether `tick` of `job` fires as a redelivery; asked once, when it fires.
    pub(crate) fn take_redelivery(&mut self, job: &str, tick: DateTime<Utc>) -> bool {
        let Some(ticks) = self.redeliveries.get_mut(job) else {
            return false;
        };
        let taken = ticks.remove(&tick);
        if ticks.is_empty() {
            self.redeliveries.remove(job);
        }
        taken
    }
}

/// Takes `tick` out of `job`'s set in `sets`, and the job once its set is empty.
fn remove(sets: &mut BTreeMap<String, BTreeSet<DateTime<Utc>>>, job: &str, tick: DateTime<Utc>) {
    if let Some(ticks) = sets.get_mut(job) {
        ticks.remove(&tick);
        if ticks.is_empty() {
            sets.remove(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::Owed;

    fn at(second: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + second, 0).unwrap_or_default()
    }

    #[test]
    fn ticks_an_earlier_leader_may_have_started_are_never_released_while_owed() {
        let mut owed = Owed::default();
        owed.owe("job", [at(1), at(2)], 10);
        assert!(owed.releasable("job"));
        // A due adopted tick waits (for a group slot, for runs elsewhere) before it starts.
        owed.adopted_maybe_started("job", at(1));
        assert!(
            !owed.releasable("job"),
            "owed: the successor must run it as a redelivery"
        );
        assert_eq!(owed.begin("job", at(1)), Some(10));
        assert!(!owed.releasable("job"), "starting: still listed pending");
        owed.started("job", at(1));
        assert!(owed.releasable("job"), "started: no longer listed");
        owed.adopted_maybe_started("job", at(2));
        assert!(owed.settle("job", at(2)));
        assert!(owed.releasable("job"), "settled without a run");
    }
}
