//! Backfill: every tick of a job's schedule in a past range run again, oldest first, through
//! the leader of the job's shard. What may be asked (a past range of at most `max` ticks), and
//! the record in etcd that the leaders serving it share: which ticks are claimed, which are
//! going on where, how many are done, which go again, and whether it was cancelled. Pure: the
//! caller passes the clock's reading and which nodes went.
//!
//! - `ask`: what an operator may ask, and the ticks it runs.
//! - `progress`: the record the leaders share while they run it.

mod ask;
mod progress;
#[cfg(test)]
mod tests;

pub use ask::{new_id, ticks, Ask, Refused, DEFAULT_MAX, MAX_PARALLEL, MAX_TICKS};
pub use progress::{Again, Backfill, InFlight, Next};
