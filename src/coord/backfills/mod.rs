//! A job's backfill in etcd (`/backfills/<job>`, a [`Backfill`]): asked for once, while no
//! other one of the job is going; each tick claimed by the leader of the job's shard in a
//! transaction guarded by its leadership and the record's revision, whose revision is the run's
//! fence; counted done, or given back, by the node that ran it; cancelled by a read-modify-write
//! that keeps the claims written before it. Every node mirrors the records: the leaders learn of
//! work, and each node gives back the ticks an earlier run of it claimed and never counted.

mod give_back;
mod mirror;
mod record;
mod settle;

pub(crate) use give_back::GiveBackUnheld;
pub(crate) use mirror::Backfills;
pub(crate) use record::{ask, cancel, claim, read, read_all, update, Asked, Claimed};
pub(crate) use settle::{settle_orphans, settle_tick, Settle};

#[cfg(test)]
mod tests;
