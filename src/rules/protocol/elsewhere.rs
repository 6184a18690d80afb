//! Whether a run of a job that its record lists as going on another node ([`Going`]) has
//! ended, from what etcd shows of it: the records its node wrote of its end, the lease it is
//! listed on, and its node's answer to a leader that asks about it.
//!
//! A listing rides its node's claims, so it may be old: a run that ended stays listed until
//! its node writes again, and that write may be held up (its etcd member died, its node
//! stalls). A leader therefore never takes a listing alone for a run still going: it starts
//! its tick beside the listed run once that run has ended as etcd shows it, skips the tick
//! (`overlap = "skip"`) only when the run's node has said the run had gone on past the tick,
//! and waits while neither is known.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::rules::record::{Claim, Going};

/// What a run's node answers a leader asking whether the run still goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Answer {
    /// It goes, and had gone on this long by its node's clock when the node answered.
    Going { age: Duration },
    /// It no longer goes (or the node does not know it: it ended before the node restarted).
    Ended,
}

/// The longest age an answer may carry; more is read as no answer.
const MAX_AGE: Duration = Duration::from_secs(366 * 24 * 3600);

impl Answer {
    /// The answer as the node writes it into the ask's key.
    pub(crate) fn to_value(self) -> String {
        match self {
            Answer::Going { age } => format!("going {}", age.as_millis()),
            Answer::Ended => "ended".to_string(),
        }
    }

    /// The answer in an ask's key, if its node has answered; anything else is no answer.
    pub(crate) fn parse(value: &[u8]) -> Option<Answer> {
        let value = std::str::from_utf8(value).ok()?;
        if value == "ended" {
            return Some(Answer::Ended);
        }
        let millis: u64 = value.strip_prefix("going ")?.parse().ok()?;
        let age = Duration::from_millis(millis);
        (age <= MAX_AGE).then_some(Answer::Going { age })
    }
}

/// What etcd shows of a listed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shown {
    /// Whether etcd holds a record of this run's end: its history entry, or the job's result
    /// while it is this run's (its node, tick and fence). Not any later record: the
    /// successor's records of ticks it skipped beside the run, or a run of the same node that
    /// never started, have higher fences and say nothing of this one.
    pub(crate) end_recorded: bool,
    /// Whether etcd still holds the lease the run is listed on.
    pub(crate) lease_held: bool,
    /// The node's answer about the run, if it has answered.
    pub(crate) answer: Option<Answer>,
}

/// What a leader makes of a listed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It has ended: a tick may start beside it.
    Ended,
    /// Its node said it had gone on this long.
    WentOnFor(Duration),
    /// Not known yet: its node has not answered, or not since it was asked again.
    Unknown,
}

/// What `shown` says of the run it shows.
pub(crate) fn verdict(shown: &Shown) -> Verdict {
    match shown.answer {
        _ if shown.end_recorded || !shown.lease_held => Verdict::Ended,
        Some(Answer::Ended) => Verdict::Ended,
        Some(Answer::Going { age }) => Verdict::WentOnFor(age),
        None => Verdict::Unknown,
    }
}

/// What a record shows beside its writer's own runs, for a run that takes no claim of the
/// schedule (a manual or backfill run): such a run starts only once a write lists it, and
/// then waits for what that write showed. A later write of another leader sees the listing
/// and waits for the run instead; an earlier one did not, so what it claimed may start (or
/// go on) beside it. Two leaders of one job at once are the two shard counts of a rolling
/// change of `shards`, whose claims see each other's runs only through the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Beside {
    /// Other nodes' runs the record lists as going.
    pub(crate) going: Vec<Going>,
    /// Ticks other leaderships claimed and had not started when they last wrote, nor
    /// released: each may have started since, listed only by that leader's next write.
    pub(crate) claimed: Vec<ClaimedTick>,
}

/// A tick another leadership claimed, as a record lists it pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimedTick {
    pub(crate) node: String,
    pub(crate) term: i64,
    pub(crate) tick: DateTime<Utc>,
}

/// What `record`, written by the leadership `term` of `node`, shows beside that node's runs.
pub(crate) fn beside(record: &Claim, node: &str, term: i64) -> Beside {
    let going = record.going.iter().filter(|run| run.node != node).cloned().collect();
    let claimed = record
        .debts()
        .filter(|debt| !debt.released)
        .filter(|debt| debt.node != node || debt.term != term)
        .flat_map(|debt| {
            debt.pending.into_iter().map(move |tick| ClaimedTick {
                node: debt.node.clone(),
                term: debt.term,
                tick,
            })
        })
        .collect();
    Beside { going, claimed }
}

/// Whether `record` still lists `claimed` pending: its leader has not written since it started
/// (or settled) the tick. Once it has, that write lists the tick's run if it goes.
pub(crate) fn still_claimed(record: &Claim, claimed: &ClaimedTick) -> bool {
    record
        .debts()
        .any(|debt| debt.node == claimed.node && debt.term == claimed.term && debt.pending.contains(&claimed.tick))
}

/// Whether an on-time tick at `scheduled_at` of an `overlap = "skip"` job is skipped beside
/// `run`, which its node said had gone on for `age`: the run went on for at least the time
/// between its tick and this one, so it was still going when this tick was due (it started
/// no earlier than its tick), as the same rule on one node reads it. The age is by the run's
/// own node's clock, as its start is, so no clock skew enters. An answer of any age says
/// nothing of when the run ended: it may be older than this tick.
pub(crate) fn skips_beside(run: &Going, age: Duration, scheduled_at: DateTime<Utc>) -> bool {
    chrono::Duration::from_std(age).is_ok_and(|age| age >= scheduled_at - run.tick)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::DateTime;

    use super::{beside, skips_beside, still_claimed, verdict, Answer, ClaimedTick, Shown, Verdict};
    use crate::rules::record::{Claim, Debt, Going};

    fn run(fence: i64) -> Going {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        Going {
            node: "b".into(),
            tick: at,
            fence,
            lease: 7,
            since: at,
        }
    }

    #[test]
    fn answers_round_trip_and_anything_else_is_none() {
        for answer in [
            Answer::Ended,
            Answer::Going {
                age: Duration::from_millis(1500),
            },
        ] {
            assert_eq!(Answer::parse(answer.to_value().as_bytes()), Some(answer));
        }
        for value in [
            "",
            "?",
            "going",
            "going -1",
            "going 1.5",
            "going 99999999999999999999",
            "Ended",
        ] {
            assert_eq!(Answer::parse(value.as_bytes()), None, "{value:?}");
        }
        assert_eq!(Answer::parse(&[0xff, 0xfe]), None);
    }

    #[test]
    fn a_listed_run_is_ended_going_or_unknown() {
        let shown = |end_recorded, lease_held, answer| Shown {
            end_recorded,
            lease_held,
            answer,
        };
        let going = Some(Answer::Going {
            age: Duration::from_secs(3),
        });
        let cases = [
            (shown(false, true, None), Verdict::Unknown),
            (shown(true, true, None), Verdict::Ended),
            (shown(true, true, going), Verdict::Ended),
            (shown(false, false, going), Verdict::Ended),
            (shown(false, true, Some(Answer::Ended)), Verdict::Ended),
            (shown(false, true, going), Verdict::WentOnFor(Duration::from_secs(3))),
        ];
        for (shown, expected) in cases {
            assert_eq!(verdict(&shown), expected, "{shown:?}");
        }
    }

    #[test]
    fn a_tick_is_skipped_only_once_the_run_went_on_past_it() {
        let run = run(10);
        let next = run.tick + chrono::Duration::seconds(2);
        assert!(!skips_beside(&run, Duration::from_millis(1999), next));
        assert!(skips_beside(&run, Duration::from_secs(2), next));
        assert!(!skips_beside(
            &run,
            Duration::from_secs(3),
            next + chrono::Duration::seconds(2)
        ));
    }

    #[test]
    fn beside_a_writers_runs_are_other_nodes_runs_and_other_leaderships_unreleased_claims() {
        let at = |second: i64| DateTime::from_timestamp(1_800_000_000 + second, 0).unwrap_or_default();
        let debt = |node: &str, term: i64, ticks: &[i64], released: bool| Debt {
            term,
            node: node.into(),
            shards: Some(3),
            pool: None,
            pending: ticks.iter().map(|second| at(*second)).collect(),
            released,
        };
        let mut mine = run(20);
        mine.node = "a".into();
        let record = Claim {
            scheduled_at: at(9),
            term: 5,
            node: "a".into(),
            pending: vec![at(9)],
            shards: Some(5),
            pool: None,
            schedule: None,
            others: vec![
                debt("c", 7, &[4, 8], false),
                debt("b", 3, &[2], true),
                debt("a", 2, &[1], false),
            ],
            released: false,
            going: vec![mine, run(10)],
        };
        let shown = beside(&record, "a", 5);
        assert_eq!(shown.going, vec![run(10)], "the writer's own run is not beside itself");
        let claimed: Vec<(&str, i64, i64)> = shown
            .claimed
            .iter()
            .map(|claimed| {
                (
                    claimed.node.as_str(),
                    claimed.term,
                    claimed.tick.timestamp() - 1_800_000_000,
                )
            })
            .collect();
        // Not the writer's own pending tick, not a released debt's; an earlier leadership of the
        // writer's node is another leadership.
        assert_eq!(claimed, vec![("c", 7, 4), ("c", 7, 8), ("a", 2, 1)]);
        assert!(still_claimed(&record, &shown.claimed[0]));
        let started = ClaimedTick {
            node: "c".into(),
            term: 7,
            tick: at(5),
        };
        assert!(!still_claimed(&record, &started));
    }
}
