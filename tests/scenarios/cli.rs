//! The `check` and `next` commands, run as the built binary: exit codes, messages and formats
//! are a contract that operators' scripts depend on.

use std::process::{Command, Output};

use crate::support::SHARDCRON;

fn shardcron(args: &[&str]) -> Output {
    Command::new(SHARDCRON)
        .args(args)
        .env_remove("SHARDCRON_CONFIG")
        .output()
        .expect("run shardcron")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_accepts_the_example_config_and_prints_a_line_per_job() {
    let out = shardcron(&["check", "--config", "config/jobs.toml"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    let heartbeat = lines
        .iter()
        .find(|line| line.starts_with("heartbeat "))
        .expect("heartbeat line");
    assert!(
        heartbeat.contains(" shard=4 ") && heartbeat.contains(" zone=UTC ") && heartbeat.contains(" next="),
        "{heartbeat}"
    );
    let berlin = lines
        .iter()
        .find(|line| line.starts_with("report-berlin "))
        .expect("berlin line");
    assert!(berlin.contains("zone=Europe/Berlin"), "{berlin}");
}

#[test]
fn check_uses_shardcron_config_from_the_environment() {
    let out = Command::new(SHARDCRON)
        .arg("check")
        .env(
            "SHARDCRON_CONFIG",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/jobs.toml"),
        )
        .current_dir("/")
        .output()
        .expect("run shardcron");
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
}

#[test]
fn check_errors_name_file_line_job_and_field_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "schedule = \"* * * * *\"\ncomand = \"true\"",
            ":10:1: job \"broken\", field \"comand\": unknown field",
        ),
        (
            "command = \"true\"\nschedule = \"0 0 31 2 *\"",
            ":10:12: job \"broken\", field \"schedule\": schedule \"0 0 31 2 *\" never fires",
        ),
        (
            "command = \"true\"\nschedule = \"* * * * *\"\ntimezone = \"Moon/Base\"",
            ":11:12: job \"broken\", field \"timezone\": unknown time zone",
        ),
    ];
    for (body, expected) in cases {
        let path = dir.path().join("jobs.toml");
        std::fs::write(
            &path,
            format!("[cluster]\nname = \"t\"\nshards = 4\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\n[jobs.broken]\n{body}\n"),
        )
        .unwrap();
        let out = shardcron(&["check", "--config", path.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("{}{expected}", path.display())),
            "{stderr:?} should contain {expected:?}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("backtrace"),
            "{stderr}"
        );
    }
}

#[test]
fn check_reports_a_missing_file() {
    let out = shardcron(&["check", "--config", "/nonexistent/jobs.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/jobs.toml: cannot read config file"));
}

#[test]
fn next_prints_rfc3339_with_the_zone_offset_across_dst() {
    let out = shardcron(&[
        "next",
        "0 3 * * *",
        "--tz",
        "America/New_York",
        "--from",
        "2027-03-13T12:00:00Z",
        "-n",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "2027-03-14T03:00:00-04:00\n2027-03-15T03:00:00-04:00\n"
    );

    let out = shardcron(&[
        "next",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--from",
        "2027-03-14T00:00:00-05:00",
        "-n",
        "1",
    ]);
    assert_eq!(
        text(&out.stdout),
        "2027-03-14T03:00:00-04:00\n",
        "a time in the spring-forward gap fires right after it"
    );
}

#[test]
fn next_is_strictly_after_from_and_defaults_to_utc() {
    let out = shardcron(&["next", "@hourly", "--from", "2027-01-01T05:00:00Z", "-n", "2"]);
    assert_eq!(
        text(&out.stdout),
        "2027-01-01T06:00:00+00:00\n2027-01-01T07:00:00+00:00\n"
    );
}

#[test]
fn next_rejects_bad_input_cleanly() {
    for args in [
        vec!["next", "61 * * * *"],
        vec!["next", "* * * * *", "--tz", "Nowhere/Land"],
        vec!["next", "* * * * *", "--from", "yesterday"],
    ] {
        let out = shardcron(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("shardcron: error: "), "{stderr}");
    }
}

#[test]
fn every_command_has_help_and_the_binary_a_version() {
    for command in ["check", "next", "run", "status", "dev"] {
        let out = shardcron(&[command, "--help"]);
        assert!(
            out.status.success() && text(&out.stdout).contains("Usage:"),
            "{command} --help"
        );
    }
    let out = shardcron(&["--version"]);
    assert!(text(&out.stdout).starts_with("shardcron "));
}
