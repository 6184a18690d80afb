use etcd_client::{GetOptions, KeyValue, Txn, TxnOp};

use super::*;
use crate::etcd_server::EtcdServer;

#[test]
fn an_etcd_error_reads_as_what_etcd_said_or_why_nothing_answered() {
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
    let status = tonic::Status::from_error(Box::new(refused));
    let said = super::CoordError::Etcd(etcd_client::Error::GRpcStatus(status)).to_string();
    assert!(
        said.starts_with("no etcd member answers (connection refused)"),
        "{said}"
    );
    let handshake = std::io::Error::other("invalid peer certificate: UnknownIssuer");
    let said = super::CoordError::Etcd(etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(
        handshake,
    ))));
    assert_eq!(
        said.to_string(),
        "the connection to etcd failed: invalid peer certificate: UnknownIssuer"
    );
    assert!(!said.is_unreachable(), "a refused certificate is no unreachable etcd");
    let status = tonic::Status::new(tonic::Code::Unavailable, "etcdserver: no leader");
    assert_eq!(
        super::CoordError::Etcd(etcd_client::Error::GRpcStatus(status)).to_string(),
        "etcd: etcdserver: no leader"
    );
}

#[test]
fn only_a_leader_change_sends_a_call_again_at_once() {
    let status = |code, message: &str| {
        super::CoordError::Etcd(etcd_client::Error::GRpcStatus(tonic::Status::new(code, message)))
    };
    assert!(status(tonic::Code::Unavailable, "etcdserver: leader changed").is_leader_change());
    assert!(
        !status(tonic::Code::Unavailable, "etcdserver: no leader").is_leader_change(),
        "with no leader yet, a call sent again fails again"
    );
    assert!(!super::CoordError::Timeout(std::time::Duration::from_secs(2)).is_leader_change());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_gone_once_etcd_no_longer_holds_it_not_in_its_last_second() {
    let etcd = EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
    let client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .expect("client");
    // etcd's shortest lease is 2 s (its election timeout, rounded up); in its last second
    // etcd answers 0 seconds left.
    let lease = client.clone().lease_grant(2, None).await.expect("grant").id();
    let seconds_left = || async {
        client
            .clone()
            .lease_time_to_live(lease, None)
            .await
            .expect("read")
            .ttl()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while seconds_left().await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never reached its last second"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let gone = lease_gone(&client, lease).await.expect("read");
    // Unless it expired between the two reads (a stalled machine), etcd still held it.
    assert!(!gone || seconds_left().await < 0, "a lease in its last second is held");
    client.clone().lease_revoke(lease).await.expect("revoke");
    assert!(
        lease_gone(&client, lease).await.expect("read"),
        "a revoked lease is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_read_of_a_prefix_equals_one_read_of_it() {
    let etcd = EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
    let client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .expect("client");
    let keys = 2 * PAGE as usize + 500;
    for chunk in (0..keys).collect::<Vec<_>>().chunks(100) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|index| TxnOp::put(format!("/p/{index:05}"), format!("node{index}"), None))
            .collect();
        client.clone().txn(Txn::new().and_then(puts)).await.expect("put");
    }
    // Keys just outside the prefix on either side stay out.
    client.clone().put("/o", "out", None).await.expect("put");
    client.clone().put("/q", "out", None).await.expect("put");
    let (paged, revision) = read_prefix(&client, "/p/").await.expect("paged read");
    let whole = client
        .clone()
        .get("/p/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("one read");
    let pairs = |kvs: &[KeyValue]| -> Vec<(Vec<u8>, Vec<u8>, i64)> {
        kvs.iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision()))
            .collect()
    };
    assert_eq!(paged.len(), keys);
    assert_eq!(pairs(&paged), pairs(whole.kvs()));
    assert_eq!(revision, whole.header().map_or(0, |header| header.revision()));
}
