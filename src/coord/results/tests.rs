use super::*;
use chrono::{DateTime, Utc};

fn record(second: i64) -> RunRecord {
    RunRecord::for_tests(DateTime::<Utc>::from_timestamp(second, 0).unwrap(), 1)
}

#[test]
fn a_success_replaced_by_a_newer_failure_before_it_was_written_is_still_written() {
    let queue = ResultQueue::default();
    queue.push("j", 0, record(10));
    let mut failed = record(11);
    failed.exit_code = Some(1);
    queue.push("j", 0, failed.clone());
    let riders = queue.take_for(0, 10);
    assert_eq!(riders.len(), 1);
    assert_eq!(riders[0].record, failed, "the newest result");
    assert_eq!(
        riders[0].unwritten_success(),
        Some(&record(10)),
        "the success it replaced rides with it"
    );
    assert_eq!(
        ledger::result_op_count(&riders[0].record, riders[0].unwritten_success()),
        2
    );
    queue.settle(riders, true);
    assert!(queue.take_for(0, 10).is_empty(), "both written");
    // A success after it writes itself and forgets the older one.
    queue.push("k", 0, record(10));
    queue.push("k", 0, failed.clone());
    queue.push("k", 0, record(12));
    let riders = queue.take_for(0, 10);
    assert_eq!(riders[0].unwritten_success(), None);
}

#[test]
fn riders_fit_the_operations_left_and_a_success_takes_two() {
    let queue = ResultQueue::default();
    let mut failed = record(10);
    failed.exit_code = Some(1);
    queue.push("failed", 0, failed);
    queue.push("succeeded", 0, record(10));
    // A success writes its result and the job's last success.
    let riders = queue.take_for(0, 2);
    let ops: usize = riders
        .iter()
        .map(|rider| ledger::result_op_count(&rider.record, rider.unwritten_success()))
        .sum();
    assert!(ops <= 2, "{ops} operations in a room of 2");
    queue.settle(riders, false);
    let riders = queue.take_for(0, 3);
    assert_eq!(riders.len(), 2, "a failure (1) and a success (2) fill a room of 3");
    queue.settle(riders, false);
    assert_eq!(
        queue
            .take_for(0, 1)
            .iter()
            .map(|rider| rider.job.as_str())
            .collect::<Vec<_>>(),
        ["failed"]
    );
}

#[test]
fn claims_carry_their_shards_results_and_the_newest_wins() {
    let queue = ResultQueue::default();
    queue.push("a", 0, record(10));
    queue.push("a", 0, record(9));
    queue.push("b", 1, record(10));
    queue.push("c", 0, record(11));
    let mut riders = queue.take_for(0, 10);
    riders.sort_by(|x, y| x.job.cmp(&y.job));
    assert_eq!(riders.len(), 2);
    assert_eq!(
        (riders[0].job.as_str(), riders[0].record.scheduled_at.timestamp()),
        ("a", 10)
    );
    assert!(queue.take_for(0, 10).is_empty(), "riding results are not taken twice");
    assert!(
        queue
            .take_older_than(Duration::ZERO)
            .iter()
            .all(|entry| entry.shard == 1),
        "nothing writes a riding job's result"
    );

    queue.push("a", 0, record(12));
    queue.settle(riders, true);
    assert!(
        queue.take_older_than(Duration::from_secs(1)).is_empty(),
        "a's newer result came during the claim: its window starts after it"
    );
    let left = queue.take_older_than(Duration::ZERO);
    let jobs: Vec<(&str, i64)> = left
        .iter()
        .map(|entry| (entry.job.as_str(), entry.record.scheduled_at.timestamp()))
        .collect();
    assert_eq!(
        jobs,
        vec![("a", 12)],
        "c was written by its claim; a's newer result waits"
    );
}

#[test]
fn a_failed_claim_frees_its_riders_and_a_failed_write_keeps_them() {
    let queue = ResultQueue::default();
    queue.push("a", 0, record(10));
    let riders = queue.take_for(0, 10);
    queue.settle(riders, false);
    assert_eq!(queue.take_for(0, 10).len(), 1, "free to ride again");
    let queue = ResultQueue::default();
    queue.push("a", 0, record(10));
    let batch = queue.take_older_than(Duration::ZERO);
    queue.push("a", 0, record(11));
    queue.put_back(batch);
    let left = queue.take_older_than(Duration::ZERO);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].record.scheduled_at.timestamp(), 11, "the newer result wins");
}
