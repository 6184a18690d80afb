//! A job's backfill record in etcd: read, asked for, changed by a read-modify-write guarded
//! by its revision, and a tick of it claimed under the leadership's guard.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use crate::coord::election::Leadership;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::record_at_key::{encode, Change, Changed, RecordAtKey};
use crate::rules::backfill::Backfill;

/// How asking for a backfill ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Asked {
    /// Written: the leader of the job's shard serves it.
    Written,
    /// The job has a backfill going: the operator cancels it first, or waits.
    Going(Box<Backfill>),
}

/// How a leader's claim of a backfill tick ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Written: the run's fence.
    Ours(i64),
    /// The record changed since it was read: read it again.
    Changed,
    /// The leadership guard failed.
    Deposed,
}

/// What a backfill record is called in errors.
pub(super) const BACKFILL: &str = "backfill";

fn record<'a>(client: &'a etcd_client::Client, keys: &Keys, job: &str) -> RecordAtKey<'a, Backfill> {
    RecordAtKey::new(client, keys.backfill(job), BACKFILL)
}

/// The job's backfill, and its record's revision; `None` if it has none.
pub(crate) async fn read(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
) -> Result<Option<(Backfill, i64)>, CoordError> {
    Ok(record(client, keys, job).read().await?)
}

/// Every job's backfill, by job.
pub(crate) async fn read_all(client: &etcd_client::Client, keys: &Keys) -> Result<Vec<(String, Backfill)>, CoordError> {
    etcd::read_named(client, &keys.backfills_prefix()).await
}

/// Writes `backfill` for `job`, unless one of the job is going; one that is over is replaced.
pub(crate) async fn ask(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    backfill: &Backfill,
) -> Result<Asked, CoordError> {
    let asked = record(client, keys, job)
        .change(|current| {
            Ok(match current? {
                Some(going) if !going.is_over() => Change::Leave(Box::new(going)),
                _ => Change::Write(backfill.clone()),
            })
        })
        .await?;
    Ok(match asked {
        Changed::Written(_) => Asked::Written,
        Changed::Left(going) => Asked::Going(going),
    })
}

/// Changes `job`'s backfill `id` by `change` (which says whether it changed anything), in a
/// read-modify-write guarded by the record's revision; the record as written, or `None` if
/// the job has no backfill `id` or `change` left it as it was.
pub(crate) async fn update(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    id: Option<&str>,
    change: impl Fn(&mut Backfill) -> bool,
) -> Result<Option<Backfill>, CoordError> {
    let changed = record(client, keys, job)
        .change(|current| {
            let Some(mut backfill) = current? else {
                return Ok(Change::Leave(()));
            };
            if id.is_some_and(|id| id != backfill.id) || !change(&mut backfill) {
                return Ok(Change::Leave(()));
            }
            Ok(Change::Write(backfill))
        })
        .await?;
    Ok(changed.written())
}

/// Cancels `job`'s backfill: no tick is claimed after it, those in flight end as they will.
/// Returns the record as cancelled; `None` if the job has no backfill.
pub(crate) async fn cancel(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
) -> Result<Option<Backfill>, CoordError> {
    let cancelled = update(client, keys, job, None, |backfill| {
        let changed = !backfill.cancelled;
        backfill.cancelled = true;
        changed
    })
    .await?;
    match cancelled {
        Some(backfill) => Ok(Some(backfill)),
        // Cancelled already, or none.
        None => Ok(read(client, keys, job).await?.map(|(backfill, _)| backfill)),
    }
}

/// Writes `claimed`, the record read at `revision` with a tick claimed, if it is unchanged and
/// `leadership` still holds.
pub(crate) async fn claim(
    client: &etcd_client::Client,
    keys: &Keys,
    leadership: &Leadership,
    job: &str,
    revision: i64,
    claimed: &Backfill,
) -> Result<Claimed, CoordError> {
    let key = keys.backfill(job);
    let txn = Txn::new()
        .when([
            leadership.guard(),
            Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
        ])
        .and_then([TxnOp::put(key.as_str(), encode(claimed)?, None)])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let response = etcd::call(client.clone().txn(txn)).await?;
    if response.succeeded() {
        return Ok(Claimed::Ours(response.header().map_or(0, |header| header.revision())));
    }
    let unchanged = response.op_responses().iter().any(|answer| {
        matches!(answer, TxnOpResponse::Get(got) if got.kvs().first().is_some_and(|kv| kv.mod_revision() == revision))
    });
    Ok(if unchanged { Claimed::Deposed } else { Claimed::Changed })
}
