//! Finished runs' records on their way to etcd.
//!
//! Most of them ride in their shard's next claim transaction, which etcd commits anyway; what
//! no claim picks up within [`RIDE_WINDOW`] is written on its own. So a leader that fires every
//! second costs one etcd write per shard per instant, results included, and a job that fires
//! rarely still has its result recorded within a couple of seconds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::keys::Keys;
use crate::ledger::{self, RunRecord};

/// How long a result waits for a claim of its shard to carry it.
pub const RIDE_WINDOW: Duration = Duration::from_millis(1500);

/// A result waiting to be written.
#[derive(Debug, Clone)]
pub struct Pending {
    pub job: String,
    pub shard: u32,
    pub record: RunRecord,
    /// When it first waited: it is written on its own [`RIDE_WINDOW`] after this.
    since: Instant,
}

/// The newest unwritten result of each job.
#[derive(Default)]
pub struct ResultQueue {
    pending: Mutex<HashMap<String, Pending>>,
    arrived: Notify,
}

impl ResultQueue {
    pub fn push(&self, job: &str, shard: u32, record: RunRecord) {
        self.insert_newest(Pending {
            job: job.to_string(),
            shard,
            record,
            since: Instant::now(),
        });
        self.arrived.notify_one();
    }

    /// Takes at most `max` pending results of `shard`'s jobs, for a claim to carry.
    pub fn take_for(&self, shard: u32, max: usize) -> Vec<Pending> {
        let mut pending = self.lock();
        let jobs: Vec<String> = pending
            .values()
            .filter(|entry| entry.shard == shard)
            .map(|entry| entry.job.clone())
            .take(max)
            .collect();
        jobs.iter().filter_map(|job| pending.remove(job)).collect()
    }

    /// Returns results a failed claim could not write; a newer result of the same job wins.
    pub fn put_back(&self, results: Vec<Pending>) {
        if results.is_empty() {
            return;
        }
        for entry in results {
            self.insert_newest(entry);
        }
        self.arrived.notify_one();
    }

    fn insert_newest(&self, entry: Pending) {
        let mut pending = self.lock();
        match pending.get_mut(&entry.job) {
            Some(held) if held.record.scheduled_at > entry.record.scheduled_at => {}
            Some(held) => {
                // The job's slot keeps waiting since its first result, so a job that finishes
                // runs faster than its shard claims still gets written within the window.
                let since = held.since.min(entry.since);
                *held = Pending { since, ..entry };
            }
            None => {
                pending.insert(entry.job.clone(), entry);
            }
        }
    }

    fn oldest(&self) -> Option<Instant> {
        self.lock().values().map(|entry| entry.since).min()
    }

    /// Takes the results that have waited at least `age`.
    fn take_older_than(&self, age: Duration) -> Vec<(String, RunRecord)> {
        let now = Instant::now();
        let mut pending = self.lock();
        let due: Vec<String> = pending
            .values()
            .filter(|entry| now.saturating_duration_since(entry.since) >= age)
            .map(|entry| entry.job.clone())
            .collect();
        due.iter()
            .filter_map(|job| pending.remove(job))
            .map(|entry| (entry.job, entry.record))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Writes each result that no claim carried once it has waited [`RIDE_WINDOW`]; once `closed`,
/// writes the rest and ends.
pub async fn write_leftovers(
    queue: std::sync::Arc<ResultQueue>,
    client: etcd_client::Client,
    keys: Keys,
    closed: CancellationToken,
) {
    loop {
        match queue.oldest() {
            Some(since) => tokio::select! {
                _ = tokio::time::sleep_until((since + RIDE_WINDOW).into()) => {}
                _ = closed.cancelled() => {}
            },
            None => tokio::select! {
                _ = queue.arrived.notified() => continue,
                _ = closed.cancelled() => {}
            },
        }
        let closing = closed.is_cancelled();
        let batch = queue.take_older_than(if closing { Duration::ZERO } else { RIDE_WINDOW });
        if !batch.is_empty() {
            if let Err(err) = ledger::record_runs(&client, &keys, &batch).await {
                tracing::warn!(error = %err, runs = batch.len(), "could not record run results in etcd (the runs themselves happened and were logged)");
            }
        }
        if closing {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};

    fn record(second: i64) -> RunRecord {
        let at = DateTime::<Utc>::from_timestamp(second, 0).unwrap();
        RunRecord {
            scheduled_at: at,
            fence: 1,
            node: "n".into(),
            outcome: "exited".into(),
            exit_code: Some(0),
            duration_ms: 1,
            finished_at: at,
            attempts: 1,
        }
    }

    #[test]
    fn claims_take_their_shards_results_and_the_newest_wins() {
        let queue = ResultQueue::default();
        queue.push("a", 0, record(10));
        queue.push("a", 0, record(9));
        queue.push("b", 1, record(10));
        queue.push("c", 0, record(11));
        let mut taken = queue.take_for(0, 10);
        taken.sort_by(|x, y| x.job.cmp(&y.job));
        assert_eq!(taken.len(), 2);
        assert_eq!(
            (taken[0].job.as_str(), taken[0].record.scheduled_at.timestamp()),
            ("a", 10)
        );
        assert!(queue.take_for(0, 10).is_empty());
        queue.put_back(taken);
        queue.push("a", 0, record(12));
        assert!(
            queue.take_older_than(RIDE_WINDOW).is_empty(),
            "nothing has waited the window yet"
        );
        let all = queue.take_older_than(Duration::ZERO);
        let newest_a = all
            .iter()
            .find(|(job, _)| job == "a")
            .map(|(_, r)| r.scheduled_at.timestamp());
        assert_eq!((all.len(), newest_a), (3, Some(12)));
        assert_eq!(queue.take_for(1, 0).len(), 0, "a claim with no room takes nothing");
    }
}
