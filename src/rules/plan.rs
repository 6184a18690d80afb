//! The fire instants of a set of jobs over a window, in time order, each with the DST rule that
//! decided it, if one did. Pure: `plan` and the API read it; nothing here reads the clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use chrono::{DateTime, LocalResult, SecondsFormat, TimeZone, Utc};

use crate::rules::config::Job;

/// One fire instant of one job.
#[derive(Debug, Clone)]
pub struct Fire<'a> {
    pub at: DateTime<Utc>,
    pub job: &'a Job,
    pub dst: Option<DstRule>,
    /// The blackout that covers the instant: the tick is claimed and recorded `skipped`.
    pub blackout: Option<&'a str>,
}

impl Fire<'_> {
    /// What `plan` notes of the instant: `blackout <name>`, the DST rule that decided it, or
    /// both, joined by `"; "`.
    pub fn note(&self) -> Option<String> {
        let blackout = self.blackout.map(|name| format!("blackout {name}"));
        match (blackout, self.dst) {
            (Some(blackout), Some(rule)) => Some(format!("{blackout}; {}", rule.note())),
            (Some(blackout), None) => Some(blackout),
            (None, rule) => rule.map(|rule| rule.note().to_string()),
        }
    }
}

/// One fire as `plan --json` and the API print it; the keys are a contract.
#[derive(Debug, serde::Serialize)]
pub struct PlannedFire<'a> {
    /// In the job's zone, with its offset.
    pub at: String,
    pub at_utc: String,
    pub job: &'a str,
    /// The shard within the job's pool (or within the fleet's `shards`).
    pub shard: u32,
    /// The job's pool: its `run_on` tags joined by `+`; absent for a job without `run_on`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub zone: &'a str,
    pub note: Option<String>,
}

impl<'a> From<&Fire<'a>> for PlannedFire<'a> {
    fn from(fire: &Fire<'a>) -> Self {
        let zone = fire.job.schedule.zone();
        PlannedFire {
            at: fire.at.with_timezone(&zone).to_rfc3339_opts(SecondsFormat::Secs, false),
            at_utc: fire.at.to_rfc3339_opts(SecondsFormat::Secs, true),
            job: &fire.job.name,
            shard: fire.job.pool_shard,
            pool: (!fire.job.run_on.is_empty()).then(|| fire.job.run_on.id()),
            zone: zone.name(),
            note: fire.note(),
        }
    }
}

/// Why a DST transition decided an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DstRule {
    /// The wall time the schedule names does not exist that day (clocks sprang forward over it):
    /// the job fires once, at the first instant after the gap.
    MovedOutOfGap,
    /// The wall time happens twice (clocks fell back); this is its first occurrence.
    RepeatedHourFirst,
    /// The wall time happens twice; this is its second occurrence (only schedules with a
    /// wildcard or step in their time fields fire at both).
    RepeatedHourSecond,
}

impl DstRule {
    /// The note `plan` prints; a contract for scripts that read it.
    pub fn note(self) -> &'static str {
        match self {
            DstRule::MovedOutOfGap => "moved forward out of a DST gap",
            DstRule::RepeatedHourFirst => "repeated hour, first",
            DstRule::RepeatedHourSecond => "repeated hour, second",
        }
    }
}

/// The fire instants of `jobs` in `[from, to)`, oldest first (ties in the order of `jobs`), at
/// most `limit` of them, and whether more were left out.
pub fn fires<'a>(jobs: &[&'a Job], from: DateTime<Utc>, to: DateTime<Utc>, limit: usize) -> (Vec<Fire<'a>>, bool) {
    // `next_after` is strict; a second before `from` lets an instant exactly at `from` in.
    // Checked: `from` may come from a request or etcd, and at chrono's limit `-` panics.
    let before_from = from.checked_sub_signed(chrono::Duration::seconds(1)).unwrap_or(from);
    let mut due: BinaryHeap<Reverse<(DateTime<Utc>, usize)>> = jobs
        .iter()
        .enumerate()
        .filter_map(|(index, job)| first_at_or_after(job, before_from, from).map(|at| Reverse((at, index))))
        .collect();
    let mut fires = Vec::new();
    while let Some(Reverse((at, index))) = due.pop() {
        if at >= to {
            break;
        }
        if fires.len() == limit {
            return (fires, true);
        }
        let job = jobs[index];
        fires.push(Fire {
            at,
            job,
            dst: dst_rule(job, at),
            blackout: crate::rules::blackouts::covering(&job.blackouts, at).map(|blackout| blackout.name.as_str()),
        });
        if let Some(next) = job.schedule.next_after(at) {
            due.push(Reverse((next, index)));
        }
    }
    (fires, false)
}

fn first_at_or_after(job: &Job, before_from: DateTime<Utc>, from: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let mut at = job.schedule.next_after(before_from)?;
    while at < from {
        at = job.schedule.next_after(at)?;
    }
    Some(at)
}

fn dst_rule(job: &Job, at: DateTime<Utc>) -> Option<DstRule> {
    if !job.schedule.matches_wall_time(at) {
        return Some(DstRule::MovedOutOfGap);
    }
    let zone = job.schedule.zone();
    match zone.from_local_datetime(&at.with_timezone(&zone).naive_local()) {
        LocalResult::Ambiguous(first, _) if first.with_timezone(&Utc) == at => Some(DstRule::RepeatedHourFirst),
        LocalResult::Ambiguous(..) => Some(DstRule::RepeatedHourSecond),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::config::Job;
    use crate::rules::schedule::{parse_zone, Schedule};
    use std::sync::Arc;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().with_timezone(&Utc)
    }

    fn job(name: &str, expressions: &[&str], zone: &str) -> Job {
        let mut job = Job::for_tests(name, "* * * * *");
        job.schedule = Arc::new(Schedule::parse_for_job(expressions, parse_zone(zone).unwrap(), Some(name)).unwrap());
        job
    }

    fn lines(fires: &[Fire]) -> Vec<String> {
        fires
            .iter()
            .map(|fire| {
                let local = fire.at.with_timezone(&fire.job.schedule.zone()).to_rfc3339();
                match fire.dst {
                    Some(rule) => format!("{local} {} ({})", fire.job.name, rule.note()),
                    None => format!("{local} {}", fire.job.name),
                }
            })
            .collect()
    }

    /// An instant at chrono's limits (a backfill's `from`, a record read from etcd) is no
    /// panic: the window is just empty, or starts where the schedule can.
    #[test]
    fn a_window_at_the_limits_of_time_does_not_panic() {
        let job = job("j", &["0 3 * * *"], "UTC");
        let (fires, cut) = fires(&[&job], DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MIN_UTC, 10);
        assert!(fires.is_empty() && !cut);
        let (fires, _) = fires_of_max(&job);
        assert!(fires.is_empty());
    }

    fn fires_of_max(job: &Job) -> (Vec<Fire<'_>>, bool) {
        fires(&[job], DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MAX_UTC, 10)
    }

    #[test]
    fn jobs_are_merged_in_time_order_over_the_window() {
        let daily = job("daily", &["0 9 * * *"], "Europe/Berlin");
        let hourly = job("hourly", &["30 * * * *"], "UTC");
        let (fires, cut) = fires(
            &[&daily, &hourly],
            at("2027-07-01T06:00:00Z"),
            at("2027-07-01T09:00:00Z"),
            100,
        );
        assert!(!cut);
        assert_eq!(
            lines(&fires),
            [
                "2027-07-01T06:30:00+00:00 hourly",
                "2027-07-01T09:00:00+02:00 daily",
                "2027-07-01T07:30:00+00:00 hourly",
                "2027-07-01T08:30:00+00:00 hourly",
            ]
        );
    }

    #[test]
    fn the_window_includes_from_and_excludes_to_and_the_limit_cuts() {
        let minutely = job("minutely", &["* * * * *"], "UTC");
        let (fires_in, cut) = fires(
            &[&minutely],
            at("2027-01-01T00:00:00Z"),
            at("2027-01-01T00:03:00Z"),
            100,
        );
        assert!(!cut);
        assert_eq!(fires_in.len(), 3);
        assert_eq!(fires_in[0].at, at("2027-01-01T00:00:00Z"));
        let (cut_fires, cut) = fires(&[&minutely], at("2027-01-01T00:00:00Z"), at("2027-01-01T00:03:00Z"), 2);
        assert!(cut);
        assert_eq!(cut_fires.len(), 2);
    }

    #[test]
    fn dst_decisions_are_noted() {
        let in_gap = job("in-gap", &["30 2 * * *"], "America/New_York");
        let in_overlap = job("in-overlap", &["30 1 * * *"], "America/New_York");
        let every_half_hour = job("every-half-hour", &["*/30 1 * * *"], "America/New_York");
        let (spring, _) = fires(&[&in_gap], at("2027-03-14T00:00:00Z"), at("2027-03-16T00:00:00Z"), 100);
        assert_eq!(
            lines(&spring),
            [
                "2027-03-14T03:00:00-04:00 in-gap (moved forward out of a DST gap)",
                "2027-03-15T02:30:00-04:00 in-gap",
            ]
        );
        let (fall, _) = fires(
            &[&in_overlap, &every_half_hour],
            at("2027-11-07T04:00:00Z"),
            at("2027-11-07T08:00:00Z"),
            100,
        );
        assert_eq!(
            lines(&fall),
            [
                "2027-11-07T01:00:00-04:00 every-half-hour (repeated hour, first)",
                "2027-11-07T01:30:00-04:00 in-overlap (repeated hour, first)",
                "2027-11-07T01:30:00-04:00 every-half-hour (repeated hour, first)",
                "2027-11-07T01:00:00-05:00 every-half-hour (repeated hour, second)",
                "2027-11-07T01:30:00-05:00 every-half-hour (repeated hour, second)",
            ]
        );
    }

    #[test]
    fn a_schedule_list_fires_once_at_an_instant_both_expressions_match() {
        let listed = job("listed", &["0 * * * *", "0 */2 * * *", "15 3 * * *"], "UTC");
        let (fires, _) = fires(&[&listed], at("2027-01-01T02:00:00Z"), at("2027-01-01T05:00:00Z"), 100);
        assert_eq!(
            lines(&fires),
            [
                "2027-01-01T02:00:00+00:00 listed",
                "2027-01-01T03:00:00+00:00 listed",
                "2027-01-01T03:15:00+00:00 listed",
                "2027-01-01T04:00:00+00:00 listed",
            ]
        );
    }
}
