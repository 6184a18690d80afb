use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::queue::{batches, output_bytes, MAX_QUEUED_OUTPUT};
use super::*;
use crate::coord::keys::Keys;
use crate::rules::config::Job;
use crate::rules::record::{RunRecord, Trigger};

fn at(second: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap()
}

#[test]
fn the_horizon_keeps_the_last_ticks_whether_stepped_or_walked() {
    let job = Job::for_tests("j", "*/10 * * * * *");
    let queue = HistoryQueue::new(3);
    for second in [0, 10, 20, 30, 50] {
        let walked = job.schedule.nth_newest_at_or_before(at(second), 3);
        assert_eq!(queue.horizon(&job, at(second)), walked, "tick {second}");
    }
    assert_eq!(queue.horizon(&job, at(50)), Some(at(30)));
    assert_eq!(HistoryQueue::new(1).horizon(&job, at(50)), Some(at(50)));
}

#[test]
fn keys_sort_by_tick_and_a_manual_run_after_its_seconds_tick() {
    let keys = Keys::new("c");
    let tick = key_of(&keys, "j", at(5), Trigger::Schedule);
    let manual = key_of(&keys, "j", at(5) + chrono::Duration::milliseconds(250), Trigger::Manual);
    let next = key_of(&keys, "j", at(6), Trigger::Schedule);
    assert!(tick < manual && manual < next, "{tick} {manual} {next}");
    assert!(tick.starts_with(&keys.job_runs_prefix("j")));
    assert!(
        !tick.starts_with(&keys.job_runs_prefix("j-")),
        "a job's prefix holds only its own runs"
    );
}

/// More runs of a job than it keeps can ride one transaction (a backlog of short runs), and
/// a tick can come twice (a redelivery). etcd refuses a transaction that puts a key inside a
/// range it deletes, or puts one key twice: the claim carrying them would fail every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_runs_of_a_job_in_one_transaction_keep_only_its_newest() {
    let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
    let client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .expect("client");
    let keys = Keys::new("history");
    let job = Job::for_tests("j", "* * * * * *");
    let queue = HistoryQueue::new(3);
    for second in [0, 1, 2, 3, 4, 5, 6, 6, 7] {
        queue.push(&job, &RunRecord::for_tests(at(second), 100 + second));
    }
    let entries = queue.take_older_than(Duration::ZERO);
    write(&client, &keys, &entries)
        .await
        .expect("one transaction etcd takes");
    let kept = read(&client, &keys, "j", 10, false).await.expect("read");
    let ticks: Vec<DateTime<Utc>> = kept.iter().map(|run| run.scheduled_at).collect();
    assert_eq!(ticks, [at(7), at(6), at(5)]);
}

/// A backfill run of an old tick (older than the live history's horizon) is kept: put
/// beside a live run of the job in one transaction, and not trimmed by the next live run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_backfill_runs_stay_beside_live_runs_until_their_own_bound() {
    let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
    let client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .expect("client");
    let keys = Keys::new("history");
    let job = Job::for_tests("j", "* * * * * *");
    let queue = HistoryQueue::new(3);
    let backfill = |second| RunRecord {
        trigger: Trigger::Backfill,
        ..RunRecord::for_tests(at(second), 900 + second)
    };
    queue.push(&job, &RunRecord::for_tests(at(100), 1));
    queue.push(&job, &backfill(10));
    write(&client, &keys, &queue.take_older_than(Duration::ZERO))
        .await
        .expect("write");
    for second in [101, 102, 103] {
        queue.push(&job, &RunRecord::for_tests(at(second), 1));
        write(&client, &keys, &queue.take_older_than(Duration::ZERO))
            .await
            .expect("write");
    }
    let kept = read(&client, &keys, "j", 10, false).await.expect("read");
    let ticks: Vec<(DateTime<Utc>, Trigger)> = kept.iter().map(|run| (run.scheduled_at, run.trigger)).collect();
    assert_eq!(
        ticks,
        [
            (at(103), Trigger::Schedule),
            (at(102), Trigger::Schedule),
            (at(101), Trigger::Schedule),
            (at(10), Trigger::Backfill)
        ]
    );
    for second in [11, 12, 13, 14] {
        queue.push(&job, &backfill(second));
    }
    write(&client, &keys, &queue.take_older_than(Duration::ZERO))
        .await
        .expect("write");
    let backfilled: Vec<i64> = read(&client, &keys, "j", 10, false)
        .await
        .expect("read")
        .iter()
        .filter(|run| run.trigger == Trigger::Backfill)
        .map(|run| run.fence - 900)
        .collect();
    assert_eq!(backfilled, [14, 13, 12], "backfill runs keep their own last 3");
}

fn with_output(second: i64, bytes: usize) -> RunRecord {
    RunRecord {
        output: Some(crate::rules::record::RunOutput {
            stdout: "x".repeat(bytes),
            ..Default::default()
        }),
        ..RunRecord::for_tests(at(second), 100 + second)
    }
}

#[test]
fn big_outputs_go_in_transactions_of_at_most_a_mebibyte_and_one_entry_always_goes() {
    let job = Job::for_tests("j", "* * * * * *");
    let queue = HistoryQueue::new(100);
    for second in 0..10 {
        queue.push(&job, &with_output(second, 300 * 1024));
    }
    let taken = queue.take_for(job.shard, 100);
    assert_eq!(taken.len(), 3, "three of 300 KiB fit in a mebibyte, four do not");
    let entries = queue.take_older_than(Duration::ZERO);
    let sizes: Vec<usize> = batches(&entries).iter().map(|batch| batch.len()).collect();
    assert_eq!(sizes, [3, 3, 1]);
    queue.push(&job, &with_output(20, 2 * 1024 * 1024));
    assert_eq!(queue.take_for(job.shard, 100).len(), 1, "an entry past the bound alone");
}

#[test]
fn output_waiting_for_etcd_is_bounded_by_dropping_the_oldest() {
    let job = Job::for_tests("j", "* * * * * *");
    let queue = HistoryQueue::new(1000);
    for second in 0..300 {
        queue.push(&job, &with_output(second, 128 * 1024));
    }
    let entries = queue.take_older_than(Duration::ZERO);
    assert_eq!(entries.len(), 300, "every record stays");
    let kept: usize = entries.iter().map(|entry| output_bytes(&entry.record)).sum();
    assert!(kept <= MAX_QUEUED_OUTPUT, "{kept}");
    assert!(kept > MAX_QUEUED_OUTPUT - 128 * 1024, "{kept}");
    assert!(entries[0].record.output.is_none(), "the oldest lost their output");
    assert!(entries[299].record.output.is_some(), "the newest kept it");
    assert_eq!(queue.queued_output.load(Ordering::Relaxed), 0);
}

#[test]
fn history_off_keeps_nothing() {
    let job = Job::for_tests("j", "* * * * * *");
    let queue = HistoryQueue::new(0);
    queue.push(&job, &RunRecord::for_tests(at(0), 1));
    assert!(queue.take_older_than(Duration::ZERO).is_empty());
}
