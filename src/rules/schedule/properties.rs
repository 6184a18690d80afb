//! Property tests: firing (forwards) and catch-up (backwards) agree, and both follow the DST
//! rules, on generated schedules, zones and windows around the DST changes of 2026 and 2027.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{Duration, LocalResult, NaiveDateTime, TimeZone};
use croner::JobType;
use proptest::prelude::*;
use proptest::sample::{select, Index};

use super::*;
use crate::rules::catch_up::{missed_ticks, misses_any, MAX_CATCH_UP};
use crate::rules::config::{CatchUp, Job};

mod strategies;
mod zones;

use strategies::*;
use zones::*;

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
