//! Elections and claims through the library against a real etcd.

mod support;

use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use shardcron::election;
use shardcron::etcd_server::EtcdServer;
use shardcron::keys::Keys;
use shardcron::ledger::{self, ClaimRequest};
use shardcron::record::Claim;
use shardcron::session::Session;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_a_stale_fence_is_rejected_by_etcd() {
    let etcd = EtcdServer::start(Path::new("etcd")).expect("etcd");
    let client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .expect("client");
    let keys = Keys::new("fence");
    let prefix = keys.election_prefix(1, 0);

    support::step("node a leads");
    let session_a = Session::open(&client, Duration::from_secs(5)).await.expect("session a");
    let leader_a = election::campaign(&session_a, &prefix, 0, "a").await.expect("a leads");
    support::step("node b campaigns behind a");
    let session_b = Session::open(&client, Duration::from_secs(5)).await.expect("session b");
    let campaign_b = {
        let (session_b, prefix) = (session_b.clone(), prefix.clone());
        tokio::spawn(async move { election::campaign(&session_b, &prefix, 0, "b").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!campaign_b.is_finished(), "b waits while a leads");

    let tick = Utc::now();
    let request = |node: &str, fence: i64, expected_revision: i64| ClaimRequest {
        job: "j".into(),
        expected_revision,
        claim: Claim {
            scheduled_at: tick,
            fence,
            node: node.into(),
        },
    };
    support::step("a's session ends; b leads");
    session_a.close().await;
    let leader_b = tokio::time::timeout(Duration::from_secs(5), campaign_b)
        .await
        .expect("b elected")
        .unwrap()
        .unwrap();
    assert!(
        leader_b.fence > leader_a.fence,
        "fences grow: {} then {}",
        leader_a.fence,
        leader_b.fence
    );

    support::step("a's late claim is rejected; b's succeeds");
    let stale = ledger::claim(&session_b, &keys, &leader_a, &[request("a", leader_a.fence, 0)], &[])
        .await
        .unwrap();
    assert_eq!(stale, None, "a claim guarded by the old leader key must fail");
    let fresh = ledger::claim(&session_b, &keys, &leader_b, &[request("b", leader_b.fence, 0)], &[])
        .await
        .unwrap();
    assert!(fresh.is_some());
    support::step("a second claim from the same read is rejected too");
    let again = ledger::claim(&session_b, &keys, &leader_b, &[request("b", leader_b.fence, 0)], &[])
        .await
        .unwrap();
    assert_eq!(again, None, "the record changed since it was read");
    let seen = ledger::read_claims(&session_b, &keys, &["j"]).await.unwrap();
    assert_eq!(seen[0].claim.as_ref().map(|claim| claim.node.as_str()), Some("b"));
    session_b.close().await;
}
