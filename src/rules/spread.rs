//! Hash-spread schedules (Jenkins' `H`): a field value derived from the job's name, so that
//! hundreds of jobs written with one schedule spread over the hour instead of all firing at :00.
//!
//! The mapping is a contract: a job's `H` values depend on its name and the field only, never on
//! the node, the shard count or the order of jobs. Renaming a job moves its slot; nothing else
//! does. For a field with range `lo..=hi` and the hash `h` = seahash of `"<job>\0<field>"`:
//!
//! | written | becomes |
//! |---|---|
//! | `H` | `lo + h % (hi - lo + 1)` |
//! | `H(a-b)` | `a + h % (b - a + 1)` |
//! | `H/n` | `lo + h % n` to `hi` every `n` |
//! | `H(a-b)/n` | `a + h % n` to `b` every `n` |
//!
//! Day-of-month `H` uses 1–28, so the job fires in every month.

/// Each field's name and the range `H` takes in it, for 6 fields (leading seconds).
const FIELDS: [(&str, u32, u32); 6] = [
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 28),
    ("month", 1, 12),
    ("day-of-week", 0, 6),
];

/// Whether `expression` has an `H` item in any field. Names such as `THU` contain an `H` but
/// never start an item with one.
pub fn uses_hash(expression: &str) -> bool {
    expression
        .split_whitespace()
        .flat_map(|field| field.split(','))
        .any(|item| item.starts_with('H'))
}

/// `expression` (5 or 6 fields) with every `H` item replaced by its value for `job`.
pub fn expand(expression: &str, job: &str) -> Result<String, String> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let kinds = match fields.len() {
        6 => &FIELDS[..],
        5 => &FIELDS[1..],
        found => {
            return Err(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week) or 6 with leading seconds, found {found}"
        ))
        }
    };
    let expanded: Result<Vec<String>, String> = fields
        .iter()
        .zip(kinds)
        .map(|(field, &(name, lo, hi))| {
            field
                .split(',')
                .map(|item| expand_item(item, job, name, lo, hi))
                .collect::<Result<Vec<_>, _>>()
                .map(|items| items.join(","))
        })
        .collect();
    Ok(expanded?.join(" "))
}

fn expand_item(item: &str, job: &str, field: &str, lo: u32, hi: u32) -> Result<String, String> {
    let Some(rest) = item.strip_prefix('H') else {
        return Ok(item.to_string());
    };
    let hash = seahash::hash(format!("{job}\0{field}").as_bytes());
    let pick = |from: u32, count: u32| from + (hash % u64::from(count)) as u32;
    let (range, step) = match rest.split_once('/') {
        Some((range, step)) => {
            let step: u32 = step
                .parse()
                .ok()
                .filter(|step| *step > 0)
                .ok_or_else(|| format!("{field}: invalid step in {item:?}"))?;
            (range, Some(step))
        }
        None => (rest, None),
    };
    let (from, to) = if range.is_empty() {
        (lo, hi)
    } else {
        let inner = range
            .strip_prefix('(')
            .and_then(|range| range.strip_suffix(')'))
            .ok_or_else(|| format!("{field}: expected H, H(a-b), H/n or H(a-b)/n, found {item:?}"))?;
        let (from, to) = inner
            .split_once('-')
            .and_then(|(from, to)| Some((from.trim().parse::<u32>().ok()?, to.trim().parse::<u32>().ok()?)))
            .ok_or_else(|| format!("{field}: invalid range in {item:?}"))?;
        let field_lo = if field == "day-of-month" { 1 } else { lo };
        let field_hi = if field == "day-of-month" { 31 } else { hi };
        if from > to || from < field_lo || to > field_hi {
            return Err(format!(
                "{field}: range in {item:?} must lie within {field_lo}-{field_hi}"
            ));
        }
        (from, to)
    };
    Ok(match step {
        None => pick(from, to - from + 1).to_string(),
        Some(step) => {
            let start = pick(from, step.min(to - from + 1));
            format!("{start}-{to}/{step}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values are a contract: these must never change for these names.
    #[test]
    fn values_are_pinned_for_fixed_names() {
        let cases = [
            ("backup", "H H * * *"),
            ("backup", "H(0-29) H(1-5) * * *"),
            ("report", "H/15 * * * *"),
            ("report", "0 H(8-17)/2 * * 1-5"),
            ("cleanup", "H H H H H"),
            ("cleanup", "H * * * * *"),
            ("cleanup", "H,30 * * * *"),
        ];
        let expanded: Vec<String> = cases
            .iter()
            .map(|(job, expression)| expand(expression, job).unwrap())
            .collect();
        assert_eq!(expanded, PINNED);
    }

    const PINNED: [&str; 7] = [
        "13 8 * * *",
        "13 4 * * *",
        "8-59/15 * * * *",
        "0 9-17/2 * * 1-5",
        "10 4 15 6 3",
        "59 * * * * *",
        "10,30 * * * *",
    ];

    #[test]
    fn every_value_lies_in_its_range_and_names_spread() {
        let mut minutes = std::collections::HashSet::new();
        for index in 0..200 {
            let job = format!("job-{index}");
            let fields: Vec<u32> = expand("H H H H H", &job)
                .unwrap()
                .split(' ')
                .map(|field| field.parse().unwrap())
                .collect();
            assert!(fields[0] <= 59 && fields[1] <= 23);
            assert!((1..=28).contains(&fields[2]) && (1..=12).contains(&fields[3]) && fields[4] <= 6);
            minutes.insert(fields[0]);
            let step = expand("H(10-20)/4 * * * *", &job).unwrap();
            let start: u32 = step.split('-').next().unwrap().parse().unwrap();
            assert!((10..=13).contains(&start), "{step}");
        }
        assert!(minutes.len() > 40, "200 names use {} distinct minutes", minutes.len());
    }

    #[test]
    fn malformed_h_items_are_refused() {
        for bad in [
            "H(5) * * * *",
            "H(9-3) * * * *",
            "H/0 * * * *",
            "H(0-99) * * * *",
            "Hx * * * *",
        ] {
            assert!(expand(bad, "j").is_err(), "{bad}");
        }
    }
}
