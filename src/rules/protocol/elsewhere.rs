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

use crate::rules::record::Going;

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
    /// The highest fence of a record of the run's end its node wrote: its history entry, or
    /// the job's result written by that node. Not any result: the successor's own records of
    /// ticks it skipped beside the run have higher fences.
    pub(crate) ended_fence: Option<i64>,
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

/// What `shown` says of `run`.
pub(crate) fn verdict(shown: &Shown, run: &Going) -> Verdict {
    let recorded_end = shown.ended_fence.is_some_and(|fence| fence >= run.fence);
    match shown.answer {
        _ if recorded_end || !shown.lease_held => Verdict::Ended,
        Some(Answer::Ended) => Verdict::Ended,
        Some(Answer::Going { age }) => Verdict::WentOnFor(age),
        None => Verdict::Unknown,
    }
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

    use super::{skips_beside, verdict, Answer, Shown, Verdict};
    use crate::rules::record::Going;

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
        let shown = |ended_fence, lease_held, answer| Shown {
            ended_fence,
            lease_held,
            answer,
        };
        let going = Some(Answer::Going {
            age: Duration::from_secs(3),
        });
        let cases = [
            (shown(None, true, None), Verdict::Unknown),
            (shown(Some(9), true, None), Verdict::Unknown),
            (shown(Some(10), true, None), Verdict::Ended),
            (shown(Some(11), true, going), Verdict::Ended),
            (shown(None, false, going), Verdict::Ended),
            (shown(None, true, Some(Answer::Ended)), Verdict::Ended),
            (shown(None, true, going), Verdict::WentOnFor(Duration::from_secs(3))),
        ];
        for (shown, expected) in cases {
            assert_eq!(verdict(&shown, &run(10)), expected, "{shown:?}");
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
}
