//! Each job's last runs in etcd, for `shardcron history`.
//!
//! A finished run's record is also put under `/shardcron/<cluster>/runs/<job>/<tick>`, and the
//! same transaction deletes the job's runs older than its `[cluster] history`-th newest tick.
//! Both operations ride the writes that carry results anyway (a claim of the job's shard, or
//! the write of results no claim carried), so history costs operations inside transactions
//! etcd commits regardless, not a write per run. Trimming by the schedule needs no read: the
//! oldest tick to keep follows from the schedule alone.
//!
//! Where each run and its output live, and why that is safe across releases: `layout`.

mod layout;
mod queue;
mod read;
mod render;
mod write;

pub(crate) use layout::key_of;
pub use queue::{HistoryEntry, HistoryQueue, MAX_TXN_BYTES, OPS_PER_ENTRY};
pub use read::{read, read_each, read_run, READ_LIMIT};
pub use render::{render, render_with_output};
pub use write::{ops, write};

#[cfg(test)]
mod tests;
