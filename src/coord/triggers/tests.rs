use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ask::AskerLease;
use super::*;
use crate::etcd_server::EtcdServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_from_a_revision_etcd_compacted_reads_the_answer_again() {
    let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
    let client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .expect("client");
    let keys = Keys::new("c");
    client.clone().put(keys.node("n"), "{}", None).await.expect("member");
    let mut answer = Answer {
        job: "j".into(),
        node: "n".into(),
        term: 1,
        requested_at: Utc::now(),
        run: None,
    };
    let value = |answer: &Answer| serde_json::to_vec(answer).expect("answer");
    let taken = client
        .clone()
        .put(keys.triggered("r"), value(&answer), None)
        .await
        .expect("taken");
    let revision = taken.header().expect("header").revision();
    // The run ends, and etcd's history is compacted past the revision the wait starts from.
    let record = RunRecord::for_tests(DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap(), revision);
    answer.run = Some(record.clone());
    let ended = client
        .clone()
        .put(keys.triggered("r"), value(&answer), None)
        .await
        .expect("ended");
    client
        .clone()
        .compact(ended.header().expect("header").revision(), None)
        .await
        .expect("compact");
    let claimed = Claimed {
        id: "r".into(),
        node: "n".into(),
        fence: revision,
        revision,
        _lease: AskerLease::grant(&client).await.expect("lease"),
    };
    let run = tokio::time::timeout(Duration::from_secs(20), wait_for_run(&client, &keys, &claimed))
        .await
        .expect("the wait ends: etcd cancelled its watch, and it read the answer again")
        .expect("the wait");
    assert_eq!(run, Some(record));
}

#[test]
fn a_term_takes_the_requests_of_its_jobs_oldest_first_and_once() {
    let keys = Keys::new("c");
    let triggers = Triggers::default();
    let mut arrived = triggers.subscribe();
    assert!(
        arrived.has_changed().unwrap(),
        "a new term looks at the requests already there"
    );
    let at = |second: i64| DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap();
    for (job, id, second) in [("a", "r2", 2), ("a", "r1", 1), ("b", "r3", 0)] {
        let value = serde_json::to_vec(&RequestValue {
            requested_at: at(second),
        })
        .unwrap();
        let put = Put {
            value: &value,
            lease: 0,
        };
        triggers.apply(&keys, keys.trigger(job, id).as_bytes(), Some(put));
    }
    arrived.mark_unchanged();
    triggers.apply(&keys, keys.trigger("a", "r9").as_bytes(), None);
    let taken: Vec<String> = triggers
        .take_for(|job| job == "a")
        .into_iter()
        .map(|request| request.id)
        .collect();
    assert_eq!(taken, ["r1", "r2"]);
    assert!(triggers.take_for(|job| job == "a").is_empty());
    // A term that ends before settling what it took gives it back for the next one.
    let given_back = triggers.take_for(|job| job == "b");
    triggers.put_back(given_back);
    assert_eq!(triggers.take_for(|job| job == "b").len(), 1);
    triggers.put_back(Vec::new());
    triggers.apply(&keys, keys.trigger("b", "r3").as_bytes(), None);
    assert!(
        triggers.take_for(|_| true).is_empty(),
        "a withdrawn request is forgotten"
    );
}

/// The claim of a request committed but its reply was lost, and the command that did not
/// wait deleted the answer at once: the leader's next try finds the request gone, and the
/// job's marker says the claim was its own, with the same fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_tried_again_after_its_reply_was_lost_is_still_ours() {
    let etcd = EtcdServer::start(Path::new("etcd")).expect("etcd");
    let client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .expect("client");
    let keys = Keys::new("lost-reply");
    let session = Session::open(&client, Duration::from_secs(5), &CancellationToken::new())
        .await
        .expect("session");
    let key = keys.candidate(1, 0, session.lease());
    let term = crate::coord::election::enter(&session, &key, "a").await.expect("enter");
    let leadership = Leadership {
        shard: 0,
        shards: 1,
        pool: None,
        prefix: keys.election_prefix(1, 0),
        key,
        term,
    };
    let value = serde_json::to_vec(&RequestValue {
        requested_at: Utc::now(),
    })
    .expect("value");
    client
        .clone()
        .put(keys.trigger("once", "r1"), value, None)
        .await
        .expect("request");
    let request = Request {
        job: "once".into(),
        id: "r1".into(),
        requested_at: Utc::now(),
        lease: 0,
    };

    let first = claim(&session, &keys, &leadership, "a", &request).await.expect("claim");
    let Taken::Ours(run_fence) = first else {
        panic!("the first claim takes the request: {first:?}");
    };
    forget(&client, &keys, "r1")
        .await
        .expect("the command deletes the answer");
    let again = claim(&session, &keys, &leadership, "a", &request)
        .await
        .expect("claim again");
    assert_eq!(again, Taken::Ours(run_fence), "the lost claim is found to be ours");

    let other = Leadership {
        term: term + 1_000,
        ..leadership.clone()
    };
    let by_another = claim(&session, &keys, &other, "a", &request).await.expect("claim");
    assert_eq!(by_another, Taken::Gone, "the claim is not another term's");
    session.close().await;
}

#[test]
fn the_previous_releases_marker_of_a_taken_run_is_read() {
    let markers: Vec<(String, String)> = crate::coord::record_format::previous_release_records()
        .into_iter()
        .filter(|(path, _)| path.ends_with("/manual"))
        .collect();
    assert!(!markers.is_empty(), "the fixture has a marker");
    for (path, value) in markers {
        let taken: TakenBy = serde_json::from_str(&value).unwrap_or_else(|err| panic!("{path}: {err}"));
        assert!(!taken.id.is_empty() && taken.term > 0, "{path}: {taken:?}");
    }
}
