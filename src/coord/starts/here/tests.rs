use super::*;

fn at(second: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap()
}

#[test]
fn a_start_is_remembered_until_a_written_record_no_longer_lists_it() {
    let here = StartedHere::default();
    here.remember("j", at(1));
    here.remember("j", at(2));
    here.written("j", &[at(2), at(3)]);
    assert!(!here.contains("j", at(1)), "settled by the write");
    assert!(here.contains("j", at(2)), "still listed as pending");
    assert!(!here.contains("other", at(2)));
    here.written("j", &[]);
    assert!(here.lock().is_empty(), "no job kept once every start is written");
}

#[test]
fn a_job_never_written_again_keeps_only_its_newest_starts() {
    let here = StartedHere::default();
    for second in 0..(REMEMBERED_PER_JOB as i64 + 10) {
        here.remember("j", at(second));
    }
    assert!(!here.contains("j", at(9)));
    assert!(here.contains("j", at(10)));
    assert_eq!(here.lock()["j"].len(), REMEMBERED_PER_JOB);
}

fn going(node: &str, fence: i64) -> Going {
    Going {
        node: node.to_string(),
        tick: at(fence),
        fence,
        lease: 7,
        since: at(fence),
    }
}

#[test]
fn only_runs_that_await_their_listing_keep_what_the_write_showed() {
    let here = StartedHere::default();
    assert!(here.run_going("j", going("me", 10), false), "a scheduled run");
    assert!(here.run_going("j", going("me", 11), true), "a manual run");
    assert!(
        here.run_going("j", going("me", 12), true),
        "a manual run the write misses"
    );
    let record = Claim {
        node: "me".to_string(),
        term: 3,
        going: vec![going("me", 10), going("me", 11), going("other", 9)],
        ..Claim::default()
    };
    here.record_written("j", &record, "me", 3);
    let landed = lock(&here.landed);
    let runs = &landed["j"];
    assert_eq!(
        runs.keys().copied().collect::<Vec<_>>(),
        vec![11],
        "only the listed run awaiting it"
    );
    assert_eq!(
        runs[&11].going,
        vec![going("other", 9)],
        "beside it: the other node's run"
    );
    drop(landed);
    here.run_ended("j", 12);
    assert!(
        lock(&here.landing_awaited).is_empty(),
        "a run that ended awaits nothing"
    );
    here.run_ended("j", 11);
    assert!(lock(&here.landed).is_empty());
}

#[test]
fn the_next_run_of_a_backlog_is_not_taken_for_ended_with_the_one_before() {
    let here = StartedHere::default();
    // One claim won both ticks of a backlog: their runs share its fence.
    let first = Going {
        tick: at(40),
        ..going("b", 500)
    };
    let next = Going {
        tick: at(44),
        ..going("b", 500)
    };
    here.ended_elsewhere("j", &first);
    assert!(here.seen_ended("j", &first));
    assert!(!here.seen_ended("j", &next), "the backlog's next run goes on");
    let record = Claim {
        node: "b".to_string(),
        going: vec![next.clone()],
        ..Claim::default()
    };
    let going = crate::rules::protocol::going_after(Some(&record), None, "me", |run| here.seen_ended("j", run));
    assert_eq!(going, vec![next], "a write keeps listing it");
}
