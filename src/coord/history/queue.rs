//! Runs on their way to etcd's history: queued until a write carries them, their output bounded
//! while etcd is out of reach, and cut into transactions etcd takes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::rules::config::Job;
use crate::rules::record::{RunRecord, Trigger};

/// Three operations per entry at most: its put, its output's put and a trim.
pub const OPS_PER_ENTRY: usize = 3;

/// At most this many bytes of entries go in one transaction, unless one entry alone is more:
/// etcd refuses a request past its `--max-request-bytes` (1.5 MiB by default), and an entry
/// with two full output tails of bytes JSON escapes (up to 6 bytes each) is about 768 KiB.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;

/// At most this many bytes of output wait in the queue: while etcd is out of reach the oldest
/// waiting runs lose their output (their records stay), so a node's memory stays bounded.
pub(super) const MAX_QUEUED_OUTPUT: usize = 32 * 1024 * 1024;

/// One run on its way to the job's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub job: String,
    pub shard: u32,
    pub record: RunRecord,
    /// The oldest tick the job's history keeps once this entry is in; `None` keeps all.
    pub keep_from: Option<DateTime<Utc>>,
    pub(super) since: Instant,
    /// Its record's size in etcd.
    pub(super) bytes: usize,
}

/// Bytes of output a record holds.
pub(super) fn output_bytes(record: &RunRecord) -> usize {
    record
        .output
        .as_ref()
        .map_or(0, |output| output.stdout.len() + output.stderr.len())
}

/// Runs not yet in etcd's history, and each job's last trim horizon.
#[derive(Debug, Default)]
pub struct HistoryQueue {
    /// How many runs per job the history keeps; 0 turns it off.
    keep: u32,
    entries: Mutex<Vec<HistoryEntry>>,
    /// Bytes of output the entries hold; changed only with `entries` locked.
    pub(super) queued_output: AtomicUsize,
    /// The newest tick seen per job and the oldest tick kept with it: the next tick's horizon is
    /// one schedule step on, instead of a walk of `keep` steps back.
    horizons: Mutex<HashMap<String, Horizon>>,
}

/// A job's newest tick seen, and the oldest tick its history keeps with it.
type Horizon = (DateTime<Utc>, DateTime<Utc>);

impl HistoryQueue {
    pub fn new(keep: u32) -> HistoryQueue {
        HistoryQueue {
            keep,
            ..HistoryQueue::default()
        }
    }

    pub fn push(&self, job: &Job, record: &RunRecord) {
        let Some(entry) = self.entry(job, record) else {
            return;
        };
        let mut entries = lock(&self.entries);
        let mut queued = self.queued_output.load(Ordering::Relaxed) + output_bytes(&entry.record);
        entries.push(entry);
        let mut dropped = 0;
        for entry in entries.iter_mut() {
            if queued <= MAX_QUEUED_OUTPUT {
                break;
            }
            if entry.record.output.is_some() {
                queued -= output_bytes(&entry.record);
                entry.record.output = None;
                entry.bytes = entry_bytes(&entry.record);
                dropped += 1;
            }
        }
        self.queued_output.store(queued, Ordering::Relaxed);
        if dropped == 0 {
            return;
        }
        tracing::warn!(
            dropped,
            waiting = entries.len(),
            "too much run output waits for etcd: the oldest waiting runs keep their records but not their output"
        );
    }

    /// The entry `record` makes in `job`'s history; `None` when histories are off.
    pub fn entry(&self, job: &Job, record: &RunRecord) -> Option<HistoryEntry> {
        if self.keep == 0 {
            return None;
        }
        // Backfill runs keep their own last `keep` ticks; their old ticks would throw the live
        // horizon's one-step cache back to a walk.
        let keep_from = match record.trigger {
            Trigger::Backfill => job
                .schedule
                .nth_newest_at_or_before(record.scheduled_at, self.keep as usize),
            _ => self.horizon(job, record.scheduled_at),
        };
        Some(HistoryEntry {
            job: job.name.clone(),
            shard: job.shard,
            record: record.clone(),
            keep_from,
            since: Instant::now(),
            bytes: entry_bytes(record),
        })
    }

    /// The oldest tick to keep when `tick` is the newest: the `keep`-th newest tick at or before
    /// it.
    pub(super) fn horizon(&self, job: &Job, tick: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut horizons = lock(&self.horizons);
        let stepped = horizons.get(&job.name).and_then(|(newest, kept)| {
            if *newest == tick {
                Some(*kept)
            } else if job.schedule.next_after(*newest) == Some(tick) {
                job.schedule.next_after(*kept)
            } else {
                None
            }
        });
        let kept = match stepped {
            Some(kept) => kept,
            None => job.schedule.nth_newest_at_or_before(tick, self.keep as usize)?,
        };
        horizons.insert(job.name.clone(), (tick, kept));
        Some(kept)
    }

    /// Takes at most `max` entries of `shard`'s jobs, oldest first, of at most
    /// [`MAX_TXN_BYTES`] together, for a claim to carry; put them back with
    /// [`HistoryQueue::put_back`] if it did not land.
    pub fn take_for(&self, shard: u32, max: usize) -> Vec<HistoryEntry> {
        let mut entries = lock(&self.entries);
        let mut taken = Vec::new();
        let mut bytes = 0;
        entries.retain(|entry| {
            let fits = taken.is_empty() || bytes + entry.bytes <= MAX_TXN_BYTES;
            if taken.len() < max && entry.shard == shard && fits {
                bytes += entry.bytes;
                self.queued_output
                    .fetch_sub(output_bytes(&entry.record), Ordering::Relaxed);
                taken.push(entry.clone());
                false
            } else {
                true
            }
        });
        taken
    }

    pub fn put_back(&self, entries: Vec<HistoryEntry>) {
        let mut queued = lock(&self.entries);
        let bytes: usize = entries.iter().map(|entry| output_bytes(&entry.record)).sum();
        self.queued_output.fetch_add(bytes, Ordering::Relaxed);
        queued.extend(entries);
    }

    /// How many runs wait to be written.
    pub fn waiting(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn oldest(&self) -> Option<Instant> {
        lock(&self.entries).iter().map(|entry| entry.since).min()
    }

    pub fn take_older_than(&self, age: Duration) -> Vec<HistoryEntry> {
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        let (due, waiting) = std::mem::take(&mut *entries)
            .into_iter()
            .partition(|entry| now.saturating_duration_since(entry.since) >= age);
        *entries = waiting;
        let bytes: usize = due.iter().map(|entry| output_bytes(&entry.record)).sum();
        self.queued_output.fetch_sub(bytes, Ordering::Relaxed);
        due
    }
}

/// A record's size as etcd stores it, its key aside.
fn entry_bytes(record: &RunRecord) -> usize {
    serde_json::to_vec(record).map_or(0, |value| value.len())
}

/// `entries` in transactions etcd takes: at most as many operations as one allows, and at most
/// [`MAX_TXN_BYTES`] (or a single entry).
pub(super) fn batches(entries: &[HistoryEntry]) -> Vec<&[HistoryEntry]> {
    let max_entries = (crate::coord::etcd::ops_per_txn() / OPS_PER_ENTRY).max(1);
    let mut batches = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (index, entry) in entries.iter().enumerate() {
        let full = index - start == max_entries || (index > start && bytes + entry.bytes > MAX_TXN_BYTES);
        if full {
            batches.push(&entries[start..index]);
            (start, bytes) = (index, 0);
        }
        bytes += entry.bytes;
    }
    if start < entries.len() {
        batches.push(&entries[start..]);
    }
    batches
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
