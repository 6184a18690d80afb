//! "Did you mean": the known name closest to one that is not known, when one is close enough
//! to be a typo.

/// Names longer than this are compared by their first this many characters: a hostile or
/// generated name cannot make a lookup slow.
const COMPARED: usize = 128;

/// The name of `known` closest to `given` by edits (insert, delete, replace a character), if
/// it is at most a third of `given`'s length away, and at most 3; the first such, when several
/// are as close.
pub fn closest<'a>(given: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let given: Vec<char> = given.chars().take(COMPARED).collect();
    let limit = (given.len() / 3).clamp(1, 3);
    let mut best: Option<(usize, &str)> = None;
    for name in known {
        let candidate: Vec<char> = name.chars().take(COMPARED).collect();
        let within = best.map_or(limit, |(distance, _)| distance.saturating_sub(1));
        if let Some(distance) = distance_within(&given, &candidate, within) {
            best = Some((distance, name));
        }
    }
    best.map(|(_, name)| name)
}

/// `"; did you mean \"NAME\"?"` for the closest of `known`, or nothing.
pub fn did_you_mean<'a>(given: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    closest(given, known).map_or_else(String::new, |name| format!("; did you mean {name:?}?"))
}

/// The edit distance of `a` and `b` if it is at most `limit`: only a band of the table as wide
/// as the limit is filled, so a long list of far names costs little.
fn distance_within(a: &[char], b: &[char], limit: usize) -> Option<usize> {
    if a.len().abs_diff(b.len()) > limit {
        return None;
    }
    let beyond = limit + 1;
    let mut previous: Vec<usize> = (0..=b.len()).map(|j| j.min(beyond)).collect();
    for (i, &left) in a.iter().enumerate() {
        let mut current = vec![beyond; b.len() + 1];
        current[0] = (i + 1).min(beyond);
        let from = (i + 1).saturating_sub(limit).max(1);
        let to = (i + 1 + limit).min(b.len());
        for j in from..=to {
            let replace = previous[j - 1] + usize::from(left != b[j - 1]);
            current[j] = replace.min(previous[j] + 1).min(current[j - 1] + 1).min(beyond);
        }
        if current.iter().all(|&cell| cell > limit) {
            return None;
        }
        previous = current;
    }
    let distance = previous[b.len()];
    (distance <= limit).then_some(distance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_finds_its_name_and_a_stranger_finds_none() {
        let fields = ["schedule", "command", "timezone", "group", "overlap"];
        assert_eq!(closest("shcedule", fields), Some("schedule"));
        assert_eq!(closest("comand", fields), Some("command"));
        assert_eq!(closest("grup", fields), Some("group"));
        assert_eq!(closest("owner", fields), None);
        assert_eq!(closest("x", fields), None);
        assert_eq!(did_you_mean("dbs", ["db", "cache"]), "; did you mean \"db\"?");
        assert_eq!(did_you_mean("queue", ["db", "cache"]), "");
    }

    #[test]
    fn the_closest_of_several_wins() {
        assert_eq!(
            closest("backup-2", ["backup-10", "backup-1", "backup-22"]),
            Some("backup-1")
        );
    }

    #[test]
    fn a_long_name_is_compared_by_its_start() {
        let long = "a".repeat(10_000);
        assert_eq!(closest(&long, [long.as_str()]), Some(long.as_str()));
    }
}
