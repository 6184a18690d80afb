//! The `check`, `next` and `plan` commands, run as the built binary: exit codes, messages and formats
//! are a contract that operators' scripts depend on.

use std::process::{Command, Output};

use crate::support::SHARDCRON;

mod plan;

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
    assert_eq!(lines.len(), 5, "a line per job and the summary: {stdout}");
    assert_eq!(lines[4], "config/jobs.toml: ok: 4 jobs in 8 shards, cluster \"demo\"");
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
fn a_command_that_reaches_no_etcd_says_so_in_plain_words() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("jobs.toml");
    // Port 9 (discard) on loopback: nothing listens, the connection is refused.
    std::fs::write(
        &config,
        "[cluster]\nname = \"lonely\"\nshards = 1\n\n[etcd]\nendpoints = [\"http://127.0.0.1:9\"]\n",
    )
    .expect("config");
    let config = config.to_str().expect("path");
    for args in [["status", "--config", config], ["history", "--config", config]] {
        let args: Vec<&str> = match args[0] {
            "history" => vec!["history", "nope", "--config", config],
            _ => args.to_vec(),
        };
        let out = shardcron(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("no etcd member answers (connection refused)") && stderr.contains("shardcron: hint:"),
            "{args:?}: {stderr}"
        );
        for dump in ["tonic::", "Transport", "Some(", "Os {"] {
            assert!(!stderr.contains(dump), "{args:?} prints {dump}: {stderr}");
        }
    }
}

#[test]
fn a_name_one_typo_away_gets_a_did_you_mean() {
    for (args, said) in [
        (
            vec!["trigger", "heartbeet", "--config", "config/jobs.toml"],
            "no job \"heartbeet\" in config/jobs.toml; did you mean \"heartbeat\"?",
        ),
        (
            vec!["pause", "rotate-log", "--config", "config/jobs.toml"],
            "did you mean \"rotate-logs\"?",
        ),
        (
            vec![
                "backfill",
                "slow-exprt",
                "--from",
                "2026-01-01T00:00:00Z",
                "--to",
                "2026-01-01T01:00:00Z",
                "--config",
                "config/jobs.toml",
            ],
            "did you mean \"slow-export\"?",
        ),
    ] {
        let out = shardcron(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    let far = shardcron(&["trigger", "nothing-like-it", "--config", "config/jobs.toml"]);
    assert!(!text(&far.stderr).contains("did you mean"), "{}", text(&far.stderr));
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
    for command in [
        "check",
        "next",
        "plan",
        "run",
        "status",
        "dev",
        "pause",
        "resume",
        "history",
        "trigger",
        "completions",
        "man",
    ] {
        let out = shardcron(&[command, "--help"]);
        assert!(
            out.status.success() && text(&out.stdout).contains("Usage:"),
            "{command} --help"
        );
    }
    let out = shardcron(&["--version"]);
    let version = text(&out.stdout);
    assert!(
        version.starts_with(&format!("shardcron {} (", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    assert!(
        version.contains(&format!("tzdb {})", chrono_tz::IANA_TZDB_VERSION)),
        "{version}"
    );
    // Built from a checkout: the commit it was built from.
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output();
    if let Some(head) = head.ok().filter(|head| head.status.success()) {
        let head = text(&head.stdout);
        assert!(
            version.contains(&format!("commit {}", head.trim())),
            "{version} (HEAD {head})"
        );
    }
}

#[test]
fn the_config_is_looked_for_in_order_and_the_error_names_every_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run_in = |dir: &std::path::Path, env: Option<&str>, args: &[&str]| {
        let mut command = Command::new(SHARDCRON);
        command.args(args).current_dir(dir).env_remove("SHARDCRON_CONFIG");
        if let Some(path) = env {
            command.env("SHARDCRON_CONFIG", path);
        }
        command.output().expect("run shardcron")
    };
    let missing = run_in(dir.path(), None, &["check"]);
    assert_eq!(missing.status.code(), Some(1));
    let error = text(&missing.stderr);
    for place in [
        "--config",
        "SHARDCRON_CONFIG",
        "config/jobs.toml",
        "/etc/shardcron/jobs.toml",
    ] {
        assert!(error.contains(place), "the error names {place}: {error}");
    }
    let example = std::fs::read_to_string("config/jobs.toml").expect("example config");
    std::fs::create_dir(dir.path().join("config")).expect("config dir");
    std::fs::write(dir.path().join("config/jobs.toml"), &example).expect("write");
    std::fs::write(
        dir.path().join("other.toml"),
        example.replace("name = \"demo\"", "name = \"other\""),
    )
    .expect("write");
    // The summary is the last line on stdout.
    let summary = |out: &Output| text(&out.stdout).lines().last().unwrap_or_default().to_owned();
    let local = run_in(dir.path(), None, &["check"]);
    assert!(
        summary(&local).starts_with("config/jobs.toml: ok"),
        "{}",
        text(&local.stdout)
    );
    let from_env = run_in(dir.path(), Some("other.toml"), &["check"]);
    assert!(
        summary(&from_env).contains("cluster \"other\""),
        "{}",
        text(&from_env.stdout)
    );
    let from_flag = run_in(
        dir.path(),
        Some("missing.toml"),
        &["check", "--config", "config/jobs.toml"],
    );
    assert!(
        summary(&from_flag).contains("cluster \"demo\""),
        "--config wins over the environment"
    );
}

#[test]
fn check_json_lists_the_validated_jobs() {
    let out = shardcron(&["check", "--json", "--config", "config/jobs.toml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let jobs = jobs.as_array().expect("an array");
    assert_eq!(jobs.len(), 4);
    let heartbeat = jobs.iter().find(|job| job["name"] == "heartbeat").expect("heartbeat");
    assert_eq!(heartbeat["shard"], 4);
    assert_eq!(heartbeat["zone"], "UTC");
    assert_eq!(heartbeat["schedule"], "*/5 * * * * *");
    assert!(
        heartbeat["next"].as_str().is_some_and(|next| next.ends_with("+00:00")),
        "{heartbeat}"
    );
}

#[test]
fn completions_and_the_man_page_come_from_the_command_definitions() {
    for (shell, marker) in [
        ("bash", "_shardcron()"),
        ("zsh", "#compdef shardcron"),
        ("fish", "complete -c shardcron"),
    ] {
        let out = shardcron(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell} completion lacks {marker}");
        for command in ["check", "trigger", "pause", "completions"] {
            assert!(script.contains(command), "{shell} completion lacks {command}");
        }
    }
    let bad = shardcron(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "an unknown shell is a usage error");
    let man = shardcron(&["man"]);
    assert!(man.status.success());
    // roff writes a dash as \-.
    let page = text(&man.stdout).replace("\\-", "-");
    assert!(
        page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH shardcron 1"),
        "roff:\n{}",
        &page[..page.len().min(300)]
    );
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        "SHARDCRON TRIGGER",
        "--api-token-env",
        "/etc/shardcron/jobs.toml",
    ] {
        assert!(page.contains(section), "the man page lacks {section}");
    }
}

/// A config with a fixed-time New York job, a per-hour UTC job, an `H` job and a schedule list.
fn plan_config(dir: &std::path::Path) -> String {
    let path = dir.join("jobs.toml");
    std::fs::write(
        &path,
        r#"[cluster]
name = "t"
shards = 4

[etcd]
endpoints = ["http://127.0.0.1:2379"]

[jobs.nightly]
schedule = "30 2 * * *"
timezone = "America/New_York"
command = "true"

[jobs.early]
schedule = "30 1 * * *"
timezone = "America/New_York"
command = "true"

[jobs.lh-gap]
schedule = "15 2 * * *"
timezone = "Australia/Lord_Howe"
command = "true"

[jobs.lh-twice]
schedule = "45 1 * * *"
timezone = "Australia/Lord_Howe"
command = "true"

[jobs.hourly]
schedule = "0 * * * *"
command = "true"

[jobs.spread]
schedule = "H H(0-3) * * *"
command = "true"

[jobs.listed]
schedule = ["15 6 * * *", "45 6 * * *", "15 6 * * SUN"]
command = "true"
"#,
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn check_prints_each_jobs_schedule_as_it_fires() {
    let dir = tempfile::tempdir().unwrap();
    let config = plan_config(dir.path());
    let out = shardcron(&["check", "--config", &config]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let line = |job: &str| {
        stdout
            .lines()
            .find(|line| line.starts_with(&format!("{job} ")))
            .unwrap_or_else(|| panic!("no line for {job} in {stdout}"))
            .to_string()
    };
    assert!(line("nightly").ends_with(" schedule=\"30 2 * * *\""), "{stdout}");
    assert!(
        line("listed").ends_with(" schedule=\"15 6 * * * | 45 6 * * * | 15 6 * * SUN\""),
        "{stdout}"
    );
    let spread = shardcron(&[
        "next",
        "H H(0-3) * * *",
        "--job",
        "spread",
        "--from",
        "2027-01-01T00:00:00Z",
        "-n",
        "1",
    ]);
    let first = text(&spread.stdout);
    let fires_at = chrono::DateTime::parse_from_rfc3339(first.trim()).expect("an instant");
    assert!(
        line("spread").ends_with(&format!(
            " schedule=\"{} {} * * *\"",
            fires_at.format("%-M"),
            fires_at.format("%-H")
        )),
        "check and next --job expand H alike: {stdout} / {first}"
    );
}

#[test]
fn next_refuses_an_h_without_a_job() {
    let out = shardcron(&["next", "H * * * *"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("uses H") && stderr.contains("--job NAME"), "{stderr}");
    let out = shardcron(&["next", "H * * * *", "--job", "backup", "-n", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 2);
}

#[test]
fn pause_refuses_what_it_cannot_do_before_it_reaches_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let config = plan_config(dir.path());
    for (args, expected) in [
        (vec!["pause"], "required"),
        (vec!["pause", "nosuch"], "no job \"nosuch\" in"),
        (
            vec!["pause", "hourly", "--until", "2020-01-01T00:00:00Z"],
            "--until must be in the future",
        ),
        (vec!["pause", "hourly", "--all"], "cannot be used with"),
        (vec!["resume"], "required"),
        (vec!["history"], "required"),
        (vec!["trigger"], "required"),
        (vec!["trigger", "nosuch"], "no job \"nosuch\" in"),
    ] {
        let out = shardcron(&[&args[..], &["--config", &config]].concat());
        let stderr = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
