//! Running one tick of a job: `sh -c <command>` in its own process group.
//!
//! The child's environment is the node's without its secrets ([`ChildEnv`], made once per
//! node), then the job's `env_file` (read at each run) and `env`, then the tick's identity in
//! `CRON_*` variables; it never inherits the node's environment as it is. Its output lines go
//! to the node's log in the run's span; a timeout or a forced shutdown kills the whole process
//! group, so nothing the command started outlives it.
//!
//! - `arrival`: how a run came to this node, and what differs by it.
//! - `attempt`: one attempt, in named steps: the env_file, the spawn behind the lease gate,
//!   the wait, the record.
//! - `child`: the command as a process and its group: spawn, signals, waits.
//! - `output`: the child's first line (the gate's) and its output lines forwarded to the log.

mod arrival;
mod attempt;
mod child;
mod output;
pub mod slot;

pub use arrival::{Arrival, BackfillClaim, NotStarted};

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::coord::groups::{Groups, Slot};
use crate::coord::starts::{StartTicket, Starts};
use crate::rules::config::{Job, MAX_RETRY_BACKOFF};
use crate::rules::protocol::elsewhere::ClaimedTick;
use crate::rules::record::{Going, Outcome, RunRecord, Trigger};
use crate::secrets::ChildEnv;

/// Longer output lines are cut, so a job printing without newlines cannot grow the node's memory.
pub const MAX_LINE: usize = 8 * 1024;

/// One tick to run.
#[derive(Debug, Clone)]
pub struct Tick {
    pub job: Arc<Job>,
    pub scheduled_at: DateTime<Utc>,
    /// `CRON_FENCE`: the revision of the claim that won the tick.
    pub fence: i64,
    /// `CRON_TERM`: the term of the shard leadership that claimed it (its leader key's create
    /// revision).
    pub term: i64,
    pub node: String,
    /// What the leadership that claimed this tick owes: the tick starts only through it, and
    /// no retry starts once the leadership ended or its lease may have expired.
    pub starts: Arc<Starts>,
    /// How the run came: a tick of the schedule (on time, caught up, redelivered), a request
    /// by hand, or a backfill.
    pub arrival: Arrival,
    /// Runs of the job going on other nodes as its record lists them, not seen ended: a tick
    /// of an `overlap = "skip"` or `"replace"` job waits for them (or skips, or has them
    /// stopped) before it starts.
    pub elsewhere: Vec<Going>,
    /// Ticks of the job other leaderships had claimed and not written as started when the
    /// record its claim read was written (a manual run's too: the claims its listing's write
    /// shows since are waited for only briefly, in `running/runs/elsewhere.rs`): their runs may
    /// have started unlisted (another shard count's leader, while a change of `shards` rolls).
    /// A tick waits for their leader's next write, then for the runs it lists, as for
    /// [`Tick::elsewhere`].
    pub claimed_elsewhere: Vec<ClaimedTick>,
}

impl Tick {
    /// `CRON_TRIGGER`: a tick of the schedule, a run asked for by `shardcron trigger`, or a past
    /// tick run again by `shardcron backfill`.
    pub fn trigger(&self) -> Trigger {
        self.arrival.trigger()
    }

    /// When the tick counts as due, for pauses and a concurrency group's line and wait.
    pub fn due_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.arrival.due_at(self.scheduled_at, now)
    }

    /// The tick, or a requested run's request time to the millisecond.
    pub fn scheduled_at_text(&self) -> String {
        self.trigger().tick_shown(self.scheduled_at)
    }
}

/// Why a running command is stopped from outside.
pub struct Stops<'a> {
    /// The shutdown grace is over: SIGKILL at once.
    pub kill: &'a CancellationToken,
    /// A newer tick replaces this run (`overlap = "replace"`): SIGTERM, SIGKILL after
    /// `kill_grace`.
    pub replace: &'a CancellationToken,
    /// The lease the attempt's group slot, or its listing as going, is on is lost: the slot may
    /// be another's, or another node may start the job's next tick: SIGKILL at once.
    pub lapsed: &'a CancellationToken,
}

/// What a run needs of the job's concurrency group: the slot its first attempt took, and the
/// node's groups, where each retry takes one again.
pub struct Slots<'a> {
    pub first: Option<Slot>,
    pub groups: &'a Arc<Groups>,
}

/// Runs `tick` to completion, retrying a failed attempt as the job allows while this node still
/// leads the shard, and says how the last attempt ended; `None` when the first attempt could
/// not start because the leadership or its lease ended since `ticket` was given. An attempt of
/// a grouped job holds a slot of its group from its start to the end of its process group: a
/// retry's backoff holds none.
pub async fn run(
    tick: &Tick,
    stops: &Stops<'_>,
    mut ticket: Option<StartTicket>,
    child_env: &ChildEnv,
    mut slots: Slots<'_>,
) -> Option<RunRecord> {
    let job = &tick.job;
    let mut attempt = 1;
    let mut backoff = Backoff::new(job.retry_backoff, MAX_RETRY_BACKOFF);
    let mut last = None;
    loop {
        // Inside the run's span (job, tick, fence): the attempt's number is a span of its own,
        // since a span's fields cannot be replaced, only added to.
        let span = tracing::error_span!("attempt", attempt);
        let mut slot = slots.first.take();
        if let (Some(group), None) = (&job.group, &slot) {
            match slot::take(tick, group, slots.groups, stops, std::future::pending()).await {
                Ok(taken) => slot = Some(taken),
                Err(why) => {
                    span.in_scope(|| tracing::warn!(group = %group.name, limit = group.limit, reason = ?why, "no retry: no slot of the job's group came free in time"));
                    return last;
                }
            }
        }
        let lapsed = slot.as_ref().map_or_else(|| stops.lapsed.clone(), Slot::lapsed);
        let attempt_stops = Stops {
            lapsed: &lapsed,
            ..*stops
        };
        let run_once = attempt::run_once(tick, attempt, &attempt_stops, ticket.take(), child_env);
        let ran = run_once.instrument(span.clone()).await;
        if let Some(slot) = slot {
            slot.release().await;
        }
        let Some(mut record) = ran else {
            if attempt > 1 {
                span.in_scope(|| {
                    tracing::warn!(
                        "this node no longer leads the shard, or its lease may have expired: no more retries"
                    )
                });
            }
            return last;
        };
        record.attempts = attempt;
        let retryable = match record.outcome {
            Outcome::Exited => record.exit_code != Some(0),
            Outcome::Timeout | Outcome::SpawnFailed => true,
            Outcome::Killed
            | Outcome::Replaced
            | Outcome::Skipped
            | Outcome::Lost
            | Outcome::Paused
            | Outcome::GroupFull => false,
        };
        if !retryable || attempt > job.retries {
            return Some(record);
        }
        let delay = backoff.next_delay();
        span.in_scope(|| tracing::warn!(retries = job.retries, retry_in = ?delay, "attempt failed; retrying"));
        crate::metrics::get()
            .retries
            .get_or_create(&crate::metrics::JobLabel::new(job.job_name()))
            .inc();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = tick.starts.leading().cancelled() => {}
            _ = stops.kill.cancelled() => return Some(record),
            _ = stops.replace.cancelled() => return Some(record),
        }
        last = Some(record);
        attempt += 1;
    }
}

/// The span a tick's log lines carry, from its turn to its record: every line of the run says
/// which job, tick and fence it is about without repeating them. At error level so that it is
/// enabled whenever any of the run's lines is, whatever level the log is filtered at.
pub(crate) fn span(tick: &Tick) -> tracing::Span {
    tracing::error_span!("run", job = %tick.job.name, tick = %tick.scheduled_at_text(), fence = tick.fence)
}
