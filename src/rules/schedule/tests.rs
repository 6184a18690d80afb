use super::*;

fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339).unwrap().with_timezone(&Utc)
}

fn next_n(expr: &str, zone: &str, from: &str, n: usize) -> Vec<String> {
    let zone = parse_zone(zone).unwrap();
    let schedule = Schedule::parse(expr, zone).unwrap();
    let mut cursor = at(from);
    (0..n)
        .map(|_| {
            cursor = schedule.next_after(cursor).unwrap();
            cursor.with_timezone(&zone).to_rfc3339()
        })
        .collect()
}

#[test]
fn days_of_the_week_table() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // Monday is 1: `0 0 * * 1` fires on Monday, not Sunday.
        (
            "0 0 * * 1",
            "UTC",
            "2027-01-01T00:00:00Z",
            &["2027-01-04T00:00:00+00:00"],
        ),
        // Sunday is both 0 and 7.
        (
            "0 0 * * 0",
            "UTC",
            "2027-01-01T00:00:00Z",
            &["2027-01-03T00:00:00+00:00"],
        ),
        (
            "0 0 * * 7",
            "UTC",
            "2027-01-01T00:00:00Z",
            &["2027-01-03T00:00:00+00:00"],
        ),
        (
            "0 0 * * SUN",
            "UTC",
            "2027-01-01T00:00:00Z",
            &["2027-01-03T00:00:00+00:00"],
        ),
        // Day-of-month OR day-of-week when both are restricted: the 13th or any Friday.
        (
            "0 0 13 * FRI",
            "UTC",
            "2027-01-01T00:00:00Z",
            &[
                "2027-01-08T00:00:00+00:00",
                "2027-01-13T00:00:00+00:00",
                "2027-01-15T00:00:00+00:00",
            ],
        ),
        // Names and ranges.
        (
            "30 9 * JAN MON-FRI",
            "UTC",
            "2027-01-01T10:00:00Z",
            &["2027-01-04T09:30:00+00:00", "2027-01-05T09:30:00+00:00"],
        ),
    ];
    for (expr, zone, from, expected) in cases {
        assert_eq!(
            &next_n(expr, zone, from, expected.len()),
            expected,
            "{expr} in {zone} after {from}"
        );
    }
}

#[test]
fn fields_table() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // Feb 29 only in leap years.
        (
            "0 12 29 2 *",
            "UTC",
            "2027-01-01T00:00:00Z",
            &["2028-02-29T12:00:00+00:00", "2032-02-29T12:00:00+00:00"],
        ),
        // Six fields: leading seconds.
        (
            "*/20 * * * * *",
            "UTC",
            "2027-01-01T00:00:00Z",
            &["2027-01-01T00:00:20+00:00", "2027-01-01T00:00:40+00:00"],
        ),
        // Lists and steps.
        (
            "0 8,12-14/2 * * *",
            "UTC",
            "2027-01-01T00:00:00Z",
            &[
                "2027-01-01T08:00:00+00:00",
                "2027-01-01T12:00:00+00:00",
                "2027-01-01T14:00:00+00:00",
            ],
        ),
        // Europe/Berlin wall clock.
        (
            "0 9 * * *",
            "Europe/Berlin",
            "2027-07-01T00:00:00Z",
            &["2027-07-01T09:00:00+02:00"],
        ),
        (
            "0 9 * * *",
            "Europe/Berlin",
            "2027-12-01T00:00:00Z",
            &["2027-12-01T09:00:00+01:00"],
        ),
    ];
    for (expr, zone, from, expected) in cases {
        assert_eq!(
            &next_n(expr, zone, from, expected.len()),
            expected,
            "{expr} in {zone} after {from}"
        );
    }
}

#[test]
fn nicknames_table() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        ("@hourly", "UTC", "2027-01-01T00:30:00Z", &["2027-01-01T01:00:00+00:00"]),
        ("@daily", "UTC", "2027-01-01T00:30:00Z", &["2027-01-02T00:00:00+00:00"]),
        (
            "@midnight",
            "UTC",
            "2027-01-01T00:30:00Z",
            &["2027-01-02T00:00:00+00:00"],
        ),
        ("@weekly", "UTC", "2027-01-01T00:30:00Z", &["2027-01-03T00:00:00+00:00"]),
        (
            "@monthly",
            "UTC",
            "2027-01-01T00:30:00Z",
            &["2027-02-01T00:00:00+00:00"],
        ),
        ("@yearly", "UTC", "2027-01-01T00:30:00Z", &["2028-01-01T00:00:00+00:00"]),
        (
            "@annually",
            "UTC",
            "2027-01-01T00:30:00Z",
            &["2028-01-01T00:00:00+00:00"],
        ),
    ];
    for (expr, zone, from, expected) in cases {
        assert_eq!(
            &next_n(expr, zone, from, expected.len()),
            expected,
            "{expr} in {zone} after {from}"
        );
    }
}

#[test]
fn dst_table() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // New York spring forward 2027-03-14 02:00 -> 03:00: a fixed time in the gap fires
        // once, at the first instant after it.
        (
            "30 2 * * *",
            "America/New_York",
            "2027-03-13T12:00:00Z",
            &["2027-03-14T03:00:00-04:00", "2027-03-15T02:30:00-04:00"],
        ),
        // New York fall back 2027-11-07 02:00 -> 01:00: a fixed time in the overlap fires once,
        // at the first (EDT) occurrence.
        (
            "30 1 * * *",
            "America/New_York",
            "2027-11-06T12:00:00Z",
            &["2027-11-07T01:30:00-04:00", "2027-11-08T01:30:00-05:00"],
        ),
        // A wildcard hour fires by elapsed time: both 01:30s in the overlap.
        (
            "30 * * * *",
            "America/New_York",
            "2027-11-07T04:45:00Z",
            &[
                "2027-11-07T01:30:00-04:00",
                "2027-11-07T01:30:00-05:00",
                "2027-11-07T02:30:00-05:00",
            ],
        ),
        // ... and the missing hour simply does not happen.
        (
            "30 * * * *",
            "America/New_York",
            "2027-03-14T06:00:00Z",
            &["2027-03-14T01:30:00-05:00", "2027-03-14T03:30:00-04:00"],
        ),
        // Berlin spring forward 2027-03-28 02:00 -> 03:00.
        (
            "15 2 * * *",
            "Europe/Berlin",
            "2027-03-27T12:00:00Z",
            &["2027-03-28T03:00:00+02:00", "2027-03-29T02:15:00+02:00"],
        ),
        // Lord Howe moves by 30 minutes: spring forward 2027-10-03 02:00 -> 02:30.
        (
            "15 2 * * *",
            "Australia/Lord_Howe",
            "2027-10-02T00:00:00Z",
            &["2027-10-03T02:30:00+11:00", "2027-10-04T02:15:00+11:00"],
        ),
        // Lord Howe fall back 2027-04-04 02:00 -> 01:30: 01:45 happens twice, fires once.
        (
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2027-04-03T00:00:00Z",
            &["2027-04-04T01:45:00+11:00", "2027-04-05T01:45:00+10:30"],
        ),
    ];
    for (expr, zone, from, expected) in cases {
        assert_eq!(
            &next_n(expr, zone, from, expected.len()),
            expected,
            "{expr} in {zone} after {from}"
        );
    }
}

#[test]
fn rejects_bad_and_never_firing_expressions() {
    let utc = Tz::UTC;
    for bad in [
        "",
        "* * * *",
        "61 * * * *",
        "* * * * * * *",
        "0 0 * * FOO",
        "@sometimes",
    ] {
        assert!(
            matches!(Schedule::parse(bad, utc), Err(ScheduleError::Invalid { .. })),
            "{bad:?} should be invalid"
        );
    }
    assert!(matches!(
        Schedule::parse("0 0 31 2 *", utc),
        Err(ScheduleError::NeverFires { .. })
    ));
    assert!(matches!(
        Schedule::parse("0 0 30 2 *", utc),
        Err(ScheduleError::NeverFires { .. })
    ));
}

#[test]
fn newest_ticks_walk_back_from_the_end() {
    let schedule = Schedule::parse("*/10 * * * * *", Tz::UTC).unwrap();
    let (ticks, more) = schedule.newest_ticks_between(at("2027-01-01T00:00:00Z"), at("2027-01-01T00:00:35Z"), 100);
    assert_eq!(
        ticks,
        vec![
            at("2027-01-01T00:00:10Z"),
            at("2027-01-01T00:00:20Z"),
            at("2027-01-01T00:00:30Z")
        ]
    );
    assert!(!more);
    let (ticks, more) = schedule.newest_ticks_between(at("2026-01-01T00:00:00Z"), at("2027-01-01T00:00:35Z"), 2);
    assert_eq!(ticks, vec![at("2027-01-01T00:00:20Z"), at("2027-01-01T00:00:30Z")]);
    assert!(more);
    let (ticks, _) = schedule.newest_ticks_between(at("2027-01-01T00:00:30Z"), at("2027-01-01T00:00:30Z"), 5);
    assert!(ticks.is_empty());
}

#[test]
fn a_list_fires_at_the_union_of_its_expressions_once_per_instant() {
    let zone = parse_zone("UTC").unwrap();
    let list = Schedule::parse_for_job(&["0 9 * * 1-5", "0 9,12 * * 5-6"], zone, None).unwrap();
    let mut cursor = at("2027-01-06T12:00:00Z");
    let fires: Vec<String> = (0..5)
        .map(|_| {
            cursor = list.next_after(cursor).unwrap();
            cursor.to_rfc3339()
        })
        .collect();
    // Wednesday 6 January 2027: Thursday 09:00, Friday 09:00 (named twice, fired once) and
    // 12:00, Saturday 09:00 and 12:00.
    assert_eq!(
        fires,
        [
            "2027-01-07T09:00:00+00:00",
            "2027-01-08T09:00:00+00:00",
            "2027-01-08T12:00:00+00:00",
            "2027-01-09T09:00:00+00:00",
            "2027-01-09T12:00:00+00:00",
        ]
    );
    assert_eq!(list.expanded(), "0 9 * * 1-5 | 0 9,12 * * 5-6");
    assert_eq!(
        Schedule::parse_for_job(&[], zone, None).unwrap_err(),
        ScheduleError::Empty
    );
}

#[test]
fn an_h_needs_a_job_and_day_names_are_not_an_h() {
    let zone = parse_zone("UTC").unwrap();
    assert!(matches!(
        Schedule::parse("H * * * *", zone),
        Err(ScheduleError::NeedsJob { .. })
    ));
    let thursdays = Schedule::parse("0 9 * * THU", zone).unwrap();
    assert_eq!(thursdays.expanded(), "0 9 * * THU");
    let spread = Schedule::parse_for_job(&["H 9 * * THU"], zone, Some("report")).unwrap();
    assert_eq!(
        spread.expanded(),
        crate::rules::spread::expand("H 9 * * THU", "report").unwrap()
    );
    assert_eq!(Schedule::parse("@daily", zone).unwrap().label(), "@daily in UTC");
}

/// Catch-up walks backwards from now, firing walks forwards from the last tick: on every
/// schedule, zone and DST day of the table both must find the same instants.
#[test]
fn catching_up_backwards_finds_what_firing_finds_forwards() {
    let expressions = [
        "30 2 * * *",
        "30 1 * * *",
        "15 2 * * *",
        "45 1 * * *",
        "30 * * * *",
        "*/15 * * * *",
        "0 */2 * * *",
        "0 0 * * 0",
        "@hourly",
        "*/20 * * * * *",
        "* * * * * *",
        // A list whose expressions name some instants in common, and a hash-spread one.
        "30 2 * * * | 0 */2 * * * | 30 */3 * * *",
        "H H(1-3) * * *",
    ];
    // Three days around each zone's DST changes of 2027, and a quiet week in UTC.
    let windows = [
        ("America/New_York", "2027-03-13T00:00:00Z", "2027-03-16T00:00:00Z"),
        ("America/New_York", "2027-11-06T00:00:00Z", "2027-11-09T00:00:00Z"),
        ("Europe/Berlin", "2027-03-27T00:00:00Z", "2027-03-30T00:00:00Z"),
        ("Europe/Berlin", "2027-10-30T00:00:00Z", "2027-11-02T00:00:00Z"),
        ("Australia/Lord_Howe", "2027-04-03T00:00:00Z", "2027-04-06T00:00:00Z"),
        ("Australia/Lord_Howe", "2027-10-02T00:00:00Z", "2027-10-05T00:00:00Z"),
        ("UTC", "2027-01-01T00:00:00Z", "2027-01-08T00:00:00Z"),
    ];
    for expression in expressions {
        for (zone, after, until) in windows {
            let list: Vec<&str> = expression.split(" | ").collect();
            let schedule = Schedule::parse_for_job(&list, zone.parse().unwrap(), Some("spread")).unwrap();
            let (after, until) = (at(after), at(until));
            // The per-second schedule over a whole window is a quarter million ticks: an hour of it.
            let until = if expression.split_whitespace().count() == 6 {
                after + chrono::Duration::hours(1)
            } else {
                until
            };
            let mut forwards = Vec::new();
            let mut cursor = schedule.next_after(after);
            while let Some(tick) = cursor.filter(|tick| *tick <= until) {
                forwards.push(tick);
                cursor = schedule.next_after(tick);
            }
            assert!(
                forwards.windows(2).all(|pair| pair[0] < pair[1]),
                "{expression} in {zone}: two fires at one instant"
            );
            let (backwards, more) = schedule.newest_ticks_between(after, until, usize::MAX);
            let differs = backwards.iter().zip(&forwards).position(|(back, forth)| back != forth);
            assert!(
                backwards.len() == forwards.len() && differs.is_none(),
                "{expression} in {zone} from {after} to {until}: {} ticks backwards, {} forwards, first difference at {differs:?}",
                backwards.len(),
                forwards.len()
            );
            assert!(!more);
            for limit in [1, 3] {
                let (newest, more) = schedule.newest_ticks_between(after, until, limit);
                let start = forwards.len().saturating_sub(limit);
                assert_eq!(newest, forwards[start..], "{expression} in {zone}, newest {limit}");
                assert_eq!(more, forwards.len() > limit, "{expression} in {zone}, newest {limit}");
            }
        }
    }
}
