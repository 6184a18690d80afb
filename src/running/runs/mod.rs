//! The runs of this node: starting them with the overlap policy, waiting for them at
//! shutdown, and handing their results to the [`crate::coord::results`] queue.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock;
use crate::coord::backfills::Settle;
use crate::coord::groups::Groups;
use crate::coord::pauses::Pauses;
use crate::rules::config::{Delivery, Overlap};
use crate::rules::record::{Outcome, RunRecord};
use crate::running::backfill_settles::BackfillSettles;
use crate::running::report::Reports;
use crate::running::runner::{self, Origin, Tick};
use crate::secrets::ChildEnv;
use overlap::{may_overlap, overlaps, Running, Skip};

mod backfill;
mod elsewhere;
pub(crate) use elsewhere::AskedHere;
mod overlap;
mod sequence;
#[cfg(test)]
mod tests;

/// Caught-up and redelivered runs that may go at once on a node, per core: a takeover after a
/// long outage may owe a backlog to every one of 100,000 jobs, and starting them all together
/// would bury the machine (and the node's lease renewals) under processes. Live ticks never wait.
const LATE_RUNS_PER_CORE: usize = 4;

/// At most how long a late run holds its permit. The permits keep a backlog from starting
/// thousands of processes at once; a run that has gone on this long is past that burst, and
/// runs that never end (no `timeout`) would otherwise hold every permit and stop every backlog
/// of the node for good.
const LATE_PERMIT_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// How many caught-up and redelivered ticks may wait for a permit on a node before a leader
/// claims more of its backlog: a takeover that owes 100 ticks to each of 100,000 jobs claims and
/// holds them a part at a time, not ten million at once.
pub const LATE_ROOM: usize = 10_000;

/// Runs started on this node. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    tracker: TaskTracker,
    jobs: Arc<Mutex<HashMap<String, JobRuns>>>,
    /// Permits for caught-up and redelivered runs (see [`LATE_RUNS_PER_CORE`]).
    late: Arc<tokio::sync::Semaphore>,
    /// Caught-up and redelivered ticks handed over and not taken up yet (see [`LATE_ROOM`]).
    late_waiting: Arc<std::sync::atomic::AtomicUsize>,
    /// Told when `late_waiting` drops below [`LATE_ROOM`].
    late_room: Arc<tokio::sync::Notify>,
    /// Cancelled when the shutdown grace is over: running commands are killed.
    kill: CancellationToken,
    /// Where every run of this node goes once it ended, run or not.
    reports: Reports,
    pauses: Arc<Pauses>,
    /// The node's part in the concurrency groups: grouped attempts take their slots there.
    groups: Arc<Groups>,
    /// What every command's environment starts from, made once for the node.
    child_env: Arc<ChildEnv>,
    /// Gives a backfill tick that did not start back to its backfill's record.
    settles: Arc<BackfillSettles>,
    /// Told when a job's last backfill run on this node ends.
    backfills_ended: Arc<tokio::sync::Notify>,
}

/// Room for late ticks held by a leader while it claims them (see [`Runs::reserve_late`]).
pub(crate) struct LateReservation {
    runs: Runs,
    ticks: usize,
}

impl Drop for LateReservation {
    fn drop(&mut self) {
        self.runs.release_late(self.ticks);
    }
}

/// A sequence of one job's ticks, counted in its runs: what it waits for before it runs.
struct Entry {
    /// The job's turn and this sequence's number, unless `overlap = "allow"`.
    turn: Option<(Arc<tokio::sync::Mutex<()>>, u64)>,
    /// The run going when the sequence came, if it may overlap its first tick.
    met: Option<Running>,
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

impl Runs {
    /// Runs whose ends go to `reports`, and which `pauses` may stop; `tracker` follows every
    /// task of theirs until the shutdown's drain.
    pub(crate) fn new(
        tracker: TaskTracker,
        reports: Reports,
        settles: Arc<BackfillSettles>,
        pauses: Arc<Pauses>,
        groups: Arc<Groups>,
        child_env: Arc<ChildEnv>,
    ) -> Runs {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Runs {
            tracker,
            jobs: Arc::default(),
            late: Arc::new(tokio::sync::Semaphore::new(cores * LATE_RUNS_PER_CORE)),
            late_waiting: Arc::default(),
            late_room: Arc::default(),
            kill: CancellationToken::new(),
            reports,
            pauses,
            groups,
            child_env,
            settles,
            backfills_ended: Arc::default(),
        }
    }

    /// Runs `ticks` of one job one after another (a catch-up runs missed ticks in order).
    ///
    /// With `overlap = "skip"` the ticks are skipped when the running run overlaps the first of
    /// them ([`overlaps`]), at once or after waiting for it; otherwise they wait their turn. With
    /// `"replace"` the running sequence is stopped and the new ticks run once it has exited.
    pub fn start(&self, ticks: Vec<Tick>) {
        let ticks: Vec<Tick> = ticks
            .into_iter()
            .filter(|tick| !runner::span(tick).in_scope(|| self.blacked_out(tick) || self.paused(tick)))
            .collect();
        let Some(entry) = self.enter(&ticks) else { return };
        let late = ticks.iter().filter(|tick| tick.caught_up).count();
        self.late_waiting.fetch_add(late, Ordering::SeqCst);
        self.tracker.spawn(self.clone().sequence(ticks, entry));
    }

    /// Counts a sequence of `ticks` in the job's runs, and decides what it waits for; `None`
    /// if there are no ticks, or they are skipped at once.
    fn enter(&self, ticks: &[Tick]) -> Option<Entry> {
        let first = ticks.first()?;
        let job = &first.job;
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let runs = jobs.entry(job.name.clone()).or_default();
        if !first.origin.takes_turn() {
            runs.pending += 1;
            runs.backfilling += 1;
            return Some(Entry { turn: None, met: None });
        }
        let now = clock::now();
        // The run going when this one came, if it may overlap it: decided once that run has
        // ended or has run the time between the two ticks.
        let mut met = None;
        match job.overlap {
            Overlap::Skip
                if runs
                    .running
                    .is_some_and(|running| overlaps(running, first.scheduled_at, now)) =>
            {
                drop(jobs);
                self.skip_all(ticks, Skip::Overlapped);
                return None;
            }
            Overlap::Skip if ticks.iter().all(|tick| !tick.caught_up) => {
                met = runs.running.filter(|running| may_overlap(*running, first.scheduled_at));
            }
            Overlap::Replace if runs.pending > 0 => {
                runner::span(first).in_scope(|| {
                    tracing::info!("replacing the job's running run with this tick (overlap = \"replace\")");
                });
                runs.replace.cancel();
            }
            _ => {}
        }
        runs.pending += 1;
        runs.newest += 1;
        let turn = (job.overlap != Overlap::Allow).then(|| (Arc::clone(&runs.turn), runs.newest));
        Some(Entry { turn, met })
    }

    /// Records each of `ticks` skipped, in its run's span.
    fn skip_all(&self, ticks: &[Tick], why: Skip) {
        for tick in ticks {
            runner::span(tick).in_scope(|| self.skip(tick, why.clone()));
        }
    }

    /// Records `tick` skipped under `overlap = "skip"`, if it may be settled without a run.
    fn skip(&self, tick: &Tick, why: Skip) {
        if !self.settle(tick) {
            return;
        }
        match why {
            Skip::Overlapped => {
                tracing::info!("skipped: the previous run of this job on this node was still going at this tick (overlap = \"skip\")")
            }
            Skip::BehindLongerRun { previous_tick, took } => {
                tracing::info!(previous_tick = %clock::rfc3339(previous_tick), previous_took_ms = took.num_milliseconds(), "skipped: the previous run of this job was still going at this tick and ran longer than the time between the two ticks (overlap = \"skip\")")
            }
            Skip::Outrun => {
                tracing::info!("skipped: it waited behind a backlog of this job's runs until its next tick was due (overlap = \"skip\")")
            }
            Skip::Elsewhere { node, previous_tick } => {
                tracing::info!(%node, previous_tick = %clock::rfc3339(previous_tick), "skipped: a run of this job was still going on another node at this tick, as its record shows (overlap = \"skip\")")
            }
        }
        crate::metrics::get().skipped_overlaps.inc();
        self.report(tick, not_run(tick, Outcome::Skipped));
    }

    /// A sequence of the job's ticks is over: the job's entry goes once none is left.
    fn release_turn(&self, job: &str) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
            entry.pending = entry.pending.saturating_sub(1);
            if entry.pending == 0 {
                jobs.remove(job);
            }
        }
    }

    /// Whether fewer than [`LATE_ROOM`] late ticks wait on this node.
    pub fn has_late_room(&self) -> bool {
        self.late_waiting.load(Ordering::SeqCst) < LATE_ROOM
    }

    /// Waits until [`Runs::has_late_room`].
    pub async fn late_room(&self) {
        loop {
            let notified = self.late_room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.has_late_room() {
                return;
            }
            notified.await;
        }
    }

    /// Holds room for `ticks` late ticks about to be claimed, if fewer than [`LATE_ROOM`] wait:
    /// several shards taking over at once share the room instead of each finding it empty
    /// before any of their runs is counted. The room is held until the reservation is dropped,
    /// by which time [`Runs::start`] counts the ticks that started.
    pub(crate) fn reserve_late(&self, ticks: usize) -> Option<LateReservation> {
        let mut waiting = self.late_waiting.load(Ordering::SeqCst);
        loop {
            if waiting >= LATE_ROOM {
                return None;
            }
            match self
                .late_waiting
                .compare_exchange(waiting, waiting + ticks, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    return Some(LateReservation {
                        runs: self.clone(),
                        ticks,
                    })
                }
                Err(now) => waiting = now,
            }
        }
    }

    fn release_late(&self, ticks: usize) {
        let before = self.late_waiting.fetch_sub(ticks, Ordering::SeqCst);
        if before >= LATE_ROOM && before - ticks < LATE_ROOM {
            self.late_room.notify_waiters();
        }
    }

    fn late_taken_up(&self) {
        self.release_late(1);
    }

    /// Called by a sequence once it holds the job's turn: the token that stops it, stored so a
    /// newer `replace` tick can cancel it. A `replace` sequence started before the newest one
    /// starts out replaced, whatever order the two reached the turn in.
    fn take_turn(&self, job: &str, overlap: Overlap, ticket: u64) -> CancellationToken {
        let token = CancellationToken::new();
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
            if overlap == Overlap::Replace && ticket < entry.newest {
                token.cancel();
            }
            entry.replace = token.clone();
        }
        token
    }

    fn took(&self, job: &str, took: chrono::Duration) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
            entry.last_took = Some(took);
        }
    }

    /// Whether `met`, the run a tick of `scheduled_at` came upon, still goes and now overlaps
    /// that tick for certain.
    fn still_overlaps(&self, job: &str, met: Running, scheduled_at: DateTime<Utc>) -> bool {
        let jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        jobs.get(job)
            .and_then(|entry| entry.running)
            .is_some_and(|running| running == met && overlaps(running, scheduled_at, clock::now()))
    }

    fn last_took(&self, job: &str) -> Option<chrono::Duration> {
        let jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        jobs.get(job).and_then(|entry| entry.last_took)
    }

    fn mark_running(&self, job: &str, running: Option<Running>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
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

    /// Whether `tick` may be settled without a run now (see [`crate::coord::starts::Starts::settle`]).
    fn settle(&self, tick: &Tick) -> bool {
        // A requested or backfilled run is no tick of the schedule: its leadership owes it to
        // no record.
        let may = match tick.is_asked() {
            true => tick.starts.may_spawn(),
            false => tick.starts.settle(&tick.job.name, tick.scheduled_at),
        };
        if !may {
            self.not_starting(tick);
        }
        may
    }

    /// A claimed tick this node does not start. A tick of the schedule stays pending in etcd,
    /// and the next leader delivers it or records it lost; a requested run is recorded lost
    /// here, since no record lists it; a backfill tick goes back to its backfill's record.
    fn not_starting(&self, tick: &Tick) {
        match &tick.origin {
            Origin::Request(_) => {
                tracing::warn!(requested_at = %tick.scheduled_at_text(), "lost: a run asked for by hand was claimed, and this node no longer leads the shard or its lease may have expired before it started");
                self.report(tick, not_run(tick, Outcome::Lost));
                return;
            }
            Origin::Backfill(claim) => {
                tracing::info!("not starting a backfill tick: this node no longer leads the shard, or its lease may have expired; it goes back to be claimed again");
                self.settles
                    .settle(&tick.job.name, tick.scheduled_at, claim, Settle::Again);
                return;
            }
            Origin::Schedule => {}
        }
        let next = match tick.job.delivery {
            Delivery::AtLeastOnce => "the next leader runs it",
            Delivery::AtMostOnce => "the next leader records it lost",
        };
        if let Some(left_out) = crate::repeats::log_now("not starting a claimed tick") {
            tracing::warn!(next, left_out, "not starting a claimed tick: this node no longer leads the shard, or its lease may have expired (left_out: lines like this one not logged since the last)");
        }
    }

    /// Whether a pause stops `tick`; if one does, the tick is recorded `paused` (a backfill
    /// tick, stopped only by a pause that holds now, goes back to its backfill's record).
    fn paused(&self, tick: &Tick) -> bool {
        let now = clock::now();
        let Some(pause) = self.pauses.stopping(tick.job.job_name(), tick.due_at(now), now) else {
            return false;
        };
        if let Origin::Backfill(claim) = &tick.origin {
            tracing::info!(
                until = %crate::clock::shown(pause.until),
                "paused: the backfill tick goes back to be run once the pause ends"
            );
            self.settles
                .settle(&tick.job.name, tick.scheduled_at, claim, Settle::Again);
            return true;
        }
        if self.settle(tick) {
            tracing::info!(
                until = %crate::clock::shown(pause.until),
                reason = pause.reason.as_deref().unwrap_or("-"),
                "paused: not run"
            );
            self.report(tick, not_run(tick, Outcome::Paused));
        }
        true
    }

    /// Whether a blackout covers `tick`'s scheduled instant; if one does, the tick is recorded
    /// `skipped` with the blackout's name. A run asked for by hand is an operator's own choice
    /// and goes ahead; a backfill's historic tick that fell in a blackout is skipped as it was.
    fn blacked_out(&self, tick: &Tick) -> bool {
        if !tick.origin.kept_out_by_blackouts() {
            return false;
        }
        let Some(blackout) = crate::rules::blackouts::covering(&tick.job.blackouts, tick.scheduled_at) else {
            return false;
        };
        if self.settle(tick) {
            tracing::info!(blackout = %blackout.name, "skipped: the tick falls inside a blackout");
            crate::metrics::get()
                .blackout_skips
                .get_or_create(&crate::metrics::BlackoutLabel {
                    blackout: blackout.name.clone(),
                })
                .inc();
            let record = RunRecord {
                blackout: Some(blackout.name.clone()),
                ..not_run(tick, Outcome::Skipped)
            };
            self.report(tick, record);
        }
        true
    }

    fn report(&self, tick: &Tick, record: RunRecord) {
        self.reports.ran(tick, &record);
    }

    /// Kills every running command's process group now.
    pub fn kill_all(&self) {
        self.kill.cancel();
    }

    /// Waits for running commands up to `grace`, then kills their process groups and waits for
    /// them to exit.
    pub async fn drain(&self, grace: Duration, hurry: &CancellationToken) {
        self.tracker.close();
        if !self.tracker.is_empty() {
            tracing::info!(
                running = self.tracker.len(),
                grace = %humantime::format_duration(grace),
                "waiting for running commands to end within the grace; Ctrl-C (or SIGTERM) again stops them now"
            );
            let finished = tokio::select! {
                finished = tokio::time::timeout(grace, self.tracker.wait()) => finished.is_ok(),
                _ = hurry.cancelled() => false,
            };
            if finished {
                return;
            }
            if hurry.is_cancelled() {
                tracing::warn!(
                    running = self.tracker.len(),
                    "second signal: killing the remaining commands now"
                );
            } else {
                tracing::warn!(
                    running = self.tracker.len(),
                    "shutdown grace is over: killing the remaining commands"
                );
            }
            self.kill.cancel();
            self.tracker.wait().await;
        }
    }
}

/// The record of a tick that was claimed but not run: `skipped`, `replaced` or `paused`.
fn not_run(tick: &Tick, outcome: Outcome) -> RunRecord {
    RunRecord {
        scheduled_at: tick.scheduled_at,
        fence: tick.fence,
        node: tick.node.clone(),
        outcome,
        exit_code: None,
        duration_ms: 0,
        finished_at: clock::now(),
        attempts: 0,
        trigger: tick.trigger(),
        output: None,
        blackout: None,
    }
}
