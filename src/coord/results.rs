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

use crate::coord::etcd::CoordError;
use crate::coord::history::{self, HistoryQueue};
use crate::coord::keys::Keys;
use crate::coord::ledger;
use crate::coord::triggers;
use crate::rules::config::Job;
use crate::rules::record::RunRecord;

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
    /// A claim is carrying this job's result (this one or an older one) right now: nothing else
    /// may write the job's result until that claim settles, or an older result could land last.
    riding: bool,
    /// A success that `record`, a newer failure, replaced before it was written: it is still
    /// the job's last success, written with `record`.
    success: Option<RunRecord>,
}

impl Pending {
    /// The older success written with this result, if `record` did not succeed.
    pub fn unwritten_success(&self) -> Option<&RunRecord> {
        self.success.as_ref()
    }
}

/// The newest unwritten result of each job, and every run on its way to the history.
#[derive(Default)]
pub struct ResultQueue {
    pending: Mutex<HashMap<String, Pending>>,
    pub history: HistoryQueue,
    /// How runs asked for by hand ended, by request id, for the commands that wait for them:
    /// written at once, not left to ride.
    answers: Mutex<Vec<(String, RunRecord)>>,
    arrived: Notify,
}

/// After a failed write of leftovers, the pause before the next try.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// At most how many answers to runs asked for by hand wait for a write that failed.
const MAX_UNANSWERED: usize = 10_000;

impl ResultQueue {
    /// A queue whose runs also go to their jobs' histories, `keep` runs per job.
    pub fn new(keep: u32) -> ResultQueue {
        ResultQueue {
            history: HistoryQueue::new(keep),
            ..ResultQueue::default()
        }
    }

    /// How the run asked for by `request` ended.
    pub fn answer(&self, request: &str, record: RunRecord) {
        let record = RunRecord { output: None, ..record };
        self.answers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push((request.to_string(), record));
        self.arrived.notify_one();
    }

    fn take_answers(&self) -> Vec<(String, RunRecord)> {
        std::mem::take(&mut *self.answers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// Keeps answers whose write failed for the next try, at most [`MAX_UNANSWERED`] (the
    /// newest): each stands for a command still waiting, and an asker gone meanwhile took its
    /// answer key with it, which ends the answer's tries.
    fn put_back_answers(&self, failed: Vec<(String, RunRecord)>) {
        let mut answers = self.answers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let arrived_since = std::mem::take(&mut *answers);
        answers.extend(failed);
        answers.extend(arrived_since);
        let over = answers.len().saturating_sub(MAX_UNANSWERED);
        if over > 0 {
            tracing::warn!(
                dropped = over,
                "too many runs asked for by hand wait to be answered: the oldest commands waiting get no answer"
            );
            answers.drain(..over);
        }
    }

    /// A finished (or settled) run of `job`: its result and its entry in the job's history.
    pub fn push_run(&self, job: &Job, record: RunRecord) {
        self.history.push(job, &record);
        // The output stays in the history entry: the result is read for every job at once.
        let record = RunRecord { output: None, ..record };
        self.push(&job.name, job.shard, record);
    }

    /// Writes each job's `records` (none a success) to etcd at once, its result and its
    /// history, instead of riding a later write. Ticks recorded lost are written before the
    /// claim that drops them from the job's record: a leader that dies in between leaves them
    /// listed, and the next records them again under the same keys, never a tick gone without a
    /// record.
    pub async fn write_now(
        &self,
        client: &etcd_client::Client,
        keys: &Keys,
        lost: &[(&Job, &[RunRecord])],
    ) -> Result<(), CoordError> {
        let newest: Vec<(String, RunRecord, Option<RunRecord>)> = lost
            .iter()
            .filter_map(|(job, records)| {
                let newest = records.iter().max_by_key(|record| record.scheduled_at)?;
                Some((job.name.clone(), newest.clone(), None))
            })
            .collect();
        ledger::record_runs(client, keys, &newest).await?;
        let entries: Vec<history::HistoryEntry> = lost
            .iter()
            .flat_map(|(job, records)| records.iter().filter_map(|record| self.history.entry(job, record)))
            .collect();
        history::write(client, keys, &entries).await
    }

    pub fn push(&self, job: &str, shard: u32, record: RunRecord) {
        let mut pending = self.lock();
        let since = Instant::now();
        match pending.get_mut(job) {
            Some(held) if held.record.scheduled_at > record.scheduled_at => {}
            // The slot keeps its age and its riding mark: a job whose runs finish faster than
            // its shard claims is still written within the window, and never under a claim.
            Some(held) => {
                if record.succeeded() {
                    held.success = None;
                } else if held.record.succeeded() {
                    held.success = Some(held.record.clone());
                }
                held.record = record;
            }
            None => {
                pending.insert(
                    job.to_string(),
                    Pending {
                        job: job.to_string(),
                        shard,
                        record,
                        since,
                        riding: false,
                        success: None,
                    },
                );
            }
        }
        drop(pending);
        self.arrived.notify_one();
    }

    /// Marks pending results of `shard`'s jobs as riding, as many as fit in `max_ops`
    /// transaction operations (see [`ledger::result_op_count`]), and returns copies, for a claim
    /// to carry; [`ResultQueue::settle`] says how it went.
    pub fn take_for(&self, shard: u32, max_ops: usize) -> Vec<Pending> {
        let mut pending = self.lock();
        let mut room = max_ops;
        let mut riders = Vec::new();
        for entry in pending.values_mut() {
            if room == 0 {
                break;
            }
            let ops = ledger::result_op_count(&entry.record, entry.success.as_ref());
            if entry.shard != shard || entry.riding || ops > room {
                continue;
            }
            room -= ops;
            entry.riding = true;
            riders.push(entry.clone());
        }
        riders
    }

    /// After the claim that carried `riders`: a written result leaves the queue unless a newer
    /// one of its job came meanwhile; anything left is free to be written again.
    pub fn settle(&self, riders: Vec<Pending>, written: bool) {
        if riders.is_empty() {
            return;
        }
        let mut pending = self.lock();
        for rider in riders {
            let Some(held) = pending.get_mut(&rider.job) else {
                continue;
            };
            if written && held.record == rider.record {
                pending.remove(&rider.job);
            } else {
                held.riding = false;
                if written && held.success.as_ref() == ledger::last_success(&rider.record, rider.success.as_ref()) {
                    held.success = None;
                }
                if written {
                    // A newer result came while the claim carried the older one: it has not
                    // waited for a claim yet, so its window starts now rather than being
                    // written on its own at once.
                    held.since = Instant::now();
                }
            }
        }
        drop(pending);
        self.arrived.notify_one();
    }

    /// When the oldest result (or history entry) that no claim carries began to wait.
    fn oldest(&self) -> Option<Instant> {
        let result = self
            .lock()
            .values()
            .filter(|entry| !entry.riding)
            .map(|entry| entry.since)
            .min();
        match (result, self.history.oldest()) {
            (Some(result), Some(entry)) => Some(result.min(entry)),
            (result, entry) => result.or(entry),
        }
    }

    /// Takes the results no claim carries that have waited at least `age`.
    fn take_older_than(&self, age: Duration) -> Vec<Pending> {
        let now = Instant::now();
        let mut pending = self.lock();
        let due: Vec<String> = pending
            .values()
            .filter(|entry| !entry.riding && now.saturating_duration_since(entry.since) >= age)
            .map(|entry| entry.job.clone())
            .collect();
        due.iter().filter_map(|job| pending.remove(job)).collect()
    }

    /// Returns results whose write failed; a newer result of the same job wins.
    fn put_back(&self, results: Vec<Pending>) {
        let mut pending = self.lock();
        for entry in results {
            match pending.get_mut(&entry.job) {
                Some(held) if held.record.scheduled_at >= entry.record.scheduled_at => {
                    // The newer result keeps the older one's unwritten success.
                    if held.success.is_none() && !held.record.succeeded() {
                        held.success = ledger::last_success(&entry.record, entry.success.as_ref()).cloned();
                    }
                }
                _ => {
                    pending.insert(entry.job.clone(), entry);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Writes each result that no claim carried once it has waited [`RIDE_WINDOW`]; once `closed`,
/// writes the rest (one try) and ends. A failed write keeps the results for the next try.
pub async fn write_leftovers(
    queue: std::sync::Arc<ResultQueue>,
    client: etcd_client::Client,
    keys: Keys,
    closed: CancellationToken,
) {
    loop {
        let metrics = crate::metrics::get();
        metrics.results_unwritten.set(queue.lock().len() as i64);
        metrics.history_unwritten.set(queue.history.waiting() as i64);
        // A command waits for its answer (`trigger --wait`): one failed write must not leave
        // it waiting for ever.
        let mut unanswered = Vec::new();
        let answers = queue.take_answers();
        if !answers.is_empty() {
            // Read your writes: the runs waiting to ride a claim (the answered ones among them)
            // are written first, so a command told how its run ended reads it at once in
            // `history` and `status`. The answers go whatever these writes did: a command waits
            // for its answer, not for the history.
            write_results(&queue, &client, &keys, Duration::ZERO).await;
            write_history(&queue, &client, &keys, Duration::ZERO).await;
        }
        for (request, record) in answers {
            if let Err(err) = triggers::answer(&client, &keys, &request, &record).await {
                if let Some(left_out) = crate::repeats::log_now("answer failed") {
                    tracing::warn!(error = %err, request, left_out, "could not tell the command that asked for a run how it ended yet; trying again (left_out: lines like this one not logged since the last)");
                }
                unanswered.push((request, record));
            }
        }
        let answers_wait = !unanswered.is_empty();
        queue.put_back_answers(unanswered);
        let retry_answers = async {
            if answers_wait && !closed.is_cancelled() {
                tokio::time::sleep(RETRY_PAUSE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        match queue.oldest() {
            Some(since) => tokio::select! {
                _ = tokio::time::sleep_until((since + RIDE_WINDOW).into()) => {}
                _ = queue.arrived.notified() => continue,
                _ = retry_answers => continue,
                _ = closed.cancelled() => {}
            },
            None => tokio::select! {
                _ = queue.arrived.notified() => continue,
                _ = retry_answers => continue,
                _ = closed.cancelled() => {}
            },
        }
        let closing = closed.is_cancelled();
        let age = if closing { Duration::ZERO } else { RIDE_WINDOW };
        // Both, whatever the first did: the history does not wait for the results.
        let results_written = write_results(&queue, &client, &keys, age).await;
        let history_written = write_history(&queue, &client, &keys, age).await;
        let failed = !(results_written && history_written);
        if failed && !closing {
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PAUSE) => {}
                _ = closed.cancelled() => {}
            }
        }
        if closing {
            return;
        }
    }
}

/// Writes the results older than `age`; false if etcd did not take them (they wait for the
/// next try).
async fn write_results(queue: &ResultQueue, client: &etcd_client::Client, keys: &Keys, age: Duration) -> bool {
    let batch = queue.take_older_than(age);
    if batch.is_empty() {
        return true;
    }
    let records: Vec<(String, RunRecord, Option<RunRecord>)> = batch
        .iter()
        .map(|entry| (entry.job.clone(), entry.record.clone(), entry.success.clone()))
        .collect();
    let Err(err) = ledger::record_runs(client, keys, &records).await else {
        return true;
    };
    if err.is_nospace() {
        tracing::debug!(error = %err, runs = records.len(), "etcd is out of space: run results wait to be recorded");
    } else {
        tracing::warn!(error = %err, runs = records.len(), "could not record run results in etcd (the runs themselves happened and were logged); will retry");
    }
    queue.put_back(batch);
    false
}

/// Adds the runs older than `age` to their jobs' history; false if etcd did not take them.
async fn write_history(queue: &ResultQueue, client: &etcd_client::Client, keys: &Keys, age: Duration) -> bool {
    let entries = queue.history.take_older_than(age);
    if entries.is_empty() {
        return true;
    }
    let Err(err) = history::write(client, keys, &entries).await else {
        return true;
    };
    if err.is_nospace() {
        tracing::debug!(error = %err, runs = entries.len(), "etcd is out of space: runs wait to be added to their jobs' history");
    } else {
        tracing::warn!(error = %err, runs = entries.len(), "could not add runs to their jobs' history in etcd; will retry");
    }
    queue.history.put_back(entries);
    false
}

#[cfg(test)]
mod tests;
