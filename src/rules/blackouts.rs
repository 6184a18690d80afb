//! Blackouts: named spans of time in which a job's ticks are not run, but claimed and recorded
//! `skipped` with the blackout's name (a change freeze, a maintenance window, a holiday).
//!
//! A blackout covers whole days (`dates`, read in its zone) and windows that open at each
//! instant of a crontab expression and stay open for an elapsed duration. A window's start
//! follows the same DST rules as a job's schedule in the zone; its duration is elapsed time, so
//! a two-hour window that opens at 01:30 on the night the clocks spring forward closes at 04:30
//! local time.
//!
//! Pure: every question takes the instant it is about.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;

use crate::rules::schedule::Schedule;

/// The longest window: one that never ends is a pause, which `shardcron pause` says better.
pub const MAX_WINDOW: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);
/// At most this many windows in one blackout.
pub const MAX_WINDOWS: usize = 64;
/// At most this many dates in one blackout: a few years of holidays.
pub const MAX_DATES: usize = 1_000;
/// At most this many blackouts in a file: each is checked at every tick of the jobs that list it.
pub const MAX_BLACKOUTS: usize = 256;
/// At most this many blackouts on one job, the cluster's included.
pub const MAX_BLACKOUTS_PER_JOB: usize = 32;

/// A validated `[blackouts.<name>]`.
#[derive(Debug, Clone)]
pub struct Blackout {
    pub name: String,
    pub windows: Vec<Window>,
    /// Whole days in `zone`.
    pub dates: BTreeSet<NaiveDate>,
    pub zone: Tz,
}

/// A window that opens at each instant of `start` and stays open for `duration`.
#[derive(Debug, Clone)]
pub struct Window {
    pub start: Arc<Schedule>,
    pub duration: chrono::Duration,
}

impl Blackout {
    /// Whether `at` falls inside the blackout: on one of its dates, or at or after a window's
    /// opening and before its close.
    pub fn covers(&self, at: DateTime<Utc>) -> bool {
        self.dates.contains(&at.with_timezone(&self.zone).date_naive())
            || self.windows.iter().any(|window| window.covers(at))
    }
}

impl Window {
    /// Whether a window opened at or before `at` is still open: the latest opening decides,
    /// since every window lasts as long, so an earlier one closes no later.
    pub fn covers(&self, at: DateTime<Utc>) -> bool {
        self.start
            .latest_at_or_before(at)
            .is_some_and(|opened| at < opened + self.duration)
    }
}

/// The first of `blackouts` that covers `at`, in the order the job lists them (the cluster's
/// first).
pub fn covering(blackouts: &[Arc<Blackout>], at: DateTime<Utc>) -> Option<&Arc<Blackout>> {
    blackouts.iter().find(|blackout| blackout.covers(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn window(start: &str, zone: Tz, minutes: i64) -> Window {
        Window {
            start: Arc::new(Schedule::parse(start, zone).unwrap()),
            duration: chrono::Duration::minutes(minutes),
        }
    }

    fn blackout(windows: Vec<Window>, dates: &[&str], zone: Tz) -> Blackout {
        Blackout {
            name: "freeze".into(),
            windows,
            dates: dates.iter().map(|date| date.parse().unwrap()).collect(),
            zone,
        }
    }

    #[test]
    fn a_window_covers_from_its_opening_up_to_but_not_including_its_close() {
        let nightly = blackout(vec![window("0 2 * * *", chrono_tz::UTC, 120)], &[], chrono_tz::UTC);
        for (instant, inside) in [
            ("2027-01-05T01:59:59Z", false),
            ("2027-01-05T02:00:00Z", true),
            ("2027-01-05T03:59:59Z", true),
            ("2027-01-05T04:00:00Z", false),
            ("2027-01-05T12:00:00Z", false),
        ] {
            assert_eq!(nightly.covers(at(instant)), inside, "{instant}");
        }
    }

    #[test]
    fn windows_longer_than_their_period_overlap_and_a_later_opening_extends_them() {
        let hourly_for_two_hours = blackout(vec![window("0 * * * *", chrono_tz::UTC, 120)], &[], chrono_tz::UTC);
        assert!(hourly_for_two_hours.covers(at("2027-01-05T10:59:59Z")));
        assert!(hourly_for_two_hours.covers(at("2027-01-05T11:00:00Z")));
    }

    #[test]
    fn a_date_is_a_whole_day_in_the_blackouts_zone() {
        let christmas = blackout(Vec::new(), &["2026-12-25"], chrono_tz::Europe::Berlin);
        for (instant, inside) in [
            // 00:00 in Berlin is 23:00 UTC the day before.
            ("2026-12-24T22:59:59Z", false),
            ("2026-12-24T23:00:00Z", true),
            ("2026-12-25T22:59:59Z", true),
            ("2026-12-25T23:00:00Z", false),
        ] {
            assert_eq!(christmas.covers(at(instant)), inside, "{instant}");
        }
    }

    #[test]
    fn across_the_spring_change_in_berlin_a_window_opens_by_the_schedule_and_lasts_elapsed_time() {
        // 2027-03-28: 02:00 CET springs to 03:00 CEST. A window meant to open at 02:30 opens at
        // the first instant after the gap (03:00 CEST = 01:00 UTC), as a schedule fires, and
        // stays open two elapsed hours: until 05:00 CEST (03:00 UTC).
        let berlin = chrono_tz::Europe::Berlin;
        let maintenance = blackout(vec![window("30 2 * * *", berlin, 120)], &[], berlin);
        for (instant, inside) in [
            ("2027-03-28T00:59:59Z", false),
            ("2027-03-28T01:00:00Z", true),
            ("2027-03-28T02:59:59Z", true),
            ("2027-03-28T03:00:00Z", false),
            // The next day opens at 02:30 CEST = 00:30 UTC.
            ("2027-03-29T00:30:00Z", true),
            ("2027-03-29T00:29:59Z", false),
        ] {
            assert_eq!(maintenance.covers(at(instant)), inside, "{instant}");
        }
    }

    #[test]
    fn across_the_autumn_change_in_berlin_a_window_opens_once_and_lasts_elapsed_time() {
        // 2027-10-31: 03:00 CEST falls back to 02:00 CET. A window at 02:30 opens at the first
        // 02:30 (CEST, 00:30 UTC) only, and two elapsed hours later (02:30 UTC = 03:30 CET) it
        // is closed, though the wall clock shows just one hour passed.
        let berlin = chrono_tz::Europe::Berlin;
        let maintenance = blackout(vec![window("30 2 * * *", berlin, 120)], &[], berlin);
        for (instant, inside) in [
            ("2027-10-31T00:29:59Z", false),
            ("2027-10-31T00:30:00Z", true),
            ("2027-10-31T01:30:00Z", true),
            ("2027-10-31T02:29:59Z", true),
            ("2027-10-31T02:30:00Z", false),
        ] {
            assert_eq!(maintenance.covers(at(instant)), inside, "{instant}");
        }
    }

    #[test]
    fn covering_names_the_first_blackout_in_the_jobs_order() {
        let utc = chrono_tz::UTC;
        let first = Arc::new(Blackout {
            name: "first".into(),
            ..blackout(vec![window("* * * * *", utc, 1)], &[], utc)
        });
        let second = Arc::new(Blackout {
            name: "second".into(),
            ..blackout(Vec::new(), &["2027-01-05"], utc)
        });
        let both = [Arc::clone(&first), Arc::clone(&second)];
        assert_eq!(
            covering(&both, at("2027-01-05T10:00:00Z")).map(|b| b.name.as_str()),
            Some("first")
        );
        assert!(covering(&both[1..], at("2027-01-06T10:00:00Z")).is_none());
    }
}
