//! `[groups.<name>]` and a job's `group`: the limit and wait read, and every bad group named by
//! its field, and the job that names an unknown one.

use std::time::Duration;

use super::*;

fn job_table(name: &str, extra: &str) -> String {
    format!("\n[jobs.{name}]\nschedule = \"* * * * *\"\ncommand = \"true\"\n{extra}\n")
}

#[test]
fn a_job_joins_the_group_it_names_with_its_limit_and_wait() {
    let text = format!(
        "{HEAD}\n[groups.db]\nlimit = 3\nwait = \"90s\"\n\n[groups.api]\nlimit = 10000\n{}{}",
        job_table("vacuum", "group = \"db\""),
        job_table("report", ""),
    );
    let config = parse_str(&text).unwrap();
    assert_eq!(config.groups.len(), 2);
    let job = |name: &str| config.jobs.iter().find(|job| job.name == name).unwrap();
    let group = job("vacuum").group.clone().expect("in a group");
    assert_eq!(
        (group.name.as_str(), group.limit, group.wait),
        ("db", 3, Some(Duration::from_secs(90)))
    );
    assert_eq!(config.groups["api"].wait, None, "no wait: until the job's next tick");
    assert!(job("report").group.is_none());
}

#[test]
fn bad_groups_name_their_field_and_unknown_ones_the_job() {
    let cases = [
        ("[groups.db]\nwait = \"1s\"", "groups.db.limit", "missing limit"),
        (
            "[groups.db]\nlimit = 0",
            "groups.db.limit",
            "between 1 and 10000, found 0",
        ),
        ("[groups.db]\nlimit = 10001", "groups.db.limit", "between 1 and 10000"),
        (
            "[groups.db]\nlimit = 1\nwait = \"soon\"",
            "groups.db.wait",
            "invalid duration",
        ),
        (
            "[groups.db]\nlimit = 1\nwait = \"2d\"",
            "groups.db.wait",
            "longer than the longest",
        ),
        ("[groups.\"a/b\"]\nlimit = 1", "groups.a/b", "invalid group name"),
        ("[groups.db]\nlimit = 1\nmax = 2", "", "unknown field `max`"),
    ];
    for (groups, field, message) in cases {
        let err = parse_str(&format!("{HEAD}\n{groups}\n")).unwrap_err();
        assert!(err.to_string().contains(message), "{groups}: {err}");
        if !field.is_empty() {
            assert_eq!(err.field.as_deref(), Some(field), "{groups}");
        }
    }
    let err = parse_str(&format!(
        "{HEAD}\n[groups.db]\nlimit = 1\n{}",
        job_table("j", "group = \"dbs\"")
    ))
    .unwrap_err();
    assert_eq!((err.job.as_deref(), err.field.as_deref()), (Some("j"), Some("group")));
    assert!(
        err.message.contains("unknown group \"dbs\": groups defined: db"),
        "{err}"
    );
    let err = parse_str(&format!("{HEAD}{}", job_table("j", "group = \"db\""))).unwrap_err();
    assert!(err.message.contains("defines no [groups.<name>]"), "{err}");
}
