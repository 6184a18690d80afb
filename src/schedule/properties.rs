//! Property tests: firing (forwards) and catch-up (backwards) agree, and both follow the DST
//! rules, on generated schedules, zones and windows around the DST changes of 2026 and 2027.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use chrono::{Duration, LocalResult, NaiveDateTime, Offset, TimeZone};
use croner::JobType;
use proptest::prelude::*;
use proptest::sample::{select, Index};

use super::*;
use crate::catch_up::{missed_ticks, misses_any, MAX_CATCH_UP};
use crate::config::{CatchUp, Job};

/// Zones with whole-hour, half-hour (Lord Howe), midnight (Santiago) and :45 (Chatham)
/// changes, and two without DST.
const ZONES: [&str; 7] = [
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
const MAX_TICKS: usize = 2500;

fn zone(index: usize) -> Tz {
    ZONES[index].parse().unwrap()
}

fn offset_at(zone: Tz, at: DateTime<Utc>) -> i32 {
    zone.offset_from_utc_datetime(&at.naive_utc()).fix().local_minus_utc()
}

/// The instants of 2026 and 2027 at which each zone's UTC offset changes, to the second.
fn transitions(zone_index: usize) -> &'static [DateTime<Utc>] {
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
fn anchors(zone_index: usize) -> &'static [DateTime<Utc>] {
    let own = transitions(zone_index);
    if own.is_empty() {
        transitions(0)
    } else {
        own
    }
}

fn is_gap(zone: Tz, wall: NaiveDateTime) -> bool {
    matches!(zone.from_local_datetime(&wall), LocalResult::None)
}

fn wall(zone: Tz, at: DateTime<Utc>) -> NaiveDateTime {
    at.with_timezone(&zone).naive_local()
}

/// The wall clock times of the gap that ends at `at` (the first instant after it), or none
/// if `at` does not end a gap.
fn gap_ending_at(zone: Tz, at: DateTime<Utc>) -> Vec<NaiveDateTime> {
    let mut gap = Vec::new();
    let mut cursor = wall(zone, at) - Duration::seconds(1);
    while is_gap(zone, cursor) && gap.len() <= 3 * 3600 {
        gap.push(cursor);
        cursor -= Duration::seconds(1);
    }
    gap
}

fn is_fixed_time(cron: &Cron) -> bool {
    cron.determine_job_type() == JobType::FixedTime
}

fn has_seconds(schedule: &Schedule) -> bool {
    schedule
        .expanded()
        .split(LIST_SEPARATOR)
        .any(|expression| expression.split_whitespace().count() == 6)
}

/// The windows are placed around real changes: two a year in each DST zone, on whole
/// minutes, none in Kolkata or UTC.
#[test]
fn the_windows_are_anchored_on_real_dst_changes() {
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
fn nothing_after_at_is_at_or_before_it_in_the_last_second_before_a_fall_back() {
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

// --- Strategies -------------------------------------------------------------------------

fn number(range: std::ops::Range<u32>) -> BoxedStrategy<String> {
    range.prop_map(|value| value.to_string()).boxed()
}

/// Wall clock (hour, minute)s every 15 minutes from half an hour before to half an hour
/// after each of the zone's changes, so inside and around its gaps and repeated ranges;
/// for a zone without changes, the hours where the others have them.
fn hot_times(zone_index: usize) -> Vec<(u32, u32)> {
    use chrono::Timelike;
    let zone = zone(zone_index);
    let mut times: Vec<(u32, u32)> = Vec::new();
    for &change in transitions(zone_index) {
        let (before, after) = (wall(zone, change - Duration::seconds(1)), wall(zone, change));
        let mut cursor = before.min(after) - Duration::minutes(30);
        cursor -= Duration::seconds(i64::from(cursor.second()));
        while cursor <= before.max(after) + Duration::minutes(30) {
            times.push((cursor.hour(), cursor.minute()));
            cursor += Duration::minutes(15);
        }
    }
    if times.is_empty() {
        times = [0, 1, 2, 3, 23].iter().map(|hour| (*hour, 0)).collect();
    }
    times.sort();
    times.dedup();
    times
}

fn hot_hour(zone_index: usize) -> BoxedStrategy<String> {
    let mut hours: Vec<u32> = hot_times(zone_index).iter().map(|(hour, _)| *hour).collect();
    hours.dedup();
    select(hours).prop_map(|hour| hour.to_string()).boxed()
}

/// A fixed time of day near one of the zone's changes: `m h` or `s m h`.
fn hot_fixed_time(zone_index: usize, seconds: bool) -> BoxedStrategy<String> {
    let jitter = prop_oneof![2 => Just(0u32), 1 => 0u32..15];
    (select(hot_times(zone_index)), jitter, 0u32..60)
        .prop_map(move |((hour, minute), jitter, second)| {
            let minute = (minute + jitter) % 60;
            if seconds {
                format!("{second} {minute} {hour}")
            } else {
                format!("{minute} {hour}")
            }
        })
        .boxed()
}

fn second_field() -> BoxedStrategy<String> {
    prop_oneof![
        2 => number(0..60),
        2 => select(vec![5u32, 10, 15, 20, 30]).prop_map(|step| format!("*/{step}")),
        1 => (0u32..30, 30u32..60).prop_map(|(a, b)| format!("{a},{b}")),
        1 => (0u32..50, 1u32..10).prop_map(|(a, len)| format!("{a}-{}", a + len)),
    ]
    .boxed()
}

fn minute_field() -> BoxedStrategy<String> {
    prop_oneof![
        2 => number(0..60),
        2 => select(vec![0u32, 15, 30, 45, 59]).prop_map(|minute| minute.to_string()),
        2 => select(vec![2u32, 5, 7, 10, 15, 20, 30]).prop_map(|step| format!("*/{step}")),
        1 => (0u32..30, 30u32..60).prop_map(|(a, b)| format!("{a},{b}")),
        1 => (0u32..50, 1u32..10, select(vec![1u32, 3, 5])).prop_map(|(a, len, step)| format!("{a}-{}/{step}", a + len)),
        1 => Just("*".to_string()),
    ]
    .boxed()
}

fn hour_field(zone_index: usize) -> BoxedStrategy<String> {
    prop_oneof![
        4 => hot_hour(zone_index),
        1 => number(0..24),
        2 => Just("*".to_string()),
        1 => select(vec![2u32, 3, 4, 6]).prop_map(|step| format!("*/{step}")),
        1 => (0u32..4, 1u32..4).prop_map(|(a, len)| format!("{a}-{}", a + len)),
        1 => (0u32..4).prop_map(|a| format!("{a},{}", a + 1)),
        1 => (0u32..4, 20u32..24).prop_map(|(a, b)| format!("{a},{b}")),
    ]
    .boxed()
}

fn day_fields() -> BoxedStrategy<String> {
    let day_of_month = prop_oneof![8 => Just("*"), 1 => Just("1-10"), 1 => Just("*/2")];
    let day_of_week = prop_oneof![
        6 => Just("*"),
        1 => Just("0"),
        1 => Just("6"),
        1 => Just("1-5"),
        1 => Just("SAT,SUN"),
        1 => Just("0-2"),
    ];
    (day_of_month, day_of_week)
        .prop_map(|(dom, dow)| format!("{dom} * {dow}"))
        .boxed()
}

/// Hand-picked expressions: fixed times in and around the zones' gaps and repeated hours,
/// steps, nicknames and `H`.
const PICKED: [&str; 39] = [
    "30 2 * * *",
    "30 1 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "0 30 1 * * *",
    "15 2 * * *",
    "45 1 * * *",
    "45 2 * * *",
    "15 3 * * *",
    "0 3 * * *",
    "45 3 * * *",
    "0 0 * * *",
    "30 0 * * *",
    "30 23 * * *",
    "0 0 * * 0",
    "0 0 * * 6",
    "0 2 * * 0",
    "59 1 * * *",
    "0 2 * * *",
    "0 */2 * * *",
    "30 */3 * * *",
    "5,35 0-3 * * *",
    "*/7 1-3 * * *",
    "0 8-18 * * 1-5",
    "0 0,12 * * SUN",
    "0 0 1 * *",
    "@hourly",
    "@daily",
    "H H(0-3) * * *",
    "H/20 * * * *",
    "H H H(0-3) * * *",
    "*/20 * * * * *",
    "59 59 1 * * *",
    "0 0 2 * * *",
    "30 30 2 * * *",
    "* 30 1 * * *",
    "0 */10 1-3 * * *",
    "*/30 * * * * *",
    "0 45 2 * * *",
];

fn expression(zone_index: usize) -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(PICKED.to_vec()).prop_map(str::to_string),
        3 => (hot_fixed_time(zone_index, false), day_fields()).prop_map(|(time, days)| format!("{time} {days}")),
        2 => (hot_fixed_time(zone_index, true), day_fields()).prop_map(|(time, days)| format!("{time} {days}")),
        3 => (minute_field(), hour_field(zone_index), day_fields())
            .prop_map(|(minute, hour, days)| format!("{minute} {hour} {days}")),
        2 => (second_field(), minute_field(), hour_field(zone_index), day_fields())
            .prop_map(|(second, minute, hour, days)| format!("{second} {minute} {hour} {days}")),
    ]
    .boxed()
}

fn fixed_time_expression(zone_index: usize) -> BoxedStrategy<String> {
    let picked: Vec<&str> = PICKED
        .iter()
        .copied()
        .filter(|expression| {
            Schedule::parse_for_job(&[expression], Tz::UTC, Some("a"))
                .unwrap()
                .crons
                .iter()
                .all(is_fixed_time)
        })
        .collect();
    prop_oneof![
        1 => select(picked).prop_map(str::to_string),
        2 => (hot_fixed_time(zone_index, false), day_fields()).prop_map(|(time, days)| format!("{time} {days}")),
        1 => (hot_fixed_time(zone_index, true), day_fields()).prop_map(|(time, days)| format!("{time} {days}")),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
struct Case {
    expressions: Vec<String>,
    job: String,
    zone: Tz,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    /// Move `from` back onto a tick, to test that `from` is exclusive.
    snap_from: bool,
    /// Move `to` back onto a tick, to test that `to` is inclusive.
    snap_to: bool,
}

fn case() -> impl Strategy<Value = Case> {
    case_of(expression)
}

/// A case whose expressions are all fixed-time (one second, minute and hour each).
fn fixed_time_case() -> impl Strategy<Value = Case> {
    case_of(fixed_time_expression)
}

/// Where a window lies against its anchor (a change of the zone's offset).
#[derive(Debug, Clone)]
enum Placement {
    /// Holds the anchor; starts this fraction (of 1000) of its length before it.
    Around(u32),
    /// May also end up to half a day before the anchor.
    Loose(u32),
    /// Starts this many milliseconds after the anchor: on or next to a change, or to a
    /// multiple of half an hour from it (where the repeated range or gap starts or ends).
    StartsAt(i64),
    /// Ends this many milliseconds after the anchor.
    EndsAt(i64),
}

fn placement() -> impl Strategy<Value = Placement> {
    let edge = || {
        (-2i64..=2, select(vec![-1000i64, -500, -1, 0, 0, 1, 500, 1000]))
            .prop_map(|(half_hours, millis)| half_hours * 1_800_000 + millis)
    };
    prop_oneof![
        6 => (1u32..=1000).prop_map(Placement::Around),
        2 => (1u32..=1000).prop_map(Placement::Loose),
        1 => edge().prop_map(Placement::StartsAt),
        1 => edge().prop_map(Placement::EndsAt),
    ]
}

fn case_of(expression: fn(usize) -> BoxedStrategy<String>) -> impl Strategy<Value = Case> {
    // The DST zones twice as often as Kolkata and UTC.
    select(vec![0usize, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 6]).prop_flat_map(move |zone_index| {
        (
            prop::collection::vec(expression(zone_index), 1..=2),
            select(vec!["nightly", "report", "a", "backup-db"]),
            any::<Index>(),
            0u32..=1000,
            placement(),
            select(vec![0i64, 0, 0, 250, 999]),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                move |(expressions, job, anchor, length_fraction, placement, millis, snap_from, snap_to)| {
                    let seconds = expressions
                        .iter()
                        .any(|expression| expression.split_whitespace().count() == 6);
                    // A few hours of a second-level schedule, up to three days of a
                    // minute-level one.
                    let (shortest, longest) = if seconds { (600, 3 * 3600) } else { (3600, 72 * 3600) };
                    let length = shortest + (longest - shortest) * i64::from(length_fraction) / 1000;
                    let anchors = anchors(zone_index);
                    // For a zone without changes, an instant of New York's.
                    let anchor = anchors[anchor.index(anchors.len())];
                    let before = |reach: i64, fraction: u32| {
                        Duration::seconds((reach * i64::from(fraction) / 1000).max(1)) - Duration::milliseconds(millis)
                    };
                    let from = match placement {
                        Placement::Around(fraction) => anchor - before(length, fraction),
                        Placement::Loose(fraction) => anchor - before(length + 12 * 3600, fraction),
                        Placement::StartsAt(millis) => anchor + Duration::milliseconds(millis),
                        Placement::EndsAt(millis) => {
                            anchor + Duration::milliseconds(millis) - Duration::seconds(length)
                        }
                    };
                    Case {
                        expressions,
                        job: job.to_string(),
                        zone: zone(zone_index),
                        from,
                        to: from + Duration::seconds(length),
                        snap_from,
                        snap_to,
                    }
                },
            )
    })
}

/// A parsed case: the window `(from, to]` and the ticks that firing finds in it by walking
/// forwards with `next_after` from `from`.
struct Window {
    schedule: Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    forwards: Vec<DateTime<Utc>>,
}

fn window(case: &Case) -> Window {
    let expressions: Vec<&str> = case.expressions.iter().map(String::as_str).collect();
    let schedule =
        Schedule::parse_for_job(&expressions, case.zone, Some(&case.job)).expect("generated schedules parse");
    let (mut from, mut to) = (case.from, case.to);
    if case.snap_from {
        from = schedule.latest_at_or_before(from).unwrap_or(from);
    }
    if case.snap_to {
        to = schedule
            .latest_at_or_before(to)
            .filter(|tick| *tick > from)
            .unwrap_or(to);
    }
    let forwards = walk_forwards(&schedule, from, to);
    if forwards.len() == MAX_TICKS {
        to = forwards[MAX_TICKS - 1];
    }
    Window {
        schedule,
        from,
        to,
        forwards,
    }
}

/// What firing does: `next_after` from `from` again and again, up to and including `to`, at
/// most [`MAX_TICKS`] times. A tick that does not move forward ends the walk (it is kept, for
/// the properties to report).
fn walk_forwards(schedule: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut ticks = Vec::new();
    let mut cursor = from;
    while let Some(tick) = schedule.next_after(cursor).filter(|tick| *tick <= to) {
        ticks.push(tick);
        if tick <= cursor || ticks.len() == MAX_TICKS {
            break;
        }
        cursor = tick;
    }
    ticks
}

/// Whether `schedule` fires at `at` by the DST rules, decided one instant at a time from
/// the wall clock alone: an expression fires where its fields match the wall time, a
/// fixed-time one only at the first of two instants with that wall time and also at the
/// first instant after a gap (`ends_a_gap`) that hid a matching wall time. `offset` is the
/// zone's UTC offset at `at`; `fixed` says which expressions are fixed-time.
fn fires_by_the_rules(schedule: &Schedule, fixed: &[bool], at: DateTime<Utc>, offset: i32, ends_a_gap: bool) -> bool {
    let zone = schedule.zone();
    let local = at.naive_utc() + Duration::seconds(i64::from(offset));
    schedule.crons.iter().zip(fixed).any(|(cron, &fixed)| {
        if cron.is_time_matching(&local).unwrap() {
            return !fixed
                || zone
                    .from_local_datetime(&local)
                    .earliest()
                    .is_some_and(|earliest| earliest == at);
        }
        fixed
            && ends_a_gap
            && gap_ending_at(zone, at)
                .iter()
                .any(|hidden| cron.is_time_matching(hidden).unwrap())
    })
}

/// The instants of `(from, to]` at which `schedule` fires by [`fires_by_the_rules`], tried
/// every `step` seconds.
fn ticks_by_the_rules(
    schedule: &Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    step: i64,
) -> BTreeSet<DateTime<Utc>> {
    let zone = schedule.zone();
    let fixed: Vec<bool> = schedule.crons.iter().map(is_fixed_time).collect();
    let mut ticks = BTreeSet::new();
    let mut at = DateTime::<Utc>::from_timestamp((from.timestamp().div_euclid(step) + 1) * step, 0).unwrap();
    let mut previous_offset = offset_at(zone, at - Duration::seconds(step));
    while at <= to {
        let offset = offset_at(zone, at);
        // The offset changes at most once between two tries (a day apart at least); only
        // when it does can `at` be the first instant after a gap.
        let ends_a_gap = offset != previous_offset && offset > offset_at(zone, at - Duration::seconds(1));
        if fires_by_the_rules(schedule, &fixed, at, offset, ends_a_gap) {
            ticks.insert(at);
        }
        previous_offset = offset;
        at += Duration::seconds(step);
    }
    ticks
}

/// 64 cases a property (a few seconds in a debug build); `PROPTEST_CASES` asks for more.
/// No regression file: the properties live in this source file only.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok());
    ProptestConfig {
        cases: cases.unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// The instants in `(from, to]` (from exclusive, to inclusive) are the same whether
    /// found forwards with `next_after` (firing), backwards with `newest_ticks_between`
    /// (catch-up), or backwards one `latest_at_or_before` at a time; and the `limit`
    /// and `nth_newest_at_or_before` forms give the newest of them.
    #[test]
    fn forward_and_backward_walks_find_the_same_ticks(case in case(), limit in 1usize..8) {
        let Window { schedule, from, to, forwards } = window(&case);

        let (backwards, more) = schedule.newest_ticks_between(from, to, usize::MAX);
        prop_assert_eq!(&backwards, &forwards, "newest_ticks_between vs next_after");
        prop_assert!(!more);

        let mut stepped = Vec::new();
        let mut cursor = schedule.latest_at_or_before(to);
        while let Some(tick) = cursor.filter(|tick| *tick > from) {
            stepped.push(tick);
            cursor = schedule.latest_at_or_before(tick - Duration::seconds(1));
        }
        stepped.reverse();
        prop_assert_eq!(&stepped, &forwards, "latest_at_or_before walk vs next_after");

        for limit in [1, limit, forwards.len(), forwards.len() + 1] {
            if limit == 0 {
                continue;
            }
            let (newest, more) = schedule.newest_ticks_between(from, to, limit);
            let start = forwards.len().saturating_sub(limit);
            prop_assert_eq!(&newest, &forwards[start..].to_vec(), "limit {}", limit);
            prop_assert_eq!(more, forwards.len() > limit, "limit {}", limit);
        }
        for n in 1..=forwards.len().min(4) {
            prop_assert_eq!(
                schedule.nth_newest_at_or_before(to, n),
                Some(forwards[forwards.len() - n]),
                "nth_newest_at_or_before({}, {})", to, n
            );
        }

        // The ends: nothing in (from, first tick) or (last tick, to].
        let first_after = schedule.next_after(from);
        prop_assert!(first_after.is_some());
        if let Some(first) = forwards.first() {
            prop_assert_eq!(first_after, Some(*first));
        } else {
            prop_assert!(first_after.unwrap() > to);
        }
        let latest = schedule.latest_at_or_before(to);
        match forwards.last() {
            Some(last) => prop_assert_eq!(latest, Some(*last)),
            None => prop_assert!(latest.is_none_or(|latest| latest <= from)),
        }
    }

    /// Firing never repeats an instant and always moves on: `next_after(t) > t`, the
    /// forward walk strictly increases, `latest_at_or_before(t) <= t`, and the two meet
    /// around any instant (random ones, and ones on and next to the edges of gaps and
    /// repeated ranges): no tick lies between `latest_at_or_before(t)` and `next_after(t)`.
    #[test]
    fn next_after_strictly_increases_and_meets_latest_at_or_before(
        case in case(),
        probes in prop::collection::vec((0u32..=1000, select(vec![0i64, 0, 1, 500])), 16),
    ) {
        let Window { schedule, from, to, forwards } = window(&case);
        prop_assert!(
            forwards.windows(2).all(|pair| pair[0] < pair[1]),
            "not strictly increasing: {:?}", forwards
        );
        let span = (to - from).num_milliseconds();
        let probes = probes.iter().map(|(fraction, millis)| {
            from + Duration::milliseconds(span * i64::from(*fraction) / 1000 + millis)
        });
        // Next to each change near the window: its edges and those of the range it repeats
        // or skips (half an hour or an hour away in these zones).
        let zone_index = ZONES.iter().position(|name| *name == schedule.zone().name()).unwrap();
        let edges: Vec<DateTime<Utc>> = transitions(zone_index)
            .iter()
            .filter(|change| **change > from - Duration::hours(2) && **change < to + Duration::hours(2))
            .flat_map(|change| {
                [-3600i64, -1800, 0, 1800, 3600].into_iter().flat_map(move |seconds| {
                    [-1000i64, -500, -1, 0, 1, 500].into_iter().map(move |millis| {
                        *change + Duration::seconds(seconds) + Duration::milliseconds(millis)
                    })
                })
            })
            .collect();
        for probe in forwards.iter().copied().chain(probes).chain([from, to]).chain(edges) {
            let next = schedule.next_after(probe).unwrap();
            prop_assert!(next > probe, "next_after({}) = {}", probe, next);
            let latest = schedule.latest_at_or_before(probe).unwrap();
            prop_assert!(latest <= probe, "latest_at_or_before({}) = {}", probe, latest);
            prop_assert_eq!(schedule.next_after(latest), Some(next), "next_after(latest_at_or_before({}))", probe);
            prop_assert_eq!(
                schedule.latest_at_or_before(next - Duration::seconds(1)),
                Some(latest),
                "latest_at_or_before(next_after({}) - 1s)", probe
            );
            if forwards.binary_search(&probe).is_ok() {
                prop_assert_eq!(latest, probe, "a tick is its own latest_at_or_before");
            }
        }
    }

    /// A fire's wall time exists and names it. `matches_wall_time` is true exactly for the
    /// fires some expression makes at their own wall time; a fire where it is false is the
    /// first instant after a DST gap (the second before it on the wall clock does not
    /// exist) that hid a wall time some fixed-time expression names.
    #[test]
    fn fires_only_at_real_wall_times_or_right_after_a_gap(case in case()) {
        let Window { schedule, forwards, .. } = window(&case);
        let zone = schedule.zone();
        let fixed: Vec<bool> = schedule.crons.iter().map(is_fixed_time).collect();
        for &tick in &forwards {
            let local = wall(zone, tick);
            let on_its_own_wall_time = fires_by_the_rules(&schedule, &fixed, tick, offset_at(zone, tick), false);
            prop_assert_eq!(
                schedule.matches_wall_time(tick),
                on_its_own_wall_time,
                "matches_wall_time({}) at {}", tick, local
            );
            match zone.from_local_datetime(&local) {
                LocalResult::Single(instant) => prop_assert_eq!(instant, tick),
                LocalResult::Ambiguous(earlier, later) => prop_assert!(tick == earlier || tick == later),
                LocalResult::None => prop_assert!(false, "{} fires inside a gap at {}", tick, local),
            }
            if !schedule.matches_wall_time(tick) {
                let gap = gap_ending_at(zone, tick);
                prop_assert!(!gap.is_empty(), "{} ({}) matches no expression and ends no gap", tick, local);
                prop_assert!(
                    schedule.crons.iter().filter(|cron| is_fixed_time(cron)).any(|cron| {
                        gap.iter().any(|hidden| cron.is_time_matching(hidden).unwrap())
                    }),
                    "{} ends a gap that hid no fixed time of the schedule", tick
                );
            }
        }
    }

    /// The forward walk fires exactly where an instant-by-instant reading of the DST rules
    /// says (every second of a second-level window, every minute of a minute-level one: all
    /// these zones change on a whole minute): nothing skipped, nothing extra.
    #[test]
    fn fires_exactly_where_the_dst_rules_say(case in case()) {
        let Window { schedule, from, to, forwards } = window(&case);
        let step = if has_seconds(&schedule) { 1 } else { 60 };
        let expected = ticks_by_the_rules(&schedule, from, to, step);
        let found: BTreeSet<DateTime<Utc>> = forwards.iter().copied().collect();
        let shown = |ticks: Vec<&DateTime<Utc>>| -> Vec<String> {
            ticks.iter().map(|tick| tick.with_timezone(&schedule.zone()).to_rfc3339()).collect()
        };
        let missing = shown(expected.difference(&found).collect());
        let extra = shown(found.difference(&expected).collect());
        prop_assert!(
            missing.is_empty() && extra.is_empty(),
            "missing {:?}, extra {:?}", missing, extra
        );
    }

    /// A schedule made only of fixed-time expressions fires at most once per wall-clock
    /// time, also through a repeated hour.
    #[test]
    fn fixed_time_schedules_fire_once_per_wall_time(case in fixed_time_case()) {
        let Window { schedule, forwards, .. } = window(&case);
        prop_assert!(schedule.crons.iter().all(is_fixed_time), "the generator made a non-fixed-time schedule");
        let mut walls: Vec<NaiveDateTime> = forwards.iter().map(|tick| wall(schedule.zone(), *tick)).collect();
        walls.sort();
        prop_assert!(walls.windows(2).all(|pair| pair[0] != pair[1]), "a wall time fires twice: {:?}", walls);
    }

    /// On a fall-back day, a fixed time inside the repeated range fires once, at its first
    /// occurrence, and the same minute and second with a wildcard hour fires at both.
    #[test]
    fn a_repeated_wall_time_fires_once_if_fixed_and_twice_if_wildcard(
        zone_index in prop::sample::select(vec![0usize, 1, 2, 3, 4]),
        transition in any::<Index>(),
        offset_fraction in 0u32..1000,
        minute_level in any::<bool>(),
    ) {
        let zone = zone(zone_index);
        let fall_backs: Vec<DateTime<Utc>> = transitions(zone_index)
            .iter()
            .copied()
            .filter(|at| offset_at(zone, *at) < offset_at(zone, *at - Duration::seconds(1)))
            .collect();
        prop_assert!(!fall_backs.is_empty());
        let change = fall_backs[transition.index(fall_backs.len())];
        let repeated = offset_at(zone, change - Duration::seconds(1)) - offset_at(zone, change);
        let mut into = i64::from(repeated) * i64::from(offset_fraction) / 1000;
        if minute_level {
            into -= into % 60;
        }
        let repeated_wall = wall(zone, change) + Duration::seconds(into);
        let (earlier, later) = match zone.from_local_datetime(&repeated_wall) {
            LocalResult::Ambiguous(earlier, later) => (earlier.with_timezone(&Utc), later.with_timezone(&Utc)),
            other => panic!("{repeated_wall} should be repeated in {zone}, is {other:?}"),
        };
        let (second, minute, hour) = (
            chrono::Timelike::second(&repeated_wall),
            chrono::Timelike::minute(&repeated_wall),
            chrono::Timelike::hour(&repeated_wall),
        );
        let (fixed, wildcard) = if minute_level {
            (format!("{minute} {hour} * * *"), format!("{minute} * * * *"))
        } else {
            (format!("{second} {minute} {hour} * * *"), format!("{second} {minute} * * * *"))
        };
        let (from, to) = (change - Duration::days(1), change + Duration::days(1));
        for (expression, expected) in [(fixed, vec![earlier]), (wildcard, vec![earlier, later])] {
            let schedule = Schedule::parse(&expression, zone).unwrap();
            let at_that_wall_time: Vec<_> =
                walk_forwards(&schedule, from, to).into_iter().filter(|tick| wall(zone, *tick) == repeated_wall).collect();
            prop_assert_eq!(&at_that_wall_time, &expected, "{} in {} around {}", expression, zone, change);
            let (backwards, _) = schedule.newest_ticks_between(from, to, usize::MAX);
            let backwards: Vec<_> = backwards.into_iter().filter(|tick| wall(zone, *tick) == repeated_wall).collect();
            prop_assert_eq!(&backwards, &expected, "{} in {} backwards", expression, zone);
        }
    }

    /// Catch-up with `CatchUp::All` runs exactly the newest <= 100 ticks that firing would
    /// have found walking forwards from the last claimed tick (or from now minus the
    /// starting deadline, if later) up to and including now, and says when it left some out.
    #[test]
    fn catch_up_all_runs_the_newest_ticks_firing_would_have_run(
        case in case(),
        deadline in prop::option::of(60u64..2 * 86_400),
    ) {
        let Window { schedule, from, to, .. } = window(&case);
        let floor = match deadline {
            Some(deadline) => from.max(to - Duration::seconds(deadline as i64)),
            None => from,
        };
        let forwards = walk_forwards(&schedule, floor, to);
        let job = Job {
            catch_up: CatchUp::All,
            starting_deadline: deadline.map(std::time::Duration::from_secs),
            schedule: Arc::new(schedule),
            ..Job::for_tests("properties", "* * * * *")
        };
        let missed = missed_ticks(&job, Some(from), to);
        let start = forwards.len().saturating_sub(MAX_CATCH_UP);
        prop_assert_eq!(&missed.ticks, &forwards[start..].to_vec());
        prop_assert_eq!(missed.truncated, forwards.len() > MAX_CATCH_UP);
        prop_assert_eq!(misses_any(&job, Some(from), to), !forwards.is_empty(), "the one-step check agrees");
        prop_assert_eq!(missed_ticks(&job, None, to).ticks, Vec::<DateTime<Utc>>::new());
    }
}
