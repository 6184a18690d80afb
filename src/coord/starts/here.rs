//! The ticks this node started, and its runs going on, across its leaderships: what a later
//! leadership of the node must not deliver again, and what every record it writes lists as
//! going.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::rules::protocol::elsewhere::{self, Beside};
use crate::rules::protocol::MAX_GOING;
use crate::rules::record::{Claim, Going};

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// At most how many ticks per job a node remembers starting without a record holding them: a
/// bound for jobs whose shard the node never leads again; the oldest are forgotten first.
const REMEMBERED_PER_JOB: usize = 1024;

/// At most how many of other nodes' ended runs a node remembers per job, the highest fences
/// kept: a listing of an older one that a record still carries is looked at again, no more.
const ENDED_REMEMBERED_PER_JOB: usize = 64;

/// Another node's run, as this node remembers it ended: its fence and tick.
type RunId = (i64, DateTime<Utc>);

/// Takes the run of `job` with `fence` out of `runs`, and the job once none is left.
fn forget_run<T>(runs: &mut HashMap<String, BTreeMap<i64, T>>, job: &str, fence: i64) {
    if let Some(of_job) = runs.get_mut(job) {
        of_job.remove(&fence);
        if of_job.is_empty() {
            runs.remove(job);
        }
    }
}

/// The ticks this node started (or settled without a run) that a job record may still list as
/// pending, whichever leadership started them. Shared by every leadership of the node.
#[derive(Default)]
pub(crate) struct StartedHere {
    ticks: Mutex<HashMap<String, BTreeSet<DateTime<Utc>>>>,
    /// This node's runs of `overlap = "skip"` and `"replace"` jobs going on now, by job and
    /// fence, of every kind (scheduled, manual, backfill: a backfill may run several at once):
    /// what the records it writes list as going, whichever of its leaderships writes them.
    going: Mutex<HashMap<String, BTreeMap<i64, Going>>>,
    /// By job: the fences and ticks of other nodes' runs this node saw end. Its records stop
    /// listing those runs. A set, not the highest fence: a lower-fenced run may still go after a
    /// higher one ended (two backfill runs at once); and by tick too, since the ticks of a
    /// backlog share the fence of the claim that won them, and run one after another.
    ended_elsewhere: Mutex<HashMap<String, BTreeSet<RunId>>>,
    /// By job and fence, for this node's runs going now: what the first write that listed the
    /// run showed beside it. A run that takes no claim of the schedule waits for it.
    landed: Mutex<HashMap<String, BTreeMap<i64, Beside>>>,
    /// By job, the fences of this node's runs that wait for a write to list them, and no write
    /// has yet: only theirs are kept in `landed`.
    landing_awaited: Mutex<HashMap<String, BTreeSet<i64>>>,
    /// Woken when a write lists a run for the first time.
    landing: Notify,
}

impl StartedHere {
    /// A run of `job` started on this node: its records list it as going until it ends. With
    /// `awaits_landing`, it waits for the first write that lists it ([`StartedHere::landed`]).
    /// Returns false if it was listed already (before it started), which stays as it was.
    pub(crate) fn run_going(&self, job: &str, going: Going, awaits_landing: bool) -> bool {
        let mut runs = lock(&self.going);
        let of_job = runs.entry(job.to_string()).or_default();
        if of_job.contains_key(&going.fence) {
            return false;
        }
        if awaits_landing {
            lock(&self.landing_awaited)
                .entry(job.to_string())
                .or_default()
                .insert(going.fence);
        }
        of_job.insert(going.fence, going);
        true
    }

    /// The run of `job` with `fence` ended.
    pub(crate) fn run_ended(&self, job: &str, fence: i64) {
        forget_run(&mut lock(&self.going), job, fence);
        forget_run(&mut lock(&self.landed), job, fence);
        let mut awaited = lock(&self.landing_awaited);
        if let Some(fences) = awaited.get_mut(job) {
            fences.remove(&fence);
            if fences.is_empty() {
                awaited.remove(job);
            }
        }
    }

    /// `record` of `job` was written by the leadership `term` of `node` (this one): each run
    /// of this node that awaits its listing and that it lists is listed in etcd now, beside
    /// what it shows.
    pub(crate) fn record_written(&self, job: &str, record: &Claim, node: &str, term: i64) {
        // A record lists at most `MAX_GOING` runs, the highest fences: one that had no room is
        // as listed as it can be, and must not wait for a write that never lists it.
        let full = record.going.len() >= MAX_GOING;
        self.land(
            job,
            |fence| full || record.going.iter().any(|run| run.node == node && run.fence == fence),
            || elsewhere::beside(record, node, term),
        );
    }

    /// `job` has no record to list this node's runs in (no leader ever claimed it): each not
    /// listed yet is as listed, with nothing beside it.
    pub(crate) fn no_record(&self, job: &str) {
        self.land(job, |_| true, Beside::default);
    }

    /// Marks listed the runs of `job` awaiting their listing that `listed` says are, beside
    /// what `shown` makes (once, only if there is one).
    fn land(&self, job: &str, listed: impl Fn(i64) -> bool, shown: impl FnOnce() -> Beside) {
        let mut awaited = lock(&self.landing_awaited);
        let Some(fences) = awaited.get_mut(job) else {
            return;
        };
        let landing: Vec<i64> = fences.iter().copied().filter(|fence| listed(*fence)).collect();
        if landing.is_empty() {
            return;
        }
        for fence in &landing {
            fences.remove(fence);
        }
        if fences.is_empty() {
            awaited.remove(job);
        }
        let beside = shown();
        let mut landed = lock(&self.landed);
        let runs = landed.entry(job.to_string()).or_default();
        for fence in landing {
            runs.insert(fence, beside.clone());
        }
        drop((landed, awaited));
        self.landing.notify_waiters();
    }

    /// What the first write that listed this node's run of `job` with `fence` showed beside
    /// it, once one has; `None` if `until` is cancelled first.
    pub(crate) async fn landed(&self, job: &str, fence: i64, until: &CancellationToken) -> Option<Beside> {
        loop {
            let landing = self.landing.notified();
            tokio::pin!(landing);
            landing.as_mut().enable();
            if let Some(beside) = lock(&self.landed).get(job).and_then(|runs| runs.get(&fence)) {
                return Some(beside.clone());
            }
            tokio::select! {
                _ = landing => {}
                _ = until.cancelled() => return None,
            }
        }
    }

    /// This node's runs of `job` going on now, highest fence first.
    pub(crate) fn own_going(&self, job: &str) -> Vec<Going> {
        lock(&self.going)
            .get(job)
            .map(|runs| runs.values().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// This node's run of `job` with `fence`, if it goes on now.
    pub(crate) fn own_run(&self, job: &str, fence: i64) -> Option<Going> {
        lock(&self.going).get(job).and_then(|runs| runs.get(&fence)).cloned()
    }

    /// The jobs this node lists runs of as going now.
    pub(crate) fn jobs_going(&self) -> Vec<String> {
        lock(&self.going).keys().cloned().collect()
    }

    /// Another node's run of `job`, `run`, was seen ended.
    pub(crate) fn ended_elsewhere(&self, job: &str, run: &Going) {
        let mut ended = lock(&self.ended_elsewhere);
        let runs = ended.entry(job.to_string()).or_default();
        runs.insert((run.fence, run.tick));
        if runs.len() > ENDED_REMEMBERED_PER_JOB {
            runs.pop_first();
        }
    }

    /// Whether this node saw another node's run of `job`, `run`, end.
    pub(crate) fn seen_ended(&self, job: &str, run: &Going) -> bool {
        lock(&self.ended_elsewhere)
            .get(job)
            .is_some_and(|runs| runs.contains(&(run.fence, run.tick)))
    }

    pub(super) fn remember(&self, job: &str, tick: DateTime<Utc>) {
        let mut ticks = self.lock();
        let started = ticks.entry(job.to_string()).or_default();
        started.insert(tick);
        if started.len() > REMEMBERED_PER_JOB {
            started.pop_first();
        }
    }

    /// A record of `job` listing `pending` was written: the ticks it does not list are settled
    /// in etcd and need no remembering.
    pub(crate) fn written(&self, job: &str, pending: &[DateTime<Utc>]) {
        let mut ticks = self.lock();
        if let Some(started) = ticks.get_mut(job) {
            started.retain(|tick| pending.contains(tick));
            if started.is_empty() {
                ticks.remove(job);
            }
        }
    }

    /// Whether this node started `tick` of `job` (or settled it without a run).
    pub(crate) fn contains(&self, job: &str, tick: DateTime<Utc>) -> bool {
        self.lock().get(job).is_some_and(|started| started.contains(&tick))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeSet<DateTime<Utc>>>> {
        self.ticks.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests;
