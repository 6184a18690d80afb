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
