//! Which field of a cron expression is wrong, and how, in words an operator can act on: the
//! parser underneath says only "Number out of bounds" or "Step cannot be zero".

/// A field of a crontab line: its name and the values it takes.
struct Field {
    name: &'static str,
    low: u32,
    high: u32,
    /// Names it also takes (`JAN`..`DEC`, `SUN`..`SAT`), upper case.
    names: &'static [&'static str],
}

const SECOND: Field = Field {
    name: "second",
    low: 0,
    high: 59,
    names: &[],
};
const MINUTE: Field = Field {
    name: "minute",
    low: 0,
    high: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    low: 0,
    high: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day of month",
    low: 1,
    high: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    low: 1,
    high: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
};
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    low: 0,
    high: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

/// What is wrong with the first field of `expression` (5 or 6 fields, nicknames and `H`
/// expanded) that holds a number out of its range, a step of 0 or a character no field takes;
/// `None` when no field shows one, and the parser's own words stand.
pub(super) fn explain(expression: &str) -> Option<String> {
    let parts: Vec<&str> = expression.split_whitespace().collect();
    let fields: &[Field] = match parts.len() {
        5 => &[MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK],
        6 => &[SECOND, MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK],
        _ => return None,
    };
    parts.iter().zip(fields).find_map(|(part, field)| wrong_in(part, field))
}

fn wrong_in(part: &str, field: &Field) -> Option<String> {
    let range = format!("{}-{}", field.low, field.high);
    for item in part.split(',') {
        let (values, step) = match item.split_once('/') {
            Some((values, step)) => (values, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step {
            match step.parse::<u32>() {
                Ok(0) => {
                    return Some(format!(
                        "the {} field has a step of 0 in {item:?}: a step is 1 or more",
                        field.name
                    ))
                }
                Ok(_) => {}
                Err(_) => {
                    return Some(format!(
                        "the {} field has {step:?} as a step in {item:?}: a step is a whole number",
                        field.name
                    ))
                }
            }
        }
        for value in values.split('-') {
            if value == "*" || value == "?" || value.is_empty() {
                continue;
            }
            // The parser's own extensions (`L`, `W`, `#`) are left to it.
            if value.contains(['L', 'W', '#', 'l', 'w'])
                && !field.names.iter().any(|name| name.eq_ignore_ascii_case(value))
            {
                continue;
            }
            match value.parse::<u32>() {
                Ok(number) if number < field.low || number > field.high => {
                    return Some(format!("the {} field takes {range}, not {number}", field.name));
                }
                Ok(_) => {}
                Err(_) if field.names.iter().any(|name| name.eq_ignore_ascii_case(value)) => {}
                Err(_) => {
                    let names = match field.names {
                        [] => String::new(),
                        names => format!(" or {}..{}", names[0], names[names.len() - 1]),
                    };
                    return Some(format!(
                        "the {} field has {value:?}: it takes {range}{names}, *, ranges a-b, lists a,b and steps */n",
                        field.name
                    ));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::explain;

    #[test]
    fn the_wrong_field_is_named_with_its_range_and_the_value() {
        let cases = [
            ("61 * * * *", "the minute field takes 0-59, not 61"),
            ("* 25 * * *", "the hour field takes 0-23, not 25"),
            ("* * 0 * *", "the day of month field takes 1-31, not 0"),
            ("* * * 13 *", "the month field takes 1-12, not 13"),
            ("* * * * 8", "the day of week field takes 0-7, not 8"),
            ("70 * * * * *", "the second field takes 0-59, not 70"),
            ("0 1-24 * * *", "the hour field takes 0-23, not 24"),
            (
                "*/0 * * * *",
                "the minute field has a step of 0 in \"*/0\": a step is 1 or more",
            ),
            (
                "a * * * *",
                "the minute field has \"a\": it takes 0-59, *, ranges a-b, lists a,b and steps */n",
            ),
            (
                "0 0 * FOO *",
                "the month field has \"FOO\": it takes 1-12 or JAN..DEC, *, ranges a-b, lists a,b and steps */n",
            ),
        ];
        for (expression, said) in cases {
            assert_eq!(explain(expression).as_deref(), Some(said), "{expression}");
        }
    }

    #[test]
    fn a_valid_field_is_left_alone() {
        for expression in [
            "*/5 * * * *",
            "0 9-17 * JAN-MAR MON-FRI",
            "0 0 L * *",
            "0 0 * * 5#3",
            "30 2 1,15 * *",
        ] {
            assert_eq!(explain(expression), None, "{expression}");
        }
    }
}
