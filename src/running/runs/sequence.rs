//! One sequence of a job's ticks, as a task: wait for the job's turn (or skip), then each tick
//! in its own span: a late-run permit, the checks that may settle it without a run, the start
//! ticket, the run and its record.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::elsewhere::Cleared;
use super::overlap::{outrun, Running, Skip};
use super::{not_run, Runs, Sequence, LATE_PERMIT_HOLD};
use crate::clock;
use crate::coord::groups::Slot;
use crate::rules::groups::Group;
use crate::rules::record::{Outcome, RunRecord};
use crate::running::runner::slot::{self, NoSlot};
use crate::running::runner::{self, Tick};

/// How often a tick waiting for a group slot looks for a pause of its job.
const PAUSE_LOOK: std::time::Duration = std::time::Duration::from_millis(500);

/// The job's turn, held by a sequence while it runs its ticks.
struct Turn {
    _held: Option<OwnedMutexGuard<()>>,
    /// Cancelled when a newer tick replaces the sequence (`overlap = "replace"`).
    replace: CancellationToken,
    /// Whether the sequence waited for the turn behind another one.
    waited: bool,
}

impl Runs {
    /// Runs `ticks`, a sequence [`Runs::enter`] counted, one after another.
    pub(super) async fn sequence(self, ticks: Vec<Tick>, entry: Sequence) {
        let job = Arc::clone(&ticks[0].job);
        let takes_turn = ticks[0].arrival.takes_turn();
        let Some(turn) = self.wait_turn(&entry, &ticks).await else {
            return;
        };
        if entry.turn.is_some() && takes_turn {
            // A live tick never overlaps a backfill run of a `skip` or `replace` job.
            self.backfills_over(&job.name).await;
        }
        if self.behind_longer_run(entry.met, &ticks) {
            self.jobs.release_turn(&job.name);
            return;
        }
        if !ticks[0].elsewhere.is_empty() || !ticks[0].claimed_elsewhere.is_empty() {
            if let Cleared::No = self.clear_elsewhere(&ticks).await {
                self.jobs.release_turn(&job.name);
                return;
            }
        }
        for tick in ticks {
            let span = runner::span(&tick);
            self.run_tick(tick, &turn).instrument(span).await;
        }
        if !takes_turn {
            self.leave_backfill(&job.name);
            return;
        }
        self.jobs.mark_running(&job.name, None);
        self.jobs.release_turn(&job.name);
    }

    /// Waits for the job's turn, unless `overlap = "allow"`; `None` if the ticks were skipped
    /// meanwhile.
    async fn wait_turn(&self, entry: &Sequence, ticks: &[Tick]) -> Option<Turn> {
        let Some((turn, number)) = &entry.turn else {
            return Some(Turn {
                _held: None,
                replace: CancellationToken::new(),
                waited: false,
            });
        };
        let job = &ticks[0].job;
        let (held, waited) = match Arc::clone(turn).try_lock_owned() {
            Ok(held) => (held, false),
            Err(_) => (self.wait_for_turn(turn, entry.met, ticks).await?, true),
        };
        Some(Turn {
            _held: Some(held),
            replace: self.jobs.take_turn(&job.name, job.overlap, *number),
            waited,
        })
    }

    /// Waits for a turn another sequence holds. Behind a run `met` that may overlap the first
    /// tick, waits no longer than that run started late: by then it has run the time between
    /// the two ticks if it still goes, and the ticks are skipped (`None`).
    async fn wait_for_turn(
        &self,
        turn: &Arc<Mutex<()>>,
        met: Option<Running>,
        ticks: &[Tick],
    ) -> Option<OwnedMutexGuard<()>> {
        let Some(running) = met else {
            return Some(Arc::clone(turn).lock_owned().await);
        };
        let (job, first_at) = (&ticks[0].job.name, ticks[0].scheduled_at);
        let certain = running.since + (first_at - running.tick);
        tokio::select! {
            biased;
            held = Arc::clone(turn).lock_owned() => return Some(held),
            _ = clock::sleep_past(certain) => {}
        }
        if self.jobs.still_overlaps(job, running, first_at, clock::now()) {
            self.skip_all(ticks, Skip::Overlapped);
            self.jobs.release_turn(job);
            return None;
        }
        Some(Arc::clone(turn).lock_owned().await)
    }

    /// Whether the ticks, which met the run of tick `met` and waited for it, are skipped: that
    /// run took at least the time between its tick and theirs.
    fn behind_longer_run(&self, met: Option<Running>, ticks: &[Tick]) -> bool {
        let Some(previous_tick) = met.map(|running| running.tick) else {
            return false;
        };
        let (job, first_at) = (&ticks[0].job.name, ticks[0].scheduled_at);
        let Some(took) = self
            .jobs
            .last_took(job)
            .filter(|took| *took >= first_at - previous_tick)
        else {
            return false;
        };
        self.skip_all(ticks, Skip::BehindLongerRun { previous_tick, took });
        true
    }

    /// One tick of the sequence, in its span: settled without a run if a pause, a replacing
    /// tick or its own next tick came meanwhile; otherwise run and reported.
    async fn run_tick(&self, tick: Tick, turn: &Turn) {
        let late = self.late_permit(&tick).await;
        if !self.still_to_start(&tick, turn).await {
            return;
        }
        let job = &tick.job;
        let first_slot = match &job.group {
            Some(group) => match self.take_slot(&tick, group, turn).await {
                Some(slot) => Some(slot),
                None => return,
            },
            None => None,
        };
        // A requested or backfilled run needs no ticket: no record of the schedule owes it. Its first attempt checks
        // the leadership and the lease right before the spawn, as retries do.
        let ticket = match tick.arrival.owed_to_schedule() {
            false => None,
            true => match tick.starts.begin(&job.name, tick.scheduled_at).await {
                Some(ticket) => Some(ticket),
                None => {
                    self.not_starting(&tick);
                    return;
                }
            },
        };
        let since = clock::now();
        let running = Running {
            since,
            tick: tick.scheduled_at,
            caught_up: tick.arrival.runs_late(),
            fence: tick.fence,
        };
        let takes_turn = tick.arrival.takes_turn();
        if takes_turn {
            self.jobs.mark_running(&job.name, Some(running));
        }
        let listed = self.list_going(&tick);
        let lapsed = listed
            .as_ref()
            .map_or_else(CancellationToken::new, |lease| lease.ended().clone());
        let stops = runner::Stops {
            kill: &self.kill,
            replace: &turn.replace,
            lapsed: &lapsed,
        };
        let slots = runner::Slots {
            first: first_slot,
            groups: &self.groups,
        };
        let run = runner::run(&tick, &stops, ticket, &self.child_env, slots);
        let record = holding_permit(run, late).await;
        self.unlist_going(&tick);
        if takes_turn {
            self.jobs.took(&job.name, clock::now() - since);
        }
        match record {
            Some(record) => self.report(&tick, record),
            None => self.not_starting(&tick),
        }
    }

    /// Whether `tick`, holding its turn and permit, still starts: not if a pause or a replacing
    /// tick came while it waited, if it cannot be listed as going, if runs its listing shows
    /// beside it keep it from starting, or if it waited until its own next tick was due.
    async fn still_to_start(&self, tick: &Tick, turn: &Turn) -> bool {
        // A pause may have come while the tick waited for its turn or a permit.
        if self.paused(tick) {
            return false;
        }
        if turn.replace.is_cancelled() {
            if self.settle(tick) {
                self.report(tick, not_run(tick, Outcome::Replaced));
            }
            return false;
        }
        // A run of a skip or replace job starts listed, or not at all: unlisted, another node's
        // leader would start the job beside it after a handoff.
        if !self.lease_to_list_on(tick).await {
            tracing::warn!("not starting: the lease this node lists its runs on is not open (etcd out of reach)");
            self.not_starting(tick);
            return false;
        }
        if let Cleared::No = self.listed_first(tick).await {
            return false;
        }
        let job = &tick.job;
        if turn.waited
            && outrun(
                job,
                tick.scheduled_at,
                tick.arrival.runs_late(),
                self.jobs.last_took(&job.name),
                clock::now(),
            )
        {
            self.skip(tick, Skip::Outrun);
            return false;
        }
        true
    }

    /// A slot of the job's group for the tick's first attempt, waited for in the group's line;
    /// `None` if the tick is settled or given back meanwhile: recorded `group_full` when the
    /// group stayed full as long as it could wait, `paused` or `replaced` when that came first,
    /// left owed when the leadership ended.
    async fn take_slot(&self, tick: &Tick, group: &Group, turn: &Turn) -> Option<Slot> {
        let stops = runner::Stops {
            kill: &self.kill,
            replace: &turn.replace,
            lapsed: &CancellationToken::new(),
        };
        let paused = async {
            while self
                .pauses
                .stopping(tick.job.job_name(), tick.due_at(clock::now()), clock::now())
                .is_none()
            {
                tokio::time::sleep(PAUSE_LOOK).await;
            }
        };
        let why = match slot::take(tick, group, &self.groups, &stops, paused).await {
            Ok(slot) => return Some(slot),
            Err(why) => why,
        };
        match why {
            NoSlot::Full => {
                if self.settle(tick) {
                    let view = self.groups.view(&group.name);
                    tracing::warn!(group = %group.name, limit = group.limit, running = view.slots.len(), waiting = view.waiting.len(), holders = %view.holders(10), "group full: not run; the group's slots stayed held as long as the tick could wait");
                    self.report(tick, not_run(tick, Outcome::GroupFull));
                }
            }
            NoSlot::Replaced => {
                if self.settle(tick) {
                    self.report(tick, not_run(tick, Outcome::Replaced));
                }
            }
            NoSlot::Other if self.paused(tick) => {}
            NoSlot::Other | NoSlot::NotLeading => self.not_starting(tick),
        }
        None
    }

    /// A late tick's permit, held for its run (at most [`LATE_PERMIT_HOLD`]); the semaphore is
    /// never closed. A late tick waits for room until it holds one; a live tick never waits.
    async fn late_permit(&self, tick: &Tick) -> Option<OwnedSemaphorePermit> {
        if !tick.arrival.runs_late() {
            return None;
        }
        self.late.permit().await
    }
}

/// Runs `run`; a late tick's `permit` is given back once the run has gone on for
/// [`LATE_PERMIT_HOLD`].
async fn holding_permit(
    run: impl Future<Output = Option<RunRecord>>,
    permit: Option<OwnedSemaphorePermit>,
) -> Option<RunRecord> {
    let Some(permit) = permit else {
        return run.await;
    };
    tokio::pin!(run);
    tokio::select! {
        record = &mut run => record,
        _ = tokio::time::sleep(LATE_PERMIT_HOLD) => {
            drop(permit);
            tracing::info!(held_s = LATE_PERMIT_HOLD.as_secs(), "a late run still going gives its permit back: the node's other backlogs go on beside it");
            run.await
        }
    }
}
