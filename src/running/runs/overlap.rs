//! The overlap rules of `overlap = "skip"`: which running run a tick meets, when it overlaps
//! the tick for certain, and when a waiting tick is outrun by its own next one. Pure: the
//! clock's reading is passed in.

use chrono::{DateTime, Utc};

use crate::rules::config::{Job, Overlap};

/// Why an `overlap = "skip"` tick is not run.
#[derive(Clone)]
pub(super) enum Skip {
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
    /// The run of another node that its record lists as going overlapped the tick.
    Elsewhere { node: String, previous_tick: DateTime<Utc> },
}

/// A run that is going: when it started, by the wall clock, and the tick it runs.
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Running {
    pub(super) since: DateTime<Utc>,
    pub(super) tick: DateTime<Utc>,
    /// A missed tick run by a new leader: part of a backlog, however soon it started.
    pub(super) caught_up: bool,
    /// Its `CRON_FENCE`.
    pub(super) fence: i64,
}

/// Whether the run going may overlap the tick at `scheduled_at`: it runs a live tick (not a
/// missed one a new leader caught up, which never makes a live tick skip) and started no later
/// than this tick.
pub(super) fn may_overlap(running: Running, scheduled_at: DateTime<Utc>) -> bool {
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
pub(super) fn overlaps(running: Running, scheduled_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    may_overlap(running, scheduled_at) && now - running.since >= scheduled_at - running.tick
}

/// Whether a live tick of an `overlap = "skip"` job, which waited for its turn behind a backlog
/// whose last run took `last_took`, is outrun by its own next tick at `now`: it is skipped so the
/// backlog drains. Were it run, every tick behind runs longer than the period would queue and
/// start later than the one before, without end. Behind shorter runs (ticks only delayed
/// together, by an etcd election or a lease renewal) the backlog drains by itself, and every
/// tick runs. Missed ticks a new leader catches up always run.
pub(super) fn outrun(
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
