//! Config errors in a job's table: its schedule, command, environment, policies, durations and
//! retries.

use super::*;

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

/// A job's command and environment.
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

/// A job's policies: catch-up, overlap and delivery.
#[test]
fn job_policy_errors() {
    assert_errors(vec![
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
