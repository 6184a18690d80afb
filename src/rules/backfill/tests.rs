//! What a backfill refuses, and how its claims go, by cases.

use chrono::{DateTime, Utc};

use super::{ticks, Ask, Backfill, Refused};
use crate::rules::config::Job;

fn at(minute: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + minute * 60, 0).unwrap_or_default()
}

fn ask(from: i64, to: i64) -> Ask {
    Ask {
        from: at(from),
        to: at(to),
        max: 1000,
        parallel: 1,
    }
}

#[test]
fn the_ticks_of_a_past_range_oldest_first() {
    let job = Job::for_tests("report", "* * * * *");
    let fires = ticks(&job, &ask(0, 20), at(30)).expect("twenty ticks");
    let ticks: Vec<DateTime<Utc>> = fires.iter().map(|fire| fire.at).collect();
    assert_eq!(ticks, (0..20).map(at).collect::<Vec<_>>(), "from included, to excluded");
}

#[test]
fn refusals() {
    let job = Job::for_tests("report", "* * * * *");
    let yearly = Job::for_tests("yearly", "0 0 1 1 *");
    let cases = [
        (
            &job,
            ask(10, 10),
            Refused::EmptyRange {
                from: at(10),
                to: at(10),
            },
        ),
        (
            &job,
            ask(0, 40),
            Refused::InTheFuture {
                to: at(40),
                now: at(30),
            },
        ),
        (&job, Ask { max: 5, ..ask(0, 20) }, Refused::TooMany { max: 5 }),
        (&yearly, ask(0, 20), Refused::NoTick),
        (&job, Ask { max: 0, ..ask(0, 20) }, Refused::Max),
        (
            &job,
            Ask {
                parallel: 0,
                ..ask(0, 20)
            },
            Refused::Parallel,
        ),
    ];
    for (job, ask, refused) in cases {
        assert_eq!(ticks(job, &ask, at(30)).map(|fires| fires.len()), Err(refused));
    }
    assert_eq!(
        ticks(&job, &Ask { max: 20, ..ask(0, 20) }, at(30)).map(|fires| fires.len()),
        Ok(20)
    );
    assert_eq!(
        Refused::EmptyRange {
            from: at(10),
            to: at(10)
        }
        .to_string(),
        "--from 2027-01-15T08:10:00Z is not before --to 2027-01-15T08:10:00Z"
    );
}

/// A per-minute job's backfill of 4 ticks, 2 at a time.
fn four_ticks_two_at_a_time() -> (Job, Backfill) {
    let job = Job::for_tests("report", "* * * * *");
    let ask = Ask {
        parallel: 2,
        ..ask(0, 4)
    };
    let fires = ticks(&job, &ask, at(30)).expect("ticks");
    let backfill = Backfill::new("b1".into(), &ask, &fires, at(30));
    (job, backfill)
}

#[test]
fn claims_go_in_order_at_most_parallel_at_once_until_cancelled() {
    let (job, mut backfill) = four_ticks_two_at_a_time();
    for expected in [at(0), at(1)] {
        let next = backfill.next_claim(&job).expect("a tick to claim");
        assert_eq!(next.tick, expected);
        backfill.claim(next, "a", 7, &format!("a{}", next.tick), None);
    }
    assert_eq!(backfill.next_claim(&job), None, "two in flight");
    assert!(backfill.finish(at(1), &format!("a{}", at(1))));
    assert!(!backfill.finish(at(1), &format!("a{}", at(1))), "counted once");
    assert_eq!(backfill.next_claim(&job).map(|next| next.tick), Some(at(2)));
    backfill.cancelled = true;
    assert_eq!(backfill.next_claim(&job), None);
    assert!(!backfill.is_over(), "a tick still in flight");
    assert!(backfill.finish(at(0), &format!("a{}", at(0))));
    assert!(backfill.is_over());
    assert_eq!(backfill.progress(), (2, 4));
}

#[test]
fn a_gone_nodes_ticks_go_back_first_flagged_or_are_recorded_lost() {
    let (job, mut backfill) = four_ticks_two_at_a_time();
    for node in ["a", "b"] {
        let next = backfill.next_claim(&job).expect("a tick");
        backfill.claim(next, node, 7, node, None);
    }
    let orphans = backfill.orphans(|flight| flight.node == "a");
    assert_eq!(orphans.len(), 1);
    assert_eq!(orphans[0].tick, at(0));
    assert!(backfill.give_back(at(0), "a", true));
    assert!(!backfill.give_back(at(0), "a", true), "once");
    assert!(!backfill.finish(at(0), "a"), "its node's late end counts nothing");
    let next = backfill.next_claim(&job).expect("the given back tick first");
    assert_eq!((next.tick, next.redelivered), (at(0), true));
    backfill.claim(next, "a", 9, "a-again", None);
    assert!(
        !backfill.finish(at(0), "a"),
        "the earlier claim's late count settles nothing"
    );
    assert!(backfill.record_lost(at(1), "b"));
    let next = backfill.next_claim(&job).expect("then the next unclaimed tick");
    assert_eq!((next.tick, next.redelivered), (at(2), false));
    assert!(backfill.finish(at(0), "a-again"));
    assert_eq!(backfill.progress(), (2, 4));
    assert_eq!(backfill.lost, 1);
    assert!(!backfill.is_over());
}

#[test]
fn a_schedule_with_fewer_ticks_after_a_reload_ends_the_backfill_with_those_it_has() {
    let job = Job::for_tests("report", "* * * * *");
    let ask = ask(0, 4);
    let fires = ticks(&job, &ask, at(30)).expect("ticks");
    let mut backfill = Backfill::new("b1".into(), &ask, &fires, at(30));
    let next = backfill.next_claim(&job).expect("a tick");
    backfill.claim(next, "a", 1, "c1", None);
    assert!(backfill.finish(next.tick, "c1"));
    let hourly = Job::for_tests("report", "0 * * * *");
    assert_eq!(backfill.next_claim(&hourly), None, "the next hour is past the range");
    assert!(!backfill.clone().ran_out(&job), "the old schedule has ticks left");
    assert!(backfill.ran_out(&hourly));
    assert_eq!(backfill.progress(), (1, 1));
    assert!(backfill.is_over());
}
