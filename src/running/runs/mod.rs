//! The runs of this node: starting them with the overlap policy, waiting for them at
//! shutdown, and handing their results to the [`crate::coord::results`] queue.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock;
use crate::coord::backfills::Settle;
use crate::coord::groups::Groups;
use crate::coord::pauses::Pauses;
use crate::rules::config::Delivery;
use crate::rules::record::{Outcome, RunRecord};
use crate::running::backfill_settles::BackfillSettles;
use crate::running::report::Reports;
use crate::running::runner::{self, NotStarted, Tick};
use crate::secrets::ChildEnv;
pub(crate) use late::LateReservation;
use late::LateRoom;
use overlap::Skip;
use table::{Entered, JobTable, Sequence};

mod backfill;
mod elsewhere;
mod late;
pub(crate) use elsewhere::AskedHere;
mod overlap;
mod sequence;
mod table;
#[cfg(test)]
mod tests;

/// At most how long a late run holds its permit. The permits keep a backlog from starting
/// thousands of processes at once; a run that has gone on this long is past that burst, and
/// runs that never end (no `timeout`) would otherwise hold every permit and stop every backlog
/// of the node for good.
const LATE_PERMIT_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs started on this node. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    tracker: TaskTracker,
    /// Each job's runs here: the run going, the turn, the sequences waiting.
    jobs: Arc<JobTable>,
    /// The permits caught-up and redelivered ticks run with, and the room for them.
    late: Arc<LateRoom>,
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
        Runs {
            tracker,
            jobs: Arc::default(),
            late: Arc::new(LateRoom::new()),
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
        let late = ticks.iter().filter(|tick| tick.arrival.runs_late()).count();
        self.late.handed_over(late);
        self.tracker.spawn(self.clone().sequence(ticks, entry));
    }

    /// Counts a sequence of `ticks` in the job's runs, and decides what it waits for; `None`
    /// if there are no ticks, or they are skipped at once.
    fn enter(&self, ticks: &[Tick]) -> Option<Sequence> {
        let first = ticks.first()?;
        let late = ticks.iter().any(|tick| tick.arrival.runs_late());
        let entered = self.jobs.enter(
            &first.job,
            first.arrival.takes_turn(),
            late,
            first.scheduled_at,
            clock::now(),
        );
        match entered {
            Entered::Counted(entry) => Some(entry),
            Entered::Replacing(entry) => {
                runner::span(first).in_scope(|| {
                    tracing::info!("replacing the job's running run with this tick (overlap = \"replace\")");
                });
                Some(entry)
            }
            Entered::Overlapped => {
                self.skip_all(ticks, Skip::Overlapped);
                None
            }
        }
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

    /// Whether fewer than [`late::LATE_ROOM`] late ticks wait on this node.
    pub fn has_late_room(&self) -> bool {
        self.late.has_room()
    }

    /// Waits until [`Runs::has_late_room`].
    pub async fn late_room(&self) {
        self.late.wait_for_room().await;
    }

    /// Holds room for `ticks` late ticks about to be claimed (see [`LateRoom::reserve`]).
    pub(crate) fn reserve_late(&self, ticks: usize) -> Option<LateReservation> {
        self.late.reserve(ticks)
    }

    /// Whether `tick` may be settled without a run now (see [`crate::coord::starts::Starts::settle`]).
    fn settle(&self, tick: &Tick) -> bool {
        // A requested or backfilled run is no tick of the schedule: its leadership owes it to
        // no record.
        let may = match tick.arrival.owed_to_schedule() {
            true => tick.starts.settle(&tick.job.name, tick.scheduled_at),
            false => tick.starts.may_spawn(),
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
        match tick.arrival.not_started() {
            NotStarted::RecordedLost => {
                tracing::warn!(requested_at = %tick.scheduled_at_text(), "lost: a run asked for by hand was claimed, and this node no longer leads the shard or its lease may have expired before it started");
                self.report(tick, not_run(tick, Outcome::Lost));
                return;
            }
            NotStarted::GivenBack => {
                tracing::info!("not starting a backfill tick: this node no longer leads the shard, or its lease may have expired; it goes back to be claimed again");
                self.give_back(tick);
                return;
            }
            NotStarted::StaysOwed => {}
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
        if tick.arrival.not_started() == NotStarted::GivenBack {
            tracing::info!(
                until = %crate::clock::shown(pause.until),
                "paused: the backfill tick goes back to be run once the pause ends"
            );
            self.give_back(tick);
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
        if !tick.arrival.kept_out_by_blackouts() {
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

    /// Gives a backfill tick that did not start back to its backfill's record.
    fn give_back(&self, tick: &Tick) {
        if let Some(claim) = tick.arrival.backfill_claim() {
            self.settles
                .settle(&tick.job.name, tick.scheduled_at, claim, Settle::Again);
        }
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
