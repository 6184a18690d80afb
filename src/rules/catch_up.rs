//! Which missed ticks a new leader runs: a pure function of the job's policy, its last claimed
//! tick and now.

use chrono::{DateTime, Utc};

use crate::rules::config::{CatchUp, Job};

/// At most this many missed ticks of one job are run per takeover.
pub const MAX_CATCH_UP: usize = 100;

/// At most how many ticks of one job a leader owes at once (claimed, not started). Its record
/// lists each of them, and a claim writes up to 100 records in one request: 100 ticks a record
/// keeps that request near 0.3 MiB, under etcd's 1.5 MiB limit, and a start rewrites at most that
/// many. A longer backlog is claimed in parts as its ticks start.
pub const MAX_OWED: usize = 100;

/// The missed ticks to run, oldest first, and how the policy trimmed them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Missed {
    pub ticks: Vec<DateTime<Utc>>,
    /// More ticks were missed than [`MAX_CATCH_UP`]; the oldest were left out.
    pub truncated: bool,
}

/// Ticks of `job` after `last_claimed` up to `now` that nobody ran, filtered by `catch_up` and
/// `starting_deadline`. A job with no claim yet has missed nothing: it starts from now.
pub fn missed_ticks(job: &Job, last_claimed: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Missed {
    let Some(floor) = floor(job, last_claimed, now) else {
        return Missed::default();
    };
    let limit = match job.catch_up {
        CatchUp::None => return Missed::default(),
        CatchUp::Latest => 1,
        CatchUp::All => MAX_CATCH_UP,
    };
    let (ticks, more) = job.schedule.newest_ticks_between(floor, now, limit);
    Missed {
        ticks,
        truncated: more && job.catch_up == CatchUp::All,
    }
}

/// At most this many missed ticks are counted for a `missed` notification: "1000 or more".
pub const MAX_LEFT_OUT_COUNTED: usize = 1000;

/// The ticks of `job` in `(last_claimed, took_over]` that a takeover which catches up `caught`
/// of them (the newest) leaves out, by its `catch_up` or `starting_deadline`: how many (at most
/// [`MAX_LEFT_OUT_COUNTED`]) and the newest of them. `None` if it leaves none out.
pub fn left_out(
    job: &Job,
    last_claimed: Option<DateTime<Utc>>,
    took_over: DateTime<Utc>,
    caught: usize,
) -> Option<(usize, DateTime<Utc>)> {
    let (ticks, _) = job
        .schedule
        .newest_ticks_between(last_claimed?, took_over, MAX_LEFT_OUT_COUNTED + caught);
    let count = ticks.len().checked_sub(caught).filter(|count| *count > 0)?;
    Some((count.min(MAX_LEFT_OUT_COUNTED), ticks[count - 1]))
}

/// Whether [`missed_ticks`] has any tick for `job`, in one schedule step instead of up to
/// [`MAX_CATCH_UP`] of them.
pub fn misses_any(job: &Job, last_claimed: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    job.catch_up != CatchUp::None
        && floor(job, last_claimed, now)
            .and_then(|floor| job.schedule.next_after(floor))
            .is_some_and(|tick| tick <= now)
}

/// Ticks of `job` due after `took_over` up to `now`, and after `last_claimed`: the ticks a leader
/// that took the shard over at `took_over` and claims the job's backlog only now (the node had no
/// room for it sooner) owes in full. They came due while it led, so neither `catch_up` nor
/// [`MAX_CATCH_UP`] leaves any out; `starting_deadline` still does, as for any tick that could not
/// start in time. Only the oldest `limit` are returned: the caller claims a long backlog in parts.
pub fn due_since(
    job: &Job,
    last_claimed: Option<DateTime<Utc>>,
    took_over: DateTime<Utc>,
    now: DateTime<Utc>,
    limit: usize,
) -> Vec<DateTime<Utc>> {
    let mut after = owed_after(job, last_claimed, took_over, now);
    let mut ticks = Vec::new();
    while ticks.len() < limit {
        let Some(tick) = job.schedule.next_after(after).filter(|tick| *tick <= now) else {
            break;
        };
        ticks.push(tick);
        after = tick;
    }
    ticks
}

/// Ticks of `job` after `after` and before `before`, oldest first, at most `limit`: the ticks an
/// on-time claim would skip when the record it finds claimed less far than its leader's queue.
pub fn between(job: &Job, after: DateTime<Utc>, before: DateTime<Utc>, limit: usize) -> Vec<DateTime<Utc>> {
    let mut ticks = Vec::new();
    let mut from = after;
    while ticks.len() < limit {
        let Some(tick) = job.schedule.next_after(from).filter(|tick| *tick < before) else {
            break;
        };
        ticks.push(tick);
        from = tick;
    }
    ticks
}

/// The part of a job's backlog to claim now, oldest first, when it already owes `owed` ticks:
/// at most [`MAX_OWED`] owed in all. The flag says ticks were left for a later part.
pub fn backlog_part(
    job: &Job,
    mut missed: Vec<DateTime<Utc>>,
    last_claimed: Option<DateTime<Utc>>,
    took_over: DateTime<Utc>,
    now: DateTime<Utc>,
    owed: usize,
) -> (Vec<DateTime<Utc>>, bool) {
    let room = MAX_OWED.saturating_sub(owed);
    if missed.len() >= room {
        let more = missed.len() > room || any_due_since(job, last_claimed.max(missed.last().copied()), took_over, now);
        missed.truncate(room);
        return (missed, more);
    }
    let after = last_claimed.max(missed.last().copied());
    // One more than fits says whether any were left.
    let mut due = due_since(job, after, took_over, now, room - missed.len() + 1);
    let more = due.len() > room - missed.len();
    due.truncate(room - missed.len());
    missed.extend(due);
    (missed, more)
}

/// Whether [`due_since`] has any tick for `job`, in one schedule step.
pub fn any_due_since(
    job: &Job,
    last_claimed: Option<DateTime<Utc>>,
    took_over: DateTime<Utc>,
    now: DateTime<Utc>,
) -> bool {
    job.schedule
        .next_after(owed_after(job, last_claimed, took_over, now))
        .is_some_and(|tick| tick <= now)
}

/// The instant after which [`due_since`] counts ticks.
fn owed_after(
    job: &Job,
    last_claimed: Option<DateTime<Utc>>,
    took_over: DateTime<Utc>,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    let after = last_claimed.map_or(took_over, |last| last.max(took_over));
    oldest_to_run(job, now).map_or(after, |oldest| after.max(oldest))
}

/// The instant after which a tick counts as missed: the last claimed tick, or the oldest a
/// `starting_deadline` still runs. None for a job with no claim yet.
fn floor(job: &Job, last_claimed: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let last = last_claimed?;
    Some(oldest_to_run(job, now).map_or(last, |oldest| last.max(oldest)))
}

/// `now` less the job's `starting_deadline`: a tick no later than this is too old to start.
fn oldest_to_run(job: &Job, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    job.starting_deadline
        .and_then(|deadline| chrono::Duration::from_std(deadline).ok())
        .map(|deadline| now - deadline)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_takeover_leaves_out_the_older_missed_ticks_and_names_the_newest_of_them() {
        let job = Job::for_tests("j", "* * * * *");
        let last = Some(at("2027-01-05T10:00:00Z"));
        let took_over = at("2027-01-05T10:10:30Z");
        // Ten ticks missed, 10:01 to 10:10; `latest` catches up one.
        assert_eq!(
            left_out(&job, last, took_over, 1),
            Some((9, at("2027-01-05T10:09:00Z")))
        );
        assert_eq!(left_out(&job, last, took_over, 10), None);
        assert_eq!(
            left_out(&job, None, took_over, 0),
            None,
            "a job never claimed missed nothing"
        );
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn job(catch_up: CatchUp, starting_deadline: Option<u64>) -> Job {
        Job {
            catch_up,
            starting_deadline: starting_deadline.map(Duration::from_secs),
            ..Job::for_tests("j", "* * * * * *")
        }
    }

    #[test]
    fn policies() {
        let last = Some(at("2027-01-01T00:00:00Z"));
        let now = at("2027-01-01T00:00:05.500Z");
        let secs = |list: &[u32]| {
            list.iter()
                .map(|s| at(&format!("2027-01-01T00:00:0{s}Z")))
                .collect::<Vec<_>>()
        };
        let cases = [
            (job(CatchUp::All, None), last, secs(&[1, 2, 3, 4, 5])),
            (job(CatchUp::Latest, None), last, secs(&[5])),
            (job(CatchUp::None, None), last, vec![]),
            (job(CatchUp::All, Some(2)), last, secs(&[4, 5])),
            (job(CatchUp::All, None), None, vec![]),
            (job(CatchUp::Latest, None), Some(at("2027-01-01T00:00:05Z")), vec![]),
        ];
        for (job, last, expected) in cases {
            assert_eq!(
                missed_ticks(&job, last, now).ticks,
                expected,
                "{:?} {:?} from {last:?}",
                job.catch_up,
                job.starting_deadline
            );
            assert_eq!(
                misses_any(&job, last, now),
                !expected.is_empty(),
                "misses_any, {:?} {:?} from {last:?}",
                job.catch_up,
                job.starting_deadline
            );
        }
    }

    #[test]
    fn ticks_due_since_the_takeover_are_owed_in_full_whatever_the_policy() {
        let took_over = at("2027-01-01T00:00:02.500Z");
        let now = at("2027-01-01T00:00:05.500Z");
        let secs = |list: &[u32]| {
            list.iter()
                .map(|s| at(&format!("2027-01-01T00:00:0{s}Z")))
                .collect::<Vec<_>>()
        };
        let last = Some(at("2027-01-01T00:00:00Z"));
        let cases = [
            (job(CatchUp::All, None), last, secs(&[3, 4, 5])),
            (job(CatchUp::Latest, None), last, secs(&[3, 4, 5])),
            (job(CatchUp::None, None), last, secs(&[3, 4, 5])),
            // A job without a claim, deferred for an earlier leader's pending ticks.
            (job(CatchUp::All, None), None, secs(&[3, 4, 5])),
            // Claimed past the takeover already: only what follows its claim.
            (job(CatchUp::All, None), Some(at("2027-01-01T00:00:04Z")), secs(&[5])),
            (job(CatchUp::All, None), Some(at("2027-01-01T00:00:05Z")), vec![]),
            (job(CatchUp::All, Some(2)), last, secs(&[4, 5])),
        ];
        for (job, last, expected) in cases {
            assert_eq!(
                due_since(&job, last, took_over, now, usize::MAX),
                expected,
                "{:?} {:?} from {last:?}",
                job.catch_up,
                job.starting_deadline
            );
            assert_eq!(
                any_due_since(&job, last, took_over, now),
                !expected.is_empty(),
                "any_due_since, {:?} {:?} from {last:?}",
                job.catch_up,
                job.starting_deadline
            );
        }
        // However many: the cap is for ticks missed before the takeover.
        let hour = due_since(
            &job(CatchUp::All, None),
            last,
            at("2027-01-01T00:00:00Z"),
            at("2027-01-01T01:00:00Z"),
            usize::MAX,
        );
        assert_eq!(hour.len(), 3600);
    }

    #[test]
    fn a_long_backlog_is_claimed_in_parts_of_at_most_what_a_record_lists() {
        let job = job(CatchUp::All, None);
        let start = at("2027-01-01T00:00:00Z");
        let took_over = at("2027-01-01T00:01:00Z");
        let now = at("2027-01-01T00:11:00Z");
        let second = |n: i64| start + chrono::Duration::seconds(n);
        // 60 missed before the takeover, 600 due since: every one of them owed, in parts.
        let mut last = Some(start);
        let mut missed = missed_ticks(&job, last, took_over).ticks;
        let mut claimed = Vec::new();
        let mut parts = 0;
        loop {
            let owed = if parts == 0 { 40 } else { 0 };
            let (part, more) = backlog_part(&job, std::mem::take(&mut missed), last, took_over, now, owed);
            assert!(
                part.len() + owed <= MAX_OWED,
                "part {parts}: {} ticks with {owed} owed",
                part.len()
            );
            assert!(part.windows(2).all(|pair| pair[0] < pair[1]), "oldest first");
            last = part.last().copied().or(last);
            claimed.extend(part);
            parts += 1;
            if !more {
                break;
            }
        }
        assert_eq!(
            claimed,
            (1..=660).map(second).collect::<Vec<_>>(),
            "every tick, once, in order"
        );
        assert_eq!(parts, 7, "60, then 6 parts of 100");
        let (part, more) = backlog_part(&job, Vec::new(), last, took_over, now, 0);
        assert!(part.is_empty() && !more, "nothing left");
        let (part, more) = backlog_part(&job, vec![second(1)], Some(start), took_over, now, MAX_OWED);
        assert!(part.is_empty() && more, "a job owing its fill claims nothing more yet");
    }

    #[test]
    fn all_is_capped_with_a_flag() {
        let missed = missed_ticks(
            &job(CatchUp::All, None),
            Some(at("2027-01-01T00:00:00Z")),
            at("2027-01-01T01:00:00Z"),
        );
        assert_eq!(missed.ticks.len(), MAX_CATCH_UP);
        assert!(missed.truncated);
        assert_eq!(missed.ticks.last(), Some(&at("2027-01-01T01:00:00Z")));
    }
}
