//! Config errors, one table per part of the file: each names the line, the job and the field,
//! and says what is wrong.

use super::*;

/// One error kind: (file text, expected line, job, field, a fragment of the message).
type ErrorCase = (
    String,
    Option<usize>,
    Option<&'static str>,
    Option<&'static str>,
    &'static str,
);

/// Checks that each case's file is refused with its line, job, field and message.
fn assert_errors(cases: Vec<ErrorCase>) {
    for (text, line, job, field, fragment) in cases {
        let err = parse_str(&text)
            .err()
            .unwrap_or_else(|| panic!("expected an error for:\n{text}"));
        let shown = err.to_string();
        assert_eq!(err.location.map(|(line, _)| line), line, "line of {shown}");
        if let Some(job) = job {
            assert_eq!(err.job.as_deref(), Some(job), "job of {shown}");
        }
        assert_eq!(err.field.as_deref(), field, "field of {shown}");
        assert!(shown.contains(fragment), "{shown:?} should contain {fragment:?}");
        assert!(shown.starts_with("jobs.toml:"), "{shown:?} should name the file");
    }
}

/// A job's schedule and time zone.
#[test]
fn schedule_errors() {
    assert_errors(vec![
        (
            with_job("schedule = \"61 * * * *\"\ncommand = \"true\""),
            Some(11),
            Some("backup"),
            Some("schedule"),
            "invalid schedule",
        ),
        (
            with_job("schedule = \"0 0 31 2 *\"\ncommand = \"true\""),
            Some(11),
            Some("backup"),
            Some("schedule"),
            "never fires",
        ),
        (
            with_job("schedule = \"* * * *\"\ncommand = \"true\""),
            Some(11),
            Some("backup"),
            Some("schedule"),
            "expected 5 fields",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\ntimezone = \"Mars/Olympus\""),
            Some(13),
            Some("backup"),
            Some("timezone"),
            "unknown time zone",
        ),
        (
            with_job("command = \"true\""),
            Some(10),
            Some("backup"),
            Some("schedule"),
            "missing schedule",
        ),
        (
            with_job("schedule = []\ncommand = \"true\""),
            Some(11),
            Some("backup"),
            Some("schedule"),
            "the schedule list is empty",
        ),
        (
            with_job("schedule = [\"0 9 * * *\", \"0 61 * * *\"]\ncommand = \"true\""),
            Some(11),
            Some("backup"),
            Some("schedule"),
            "invalid schedule \"0 61 * * *\"",
        ),
        (
            with_job("schedule = 5\ncommand = \"true\""),
            Some(11),
            Some("backup"),
            Some("schedule"),
            "a crontab expression or an array of them",
        ),
        (
            with_job("schedule = \"H(50-70) * * * *\"\ncommand = \"true\""),
            Some(11),
            Some("backup"),
            Some("schedule"),
            "must lie within 0-59",
        ),
    ]);
}

/// A job's command, environment and policies.
#[test]
fn job_field_errors() {
    assert_errors(vec![
        (
            with_job("schedule = \"* * * * *\"\ncomand = \"true\""),
            Some(12),
            Some("backup"),
            Some("comand"),
            "unknown field",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"  \""),
            Some(12),
            Some("backup"),
            Some("command"),
            "empty",
        ),
        (
            with_job("schedule = \"* * * * *\""),
            Some(10),
            Some("backup"),
            Some("command"),
            "missing command",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"echo a\\u0000b\""),
            Some(12),
            Some("backup"),
            Some("command"),
            "NUL byte",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nworking_dir = \"/tmp\\u0000x\""),
            Some(13),
            Some("backup"),
            Some("working_dir"),
            "NUL byte",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nenv = { A = \"x\\u0000y\" }"),
            Some(13),
            Some("backup"),
            Some("env"),
            "NUL byte",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\ncatch_up = \"some\""),
            Some(13),
            Some("backup"),
            Some("catch_up"),
            "unknown variant",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\noverlap = \"queue\""),
            Some(13),
            Some("backup"),
            Some("overlap"),
            "unknown variant",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\ndelivery = \"exactly-once\""),
            Some(13),
            Some("backup"),
            Some("delivery"),
            "unknown variant",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nenv = { CRON_FENCE = \"1\" }"),
            Some(13),
            Some("backup"),
            Some("env"),
            "CRON_",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nenv_file = \"app.env\""),
            Some(13),
            Some("backup"),
            Some("env_file"),
            "must be absolute",
        ),
    ]);
}

/// A job's durations and retries.
#[test]
fn job_duration_and_retry_errors() {
    assert_errors(vec![
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\ntimeout = \"300000000000y\""),
            Some(13),
            Some("backup"),
            Some("timeout"),
            "longer than the longest allowed, 100years",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nstarting_deadline = \"265000y\""),
            Some(13),
            Some("backup"),
            Some("starting_deadline"),
            "longer than the longest allowed, 100years",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nkill_grace = \"265000y\""),
            Some(13),
            Some("backup"),
            Some("kill_grace"),
            "longer than the longest allowed, 1day",
        ),
        (
            with_job("schedule = \"* * * * *\"\nretries = 1\nretry_backoff = \"2d\"\ncommand = \"true\""),
            Some(13),
            Some("backup"),
            Some("retry_backoff"),
            "longer than the longest allowed, 1day",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\ntimeout = \"soon\""),
            Some(13),
            Some("backup"),
            Some("timeout"),
            "invalid duration",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nstarting_deadline = \"5 parsecs\""),
            Some(13),
            Some("backup"),
            Some("starting_deadline"),
            "invalid duration",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nretries = -1"),
            Some(13),
            Some("backup"),
            Some("retries"),
            "between 0 and 100",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nretry_backoff = \"2s\""),
            Some(13),
            Some("backup"),
            Some("retry_backoff"),
            "set retries",
        ),
        (
            with_job("schedule = \"* * * * *\"\ncommand = \"true\"\nkill_grace = \"later\""),
            Some(13),
            Some("backup"),
            Some("kill_grace"),
            "invalid duration",
        ),
    ]);
}

/// The file's syntax, `[cluster]` and job names.
#[test]
fn cluster_errors() {
    assert_errors(vec![
        ("[cluster\nname=".to_string(), Some(1), None, None, "unclosed table"),
        (
            HEAD.replace("shards = 16", "shards = 0"),
            Some(3),
            None,
            Some("cluster.shards"),
            "between 1 and 4096",
        ),
        (
            HEAD.replace("shards = 16", "shards = 5000"),
            Some(3),
            None,
            Some("cluster.shards"),
            "between 1 and 4096",
        ),
        (
            HEAD.replace("shards = 16", "shards = \"many\""),
            Some(3),
            None,
            Some("shards"),
            "invalid type",
        ),
        (
            HEAD.replace("lease_ttl = \"10s\"", "lease_ttl = \"500ms\""),
            Some(4),
            None,
            Some("cluster.lease_ttl"),
            "at least 1s",
        ),
        (
            HEAD.replace("lease_ttl = \"10s\"", "lease_ttl = \"ten\""),
            Some(4),
            None,
            Some("cluster.lease_ttl"),
            "invalid duration",
        ),
        (
            HEAD.replace("timezone = \"UTC\"", "timezone = \"Nowhere\""),
            Some(5),
            None,
            Some("cluster.timezone"),
            "unknown time zone",
        ),
        (
            HEAD.replace("name = \"prod\"", "name = \"a/b\""),
            Some(2),
            None,
            Some("cluster.name"),
            "invalid cluster name",
        ),
        (
            format!("{HEAD}\n[jobs.\"bad name\"]\nschedule = \"* * * * *\"\ncommand = \"true\"\n"),
            Some(10),
            Some("bad name"),
            None,
            "invalid job name",
        ),
        (
            format!(
                "{HEAD}\n[jobs.{}]\nschedule = \"* * * * *\"\ncommand = \"true\"\n",
                "x".repeat(129)
            ),
            Some(10),
            None,
            None,
            "invalid job name",
        ),
        (
            "[etcd]\nendpoints = [\"http://e:2379\"]\n".to_string(),
            None,
            None,
            Some("cluster"),
            "missing [cluster]",
        ),
    ]);
}

/// `[etcd]`: endpoints, credentials, TLS and compaction.
#[test]
fn etcd_errors() {
    assert_errors(vec![
        (
            HEAD.replace("[\"http://127.0.0.1:2379\"]", "[]"),
            Some(8),
            None,
            Some("etcd.endpoints"),
            "at least one",
        ),
        (
            HEAD.replace("endpoints = [\"http://127.0.0.1:2379\"]", ""),
            Some(7),
            None,
            Some("etcd.endpoints"),
            "missing etcd endpoints",
        ),
        (
            with_etcd("username = \"cron\"\npassword_file = \"secrets/etcd\""),
            Some(10),
            None,
            Some("etcd.password_file"),
            "must be absolute",
        ),
        (
            with_etcd("username = \"cron\"\npassword_env = \"P\"\npassword_file = \"/etc/p\""),
            Some(11),
            None,
            Some("etcd.password_file"),
            "one way",
        ),
        (
            with_etcd("password_file = \"/etc/p\""),
            Some(9),
            None,
            Some("etcd.password_file"),
            "needs a username",
        ),
        (
            with_etcd("[etcd.tls]\ncert = \"/etc/shardcron/node.pem\""),
            Some(10),
            None,
            Some("etcd.tls.cert"),
            "cert needs key",
        ),
        (
            with_etcd("[etcd.tls]\nca = \"/ca.pem\"\nkey = \"/etc/shardcron/node-key.pem\""),
            Some(11),
            None,
            Some("etcd.tls.key"),
            "key needs cert",
        ),
        (
            with_etcd("compaction = \"5s\""),
            Some(9),
            None,
            Some("etcd.compaction"),
            "compaction must be \"off\" or at least 10s",
        ),
        (
            with_etcd("compaction = \"2d\""),
            Some(9),
            None,
            Some("etcd.compaction"),
            "longer than the longest allowed, 1day",
        ),
        (
            with_etcd("compaction = \"never\""),
            Some(9),
            None,
            Some("etcd.compaction"),
            "invalid duration",
        ),
        (
            with_etcd("compaction = 300"),
            Some(9),
            None,
            Some("compaction"),
            "invalid type",
        ),
        (
            with_etcd("gone_node_retention = \"5s\""),
            Some(9),
            None,
            Some("etcd.gone_node_retention"),
            "gone_node_retention must be at least 10s",
        ),
        (
            with_etcd("gone_node_retention = \"31d\""),
            Some(9),
            None,
            Some("etcd.gone_node_retention"),
            "longer than the longest allowed, 30days",
        ),
        (
            with_etcd("gone_node_retention = \"soon\""),
            Some(9),
            None,
            Some("etcd.gone_node_retention"),
            "invalid duration",
        ),
    ]);
}

/// `.` and `..` are no names: a URL path normalises them away (`/api/v1/jobs/../pause`), so a
/// job so named could not be paused, resumed or shown from a browser. Names that merely hold
/// dots stay valid.
#[test]
fn dot_and_dot_dot_are_refused_as_names_of_every_table() {
    let table = |kind: &str, name: &str| match kind {
        "jobs" => format!("[jobs.\"{name}\"]\nschedule = \"* * * * *\"\ncommand = \"true\"\n"),
        "groups" => format!("[groups.\"{name}\"]\nlimit = 1\n"),
        "notify" => format!("[notify.\"{name}\"]\nurl = \"http://127.0.0.1:9/h\"\n"),
        _ => format!("[blackouts.\"{name}\"]\ndates = [\"2026-12-24\"]\n"),
    };
    for kind in ["jobs", "groups", "notify", "blackouts"] {
        for (name, refused) in [
            (".", true),
            ("..", true),
            ("...", false),
            (".a", false),
            ("a..b", false),
        ] {
            let text = format!("{HEAD}\n{}", table(kind, name));
            match (parse_str(&text), refused) {
                (Ok(_), false) => {}
                (Ok(_), true) => panic!("[{kind}.\"{name}\"] taken"),
                (Err(err), false) => panic!("[{kind}.\"{name}\"] refused: {err}"),
                (Err(err), true) => {
                    assert!(err.message.contains("invalid"), "{kind} {name}: {err}");
                    assert_eq!(err.location.map(|(line, _)| line), Some(10), "{kind} {name}: {err}");
                }
            }
        }
    }
}
