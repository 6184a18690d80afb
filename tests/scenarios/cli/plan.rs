//! `plan`: every fire instant of a window in time order, with its DST notes, and an output a
//! reader may stop reading early.

use std::process::Command;

use super::{plan_config, shardcron, text};
use crate::support::SHARDCRON;

#[test]
fn plan_lists_every_instant_in_time_order_with_dst_notes() {
    let dir = tempfile::tempdir().unwrap();
    let config = plan_config(dir.path());
    // 14 March 2027, New York springs forward at 02:00 (07:00 UTC); 06:00–08:00 UTC.
    let out = shardcron(&[
        "plan",
        "--config",
        &config,
        "--from",
        "2027-03-14T06:00:00Z",
        "--for",
        "2h",
        "--job",
        "nightly",
        "--job",
        "hourly",
        "--job",
        "listed",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "2027-03-14T06:00:00+00:00 hourly shard=1 zone=UTC\n\
         2027-03-14T06:15:00+00:00 listed shard=2 zone=UTC\n\
         2027-03-14T06:45:00+00:00 listed shard=2 zone=UTC\n\
         2027-03-14T07:00:00+00:00 hourly shard=1 zone=UTC\n\
         2027-03-14T03:00:00-04:00 nightly shard=3 zone=America/New_York note=\"moved forward out of a DST gap\"\n"
    );

    // 7 November 2027, New York falls back at 02:00 EDT (06:00 UTC): 01:30 happens twice and a
    // fixed-time job fires at the first only.
    let out = shardcron(&[
        "plan",
        "--config",
        &config,
        "--from",
        "2027-11-07T04:00:00Z",
        "--for",
        "4h",
        "--job",
        "early",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fires: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
    assert_eq!(
        fires,
        serde_json::json!([{
            "at": "2027-11-07T01:30:00-04:00",
            "at_utc": "2027-11-07T05:30:00Z",
            "job": "early",
            "shard": 0,
            "zone": "America/New_York",
            "note": "repeated hour, first"
        }])
    );

    let out = shardcron(&[
        "plan",
        "--config",
        &config,
        "--from",
        "2027-03-14T00:00:00Z",
        "--for",
        "1d",
        "--job",
        "nightly",
        "--json",
    ]);
    let fires: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
    assert_eq!(
        fires,
        serde_json::json!([{
            "at": "2027-03-14T03:00:00-04:00",
            "at_utc": "2027-03-14T07:00:00Z",
            "job": "nightly",
            "shard": 3,
            "zone": "America/New_York",
            "note": "moved forward out of a DST gap"
        }])
    );
}

#[test]
fn plan_follows_lord_howes_half_hour_dst_shifts() {
    let dir = tempfile::tempdir().unwrap();
    let config = plan_config(dir.path());
    let plan = |from: &str| {
        let out = shardcron(&[
            "plan", "--config", &config, "--from", from, "--for", "1d", "--job", "lh-gap", "--job", "lh-twice",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // 3 October 2027: 02:00 (+10:30) becomes 02:30 (+11:00); 02:15 does not exist.
    let spring = plan("2027-10-02T12:00:00Z");
    assert!(
        spring.contains("2027-10-03T02:30:00+11:00 lh-gap shard=")
            && spring.contains("note=\"moved forward out of a DST gap\""),
        "{spring}"
    );
    assert!(spring.contains("2027-10-03T01:45:00+10:30 lh-twice shard="), "{spring}");
    // 4 April 2027: 02:00 (+11:00) becomes 01:30 (+10:30); 01:45 happens twice and fires once.
    let fall = plan("2027-04-03T12:00:00Z");
    let lines: Vec<&str> = fall.lines().filter(|line| line.contains(" lh-twice ")).collect();
    assert_eq!(lines.len(), 1, "{fall}");
    assert!(
        lines[0].starts_with("2027-04-04T01:45:00+11:00 lh-twice")
            && lines[0].ends_with("note=\"repeated hour, first\""),
        "{fall}"
    );
}

#[test]
fn plan_refuses_bad_windows_and_unknown_jobs_and_says_where_a_long_plan_was_cut() {
    let dir = tempfile::tempdir().unwrap();
    let config = plan_config(dir.path());
    for (args, expected) in [
        (vec!["--job", "nosuch"], "--job \"nosuch\": no such job in"),
        (
            vec!["--from", "2027-01-02T00:00:00Z", "--to", "2027-01-01T00:00:00Z"],
            "the window is empty",
        ),
        (
            vec!["--from", "tomorrow"],
            "--from \"tomorrow\" is not an RFC 3339 instant",
        ),
        (vec!["--for", "soon"], "invalid value 'soon' for '--for <DURATION>'"),
        (
            vec!["--to", "2027-01-02T00:00:00Z", "--for", "1h"],
            "cannot be used with",
        ),
    ] {
        let out = shardcron(&[&["plan", "--config", &config][..], &args].concat());
        let stderr = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let out = shardcron(&[
        "plan",
        "--config",
        &config,
        "--from",
        "2027-01-01T00:00:00Z",
        "--limit",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout).lines().count(), 3);
    assert!(
        text(&out.stderr).contains("the plan was cut after 3 instants (the last at 2027-01-01T01:00:00Z)"),
        "{}",
        text(&out.stderr)
    );
}

/// `shardcron plan | head`: a reader that stops early is no error, as with ripgrep or `seq`.
#[test]
fn a_reader_that_closes_the_pipe_early_ends_the_command_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let config = plan_config(dir.path());
    // Each prints far more than a pipe's buffer holds, so it is still writing when the reader
    // goes.
    for args in [
        vec!["plan", "--config", &config, "--for", "365d"],
        vec!["plan", "--config", &config, "--for", "365d", "--json"],
        vec!["next", "* * * * *", "-n", "100000"],
    ] {
        let mut child = Command::new(SHARDCRON)
            .args(&args)
            .env_remove("SHARDCRON_CONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run shardcron");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("read the first line");
        assert!(!first.is_empty(), "{args:?}: no output");
        let out = child.wait_with_output().expect("wait for shardcron");
        assert_eq!(text(&out.stderr), "", "{args:?}");
        assert!(out.status.success(), "{args:?}: {:?}", out.status);
    }
}
