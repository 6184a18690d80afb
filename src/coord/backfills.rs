//! A job's backfill in etcd (`/backfills/<job>`, a [`Backfill`]): asked for once, while no
//! other one of the job is going, and cancelled by a read-modify-write guarded by the record's
//! revision, so a cancel never undoes a claim written meanwhile.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::rules::backfill::Backfill;

/// How asking for a backfill ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Asked {
    /// Written: the leader of the job's shard serves it.
    Written,
    /// The job has a backfill going: the operator cancels it first, or waits.
    Going(Box<Backfill>),
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

/// Cancels `job`'s backfill: no tick is claimed after it, those in flight end as they will.
/// Returns the record as cancelled; `None` if the job has no backfill.
pub(crate) async fn cancel(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
) -> Result<Option<Backfill>, CoordError> {
    let key = keys.backfill(job);
    loop {
        let Some((mut backfill, revision)) = read(client, keys, job).await? else {
            return Ok(None);
        };
        if backfill.cancelled {
            return Ok(Some(backfill));
        }
        backfill.cancelled = true;
        let txn = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)])
            .and_then([TxnOp::put(key.as_str(), encode(&backfill)?, None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let response = etcd::call(client.clone().txn(txn)).await?;
        if response.succeeded() {
            return Ok(Some(backfill));
        }
        // Written meanwhile (a claim, a tick done): cancel what is there now.
        if !response
            .op_responses()
            .iter()
            .any(|answer| matches!(answer, TxnOpResponse::Get(got) if !got.kvs().is_empty()))
        {
            return Ok(None);
        }
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
        let tick = claimed.next_claim().expect("a tick");
        claimed.claim(tick, "a", 3);
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
        ending.finish(tick);
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
