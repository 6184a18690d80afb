//! Where the zones' clocks change in 2026 and 2027, found by bisection, and what a wall time
//! is at and around those changes.

use std::sync::OnceLock;

use chrono::{LocalResult, NaiveDateTime, Offset, TimeZone};

use super::*;

/// Zones with whole-hour, half-hour (Lord Howe), midnight (Santiago) and :45 (Chatham)
/// changes, and two without DST.
pub(super) const ZONES: [&str; 7] = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Pacific/Chatham",
    "Asia/Kolkata",
    "UTC",
];

/// A window's forward walk stops after this many ticks (and the window ends there), which
/// bounds a case's cost whatever the schedule's density.
pub(super) const MAX_TICKS: usize = 2500;

pub(super) fn zone(index: usize) -> Tz {
    ZONES[index].parse().unwrap()
}

pub(super) fn offset_at(zone: Tz, at: DateTime<Utc>) -> i32 {
    zone.offset_from_utc_datetime(&at.naive_utc()).fix().local_minus_utc()
}

/// The instants of 2026 and 2027 at which each zone's UTC offset changes, to the second.
pub(super) fn transitions(zone_index: usize) -> &'static [DateTime<Utc>] {
    static ALL: OnceLock<Vec<Vec<DateTime<Utc>>>> = OnceLock::new();
    &ALL.get_or_init(|| {
        (0..ZONES.len())
            .map(|index| {
                let zone = zone(index);
                let at = |seconds: i64| DateTime::<Utc>::from_timestamp(seconds, 0).unwrap();
                let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap().timestamp();
                let mut found = Vec::new();
                for day in 0..730 {
                    let (mut before, mut after) = (start + day * 86_400, start + (day + 1) * 86_400);
                    if offset_at(zone, at(before)) == offset_at(zone, at(after)) {
                        continue;
                    }
                    while after - before > 1 {
                        let middle = before + (after - before) / 2;
                        if offset_at(zone, at(middle)) == offset_at(zone, at(before)) {
                            before = middle;
                        } else {
                            after = middle;
                        }
                    }
                    found.push(at(after));
                }
                found
            })
            .collect()
    })[zone_index]
}

/// Instants to place windows around: the zone's own changes, or New York's for a zone
/// without any.
pub(super) fn anchors(zone_index: usize) -> &'static [DateTime<Utc>] {
    let own = transitions(zone_index);
    if own.is_empty() {
        transitions(0)
    } else {
        own
    }
}

pub(super) fn is_gap(zone: Tz, wall: NaiveDateTime) -> bool {
    matches!(zone.from_local_datetime(&wall), LocalResult::None)
}

pub(super) fn wall(zone: Tz, at: DateTime<Utc>) -> NaiveDateTime {
    at.with_timezone(&zone).naive_local()
}

/// The wall clock times of the gap that ends at `at` (the first instant after it), or none
/// if `at` does not end a gap.
pub(super) fn gap_ending_at(zone: Tz, at: DateTime<Utc>) -> Vec<NaiveDateTime> {
    let mut gap = Vec::new();
    let mut cursor = wall(zone, at) - Duration::seconds(1);
    while is_gap(zone, cursor) && gap.len() <= 3 * 3600 {
        gap.push(cursor);
        cursor -= Duration::seconds(1);
    }
    gap
}

pub(super) fn is_fixed_time(cron: &Cron) -> bool {
    cron.determine_job_type() == JobType::FixedTime
}

pub(super) fn has_seconds(schedule: &Schedule) -> bool {
    schedule
        .expanded()
        .split(LIST_SEPARATOR)
        .any(|expression| expression.split_whitespace().count() == 6)
}

/// The windows are placed around real changes: two a year in each DST zone, on whole
/// minutes, none in Kolkata or UTC.
#[test]
pub(super) fn the_windows_are_anchored_on_real_dst_changes() {
    for (index, name) in ZONES.iter().enumerate() {
        let changes = transitions(index);
        let expected = if index < 5 { 4 } else { 0 };
        assert_eq!(changes.len(), expected, "{name}: {changes:?}");
        assert!(
            changes.iter().all(|change| change.timestamp() % 60 == 0),
            "{name}: {changes:?}"
        );
    }
    assert_eq!(
        transitions(0)[0],
        DateTime::parse_from_rfc3339("2026-03-08T07:00:00Z").unwrap()
    );
}

/// Found by `next_after_strictly_increases_and_meets_latest_at_or_before`: in the last
/// second before New York's clocks go back (2026-11-01 06:00 UTC, 02:00 EDT -> 01:00 EST),
/// `latest_at_or_before` of an instant with a fraction of a second returned 01:00 EST, the
/// change itself, half a second after `at`; and catch-up, which passes the clock's `now`,
/// ran that tick as missed before it was due.
#[test]
pub(super) fn nothing_after_at_is_at_or_before_it_in_the_last_second_before_a_fall_back() {
    let at = |text: &str| DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc);
    let hourly = Schedule::parse("0 * * * *", "America/New_York".parse().unwrap()).unwrap();
    let now = at("2026-11-01T05:59:59.500Z");
    assert_eq!(hourly.latest_at_or_before(now), Some(at("2026-11-01T05:00:00Z")));
    assert_eq!(hourly.nth_newest_at_or_before(now, 1), Some(at("2026-11-01T05:00:00Z")));
    let (ticks, _) = hourly.newest_ticks_between(at("2026-11-01T04:30:00Z"), now, 10);
    assert_eq!(ticks, [at("2026-11-01T05:00:00Z")]);
    let job = Job {
        catch_up: CatchUp::All,
        schedule: Arc::new(hourly),
        ..Job::for_tests("hourly", "* * * * *")
    };
    assert_eq!(
        missed_ticks(&job, Some(at("2026-11-01T05:00:00Z")), now).ticks,
        Vec::<DateTime<Utc>>::new()
    );
}
