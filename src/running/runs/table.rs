//! The per-job table of this node's runs: for each job with a sequence started or waiting, the
//! run going now, the job's turn, the newest sequence (for `overlap = "replace"`), how long its
//! last run took, and its backfill runs. Synchronous: every question is answered under one lock,
//! and the table tests it answers them as the overlap policy says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::overlap::{may_overlap, overlaps, Running};
use crate::rules::config::{Job, Overlap};

/// A sequence of one job's ticks, counted in its runs: what it waits for before it runs.
pub(super) struct Sequence {
    /// The job's turn and this sequence's number, unless `overlap = "allow"`.
    pub(super) turn: Option<(Arc<tokio::sync::Mutex<()>>, u64)>,
    /// The run going when the sequence came, if it may overlap its first tick.
    pub(super) met: Option<Running>,
}

/// How a new sequence of a job's ticks was taken into the table.
pub(super) enum Entered {
    /// Counted: the sequence waits for what its entry says.
    Counted(Sequence),
    /// Counted, and the job's running sequence told to stop (`overlap = "replace"`).
    Replacing(Sequence),
    /// Not counted: the job's run going here overlaps the first tick (`overlap = "skip"`).
    Overlapped,
}

/// One job's runs on this node.
#[derive(Default)]
struct JobRuns {
    /// Sequences started or waiting; the entry is dropped at zero.
    pending: usize,
    /// The run going now, if any.
    running: Option<Running>,
    /// Held by the running sequence: a `skip` or `replace` job runs one tick at a time, in order.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Numbers sequences in the order they were started; the newest one is `newest`.
    newest: u64,
    /// Cancelled to stop the sequence that holds the turn (a newer tick replaces it).
    replace: CancellationToken,
    /// How long the job's last run on this node took: a backlog grows only behind runs longer
    /// than the job's period.
    last_took: Option<chrono::Duration>,
    /// Of `pending`, the backfill runs: they take no turn, and the job's live ticks wait for
    /// them to end.
    backfilling: usize,
}

#[derive(Default)]
pub(super) struct JobTable {
    jobs: Mutex<HashMap<String, JobRuns>>,
}

impl JobTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, JobRuns>> {
        self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a sequence of `job`'s ticks, the first at `first_at`, and decides what it waits
    /// for. `takes_turn` and `late` are the first tick's kind's answers (a backfill's takes no
    /// turn; a late tick is never skipped for a run it meets).
    pub(super) fn enter(
        &self,
        job: &Job,
        takes_turn: bool,
        late: bool,
        first_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Entered {
        let mut jobs = self.lock();
        let runs = jobs.entry(job.name.clone()).or_default();
        if !takes_turn {
            runs.pending += 1;
            runs.backfilling += 1;
            return Entered::Counted(Sequence { turn: None, met: None });
        }
        // The run going when this one came, if it may overlap it: decided once that run has
        // ended or has run the time between the two ticks.
        let mut met = None;
        let mut replacing = false;
        match job.overlap {
            Overlap::Skip if runs.running.is_some_and(|running| overlaps(running, first_at, now)) => {
                return Entered::Overlapped;
            }
            Overlap::Skip if !late => {
                met = runs.running.filter(|running| may_overlap(*running, first_at));
            }
            Overlap::Replace if runs.pending > 0 => {
                runs.replace.cancel();
                replacing = true;
            }
            _ => {}
        }
        runs.pending += 1;
        runs.newest += 1;
        let turn = (job.overlap != Overlap::Allow).then(|| (Arc::clone(&runs.turn), runs.newest));
        let entry = Sequence { turn, met };
        match replacing {
            true => Entered::Replacing(entry),
            false => Entered::Counted(entry),
        }
    }

    /// A sequence of the job's ticks is over: the job's entry goes once none is left.
    pub(super) fn release_turn(&self, job: &str) {
        let mut jobs = self.lock();
        if let Some(entry) = jobs.get_mut(job) {
            entry.pending = entry.pending.saturating_sub(1);
            if entry.pending == 0 {
                jobs.remove(job);
            }
        }
    }

    /// Called by a sequence once it holds the job's turn: the token that stops it, stored so a
    /// newer `replace` tick can cancel it. A `replace` sequence started before the newest one
    /// starts out replaced, whatever order the two reached the turn in.
    pub(super) fn take_turn(&self, job: &str, overlap: Overlap, ticket: u64) -> CancellationToken {
        let token = CancellationToken::new();
        if let Some(entry) = self.lock().get_mut(job) {
            if overlap == Overlap::Replace && ticket < entry.newest {
                token.cancel();
            }
            entry.replace = token.clone();
        }
        token
    }

    pub(super) fn took(&self, job: &str, took: chrono::Duration) {
        if let Some(entry) = self.lock().get_mut(job) {
            entry.last_took = Some(took);
        }
    }

    /// Whether `met`, the run a tick of `scheduled_at` came upon, still goes and overlaps that
    /// tick for certain at `now`.
    pub(super) fn still_overlaps(
        &self,
        job: &str,
        met: Running,
        scheduled_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> bool {
        self.lock()
            .get(job)
            .and_then(|entry| entry.running)
            .is_some_and(|running| running == met && overlaps(running, scheduled_at, now))
    }

    pub(super) fn last_took(&self, job: &str) -> Option<chrono::Duration> {
        self.lock().get(job).and_then(|entry| entry.last_took)
    }

    /// Sets the job's run going now; `shardcron_runs_in_flight` counts the jobs with one.
    pub(super) fn mark_running(&self, job: &str, running: Option<Running>) {
        if let Some(entry) = self.lock().get_mut(job) {
            let in_flight = &crate::metrics::get().runs_in_flight;
            match (entry.running.is_some(), running.is_some()) {
                (false, true) => {
                    in_flight.inc();
                }
                (true, false) => {
                    in_flight.dec();
                }
                _ => {}
            }
            entry.running = running;
        }
    }

    /// Stops the job's run going here if its fence is `fence`, as a newer tick replacing it
    /// would; whether it did.
    pub(super) fn replace_run(&self, job: &str, fence: i64) -> bool {
        let jobs = self.lock();
        let Some(entry) = jobs.get(job) else { return false };
        let going = entry.running.is_some_and(|running| running.fence == fence);
        if going {
            entry.replace.cancel();
        }
        going
    }

    /// Whether no live tick of `job` runs or waits here: only backfill runs, if any.
    pub(super) fn only_backfills(&self, job: &str) -> bool {
        self.lock().get(job).is_none_or(|runs| runs.pending == runs.backfilling)
    }

    /// How many backfill runs of `job` go here.
    pub(super) fn backfilling(&self, job: &str) -> usize {
        self.lock().get(job).map_or(0, |runs| runs.backfilling)
    }

    /// A backfill sequence of `job` is over.
    pub(super) fn leave_backfill(&self, job: &str) {
        let mut jobs = self.lock();
        if let Some(entry) = jobs.get_mut(job) {
            entry.pending = entry.pending.saturating_sub(1);
            entry.backfilling = entry.backfilling.saturating_sub(1);
            if entry.pending == 0 {
                jobs.remove(job);
            }
        }
    }
}
