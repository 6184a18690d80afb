//! Each job's last runs in etcd, for `shardcron history`.
//!
//! A finished run's record is also put under `/shardcron/<cluster>/runs/<job>/<tick>`, and the
//! same transaction deletes the job's runs older than its `[cluster] history`-th newest tick.
//! Both operations ride the writes that carry results anyway (a claim of the job's shard, or
//! the write of results no claim carried), so history costs operations inside transactions
//! etcd commits regardless, not a write per run. Trimming by the schedule needs no read: the
//! oldest tick to keep follows from the schedule alone.
//!
//! # Layout under `runs/<job>/`
//!
//! - `<tick>` (12 digits, seconds) a scheduled run, `<tick>.<ms>-manual` one asked for by hand:
//!   the live history, trimmed to the job's last `history` ticks.
//! - `+backfill/<tick>`: backfill runs, trimmed on their own to the last `history` ticks of the
//!   schedule up to the newest backfill tick written. They sort before every live key (`+`
//!   before `-` and the digits), outside the live trim's range `[-, horizon)`: a backfill of
//!   last year's ticks is not deleted by the next live run. (The previous release wrote them as
//!   `<tick>-backfill` among the live keys; those are still read.)
//! - `<entry key>/output`: the run's kept output tails (up to 2 x 64 KiB, 6 x that JSON-escaped),
//!   apart from its entry, so that a history listing reads entries of a few hundred bytes and
//!   pulls output only when asked. An entry written by the previous release holds its output
//!   inside; readers take both shapes.
//!
//! Why this layout keeps a rolling upgrade and a rollback safe: the output key sorts right
//! after its entry, inside the range every release's live trim deletes, so a node of the
//! previous release trims new outputs with their entries (no orphans after a rollback). That
//! release reads new entries without their output ("no output kept") and skips the output keys
//! it cannot parse as runs (a listing of N may then show fewer); it never reads `+backfill/`
//! before its N live keys, and its trim deletes `+backfill/` entries as it did its own backfill
//! entries. A separate prefix for outputs would have left them behind after a rollback.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use etcd_client::{DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::rules::config::Job;
use crate::rules::record::{RunRecord, Trigger};

/// Three operations per entry at most: its put, its output's put and a trim.
pub const OPS_PER_ENTRY: usize = 3;

/// What follows an entry's key to name its output's.
const OUTPUT_SUFFIX: &str = "/output";
/// The folder of a job's backfill runs, within its history's prefix.
const BACKFILL_DIR: &str = "+backfill/";
/// Where a job's live keys start: `-` (a tick before 1970) and the digits sort from here,
/// [`BACKFILL_DIR`] before it.
const LIVE_FROM: &str = "-";

/// The most runs one history read fetches: with output kept apart an entry is a few hundred
/// bytes, so 1,000 (the longest history) is a few hundred KiB.
pub const READ_LIMIT: usize = 1000;

/// At most this many bytes of entries go in one transaction, unless one entry alone is more:
/// etcd refuses a request past its `--max-request-bytes` (1.5 MiB by default), and an entry
/// with two full output tails of bytes JSON escapes (up to 6 bytes each) is about 768 KiB.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;

/// At most this many bytes of output wait in the queue: while etcd is out of reach the oldest
/// waiting runs lose their output (their records stay), so a node's memory stays bounded.
const MAX_QUEUED_OUTPUT: usize = 32 * 1024 * 1024;

/// One run on its way to the job's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub job: String,
    pub shard: u32,
    pub record: RunRecord,
    /// The oldest tick the job's history keeps once this entry is in; `None` keeps all.
    pub keep_from: Option<DateTime<Utc>>,
    since: Instant,
    /// Its record's size in etcd.
    bytes: usize,
}

/// Bytes of output a record holds.
fn output_bytes(record: &RunRecord) -> usize {
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
    entries: Mutex<Vec<Entry>>,
    /// Bytes of output the entries hold; changed only with `entries` locked.
    queued_output: AtomicUsize,
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
    pub fn entry(&self, job: &Job, record: &RunRecord) -> Option<Entry> {
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
        Some(Entry {
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
    fn horizon(&self, job: &Job, tick: DateTime<Utc>) -> Option<DateTime<Utc>> {
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
    pub fn take_for(&self, shard: u32, max: usize) -> Vec<Entry> {
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

    pub fn put_back(&self, entries: Vec<Entry>) {
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

    pub fn take_older_than(&self, age: Duration) -> Vec<Entry> {
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
fn batches(entries: &[Entry]) -> Vec<&[Entry]> {
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

/// The key of a run in its job's history: ticks sort by time, and a manual run or a backfill
/// after the schedule's tick of the same second.
fn key(keys: &Keys, job: &str, record: &RunRecord) -> String {
    key_of(keys, job, record.scheduled_at, record.trigger)
}

/// The key of `job`'s history entry of the run of `at` (its tick, or when it was asked for).
pub(crate) fn key_of(keys: &Keys, job: &str, at: DateTime<Utc>, trigger: Trigger) -> String {
    match trigger {
        Trigger::Schedule => format!("{}{:012}", keys.job_runs_prefix(job), at.timestamp()),
        Trigger::Manual => format!(
            "{}{:012}.{:03}-manual",
            keys.job_runs_prefix(job),
            at.timestamp(),
            at.timestamp_subsec_millis()
        ),
        Trigger::Backfill => format!("{}{BACKFILL_DIR}{:012}", keys.job_runs_prefix(job), at.timestamp()),
    }
}

/// Where the previous release kept a backfill run: among the live keys, which trimmed it.
fn legacy_backfill_key(keys: &Keys, job: &str, at: DateTime<Utc>) -> String {
    format!("{}{:012}-backfill", keys.job_runs_prefix(job), at.timestamp())
}

fn output_key(entry_key: &str) -> String {
    format!("{entry_key}{OUTPUT_SUFFIX}")
}

/// Whether a history entry written by this release keeps its output under its own key: when
/// there is some. An empty one stays inside (a few bytes), so "printed nothing" still reads
/// apart from "no output kept".
fn output_apart(record: &RunRecord) -> bool {
    record
        .output
        .as_ref()
        .is_some_and(|output| !output.stdout.is_empty() || !output.stderr.is_empty())
}

/// The operations that put `entries` into their jobs' histories and trim them: per job and
/// kind (live or backfill) one delete, up to the newest horizon among its entries, and one put
/// per key at or past it (the last entry of a key wins), its output apart. etcd refuses a
/// transaction that puts a key twice or puts one inside a range it deletes, which several runs
/// of a job riding together would otherwise ask.
pub fn ops(keys: &Keys, entries: &[Entry]) -> Result<Vec<TxnOp>, CoordError> {
    // (job, backfill) -> (the first key of the trimmed range, its end)
    let mut horizons: HashMap<(&str, bool), (String, String)> = HashMap::new();
    for entry in entries {
        if let Some(keep_from) = entry.keep_from {
            let backfill = entry.record.trigger == Trigger::Backfill;
            let prefix = keys.job_runs_prefix(&entry.job);
            let (from, end) = if backfill {
                (
                    format!("{prefix}{BACKFILL_DIR}"),
                    key_of(keys, &entry.job, keep_from, Trigger::Backfill),
                )
            } else {
                (
                    format!("{prefix}{LIVE_FROM}"),
                    key_of(keys, &entry.job, keep_from, Trigger::Schedule),
                )
            };
            let horizon = horizons
                .entry((&entry.job, backfill))
                .or_insert_with(|| (from, end.clone()));
            if end > horizon.1 {
                horizon.1 = end;
            }
        }
    }
    let mut puts: HashMap<String, &RunRecord> = HashMap::new();
    for entry in entries {
        let key = key(keys, &entry.job, &entry.record);
        let backfill = entry.record.trigger == Trigger::Backfill;
        if horizons
            .get(&(entry.job.as_str(), backfill))
            .is_none_or(|(_, end)| key >= *end)
        {
            puts.insert(key, &entry.record);
        }
    }
    let protocol = |err: serde_json::Error| CoordError::Protocol(err.to_string());
    let mut ops = Vec::with_capacity(2 * puts.len() + horizons.len());
    for (key, record) in puts {
        if output_apart(record) {
            if let Some(output) = &record.output {
                let output = serde_json::to_vec(output).map_err(protocol)?;
                ops.push(TxnOp::put(output_key(&key), output, None));
            }
            let entry = RunRecord {
                output: None,
                ..record.clone()
            };
            ops.push(TxnOp::put(key, serde_json::to_vec(&entry).map_err(protocol)?, None));
        } else {
            ops.push(TxnOp::put(key, serde_json::to_vec(record).map_err(protocol)?, None));
        }
    }
    for (from, end) in horizons.into_values() {
        ops.push(TxnOp::delete(from, Some(DeleteOptions::new().with_range(end))));
    }
    Ok(ops)
}

/// Writes `entries` that no claim carried, in as few transactions as etcd allows. Puts of
/// whole records under their own keys: writing one twice writes the same thing.
pub async fn write(client: &etcd_client::Client, keys: &Keys, entries: &[Entry]) -> Result<(), CoordError> {
    for chunk in batches(entries) {
        etcd::call(client.clone().txn(Txn::new().and_then(ops(keys, chunk)?))).await?;
    }
    Ok(())
}

/// The job's last `count` runs (at most [`READ_LIMIT`]), newest first, backfill runs among
/// them by tick; each with its kept output only if `with_output`. Keys are listed first, then
/// the entries fetched in pages that halve past etcd-client's 4 MiB answer limit, then, if
/// asked, the outputs kept apart.
pub async fn read(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    count: usize,
    with_output: bool,
) -> Result<Vec<RunRecord>, CoordError> {
    let count = count.min(READ_LIMIT);
    let prefix = keys.job_runs_prefix(job);
    // Each entry may have an output key beside it: twice the keys hold `count` entries.
    let listed = i64::try_from(2 * count).unwrap_or(i64::MAX);
    let list = |from: String, end: String| {
        TxnOp::get(
            from,
            Some(
                GetOptions::new()
                    .with_range(end)
                    .with_keys_only()
                    .with_sort(SortTarget::Key, SortOrder::Descend)
                    .with_limit(listed),
            ),
        )
    };
    let backfill_dir = format!("{prefix}{BACKFILL_DIR}");
    let lists = [
        list(format!("{prefix}{LIVE_FROM}"), prefix_end(&prefix)),
        list(backfill_dir.clone(), prefix_end(&backfill_dir)),
    ];
    let answer = etcd::call(client.clone().txn(Txn::new().and_then(lists))).await?;
    let mut newest: Vec<(String, String)> = Vec::new();
    for listed in answer.op_responses() {
        let etcd_client::TxnOpResponse::Get(listed) = listed else {
            continue;
        };
        for kv in listed.kvs() {
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            if key.ends_with(OUTPUT_SUFFIX) {
                continue;
            }
            // Sorted as the previous release's keys sorted: a backfill after the schedule's
            // run of its second, before a manual run of that second.
            let rest = &key[prefix.len().min(key.len())..];
            let order = match rest.strip_prefix(BACKFILL_DIR) {
                Some(tick) => format!("{tick}-backfill"),
                None => rest.to_string(),
            };
            newest.push((order, key.to_string()));
        }
    }
    newest.sort_by(|a, b| b.0.cmp(&a.0));
    newest.truncate(count);
    let keys: Vec<String> = newest.into_iter().map(|(_, key)| key).collect();
    entries_of(client, keys, with_output).await
}

/// The runs under `keys`, in their order, with their kept output if `with_output`.
async fn entries_of(
    client: &etcd_client::Client,
    keys: Vec<String>,
    with_output: bool,
) -> Result<Vec<RunRecord>, CoordError> {
    let values = values_of(client, &keys).await?;
    let mut records: Vec<(String, RunRecord)> = keys
        .into_iter()
        .zip(values)
        .filter_map(|(key, value)| Some((key, serde_json::from_slice(&value?).ok()?)))
        .collect();
    if !with_output {
        // An entry of the previous release holds its output: dropped here, at least.
        for (_, record) in &mut records {
            record.output = None;
        }
        return Ok(records.into_iter().map(|(_, record)| record).collect());
    }
    let apart = values_of(client, &apart_keys(&records)).await?;
    let mut outputs = apart.into_iter();
    let mut shown = Vec::with_capacity(records.len());
    for (_, mut record) in records {
        if record.output.is_none() {
            if let Some(Some(value)) = outputs.next() {
                record.output = serde_json::from_slice(&value).ok();
            }
        }
        shown.push(record);
    }
    Ok(shown)
}

fn apart_keys(records: &[(String, RunRecord)]) -> Vec<String> {
    records
        .iter()
        .filter(|(_, record)| record.output.is_none())
        .map(|(key, _)| output_key(key))
        .collect()
}

/// The values of `keys`, in their order (`None` for a key etcd does not hold): transactions
/// of gets, as many as etcd allows in one, halved while an answer is past etcd-client's 4 MiB
/// limit (an entry of the previous release may hold 768 KiB).
async fn values_of(client: &etcd_client::Client, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, CoordError> {
    let mut values = Vec::with_capacity(keys.len());
    let mut page = crate::coord::etcd::ops_per_txn().max(1);
    let mut at = 0;
    while at < keys.len() {
        let chunk = &keys[at..(at + page).min(keys.len())];
        let gets: Vec<TxnOp> = chunk.iter().map(|key| TxnOp::get(key.as_str(), None)).collect();
        let response = match etcd::call(client.clone().txn(Txn::new().and_then(gets))).await {
            Ok(response) => response,
            Err(err) if err.is_too_large() && page > 1 => {
                page /= 2;
                continue;
            }
            Err(err) => return Err(err),
        };
        for answer in response.op_responses() {
            if let etcd_client::TxnOpResponse::Get(read) = answer {
                values.push(read.kvs().first().map(|kv| kv.value().to_vec()));
            }
        }
        at += chunk.len();
    }
    Ok(values)
}

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    String::from_utf8_lossy(&end).into_owned()
}

/// The run of `job` at `at` in its history, with its kept output: its tick's, one asked for
/// by hand at that millisecond, or its backfill's (where this release keeps it or where the
/// previous one did).
pub async fn read_run(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    at: DateTime<Utc>,
) -> Result<Option<RunRecord>, CoordError> {
    let candidates = [
        key_of(keys, job, at, Trigger::Schedule),
        key_of(keys, job, at, Trigger::Manual),
        key_of(keys, job, at, Trigger::Backfill),
        legacy_backfill_key(keys, job, at),
    ];
    let values = values_of(client, &candidates).await?;
    let found = candidates
        .into_iter()
        .zip(values)
        .find_map(|(key, value)| Some(key).zip(value));
    let Some((key, _)) = found else {
        return Ok(None);
    };
    Ok(entries_of(client, vec![key], true).await?.into_iter().next())
}

/// The last `count` runs of a `fan_out = "all"` job on every node, newest first: each node's
/// instance keeps a history of its own (`<job>@<node>`). Its keys are read first, without
/// values, so only the runs shown are fetched, with their output only if `with_output`.
pub async fn read_each(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    count: usize,
    with_output: bool,
) -> Result<Vec<RunRecord>, CoordError> {
    let prefix = format!("{}{job}@", keys.runs_prefix());
    let options = GetOptions::new().with_prefix().with_keys_only();
    let listed = etcd::call(client.clone().get(prefix.as_str(), Some(options))).await?;
    let mut newest: Vec<&[u8]> = listed
        .kvs()
        .iter()
        .map(|kv| kv.key())
        .filter(|key| !key.ends_with(OUTPUT_SUFFIX.as_bytes()))
        .collect();
    // The tick is the last segment, after the node's: newest first across every node.
    let tick = |key: &[u8]| key.rsplit(|b| *b == b'/').next().map(<[u8]>::to_vec);
    newest.sort_by_key(|key| std::cmp::Reverse(tick(key)));
    newest.truncate(count.min(READ_LIMIT));
    let keys: Vec<String> = newest
        .into_iter()
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .collect();
    entries_of(client, keys, with_output).await
}

/// `history`'s table: one run per line, newest first.
pub fn render(records: &[RunRecord]) -> String {
    render_rows(records, false)
}

/// [`render`], with each run's kept output under its row (`history --output`): each stream
/// that printed, its lines indented behind `| `, control characters but tabs shown escaped so
/// that a run's output cannot drive the terminal.
pub fn render_with_output(records: &[RunRecord]) -> String {
    render_rows(records, true)
}

fn output_block(record: &RunRecord) -> String {
    let Some(output) = &record.output else {
        return "    (no output kept)\n".to_string();
    };
    let mut block = String::new();
    for (name, text, truncated) in [
        ("stdout", &output.stdout, output.stdout_truncated),
        ("stderr", &output.stderr, output.stderr_truncated),
    ] {
        if text.is_empty() {
            continue;
        }
        let cut = if truncated { ", its last bytes" } else { "" };
        block.push_str(&format!("    {name}{cut}:\n"));
        for line in text.trim_end_matches('\n').split('\n') {
            let shown: String = line
                .chars()
                .flat_map(|c| match c {
                    '\t' => vec![c],
                    c if c.is_control() => c.escape_default().collect(),
                    c => vec![c],
                })
                .collect();
            block.push_str(&format!("    | {shown}\n"));
        }
    }
    if block.is_empty() {
        block.push_str("    (printed nothing)\n");
    }
    block
}

fn render_rows(records: &[RunRecord], with_output: bool) -> String {
    let instant = |at: &DateTime<Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|record| {
            vec![
                record.scheduled_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                record.trigger.as_str().to_string(),
                record.fence.to_string(),
                record.node.clone(),
                record.outcome_shown(),
                record
                    .exit_code
                    .map_or_else(|| "-".to_string(), |code| code.to_string()),
                record.duration_ms.to_string(),
                record.attempts.to_string(),
                instant(&record.finished_at),
            ]
        })
        .collect();
    let table = crate::text_table::table(
        &[
            "SCHEDULED AT",
            "TRIGGER",
            "FENCE",
            "NODE",
            "OUTCOME",
            "EXIT",
            "DURATION MS",
            "ATTEMPTS",
            "FINISHED AT",
        ],
        &rows,
    );
    if !with_output {
        return table;
    }
    let mut lines = table.lines();
    let mut out = format!("{}\n", lines.next().unwrap_or_default());
    for (line, record) in lines.zip(records) {
        out.push_str(line);
        out.push('\n');
        out.push_str(&output_block(record));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap()
    }

    #[test]
    fn the_horizon_keeps_the_last_ticks_whether_stepped_or_walked() {
        let job = Job::for_tests("j", "*/10 * * * * *");
        let queue = HistoryQueue::new(3);
        for second in [0, 10, 20, 30, 50] {
            let walked = job.schedule.nth_newest_at_or_before(at(second), 3);
            assert_eq!(queue.horizon(&job, at(second)), walked, "tick {second}");
        }
        assert_eq!(queue.horizon(&job, at(50)), Some(at(30)));
        assert_eq!(HistoryQueue::new(1).horizon(&job, at(50)), Some(at(50)));
    }

    #[test]
    fn keys_sort_by_tick_and_a_manual_run_after_its_seconds_tick() {
        let keys = Keys::new("c");
        let tick = key_of(&keys, "j", at(5), Trigger::Schedule);
        let manual = key_of(&keys, "j", at(5) + chrono::Duration::milliseconds(250), Trigger::Manual);
        let next = key_of(&keys, "j", at(6), Trigger::Schedule);
        assert!(tick < manual && manual < next, "{tick} {manual} {next}");
        assert!(tick.starts_with(&keys.job_runs_prefix("j")));
        assert!(
            !tick.starts_with(&keys.job_runs_prefix("j-")),
            "a job's prefix holds only its own runs"
        );
    }

    /// More runs of a job than it keeps can ride one transaction (a backlog of short runs), and
    /// a tick can come twice (a redelivery). etcd refuses a transaction that puts a key inside a
    /// range it deletes, or puts one key twice: the claim carrying them would fail every time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_runs_of_a_job_in_one_transaction_keep_only_its_newest() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("history");
        let job = Job::for_tests("j", "* * * * * *");
        let queue = HistoryQueue::new(3);
        for second in [0, 1, 2, 3, 4, 5, 6, 6, 7] {
            queue.push(&job, &RunRecord::for_tests(at(second), 100 + second));
        }
        let entries = queue.take_older_than(Duration::ZERO);
        write(&client, &keys, &entries)
            .await
            .expect("one transaction etcd takes");
        let kept = read(&client, &keys, "j", 10, false).await.expect("read");
        let ticks: Vec<DateTime<Utc>> = kept.iter().map(|run| run.scheduled_at).collect();
        assert_eq!(ticks, [at(7), at(6), at(5)]);
    }

    /// A backfill run of an old tick (older than the live history's horizon) is kept: put
    /// beside a live run of the job in one transaction, and not trimmed by the next live run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn old_backfill_runs_stay_beside_live_runs_until_their_own_bound() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("history");
        let job = Job::for_tests("j", "* * * * * *");
        let queue = HistoryQueue::new(3);
        let backfill = |second| RunRecord {
            trigger: Trigger::Backfill,
            ..RunRecord::for_tests(at(second), 900 + second)
        };
        queue.push(&job, &RunRecord::for_tests(at(100), 1));
        queue.push(&job, &backfill(10));
        write(&client, &keys, &queue.take_older_than(Duration::ZERO))
            .await
            .expect("write");
        for second in [101, 102, 103] {
            queue.push(&job, &RunRecord::for_tests(at(second), 1));
            write(&client, &keys, &queue.take_older_than(Duration::ZERO))
                .await
                .expect("write");
        }
        let kept = read(&client, &keys, "j", 10, false).await.expect("read");
        let ticks: Vec<(DateTime<Utc>, Trigger)> = kept.iter().map(|run| (run.scheduled_at, run.trigger)).collect();
        assert_eq!(
            ticks,
            [
                (at(103), Trigger::Schedule),
                (at(102), Trigger::Schedule),
                (at(101), Trigger::Schedule),
                (at(10), Trigger::Backfill)
            ]
        );
        for second in [11, 12, 13, 14] {
            queue.push(&job, &backfill(second));
        }
        write(&client, &keys, &queue.take_older_than(Duration::ZERO))
            .await
            .expect("write");
        let backfilled: Vec<i64> = read(&client, &keys, "j", 10, false)
            .await
            .expect("read")
            .iter()
            .filter(|run| run.trigger == Trigger::Backfill)
            .map(|run| run.fence - 900)
            .collect();
        assert_eq!(backfilled, [14, 13, 12], "backfill runs keep their own last 3");
    }

    fn with_output(second: i64, bytes: usize) -> RunRecord {
        RunRecord {
            output: Some(crate::rules::record::RunOutput {
                stdout: "x".repeat(bytes),
                ..Default::default()
            }),
            ..RunRecord::for_tests(at(second), 100 + second)
        }
    }

    #[test]
    fn big_outputs_go_in_transactions_of_at_most_a_mebibyte_and_one_entry_always_goes() {
        let job = Job::for_tests("j", "* * * * * *");
        let queue = HistoryQueue::new(100);
        for second in 0..10 {
            queue.push(&job, &with_output(second, 300 * 1024));
        }
        let taken = queue.take_for(job.shard, 100);
        assert_eq!(taken.len(), 3, "three of 300 KiB fit in a mebibyte, four do not");
        let entries = queue.take_older_than(Duration::ZERO);
        let sizes: Vec<usize> = batches(&entries).iter().map(|batch| batch.len()).collect();
        assert_eq!(sizes, [3, 3, 1]);
        queue.push(&job, &with_output(20, 2 * 1024 * 1024));
        assert_eq!(queue.take_for(job.shard, 100).len(), 1, "an entry past the bound alone");
    }

    #[test]
    fn output_waiting_for_etcd_is_bounded_by_dropping_the_oldest() {
        let job = Job::for_tests("j", "* * * * * *");
        let queue = HistoryQueue::new(1000);
        for second in 0..300 {
            queue.push(&job, &with_output(second, 128 * 1024));
        }
        let entries = queue.take_older_than(Duration::ZERO);
        assert_eq!(entries.len(), 300, "every record stays");
        let kept: usize = entries.iter().map(|entry| output_bytes(&entry.record)).sum();
        assert!(kept <= MAX_QUEUED_OUTPUT, "{kept}");
        assert!(kept > MAX_QUEUED_OUTPUT - 128 * 1024, "{kept}");
        assert!(entries[0].record.output.is_none(), "the oldest lost their output");
        assert!(entries[299].record.output.is_some(), "the newest kept it");
        assert_eq!(queue.queued_output.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn history_off_keeps_nothing() {
        let job = Job::for_tests("j", "* * * * * *");
        let queue = HistoryQueue::new(0);
        queue.push(&job, &RunRecord::for_tests(at(0), 1));
        assert!(queue.take_older_than(Duration::ZERO).is_empty());
    }
}
