//! The runs of this node: starting them with the overlap policy, waiting for them at
//! shutdown, and handing their results to the [`crate::results`] queue.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock;
use crate::config::{Delivery, Job, Overlap};
use crate::pauses::Pauses;
use crate::record::{Outcome, RunRecord};
use crate::results::ResultQueue;
use crate::runner::{self, Tick};
use crate::secrets::ChildEnv;

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
    results: Arc<ResultQueue>,
    pauses: Arc<Pauses>,
    /// What every command's environment starts from, made once for the node.
    child_env: Arc<ChildEnv>,
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

/// Why an `overlap = "skip"` tick is not run.
#[derive(Clone, Copy)]
enum Skip {
    /// The run going had already run the time between its tick and this one.
    Overlapped,
    /// This tick waited for a run that started late, which then took at least the time between
    /// its tick and this one.
    BehindLongerRun {
        previous_tick: DateTime<Utc>,
        took: chrono::Duration,
    },
    /// This tick waited behind a backlog until its own next tick was due ([`outrun`]).
    Outrun,
}

/// A run that is going: when it started, by the wall clock, and the tick it runs.
#[derive(Clone, Copy, PartialEq)]
struct Running {
    since: DateTime<Utc>,
    tick: DateTime<Utc>,
    /// A missed tick run by a new leader: part of a backlog, however soon it started.
    caught_up: bool,
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
}

impl Runs {
    /// Runs whose results go to `results`, and which `pauses` may stop.
    pub(crate) fn new(results: Arc<ResultQueue>, pauses: Arc<Pauses>, child_env: Arc<ChildEnv>) -> Runs {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Runs {
            tracker: TaskTracker::new(),
            jobs: Arc::default(),
            late: Arc::new(tokio::sync::Semaphore::new(cores * LATE_RUNS_PER_CORE)),
            late_waiting: Arc::default(),
            late_room: Arc::default(),
            kill: CancellationToken::new(),
            results,
            pauses,
            child_env,
        }
    }

    /// Runs `ticks` of one job one after another (a catch-up runs missed ticks in order).
    ///
    /// With `overlap = "skip"` the ticks are skipped when the running run overlaps the first of
    /// them ([`overlaps`]), at once or after waiting for it; otherwise they wait their turn. With
    /// `"replace"` the running sequence is stopped and the new ticks run once it has exited.
    pub fn start(&self, ticks: Vec<Tick>) {
        let ticks: Vec<Tick> = ticks.into_iter().filter(|tick| !self.paused(tick)).collect();
        let Some(first) = ticks.first() else { return };
        let job = Arc::clone(&first.job);
        let first_at = first.scheduled_at;
        // The run going when this one came, if it may overlap it: decided once that run has
        // ended or has run the time between the two ticks.
        let mut met = None;
        let turn = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let runs = jobs.entry(job.name.clone()).or_default();
            let now = clock::now();
            match job.overlap {
                Overlap::Skip if runs.running.is_some_and(|running| overlaps(running, first_at, now)) => {
                    drop(jobs);
                    for tick in &ticks {
                        self.skip(tick, Skip::Overlapped);
                    }
                    return;
                }
                Overlap::Skip if ticks.iter().all(|tick| !tick.caught_up) => {
                    met = runs.running.filter(|running| may_overlap(*running, first_at));
                }
                Overlap::Replace if runs.pending > 0 => {
                    tracing::info!(job = %job.name, tick = %first.scheduled_at_text(), "replacing the job's running run with this tick (overlap = \"replace\")");
                    runs.replace.cancel();
                }
                _ => {}
            }
            runs.pending += 1;
            runs.newest += 1;
            let ticket = runs.newest;
            (job.overlap != Overlap::Allow).then(|| (Arc::clone(&runs.turn), ticket))
        };
        let late = ticks.iter().filter(|tick| tick.caught_up).count();
        self.late_waiting.fetch_add(late, Ordering::SeqCst);
        let runs = self.clone();
        self.tracker.spawn(async move {
            let (_turn, replace, waited) = match &turn {
                Some((turn, ticket)) => {
                    let (held, waited) = match turn.try_lock() {
                        Ok(held) => (held, false),
                        Err(_) => match met {
                            Some(running) => {
                                // Waits no longer than the run started late: by then it has run
                                // the time between the two ticks if it still goes.
                                let certain = running.since + (first_at - running.tick);
                                tokio::select! {
                                    biased;
                                    held = turn.lock() => (held, true),
                                    _ = clock::sleep_past(certain) => {
                                        if runs.still_overlaps(&job.name, running, first_at) {
                                            for tick in &ticks {
                                                runs.skip(tick, Skip::Overlapped);
                                            }
                                            runs.release_turn(&job.name);
                                            return;
                                        }
                                        (turn.lock().await, true)
                                    }
                                }
                            }
                            None => (turn.lock().await, true),
                        },
                    };
                    (Some(held), runs.take_turn(&job.name, job.overlap, *ticket), waited)
                }
                None => (None, CancellationToken::new(), false),
            };
            if let Some(met) = met.map(|running| running.tick) {
                let previous_took = runs.last_took(&job.name);
                if let Some(took) = previous_took.filter(|took| *took >= first_at - met) {
                    for tick in &ticks {
                        runs.skip(
                            tick,
                            Skip::BehindLongerRun {
                                previous_tick: met,
                                took,
                            },
                        );
                    }
                    runs.release_turn(&job.name);
                    return;
                }
            }
            for tick in ticks {
                // Held for the run, at most LATE_PERMIT_HOLD; the semaphore is never closed. A
                // late tick waits for room until it holds a permit.
                let late = if tick.caught_up {
                    let permit = Arc::clone(&runs.late).acquire_owned().await.ok();
                    runs.late_taken_up();
                    permit
                } else {
                    None
                };
                // A pause may have come while the tick waited for its turn or a permit.
                if runs.paused(&tick) {
                    continue;
                }
                if replace.is_cancelled() {
                    if runs.settle(&tick) {
                        runs.report(&tick, not_run(&tick, Outcome::Replaced));
                    }
                    continue;
                }
                if waited
                    && outrun(
                        &tick.job,
                        tick.scheduled_at,
                        tick.caught_up,
                        runs.last_took(&job.name),
                        clock::now(),
                    )
                {
                    runs.skip(&tick, Skip::Outrun);
                    continue;
                }
                // A requested run needs no ticket: no record lists it as owed. Its first attempt
                // checks the leadership and the lease right before the spawn, as retries do.
                let ticket = match tick.request {
                    Some(_) => None,
                    None => match tick.starts.begin(&tick.job.name, tick.scheduled_at).await {
                        Some(ticket) => Some(ticket),
                        None => {
                            runs.not_starting(&tick);
                            continue;
                        }
                    },
                };
                runs.mark_running(
                    &job.name,
                    Some(Running {
                        since: clock::now(),
                        tick: tick.scheduled_at,
                        caught_up: tick.caught_up,
                    }),
                );
                let stops = runner::Stops {
                    kill: &runs.kill,
                    replace: &replace,
                };
                let began = clock::now();
                let record = match late {
                    Some(permit) => {
                        let run = runner::run(&tick, &stops, ticket, &runs.child_env);
                        tokio::pin!(run);
                        tokio::select! {
                            record = &mut run => record,
                            _ = tokio::time::sleep(LATE_PERMIT_HOLD) => {
                                drop(permit);
                                tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), held_s = LATE_PERMIT_HOLD.as_secs(), "a late run still going gives its permit back: the node's other backlogs go on beside it");
                                run.await
                            }
                        }
                    }
                    None => runner::run(&tick, &stops, ticket, &runs.child_env).await,
                };
                runs.took(&job.name, clock::now() - began);
                match record {
                    Some(record) => runs.report(&tick, record),
                    None => runs.not_starting(&tick),
                }
            }
            runs.mark_running(&job.name, None);
            runs.release_turn(&job.name);
        });
    }

    /// Records `tick` skipped under `overlap = "skip"`, if it may be settled without a run.
    fn skip(&self, tick: &Tick, why: Skip) {
        if !self.settle(tick) {
            return;
        }
        let (job, at) = (&tick.job.name, tick.scheduled_at_text());
        match why {
            Skip::Overlapped => {
                tracing::info!(%job, tick = %at, "skipped: the previous run of this job on this node was still going at this tick (overlap = \"skip\")")
            }
            Skip::BehindLongerRun { previous_tick, took } => {
                tracing::info!(%job, tick = %at, %previous_tick, previous_took_ms = took.num_milliseconds(), "skipped: the previous run of this job was still going at this tick and ran longer than the time between the two ticks (overlap = \"skip\")")
            }
            Skip::Outrun => {
                tracing::info!(%job, tick = %at, "skipped: it waited behind a backlog of this job's runs until its next tick was due (overlap = \"skip\")")
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

    /// Whether `tick` may be settled without a run now (see [`crate::starts::Starts::settle`]).
    fn settle(&self, tick: &Tick) -> bool {
        let may = match tick.request {
            // A requested run is no tick of the schedule: its leadership owes it to no record.
            Some(_) => tick.starts.may_spawn(),
            None => tick.starts.settle(&tick.job.name, tick.scheduled_at),
        };
        if !may {
            self.not_starting(tick);
        }
        may
    }

    /// A claimed tick this node does not start. A tick of the schedule stays pending in etcd,
    /// and the next leader delivers it or records it lost; a requested run is recorded lost
    /// here, since no record lists it.
    fn not_starting(&self, tick: &Tick) {
        if tick.request.is_some() {
            tracing::warn!(job = %tick.job.name, requested_at = %tick.scheduled_at_text(), fence = tick.fence, "lost: a run asked for by hand was claimed, and this node no longer leads the shard or its lease may have expired before it started");
            self.report(tick, not_run(tick, Outcome::Lost));
            return;
        }
        let next = match tick.job.delivery {
            Delivery::AtLeastOnce => "the next leader runs it",
            Delivery::AtMostOnce => "the next leader records it lost",
        };
        if let Some(left_out) = crate::repeats::log_now("not starting a claimed tick") {
            tracing::warn!(job = %tick.job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, next, left_out, "not starting a claimed tick: this node no longer leads the shard, or its lease may have expired (left_out: lines like this one not logged since the last)");
        }
    }

    /// Whether a pause stops `tick`; if one does, the tick is recorded `paused`.
    fn paused(&self, tick: &Tick) -> bool {
        let Some(pause) = self.pauses.stopping(&tick.job.name, tick.scheduled_at, clock::now()) else {
            return false;
        };
        if self.settle(tick) {
            tracing::info!(job = %tick.job.name, tick = %tick.scheduled_at_text(), until = ?pause.until, reason = ?pause.reason, "paused: not run");
            self.report(tick, not_run(tick, Outcome::Paused));
        }
        true
    }

    fn report(&self, tick: &Tick, record: RunRecord) {
        crate::metrics::get().record_run(&tick.job.name, &record);
        if let Some(request) = &tick.request {
            self.results.answer(request, record.clone());
        }
        self.results.push_run(&tick.job, record);
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
            tracing::info!(running = self.tracker.len(), grace = ?grace, "waiting for running commands");
            let finished = tokio::select! {
                finished = tokio::time::timeout(grace, self.tracker.wait()) => finished.is_ok(),
                _ = hurry.cancelled() => false,
            };
            if !finished {
                tracing::warn!(
                    running = self.tracker.len(),
                    "shutdown grace is over: killing the remaining commands"
                );
                self.kill.cancel();
                self.tracker.wait().await;
            }
        }
    }
}

/// Whether the run going may overlap the tick at `scheduled_at`: it runs a live tick (not a
/// missed one a new leader caught up, which never makes a live tick skip) and started no later
/// than this tick.
fn may_overlap(running: Running, scheduled_at: DateTime<Utc>) -> bool {
    !running.caught_up && running.since <= scheduled_at
}

/// Whether `running` overlaps the tick at `scheduled_at` for certain at `now`, so that
/// `overlap = "skip"` skips the tick: it may overlap it and has already run for the time between
/// its tick and this one, which a run started on time would have overlapped too.
///
/// A run that started late (its claim waited for a slow etcd, a lease renewal, an election) may
/// still be going at the next tick only because it started late. Such a tick waits for the run,
/// at most as long as the run started late: it is skipped once the run has gone on for the time
/// between the two ticks, or when the run ends having taken that long; otherwise it runs. A run
/// that hangs therefore keeps at most the ticks of that lateness waiting, one at a time for a
/// run that started less than a period late.
fn overlaps(running: Running, scheduled_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    may_overlap(running, scheduled_at) && now - running.since >= scheduled_at - running.tick
}

/// Whether a live tick of an `overlap = "skip"` job, which waited for its turn behind a backlog
/// whose last run took `last_took`, is outrun by its own next tick at `now`: it is skipped so the
/// backlog drains. Were it run, every tick behind runs longer than the period would queue and
/// start later than the one before, without end. Behind shorter runs (ticks only delayed
/// together, by an etcd election or a lease renewal) the backlog drains by itself, and every
/// tick runs. Missed ticks a new leader catches up always run.
fn outrun(
    job: &Job,
    scheduled_at: DateTime<Utc>,
    caught_up: bool,
    last_took: Option<chrono::Duration>,
    now: DateTime<Utc>,
) -> bool {
    let Some(next) = job.schedule.next_after(scheduled_at) else {
        return false;
    };
    let period = next - scheduled_at;
    job.overlap == Overlap::Skip && !caught_up && last_took.is_some_and(|took| took >= period) && next <= now
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_800_000_000_000 + millis).unwrap()
    }

    #[test]
    fn shards_taking_over_together_share_the_nodes_room_for_late_ticks() {
        let child_env = Arc::new(ChildEnv::of_node(std::env::vars_os(), &[]));
        let runs = Runs::new(Arc::default(), Arc::default(), child_env);
        let first = runs.reserve_late(LATE_ROOM - 1_000).expect("room");
        // One claim may pass the room by its own size, never a second one after it.
        let second = runs.reserve_late(5_000).expect("room left before it");
        assert!(runs.reserve_late(1).is_none(), "no room once the reservations fill it");
        assert!(!runs.has_late_room());
        drop(first);
        assert!(runs.has_late_room());
        assert!(runs.reserve_late(1).is_some());
        drop(second);
        assert_eq!(
            runs.late_waiting.load(Ordering::SeqCst),
            0,
            "every reservation given back"
        );
    }

    #[test]
    fn a_waiting_tick_is_outrun_only_behind_runs_longer_than_the_period() {
        let job = Job::for_tests("j", "* * * * * *");
        let took = |millis: i64| Some(chrono::Duration::milliseconds(millis));
        // Tick 0 waited until 2.2 s behind a run of 1.4 s: its next tick is due, skip it.
        assert!(outrun(&job, at(0), false, took(1400), at(2200)));
        // Behind a 3 ms run that only started late (an etcd election, a lease renewal): run it.
        assert!(!outrun(&job, at(0), false, took(3), at(2200)));
        // Its next tick not due yet, or a caught-up tick, or another overlap policy: run it.
        assert!(!outrun(&job, at(0), false, took(1400), at(900)));
        assert!(!outrun(&job, at(0), true, took(1400), at(2200)));
        let allow = Job {
            overlap: Overlap::Allow,
            ..Job::for_tests("j", "* * * * * *")
        };
        assert!(!outrun(&allow, at(0), false, took(1400), at(2200)));
    }

    #[test]
    fn only_a_run_going_for_the_ticks_distance_overlaps_a_tick() {
        let run = |tick: i64, since: i64| Running {
            since: at(since),
            tick: at(tick),
            caught_up: false,
        };
        // A run of tick 0 that started 3 ms late and still goes at tick 1000: the tick waits
        // 3 ms, and is skipped if the run still goes then.
        assert!(!overlaps(run(0, 3), at(1000), at(1001)));
        assert!(overlaps(run(0, 3), at(1000), at(1003)));
        // The same run does not overlap a tick before it started.
        assert!(!overlaps(run(0, 3), at(0), at(1003)));
        // Tick 28000 started 990 ms late (its claim waited for a slow etcd) and still goes at
        // tick 29000: the tick waits for it, and is skipped only if it runs 1 s or more.
        assert!(!overlaps(run(28000, 28990), at(29000), at(29008)));
        assert!(may_overlap(run(28000, 28990), at(29000)));
        assert!(overlaps(run(28000, 28990), at(29000), at(29990)));
        // Tick 3000 started half a period late and still goes at tick 4000, having run half a
        // period: it may yet end in less than a period, so tick 4000 waits.
        assert!(!overlaps(run(3000, 3500), at(4000), at(4000)));
        assert!(overlaps(run(3000, 3500), at(4000), at(4500)));
        // A run that hangs: each tick it meets waits the 990 ms it started late, then is skipped.
        assert!(!overlaps(run(28000, 28990), at(31000), at(31000)));
        assert!(overlaps(run(28000, 28990), at(31000), at(31990)));
        // Catch-up: tick 3000 running since 4980: tick 5000 waits behind it.
        assert!(!overlaps(run(3000, 4980), at(5000), at(5001)));
        // A claim that waited out an etcd election: tick 15000 started at 17200.
        assert!(!may_overlap(run(15000, 17200), at(17000)));
        // The last tick a new leader caught up, started just before the next live tick: still a
        // backlog, so the live tick queues behind it, whatever it takes.
        let caught_up = Running {
            caught_up: true,
            ..run(34000, 34900)
        };
        assert!(!may_overlap(caught_up, at(35000)));
        assert!(!overlaps(caught_up, at(40000), at(40000)));
    }
}
