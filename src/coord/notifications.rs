//! A job's notification record in etcd (`/notify/<job>`): each change a read-modify-write
//! guarded by the record's revision, so two nodes accounting for runs, or delivering and
//! adopting, never overwrite each other.

use chrono::{DateTime, Utc};
use etcd_client::{Txn, TxnOp, TxnOpResponse};

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::record_at_key::{decode, Change, RecordAtKey};
use crate::rules::notify::{self, Pending, Record, Sent};

/// What a notification record is called in errors.
const NOTIFICATION: &str = "notification";

fn record<'a>(client: &'a etcd_client::Client, keys: &Keys, job: &str) -> RecordAtKey<'a, Record> {
    RecordAtKey::new(client, keys.notify(job), NOTIFICATION)
}

/// Changes `job`'s record by `change` (which says whether it changed anything) and returns it
/// as written, or `None` if `change` left it as it was. A record etcd holds and cannot be read
/// is started again empty: the job's next failure is told as a first one.
async fn update(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    mut change: impl FnMut(&mut Record) -> bool,
) -> Result<Option<Record>, CoordError> {
    let changed = record(client, keys, job)
        .change(|current| {
            let mut record = current
                .unwrap_or_else(|err| {
                    let err = CoordError::from(err);
                    tracing::warn!(job, error = %err, "the job's notification record cannot be read: starting it again");
                    Some(Record::default())
                })
                .unwrap_or_default();
            if !change(&mut record) {
                return Ok(Change::Leave(()));
            }
            Ok(Change::Write(record))
        })
        .await?;
    Ok(changed.written())
}

/// Accounts for a run or a takeover's missed ticks of `job` by `change` ([`notify::account`],
/// [`notify::account_missed`]) and returns the events it added, for this node to deliver.
pub(crate) async fn account(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    mut change: impl FnMut(&mut Record) -> bool,
) -> Result<Vec<Pending>, CoordError> {
    let mut added = Vec::new();
    let mut dropped = 0;
    let written = update(client, keys, job, |record| {
        let before = record.pending.len();
        if !change(record) {
            return false;
        }
        added = record.pending[before..].to_vec();
        dropped = notify::trim(record);
        true
    })
    .await?;
    if written.is_some() && dropped > 0 {
        tracing::warn!(
            job,
            dropped,
            "more of the job's events wait undelivered than its record keeps: the oldest are dropped"
        );
        crate::metrics::get()
            .notifications
            .get_or_create(&crate::metrics::ResultLabel { result: "dropped" })
            .inc_by(dropped as u64);
    }
    Ok(added)
}

/// Records read in one transaction: a record is at most [`notify::MAX_RECORD_BYTES`], and an
/// answer must stay under the client's 4 MiB decode limit.
const READS_PER_TXN: usize = 3;

/// The records of `jobs` that hold undelivered events, by job. Each is read by its key, so
/// records this node has no business with (other nodes' instances of fanned-out jobs,
/// `<job>@<node>`, which grow with every node id the fleet ever had) are never read.
pub(crate) async fn with_pending(
    client: &etcd_client::Client,
    keys: &Keys,
    jobs: &[&str],
) -> Result<Vec<(String, Record)>, CoordError> {
    let mut records = Vec::new();
    for chunk in jobs.chunks(READS_PER_TXN) {
        let reads: Vec<TxnOp> = chunk.iter().map(|job| TxnOp::get(keys.notify(job), None)).collect();
        let answer = etcd::call(client.clone().txn(Txn::new().and_then(reads))).await?;
        for (job, read) in chunk.iter().zip(answer.op_responses()) {
            let TxnOpResponse::Get(read) = read else { continue };
            let Some(kv) = read.kvs().first() else { continue };
            match decode::<Record>(NOTIFICATION, kv.value()).map_err(CoordError::from) {
                Ok(record) if !record.pending.is_empty() => records.push((job.to_string(), record)),
                Ok(_) => {}
                Err(err) => tracing::debug!(job, error = %err, "a notification record that does not parse: left out"),
            }
        }
    }
    Ok(records)
}

/// Every job's record, by job: what `status` shows of the last notification.
pub(crate) async fn read_all(client: &etcd_client::Client, keys: &Keys) -> Result<Vec<(String, Record)>, CoordError> {
    etcd::read_named(client, &keys.notify_prefix()).await
}

/// Takes over `job`'s events that `from` was to deliver: they are `me`'s now. Returns them.
pub(crate) async fn adopt(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    from: &str,
    me: &str,
) -> Result<Vec<Pending>, CoordError> {
    let mut adopted = Vec::new();
    update(client, keys, job, |record| {
        adopted.clear();
        for pending in record.pending.iter_mut().filter(|pending| pending.node == from) {
            pending.node = me.to_string();
            adopted.push(pending.clone());
        }
        !adopted.is_empty()
    })
    .await?;
    Ok(adopted)
}

/// Whether `pending` is still `me`'s to deliver: not delivered yet, and not taken over.
pub(crate) async fn still_mine(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    pending: &Pending,
    me: &str,
) -> Result<bool, CoordError> {
    let Some((record, _)) = record(client, keys, job).read().await? else {
        return Ok(false);
    };
    Ok(record.pending.iter().any(|kept| same(kept, pending) && kept.node == me))
}

fn same(a: &Pending, b: &Pending) -> bool {
    a.notifier == b.notifier
        && a.event == b.event
        && a.run.fence == b.run.fence
        && a.run.scheduled_at == b.run.scheduled_at
}

/// Takes `pending` off `job`'s record once delivered or given up on (`result`), as the last
/// notification.
pub(crate) async fn settle(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    pending: &Pending,
    result: &str,
    now: DateTime<Utc>,
) -> Result<(), CoordError> {
    update(client, keys, job, |record| {
        let before = record.pending.len();
        record.pending.retain(|kept| !same(kept, pending));
        // Told or given up on by a node that took it over: that one wrote the last.
        if record.pending.len() == before {
            return false;
        }
        record.last = Some(Sent {
            notifier: pending.notifier.clone(),
            event: pending.event,
            scheduled_at: pending.run.scheduled_at,
            dedupe_key: pending.dedupe_key(job),
            at: now,
            result: result.to_string(),
        });
        true
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::record::{Outcome, RunRecord};

    fn with_one(node: &str) -> Record {
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        Record {
            failing: true,
            pending: vec![Pending {
                notifier: "ops".into(),
                event: notify::Event::Failure,
                run: RunRecord {
                    outcome: Outcome::Exited,
                    exit_code: Some(1),
                    ..RunRecord::for_tests(at, 3)
                },
                since: at,
                node: node.into(),
                missed: 0,
            }],
            ..Record::default()
        }
    }

    #[tokio::test]
    async fn the_sweep_reads_only_the_named_records() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("notify");
        for (name, node) in [
            ("nightly", "a"),
            ("sweep@a", "a"),
            ("sweep@gone", "gone"),
            ("quiet", "a"),
        ] {
            let mut record = with_one(node);
            if name == "quiet" {
                record.pending.clear();
            }
            let value = serde_json::to_vec(&record).unwrap();
            client.clone().put(keys.notify(name), value, None).await.unwrap();
        }

        let read = with_pending(&client, &keys, &["nightly", "quiet", "sweep@a", "absent"])
            .await
            .unwrap();
        let names: Vec<&str> = read.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["nightly", "sweep@a"],
            "never another node's instance, nor one without events"
        );
    }
}
