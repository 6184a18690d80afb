//! Unit tests of the runs: late room, overlap and outrun rules.

use super::late::LATE_ROOM;
use super::overlap::outrun;
use super::overlap::{may_overlap, overlaps, Running};
use super::*;
use crate::rules::config::{Job, Overlap};
use chrono::{DateTime, Utc};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::task::TaskTracker;

fn at(millis: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_800_000_000_000 + millis).unwrap()
}

#[tokio::test]
async fn shards_taking_over_together_share_the_nodes_room_for_late_ticks() {
    let child_env = Arc::new(ChildEnv::of_node(std::env::vars_os(), &[]));
    // Connects on first use, which this test never makes.
    let client = etcd_client::Client::connect(["http://127.0.0.1:9"], None)
        .await
        .expect("a client");
    let groups = Arc::new(Groups::new(
        client,
        crate::coord::keys::Keys::new("c"),
        Duration::from_secs(3),
        Box::new(|_| None),
    ));
    let tracker = TaskTracker::new();
    let settles = Arc::new(BackfillSettles::new(
        groups.client().clone(),
        crate::coord::keys::Keys::new("c"),
        Arc::default(),
        tracker.clone(),
    ));
    let runs = Runs::new(
        tracker,
        Reports::new(Vec::new()),
        settles,
        Arc::default(),
        groups,
        child_env,
    );
    let first = runs.reserve_late(LATE_ROOM - 1_000).expect("room");
    // One claim may pass the room by its own size, never a second one after it.
    let second = runs.reserve_late(5_000).expect("room left before it");
    assert!(runs.reserve_late(1).is_none(), "no room once the reservations fill it");
    assert!(!runs.has_late_room());
    drop(first);
    assert!(runs.has_late_room());
    assert!(runs.reserve_late(1).is_some());
    drop(second);
    assert_eq!(
        runs.late.waiting.load(Ordering::SeqCst),
        0,
        "every reservation given back"
    );
}

#[test]
fn a_waiting_tick_is_outrun_only_behind_runs_longer_than_the_period() {
    let job = Job::for_tests("j", "* * * * * *");
    let took = |millis: i64| Some(chrono::Duration::milliseconds(millis));
    // Tick 0 waited until 2.2 s behind a run of 1.4 s: its next tick is due, skip it.
    assert!(outrun(&job, at(0), false, took(1400), at(2200)));
    // Behind a 3 ms run that only started late (an etcd election, a lease renewal): run it.
    assert!(!outrun(&job, at(0), false, took(3), at(2200)));
    // Its next tick not due yet, or a caught-up tick, or another overlap policy: run it.
    assert!(!outrun(&job, at(0), false, took(1400), at(900)));
    assert!(!outrun(&job, at(0), true, took(1400), at(2200)));
    let allow = Job {
        overlap: Overlap::Allow,
        ..Job::for_tests("j", "* * * * * *")
    };
    assert!(!outrun(&allow, at(0), false, took(1400), at(2200)));
}

#[test]
fn only_a_run_going_for_the_ticks_distance_overlaps_a_tick() {
    let run = |tick: i64, since: i64| Running {
        since: at(since),
        tick: at(tick),
        caught_up: false,
        fence: 1,
    };
    // A run of tick 0 that started 3 ms late and still goes at tick 1000: the tick waits
    // 3 ms, and is skipped if the run still goes then.
    assert!(!overlaps(run(0, 3), at(1000), at(1001)));
    assert!(overlaps(run(0, 3), at(1000), at(1003)));
    // The same run does not overlap a tick before it started.
    assert!(!overlaps(run(0, 3), at(0), at(1003)));
    // Tick 28000 started 990 ms late (its claim waited for a slow etcd) and still goes at
    // tick 29000: the tick waits for it, and is skipped only if it runs 1 s or more.
    assert!(!overlaps(run(28000, 28990), at(29000), at(29008)));
    assert!(may_overlap(run(28000, 28990), at(29000)));
    assert!(overlaps(run(28000, 28990), at(29000), at(29990)));
    // Tick 3000 started half a period late and still goes at tick 4000, having run half a
    // period: it may yet end in less than a period, so tick 4000 waits.
    assert!(!overlaps(run(3000, 3500), at(4000), at(4000)));
    assert!(overlaps(run(3000, 3500), at(4000), at(4500)));
    // A run that hangs: each tick it meets waits the 990 ms it started late, then is skipped.
    assert!(!overlaps(run(28000, 28990), at(31000), at(31000)));
    assert!(overlaps(run(28000, 28990), at(31000), at(31990)));
    // Catch-up: tick 3000 running since 4980: tick 5000 waits behind it.
    assert!(!overlaps(run(3000, 4980), at(5000), at(5001)));
    // A claim that waited out an etcd election: tick 15000 started at 17200.
    assert!(!may_overlap(run(15000, 17200), at(17000)));
    // The last tick a new leader caught up, started just before the next live tick: still a
    // backlog, so the live tick queues behind it, whatever it takes.
    let caught_up = Running {
        caught_up: true,
        ..run(34000, 34900)
    };
    assert!(!may_overlap(caught_up, at(35000)));
    assert!(!overlaps(caught_up, at(40000), at(40000)));
}

#[test]
fn the_job_table_answers_each_overlap_policy() {
    let job = |overlap: Overlap| Job {
        overlap,
        ..Job::for_tests("j", "* * * * * *")
    };
    let running = Running {
        since: at(3),
        tick: at(0),
        caught_up: false,
        fence: 1,
    };
    let counted = |entered: Entered| match entered {
        Entered::Counted(entry) => Some((entry.turn.map(|(_, number)| number), entry.met.is_some())),
        _ => None,
    };

    // skip: a run going past the tick's distance skips it at once; one that may still end in
    // time is met, and the tick waits for it; a late tick never meets one.
    let table = JobTable::default();
    let skip = job(Overlap::Skip);
    assert_eq!(
        counted(table.enter(&skip, true, false, at(0), at(0))),
        Some((Some(1), false))
    );
    table.mark_running("j", Some(running));
    assert!(matches!(
        table.enter(&skip, true, false, at(1000), at(1003)),
        Entered::Overlapped
    ));
    assert_eq!(
        counted(table.enter(&skip, true, false, at(1000), at(1001))),
        Some((Some(2), true))
    );
    assert_eq!(
        counted(table.enter(&skip, true, true, at(1000), at(1001))),
        Some((Some(3), false))
    );
    assert!(table.still_overlaps("j", running, at(1000), at(1003)));
    assert!(!table.still_overlaps("j", running, at(1000), at(1001)));

    // replace: a sequence while another is counted stops it; the older one, reaching the turn
    // after the newer one was counted, starts out replaced.
    let table = JobTable::default();
    let replace = job(Overlap::Replace);
    assert_eq!(
        counted(table.enter(&replace, true, false, at(0), at(0))),
        Some((Some(1), false))
    );
    assert!(matches!(
        table.enter(&replace, true, false, at(1000), at(1000)),
        Entered::Replacing(_)
    ));
    assert!(table.take_turn("j", Overlap::Replace, 1).is_cancelled());
    assert!(!table.take_turn("j", Overlap::Replace, 2).is_cancelled());

    // allow: no turn at all.
    let table = JobTable::default();
    assert_eq!(
        counted(table.enter(&job(Overlap::Allow), true, false, at(0), at(0))),
        Some((None, false))
    );

    // A backfill run takes no turn; while only backfill runs go, another may be claimed, and
    // the job's entry goes with its last sequence.
    let table = JobTable::default();
    assert_eq!(
        counted(table.enter(&skip, false, false, at(0), at(5000))),
        Some((None, false))
    );
    assert!(table.only_backfills("j"));
    assert_eq!(table.backfilling("j"), 1);
    assert_eq!(
        counted(table.enter(&skip, true, false, at(6000), at(6000))),
        Some((Some(1), false))
    );
    assert!(!table.only_backfills("j"));
    table.leave_backfill("j");
    table.release_turn("j");
    assert_eq!(table.backfilling("j"), 0);
    assert!(table.last_took("j").is_none());
}
