//! A job's backfill in etcd (`/backfills/<job>`, a [`Backfill`]): asked for once, while no
//! other one of the job is going; each tick claimed by the leader of the job's shard in a
//! transaction guarded by its leadership and the record's revision, whose revision is the run's
//! fence; counted done, or given back, by the node that ran it; cancelled by a read-modify-write
//! that keeps the claims written before it. Every node mirrors the records: the leaders learn of
//! work, and each node gives back the ticks an earlier run of it claimed and never counted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tokio::sync::watch;

use crate::coord::election::Leadership;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::mirror::{Mirror, Put};
use crate::rules::backfill::{Backfill, InFlight};
use crate::rules::config::Delivery;

/// How long a node keeps trying to count a tick it ran before leaving it to the orphan rule.
const SETTLE_FOR: Duration = Duration::from_secs(60);

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

/// What becomes of a backfill tick a node claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its run ended and was recorded.
    Done,
    /// It did not start: claimed again later.
    Again,
}

fn encode(backfill: &Backfill) -> Result<Vec<u8>, CoordError> {
    serde_json::to_vec(backfill).map_err(|err| CoordError::Protocol(err.to_string()))
}

fn decode(value: &[u8]) -> Result<Backfill, CoordError> {
    serde_json::from_slice(value).map_err(|err| CoordError::Protocol(format!("a backfill record etcd holds: {err}")))
}

/// The job's backfill, and its record's revision; `None` if it has none.
pub(crate) async fn read(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
) -> Result<Option<(Backfill, i64)>, CoordError> {
    let read = etcd::call(client.clone().get(keys.backfill(job), None)).await?;
    read.kvs()
        .first()
        .map(|kv| Ok((decode(kv.value())?, kv.mod_revision())))
        .transpose()
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
    let key = keys.backfill(job);
    let value = encode(backfill)?;
    loop {
        let current = read(client, keys, job).await?;
        let guard = match &current {
            Some((going, _)) if !going.is_over() => return Ok(Asked::Going(Box::new(going.clone()))),
            Some((_, revision)) => Compare::mod_revision(key.as_str(), CompareOp::Equal, *revision),
            None => Compare::version(key.as_str(), CompareOp::Equal, 0),
        };
        let txn = Txn::new()
            .when([guard])
            .and_then([TxnOp::put(key.as_str(), value.clone(), None)]);
        if etcd::call(client.clone().txn(txn)).await?.succeeded() {
            return Ok(Asked::Written);
        }
    }
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
    let key = keys.backfill(job);
    loop {
        let Some((mut backfill, revision)) = read(client, keys, job).await? else {
            return Ok(None);
        };
        if id.is_some_and(|id| id != backfill.id) || !change(&mut backfill) {
            return Ok(None);
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)])
            .and_then([TxnOp::put(key.as_str(), encode(&backfill)?, None)]);
        if etcd::call(client.clone().txn(txn)).await?.succeeded() {
            return Ok(Some(backfill));
        }
    }
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

/// Counts `tick`, claimed as `claim` for backfill `id`, done or gives it back; retried for
/// [`SETTLE_FOR`], after which the tick is left in flight for the orphan rule.
pub(crate) async fn settle_tick(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    id: &str,
    tick: DateTime<Utc>,
    claim: &str,
    settle: Settle,
) -> bool {
    let deadline = tokio::time::Instant::now() + SETTLE_FOR;
    let mut backoff = crate::backoff::Backoff::coordination();
    loop {
        let written = update(client, keys, job, Some(id), |backfill| match settle {
            Settle::Done => backfill.finish(tick, claim),
            Settle::Again => backfill.give_back(tick, claim, false),
        })
        .await;
        match written {
            Ok(_) => return true,
            Err(err) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(error = %err, "could not count a backfill tick; its node's next start or the shard's leader gives it back");
                return false;
            }
            Err(err) => {
                tracing::debug!(error = %err, "counting a backfill tick; trying again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Settles the ticks of `job`'s backfill in flight that `orphaned` says their nodes will never
/// count: given back flagged as redelivered for an at-least-once job, recorded lost for an
/// at-most-once one. Returns how many.
pub(crate) async fn settle_orphans(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    delivery: Delivery,
    orphaned: impl Fn(&InFlight) -> bool,
) -> Result<usize, CoordError> {
    let settled = std::sync::atomic::AtomicUsize::new(0);
    let written = update(client, keys, job, None, |backfill| {
        let orphans = backfill.orphans(&orphaned);
        for orphan in &orphans {
            match delivery {
                Delivery::AtLeastOnce => backfill.give_back(orphan.tick, &orphan.claim, true),
                Delivery::AtMostOnce => backfill.record_lost(orphan.tick, &orphan.claim),
            };
        }
        settled.store(orphans.len(), std::sync::atomic::Ordering::Relaxed);
        !orphans.is_empty()
    })
    .await?;
    if written.is_none() {
        return Ok(0);
    }
    let next = match delivery {
        Delivery::AtLeastOnce => "run again, flagged redelivered",
        Delivery::AtMostOnce => "recorded lost",
    };
    tracing::warn!(
        job,
        ticks = settled.load(std::sync::atomic::Ordering::Relaxed),
        next,
        "backfill ticks were in flight on a node that went, or on an earlier run of this one"
    );
    Ok(settled.into_inner())
}

/// The backfills every node sees, kept current by a watch while the node has a session, and
/// the backfill ticks this node claimed and has not counted yet.
#[derive(Debug)]
pub(crate) struct Backfills {
    records: Mutex<HashMap<String, Backfill>>,
    /// By job and tick, the claim this node holds.
    held: Mutex<HashMap<(String, DateTime<Utc>), String>>,
    changed: watch::Sender<u64>,
}

impl Default for Backfills {
    fn default() -> Backfills {
        Backfills {
            records: Mutex::default(),
            held: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Backfills {
    /// Changes when a backfill record does; marked changed at once, for those already there.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        let mut receiver = self.changed.subscribe();
        receiver.mark_changed();
        receiver
    }

    /// The jobs `wanted` picks whose backfill has a tick to claim or one in flight.
    pub(crate) fn with_work(&self, wanted: impl Fn(&str) -> bool) -> Vec<String> {
        let mut jobs: Vec<String> = lock(&self.records)
            .iter()
            .filter(|(job, backfill)| wanted(job) && !backfill.is_over())
            .map(|(job, _)| job.clone())
            .collect();
        jobs.sort();
        jobs
    }

    /// The ticks of `job`'s backfill in flight on nodes other than `node`, as last seen.
    pub(crate) fn in_flight_elsewhere(&self, job: &str, node: &str) -> Vec<InFlight> {
        lock(&self.records).get(job).map_or_else(Vec::new, |backfill| {
            backfill
                .in_flight
                .iter()
                .filter(|flight| flight.node != node)
                .cloned()
                .collect()
        })
    }

    /// The jobs whose backfill lists a tick in flight on `node` that this node does not hold.
    pub(crate) fn unheld_on(&self, node: &str) -> Vec<String> {
        let held = lock(&self.held);
        lock(&self.records)
            .iter()
            .filter(|(job, backfill)| {
                backfill.in_flight.iter().any(|flight| {
                    flight.node == node && held.get(&((*job).clone(), flight.tick)) != Some(&flight.claim)
                })
            })
            .map(|(job, _)| job.clone())
            .collect()
    }

    /// Marks claim `claim` of a tick this node is about to make: held until
    /// [`Backfills::release`] of that claim.
    pub(crate) fn hold(&self, job: &str, tick: DateTime<Utc>, claim: &str) {
        lock(&self.held).insert((job.to_string(), tick), claim.to_string());
    }

    /// Ends the hold of `claim`, unless a later claim of the tick holds it now.
    pub(crate) fn release(&self, job: &str, tick: DateTime<Utc>, claim: &str) {
        let mut held = lock(&self.held);
        let key = (job.to_string(), tick);
        if held.get(&key).is_some_and(|holding| holding == claim) {
            held.remove(&key);
        }
    }

    /// Whether this node holds `flight`'s claim.
    pub(crate) fn holds(&self, job: &str, flight: &InFlight) -> bool {
        lock(&self.held).get(&(job.to_string(), flight.tick)) == Some(&flight.claim)
    }
}

impl Mirror for Backfills {
    const WHAT: &'static str = "backfills";

    fn prefix(keys: &Keys) -> String {
        keys.backfills_prefix()
    }

    fn clear(&self) {
        lock(&self.records).clear();
    }

    fn apply(&self, keys: &Keys, key: &[u8], put: Option<Put>) {
        let prefix = keys.backfills_prefix();
        let Some(job) = std::str::from_utf8(key)
            .ok()
            .and_then(|key| key.strip_prefix(prefix.as_str()))
        else {
            return;
        };
        match put.map(|put| decode(put.value)) {
            Some(Ok(backfill)) => {
                lock(&self.records).insert(job.to_string(), backfill);
            }
            Some(Err(err)) => {
                tracing::warn!(job, error = %err, "unreadable backfill record; ignoring it");
                lock(&self.records).remove(job);
            }
            None => {
                lock(&self.records).remove(job);
            }
        }
        self.changed.send_modify(|count| *count += 1);
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::{ask, cancel, read, Asked};
    use crate::coord::keys::Keys;
    use crate::rules::backfill::{ticks, Ask, Backfill};
    use crate::rules::config::Job;

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + minute * 60, 0).unwrap_or_default()
    }

    #[tokio::test]
    async fn one_backfill_of_a_job_at_a_time_and_a_cancel_keeps_what_was_claimed() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("backfills");
        let job = Job::for_tests("report", "* * * * *");
        let asked = Ask {
            from: at(0),
            to: at(5),
            max: 100,
            parallel: 1,
        };
        let fires = ticks(&job, &asked, at(30)).expect("ticks");
        let backfill = Backfill::new("b1".into(), &asked, &fires, at(30));
        assert_eq!(
            ask(&client, &keys, "report", &backfill).await.expect("ask"),
            Asked::Written
        );
        let second = Backfill {
            id: "b2".into(),
            ..backfill.clone()
        };
        match ask(&client, &keys, "report", &second).await.expect("ask") {
            Asked::Going(going) => assert_eq!(going.id, "b1"),
            Asked::Written => panic!("a second backfill of the job was written over the first"),
        }

        // A leader's claim lands, then the cancel: the claim stays.
        let (mut claimed, _) = read(&client, &keys, "report").await.expect("read").expect("the record");
        let next = claimed.next_claim(&job).expect("a tick");
        claimed.claim(next, "a", 3, "c1", None);
        client
            .clone()
            .put(
                keys.backfill("report"),
                serde_json::to_vec(&claimed).expect("json"),
                None,
            )
            .await
            .expect("the claim");
        let cancelled = cancel(&client, &keys, "report")
            .await
            .expect("cancel")
            .expect("a backfill");
        assert!(cancelled.cancelled);
        assert_eq!(
            cancelled.in_flight.len(),
            1,
            "the claim written before the cancel stays"
        );
        assert!(!cancelled.is_over(), "its tick is still in flight");
        assert!(matches!(
            ask(&client, &keys, "report", &second).await.expect("ask"),
            Asked::Going(_)
        ));

        let (mut ending, _) = read(&client, &keys, "report").await.expect("read").expect("the record");
        ending.finish(next.tick, "c1");
        client
            .clone()
            .put(
                keys.backfill("report"),
                serde_json::to_vec(&ending).expect("json"),
                None,
            )
            .await
            .expect("done");
        assert_eq!(
            ask(&client, &keys, "report", &second).await.expect("ask"),
            Asked::Written,
            "one that is over is replaced"
        );
        assert_eq!(cancel(&client, &keys, "nobody").await.expect("cancel"), None);
    }
}
