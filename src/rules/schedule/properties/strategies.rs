//! The generated cases: schedules made of fields, fixed times near the zones' changes and
//! picked expressions, in a zone, over a window placed against one of its changes.

use proptest::prelude::*;
use proptest::sample::{select, Index};

use super::*;

pub(super) fn number(range: std::ops::Range<u32>) -> BoxedStrategy<String> {
    range.prop_map(|value| value.to_string()).boxed()
}

/// Wall clock (hour, minute)s every 15 minutes from half an hour before to half an hour
/// after each of the zone's changes, so inside and around its gaps and repeated ranges;
/// for a zone without changes, the hours where the others have them.
pub(super) fn hot_times(zone_index: usize) -> Vec<(u32, u32)> {
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

pub(super) fn hot_hour(zone_index: usize) -> BoxedStrategy<String> {
    let mut hours: Vec<u32> = hot_times(zone_index).iter().map(|(hour, _)| *hour).collect();
    hours.dedup();
    select(hours).prop_map(|hour| hour.to_string()).boxed()
}

/// A fixed time of day near one of the zone's changes: `m h` or `s m h`.
pub(super) fn hot_fixed_time(zone_index: usize, seconds: bool) -> BoxedStrategy<String> {
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

pub(super) fn second_field() -> BoxedStrategy<String> {
    prop_oneof![
        2 => number(0..60),
        2 => select(vec![5u32, 10, 15, 20, 30]).prop_map(|step| format!("*/{step}")),
        1 => (0u32..30, 30u32..60).prop_map(|(a, b)| format!("{a},{b}")),
        1 => (0u32..50, 1u32..10).prop_map(|(a, len)| format!("{a}-{}", a + len)),
    ]
    .boxed()
}

pub(super) fn minute_field() -> BoxedStrategy<String> {
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

pub(super) fn hour_field(zone_index: usize) -> BoxedStrategy<String> {
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

pub(super) fn day_fields() -> BoxedStrategy<String> {
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
pub(super) const PICKED: [&str; 39] = [
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

pub(super) fn expression(zone_index: usize) -> BoxedStrategy<String> {
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

pub(super) fn fixed_time_expression(zone_index: usize) -> BoxedStrategy<String> {
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
pub(super) struct Case {
    pub(super) expressions: Vec<String>,
    pub(super) job: String,
    pub(super) zone: Tz,
    pub(super) from: DateTime<Utc>,
    pub(super) to: DateTime<Utc>,
    /// Move `from` back onto a tick, to test that `from` is exclusive.
    pub(super) snap_from: bool,
    /// Move `to` back onto a tick, to test that `to` is inclusive.
    pub(super) snap_to: bool,
}

pub(super) fn case() -> impl Strategy<Value = Case> {
    case_of(expression)
}

/// A case whose expressions are all fixed-time (one second, minute and hour each).
pub(super) fn fixed_time_case() -> impl Strategy<Value = Case> {
    case_of(fixed_time_expression)
}

/// Where a window lies against its anchor (a change of the zone's offset).
#[derive(Debug, Clone)]
pub(super) enum Placement {
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

pub(super) fn placement() -> impl Strategy<Value = Placement> {
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

pub(super) fn case_of(expression: fn(usize) -> BoxedStrategy<String>) -> impl Strategy<Value = Case> {
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
