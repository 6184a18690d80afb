//! Reading a job's last runs back, for `shardcron history`.

use chrono::{DateTime, Utc};
use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::layout::{key_of, legacy_backfill_key, output_key, BACKFILL_DIR, LIVE_FROM, OUTPUT_SUFFIX};
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::rules::record::{RunRecord, Trigger};

/// The most runs one history read fetches: with output kept apart an entry is a few hundred
/// bytes, so 1,000 (the longest history) is a few hundred KiB.
pub const READ_LIMIT: usize = 1000;

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
