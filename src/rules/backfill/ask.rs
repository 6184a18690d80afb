//! What an operator may ask of a backfill (a past range of at most `max` ticks, at most
//! `parallel` at once), and the ticks of the job's schedule it runs.

use chrono::{DateTime, Utc};

use crate::rules::config::Job;
use crate::rules::plan::{self, Fire};
use crate::rules::record::Trigger;

/// The most ticks one backfill runs unless `--max` says more.
pub const DEFAULT_MAX: usize = 1000;

/// The most `--max` may allow.
pub const MAX_TICKS: usize = 100_000;

/// The most backfill runs of a job at once (`--parallel`).
pub const MAX_PARALLEL: u32 = 64;

/// Why a backfill is refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("--from {} is not before --to {}", shown(.from), shown(.to))]
    EmptyRange { from: DateTime<Utc>, to: DateTime<Utc> },
    #[error("the range ends at {}, in the future (now {}): a backfill runs past ticks only; the schedule runs the rest", shown(.to), shown(.now))]
    InTheFuture { to: DateTime<Utc>, now: DateTime<Utc> },
    #[error(
        "the range holds more than {max} ticks of the job's schedule: narrow it, or raise --max (at most {MAX_TICKS})"
    )]
    TooMany { max: usize },
    #[error("the range holds no tick of the job's schedule")]
    NoTick,
    #[error("--max must be 1 to {MAX_TICKS}")]
    Max,
    #[error("--parallel must be 1 to {MAX_PARALLEL}")]
    Parallel,
}

/// An instant of a refusal as a backfill's ticks are shown (the rules may not import `clock`):
/// to the second, since the ticks a range holds are whole seconds.
fn shown(at: &DateTime<Utc>) -> String {
    Trigger::Backfill.tick_shown(*at)
}

/// What an operator asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub max: usize,
    pub parallel: u32,
}

/// The ticks of `job`'s schedule in `[from, to)`, oldest first, with their DST notes as `plan`
/// prints them; refused if the range is not wholly past at `now`, or holds none or too many.
pub fn ticks<'a>(job: &'a Job, ask: &Ask, now: DateTime<Utc>) -> Result<Vec<Fire<'a>>, Refused> {
    if !(1..=MAX_TICKS).contains(&ask.max) {
        return Err(Refused::Max);
    }
    if !(1..=MAX_PARALLEL).contains(&ask.parallel) {
        return Err(Refused::Parallel);
    }
    if ask.from >= ask.to {
        return Err(Refused::EmptyRange {
            from: ask.from,
            to: ask.to,
        });
    }
    if ask.to > now {
        return Err(Refused::InTheFuture { to: ask.to, now });
    }
    let (fires, cut) = plan::fires(&[job], ask.from, ask.to, ask.max);
    if cut {
        return Err(Refused::TooMany { max: ask.max });
    }
    if fires.is_empty() {
        return Err(Refused::NoTick);
    }
    Ok(fires)
}

/// A new backfill's id: what its runs count their ticks in, so that a run of a cancelled
/// backfill never counts in the next one.
pub fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
