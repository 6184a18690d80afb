//! Writing runs into their jobs' histories, and trimming them, in the transactions that carry
//! them.

use std::collections::HashMap;

use etcd_client::{DeleteOptions, Txn, TxnOp};

use super::layout::{key, key_of, output_apart, output_key, BACKFILL_DIR, LIVE_FROM};
use super::queue::{batches, HistoryEntry};
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::rules::record::{RunRecord, Trigger};

/// The operations that put `entries` into their jobs' histories and trim them: per job and
/// kind (live or backfill) one delete, up to the newest horizon among its entries, and one put
/// per key at or past it (the last entry of a key wins), its output apart. etcd refuses a
/// transaction that puts a key twice or puts one inside a range it deletes, which several runs
/// of a job riding together would otherwise ask.
pub fn ops(keys: &Keys, entries: &[HistoryEntry]) -> Result<Vec<TxnOp>, CoordError> {
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
pub async fn write(client: &etcd_client::Client, keys: &Keys, entries: &[HistoryEntry]) -> Result<(), CoordError> {
    for chunk in batches(entries) {
        etcd::call(client.clone().txn(Txn::new().and_then(ops(keys, chunk)?))).await?;
    }
    Ok(())
}
