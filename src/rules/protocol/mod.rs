//! The claim protocol's decisions, as pure functions of what a leader knows: the node's async
//! code carries them out against etcd, and the model checker (`model`, in tests) drives the same
//! functions against an abstract etcd over every interleaving it can reach.
//!
//! - [`write`]: what a leader asks of a job's record ([`Want`]) and the record it writes for it
//!   ([`next_record`]): what the writer owes, and every other leader's debt under its name.
//! - [`guards`]: what a claim transaction compares before it writes.
//! - [`outcome`]: settling a write that was rejected or whose reply was lost, from the records
//!   read again ([`after_reread`]).
//! - [`takeover`]: what a new leader claims for a job ([`takeover::plan`]): the debts it settles, each tick
//!   run again or recorded lost, and the ticks missed while the shard had no leader.
//! - [`owed`]: the ticks a leadership owes, each with the fence it starts with.
//! - [`elsewhere`]: whether a run another node's record lists as going has ended, goes on past
//!   a tick, or cannot be told yet (`overlap = "skip"` and `"replace"` across nodes).
//!
//! The properties the model checks in every state it reaches are in
//! `docs/how-it-works.md#what-the-model-checker-proves`.

pub(crate) mod elsewhere;
pub(crate) mod outcome;
pub(crate) mod owed;
pub(crate) mod takeover;
pub(crate) mod write;

#[cfg(test)]
mod going_model;
#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

pub use outcome::ReadRecord;
pub(crate) use outcome::{after_reread, Reread};
pub(crate) use owed::Owed;
pub(crate) use write::{going_after, next_record, Owner, Want, Won, Writer, MAX_GOING};

/// The election families (shard counts, and pools with theirs) the fleet ran (`before`) that no
/// live member runs now (`now`): their leaders' pending ticks have no successor in their own
/// election, so every leader of a live family reads its records again (a new term of the same
/// leadership) and settles them.
pub(crate) fn counts_gone<T: Ord + Clone>(before: &BTreeSet<T>, now: &BTreeSet<T>) -> Vec<T> {
    before.difference(now).cloned().collect()
}

/// What a claim transaction finds before it writes; it writes only if every guard holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Guard {
    /// The leader key of the writer's election still has the create revision `term`: the writer
    /// still leads, so a deposed leader's write fails in etcd, not by luck of timing.
    Leads { term: i64 },
    /// The record of `job` is still at `revision` (0: none), so no tick is claimed over a write
    /// the writer has not read.
    RecordAt { job: String, revision: i64 },
}

/// The guards of a claim by the leader of `term` over records it read at `revisions` (each
/// job's name and its record's revision).
pub(crate) fn guards<'a>(term: i64, revisions: impl IntoIterator<Item = (&'a str, i64)>) -> Vec<Guard> {
    std::iter::once(Guard::Leads { term })
        .chain(revisions.into_iter().map(|(job, revision)| Guard::RecordAt {
            job: job.to_string(),
            revision,
        }))
        .collect()
}
