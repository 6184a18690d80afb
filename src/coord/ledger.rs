//! The per-job records in etcd: the last claimed tick, and the last finished run.
//!
//! A claim is the commitment to run a tick. It is one transaction guarded by the leader key's
//! fence and by each job's record being unchanged since the leader read it, so a tick is claimed
//! at most once even while two nodes both believe they lead.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::coord::election::Leadership;
use crate::coord::etcd::{self, ops_per_txn, CoordError};
use crate::coord::history;
use crate::coord::keys::Keys;
use crate::coord::session::Session;
use crate::rules::record::{Claim, RunRecord};

/// The operations that write a finished run's `record` of `job`: its result, and the job's
/// last success: `record` if it succeeded, else `success`, an older success not written yet
/// (a failure that came before it was written must not lose it). A failed run must not hide the
/// last success: alerts and the per-job gauges read it.
pub(crate) fn result_ops(
    keys: &Keys,
    job: &str,
    record: &RunRecord,
    success: Option<&RunRecord>,
) -> Result<Vec<TxnOp>, CoordError> {
    let encode = |record: &RunRecord| serde_json::to_vec(record).map_err(|err| CoordError::Protocol(err.to_string()));
    let mut ops = Vec::with_capacity(2);
    if let Some(success) = last_success(record, success) {
        ops.push(TxnOp::put(keys.job_success(job), encode(success)?, None));
    }
    ops.push(TxnOp::put(keys.job_result(job), encode(record)?, None));
    Ok(ops)
}

/// The success [`result_ops`] writes with `record`, if any.
pub(crate) fn last_success<'r>(record: &'r RunRecord, success: Option<&'r RunRecord>) -> Option<&'r RunRecord> {
    if record.succeeded() {
        Some(record)
    } else {
        success
    }
}

/// How many operations [`result_ops`] writes for `record` and `success`.
pub(crate) fn result_op_count(record: &RunRecord, success: Option<&RunRecord>) -> usize {
    1 + usize::from(last_success(record, success).is_some())
}

pub use crate::rules::protocol::ReadRecord;
use crate::rules::protocol::{self, Guard};

/// One job's part of a claim transaction.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub job: String,
    pub expected_revision: i64,
    pub claim: Claim,
}

/// An answer of etcd that cannot be used as it stands: an error that stops the claim until it is
/// read again, logged by the caller and counted with the failed etcd calls.
fn unusable(message: String) -> CoordError {
    crate::metrics::get().etcd_errors.inc();
    CoordError::Protocol(message)
}

/// Reads the last claims of `jobs`, in order. A record that cannot be read is an error, never a
/// job without a record: what it claimed is unknown, and a fresh start could run a claimed tick
/// again or skip a pending one. It stops the claims of the shard until it is fixed or deleted.
pub async fn read_claims(session: &Session, keys: &Keys, jobs: &[&str]) -> Result<Vec<ReadRecord>, CoordError> {
    let mut seen = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(ops_per_txn()) {
        let gets: Vec<TxnOp> = chunk.iter().map(|job| TxnOp::get(keys.job_last(job), None)).collect();
        let response = etcd::call(session.client().txn(Txn::new().and_then(gets))).await?;
        let answers = response.op_responses();
        if answers.len() != chunk.len() {
            return Err(unusable(format!(
                "etcd answered {} of {} reads of claim records",
                answers.len(),
                chunk.len()
            )));
        }
        for (job, op) in chunk.iter().zip(answers) {
            let TxnOpResponse::Get(get) = op else {
                return Err(CoordError::Protocol("txn of gets answered with another op".into()));
            };
            let entry = match get.kvs().first() {
                None => ReadRecord::default(),
                Some(kv) => match serde_json::from_slice::<Claim>(kv.value()) {
                    Ok(claim) => ReadRecord {
                        claim: Some(claim),
                        mod_revision: kv.mod_revision(),
                    },
                    Err(err) => {
                        return Err(unusable(format!(
                            "the claim record {} of job {job} cannot be read ({err}): fix or delete it; until then its shard claims nothing rather than guess what was claimed",
                            keys.job_last(job)
                        )));
                    }
                },
            };
            seen.push(entry);
        }
    }
    Ok(seen)
}

/// Claims ticks in one guarded transaction, which also writes `results` of earlier runs of the
/// shard's jobs and adds `history` entries to their jobs' histories. `Ok(Some(revision))` is the new mod revision of every claimed record; `Ok(None)`
/// means a guard failed and nothing was written.
pub async fn claim(
    session: &Session,
    keys: &Keys,
    leadership: &Leadership,
    requests: &[ClaimRequest],
    results: &[(&str, &RunRecord, Option<&RunRecord>)],
    history: &[history::HistoryEntry],
) -> Result<Option<i64>, CoordError> {
    debug_assert!(
        requests.len()
            + results
                .iter()
                .map(|(_, record, success)| result_op_count(record, *success))
                .sum::<usize>()
            + history.len() * history::OPS_PER_ENTRY
            <= ops_per_txn()
    );
    let guards = protocol::guards(
        leadership.term,
        requests
            .iter()
            .map(|request| (request.job.as_str(), request.expected_revision)),
    );
    let compares: Vec<Compare> = guards
        .iter()
        .map(|guard| match guard {
            Guard::Leads { term } => {
                debug_assert_eq!(*term, leadership.term);
                leadership.guard()
            }
            Guard::RecordAt { job, revision } => {
                Compare::mod_revision(keys.job_last(job).as_str(), CompareOp::Equal, *revision)
            }
        })
        .collect();
    let mut puts = history::ops(keys, history)?;
    puts.reserve(requests.len() + results.len());
    for (job, record, success) in results {
        puts.extend(result_ops(keys, job, record, *success)?);
    }
    for request in requests {
        let value = serde_json::to_vec(&request.claim).map_err(|err| CoordError::Protocol(err.to_string()))?;
        puts.push(TxnOp::put(keys.job_last(&request.job), value, None::<PutOptions>));
    }
    let response = etcd::call(session.client().txn(Txn::new().when(compares).and_then(puts))).await?;
    if !response.succeeded() {
        return Ok(None);
    }
    Ok(Some(response.header().map_or(0, |header| header.revision())))
}

/// Writes finished runs' records in as few transactions as etcd allows, each only over an older
/// record: not guarded by a leadership, since a result is a fact about a run that happened
/// whoever leads now, but a late write (a node that was cut off, a retry after an outage) never
/// hides a newer tick's result. Each record is compared with what etcd holds and written only
/// if etcd still holds that; a record that changed meanwhile is read again.
pub async fn record_runs(
    client: &etcd_client::Client,
    keys: &Keys,
    runs: &[(String, RunRecord, Option<RunRecord>)],
) -> Result<(), CoordError> {
    // Each run may write its result and its job's last success.
    for chunk in runs.chunks(ops_per_txn() / 2) {
        let mut left: Vec<&(String, RunRecord, Option<RunRecord>)> = chunk.iter().collect();
        while !left.is_empty() {
            let gets: Vec<TxnOp> = left
                .iter()
                .map(|(job, _, _)| TxnOp::get(keys.job_result(job), None))
                .collect();
            let read = etcd::call(client.clone().txn(Txn::new().and_then(gets))).await?;
            let mut compares = Vec::with_capacity(left.len());
            let mut puts = Vec::with_capacity(left.len());
            let mut writing = Vec::with_capacity(left.len());
            for (run, op) in left.iter().zip(read.op_responses()) {
                let TxnOpResponse::Get(get) = op else {
                    return Err(CoordError::Protocol("txn of gets answered with another op".into()));
                };
                let (job, record) = (&run.0, &run.1);
                let held = get.kvs().first();
                let newer_held = held
                    .and_then(|kv| serde_json::from_slice::<RunRecord>(kv.value()).ok())
                    .is_some_and(|held| supersedes(&held, record));
                if newer_held {
                    tracing::info!(job = %job, tick = %crate::clock::rfc3339(record.scheduled_at), fence = record.fence, "not recording a late result: etcd already holds a newer one");
                    continue;
                }
                let revision = held.map_or(0, |kv| kv.mod_revision());
                compares.push(Compare::mod_revision(keys.job_result(job), CompareOp::Equal, revision));
                puts.extend(result_ops(keys, job, record, run.2.as_ref())?);
                writing.push(*run);
            }
            if writing.is_empty() {
                break;
            }
            let written = etcd::call(client.clone().txn(Txn::new().when(compares).and_then(puts))).await?;
            left = if written.succeeded() { Vec::new() } else { writing };
        }
    }
    Ok(())
}

/// Whether the result `held` in etcd is newer than `record`: a later tick, or the same tick run
/// under a later claim (a redelivery).
fn supersedes(held: &RunRecord, record: &RunRecord) -> bool {
    (held.scheduled_at, held.fence) > (record.scheduled_at, record.fence)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::coord::election;
    use crate::coord::keys::ElectionKeys;
    use crate::etcd_server::EtcdServer;

    fn step(what: &str) {
        eprintln!("--- {what}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_with_a_stale_fence_is_rejected_by_etcd() {
        let etcd = EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("fence");
        // Only members lead: each session registers as a node does before it campaigns.
        let register = |session: Session, id: &'static str| {
            let keys = keys.clone();
            async move {
                let member = crate::rules::record::Member {
                    version: "test".into(),
                    digest: "d".into(),
                    shards: 1,
                    started_at: Utc::now(),
                    tags: Default::default(),
                    pool_shards: 0,
                    pools: Vec::new(),
                    etcd: None,
                };
                crate::coord::fleet::register(&session, &keys, id, &member)
                    .await
                    .expect("register");
            }
        };

        step("node a leads");
        let session_a = Session::open(&client, Duration::from_secs(5), &CancellationToken::new())
            .await
            .expect("session a");
        register(session_a.clone(), "a").await;
        let mut view_a = crate::coord::fleet::watch_view(&session_a, &ElectionKeys::fleet(&keys, 1, "a"));
        let admission = election::ElectionThrottle::new(1);
        let leader_a = election::campaign(
            &session_a,
            &ElectionKeys::fleet(&keys, 1, "a"),
            0,
            "a",
            &mut view_a,
            &admission,
        )
        .await
        .expect("a leads");
        step("node b campaigns behind a");
        let session_b = Session::open(&client, Duration::from_secs(5), &CancellationToken::new())
            .await
            .expect("session b");
        register(session_b.clone(), "b").await;
        let campaign_b = {
            let (session_b, keys) = (session_b.clone(), keys.clone());
            let mut view_b = crate::coord::fleet::watch_view(&session_b, &ElectionKeys::fleet(&keys, 1, "b"));
            let admission = election::ElectionThrottle::new(1);
            tokio::spawn(async move {
                election::campaign(
                    &session_b,
                    &ElectionKeys::fleet(&keys, 1, "b"),
                    0,
                    "b",
                    &mut view_b,
                    &admission,
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!campaign_b.is_finished(), "b waits while a leads");

        let tick = Utc::now();
        let request = |node: &str, term: i64, expected_revision: i64| ClaimRequest {
            job: "j".into(),
            expected_revision,
            claim: Claim {
                scheduled_at: tick,
                term,
                node: node.into(),
                pending: vec![tick],
                shards: Some(1),
                pool: None,
                schedule: None,
                others: Vec::new(),
                released: false,
                going: Vec::new(),
            },
        };
        step("a's session ends; b leads");
        session_a.close().await;
        let leader_b = tokio::time::timeout(Duration::from_secs(5), campaign_b)
            .await
            .expect("b elected")
            .unwrap()
            .unwrap();
        assert!(
            leader_b.term > leader_a.term,
            "terms grow: {} then {}",
            leader_a.term,
            leader_b.term
        );

        step("a's late claim is rejected; b's succeeds");
        let stale = claim(
            &session_b,
            &keys,
            &leader_a,
            &[request("a", leader_a.term, 0)],
            &[],
            &[],
        )
        .await
        .unwrap();
        assert_eq!(stale, None, "a claim guarded by the old leader key must fail");
        let fresh = claim(
            &session_b,
            &keys,
            &leader_b,
            &[request("b", leader_b.term, 0)],
            &[],
            &[],
        )
        .await
        .unwrap();
        assert!(fresh.is_some());
        step("a second claim from the same read is rejected too");
        let again = claim(
            &session_b,
            &keys,
            &leader_b,
            &[request("b", leader_b.term, 0)],
            &[],
            &[],
        )
        .await
        .unwrap();
        assert_eq!(again, None, "the record changed since it was read");
        let seen = read_claims(&session_b, &keys, &["j"]).await.unwrap();
        assert_eq!(seen[0].claim.as_ref().map(|claim| claim.node.as_str()), Some("b"));
        session_b.close().await;
    }

    fn result(second: i64, fence: i64) -> RunRecord {
        RunRecord::for_tests(
            chrono::DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap(),
            fence,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_result_never_replaces_a_newer_one() {
        let etcd = EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("results");
        let held = |client: etcd_client::Client| {
            let keys = keys.clone();
            async move {
                let got = client.clone().get(keys.job_result("j"), None).await.unwrap();
                serde_json::from_slice::<RunRecord>(got.kvs()[0].value()).unwrap()
            }
        };
        record_runs(&client, &keys, &[("j".into(), result(10, 7), None)])
            .await
            .unwrap();
        step("an earlier tick's result arrives late: not written");
        record_runs(&client, &keys, &[("j".into(), result(9, 5), None)])
            .await
            .unwrap();
        assert_eq!(held(client.clone()).await, result(10, 7));
        step("the same tick redelivered under a later claim: written");
        record_runs(&client, &keys, &[("j".into(), result(10, 9), None)])
            .await
            .unwrap();
        assert_eq!(held(client.clone()).await, result(10, 9));
        step("a later tick: written");
        record_runs(&client, &keys, &[("j".into(), result(11, 9), None)])
            .await
            .unwrap();
        assert_eq!(held(client.clone()).await, result(11, 9));
    }
}
