//! Snapshots of every output format operators' scripts parse: `check` (text and JSON), `next`,
//! `plan` (text and JSON), `status` (table and JSON), `history` (table and JSON), and each kind
//! of config error. What changes from run to run (instants, revisions, digests, durations, temp
//! paths) is replaced by a placeholder; everything else must stay byte for byte, or the snapshot
//! in `tests/scenarios/snapshots/` is updated on purpose (`INSTA_UPDATE=always`, then review the
//! diff).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn shardcron(dir: &Path, args: &[&str]) -> (String, String, Option<i32>) {
    let out = Command::new(SHARDCRON)
        .args(args)
        .current_dir(dir)
        .env_remove("SHARDCRON_CONFIG")
        .output()
        .expect("run shardcron");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

const CONFIG: &str = r#"[cluster]
name = "snap"
shards = 4

[etcd]
endpoints = ["http://127.0.0.1:2379"]

[jobs.backup]
schedule = "30 1 * * *"
timezone = "America/New_York"
command = "true"

[jobs.heartbeat]
schedule = "*/10 * * * * *"
command = "true"

[jobs.spread]
schedule = ["H H(0-5) * * *", "H 12 * * 1-5"]
command = "true"
"#;

/// Instants in any offset, as the commands print them.
const INSTANT: &str = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})";

#[test]
fn check_next_and_plan_print_what_they_always_printed() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("jobs.toml"), CONFIG).expect("config");
    let filters = vec![(INSTANT, "[instant]")];
    insta::with_settings!({ filters => filters }, {
        let (stdout, stderr, code) = shardcron(dir.path(), &["check", "--config", "jobs.toml"]);
        assert_eq!(code, Some(0), "{stderr}");
        insta::assert_snapshot!("check", format!("{stdout}--- stderr\n{stderr}"));
        let (stdout, _, _) = shardcron(dir.path(), &["check", "--json", "--config", "jobs.toml"]);
        insta::assert_snapshot!("check_json", stdout);
    });
    let (stdout, _, _) = shardcron(
        dir.path(),
        &[
            "next",
            "30 2 * * *",
            "--tz",
            "America/New_York",
            "--from",
            "2027-03-13T00:00:00Z",
            "-n",
            "3",
        ],
    );
    insta::assert_snapshot!("next_across_spring_forward", stdout);
    // New York's clocks fall back on 2027-11-07: 01:30 happens twice.
    let window = ["--from", "2027-11-07T00:00:00Z", "--to", "2027-11-07T08:00:00Z"];
    let (stdout, _, _) = shardcron(
        dir.path(),
        &[
            &["plan", "--config", "jobs.toml", "--job", "backup", "--job", "spread"],
            &window[..],
        ]
        .concat(),
    );
    insta::assert_snapshot!("plan", stdout);
    let (stdout, _, _) = shardcron(
        dir.path(),
        &[
            &["plan", "--json", "--config", "jobs.toml", "--job", "spread"],
            &window[..],
        ]
        .concat(),
    );
    insta::assert_snapshot!("plan_json", stdout);
}

#[test]
fn every_kind_of_config_error_keeps_its_format() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = "[cluster]\nname = \"t\"\nshards = 4\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n";
    let cases: Vec<(&str, String)> = vec![
        (
            "TOML syntax",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\ncommand = \"true\"\n"),
        ),
        (
            "missing [cluster]",
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n".to_string(),
        ),
        ("missing [etcd]", "[cluster]\nname = \"t\"\nshards = 4\n".to_string()),
        ("shards out of range", cluster.replace("shards = 4", "shards = 0")),
        (
            "unknown field",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ncomand = \"true\"\n"),
        ),
        ("missing schedule", format!("{cluster}\n[jobs.a]\ncommand = \"true\"\n")),
        (
            "missing command",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\n"),
        ),
        (
            "empty command",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ncommand = \"\"\n"),
        ),
        (
            "invalid schedule",
            format!("{cluster}\n[jobs.a]\nschedule = \"61 * * * *\"\ncommand = \"true\"\n"),
        ),
        (
            "never fires",
            format!("{cluster}\n[jobs.a]\nschedule = \"0 0 31 2 *\"\ncommand = \"true\"\n"),
        ),
        (
            "empty schedule list",
            format!("{cluster}\n[jobs.a]\nschedule = []\ncommand = \"true\"\n"),
        ),
        (
            "unknown zone",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ntimezone = \"Moon/Base\"\ncommand = \"true\"\n"),
        ),
        (
            "bad duration",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ncommand = \"true\"\ntimeout = \"soon\"\n"),
        ),
        (
            "duration too long",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ncommand = \"true\"\nkill_grace = \"265000y\"\n"),
        ),
        (
            "NUL byte",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ncommand = \"echo a\\u0000b\"\n"),
        ),
        (
            "bad overlap",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ncommand = \"true\"\noverlap = \"sometimes\"\n"),
        ),
        (
            "bad catch_up",
            format!("{cluster}\n[jobs.a]\nschedule = \"* * * * *\"\ncommand = \"true\"\ncatch_up = \"some\"\n"),
        ),
        ("missing file", String::new()),
    ];
    let mut report = String::new();
    for (case, text) in cases {
        let file = format!("{}.toml", case.replace(' ', "-"));
        if case != "missing file" {
            std::fs::write(dir.path().join(&file), text).expect("config");
        }
        let (stdout, stderr, code) = shardcron(dir.path(), &["check", "--config", &file]);
        assert_eq!(code, Some(1), "{case}: {stderr}");
        assert!(stdout.is_empty(), "{case}: nothing on stdout");
        assert!(!stderr.contains("panicked"), "{case}: {stderr}");
        // Errors read as sentences: no Rust debug text, no transport dump (#45).
        for debug in ["Some(", "None", "tonic::", "Transport", "Os {"] {
            assert!(!stderr.contains(debug), "{case}: the error prints {debug}: {stderr}");
        }
        report.push_str(&format!("## {case}\n{stderr}\n"));
    }
    insta::assert_snapshot!("config_errors", report);
}

#[test]
fn status_and_history_print_what_they_always_printed() {
    let mut world = World::new();
    // No job ticks while the snapshots are taken: the only run is the one asked for.
    let config = world.write_config(
        "jobs.toml",
        2,
        2,
        &[
            ("daily", "0 3 * * *", ""),
            ("yearly", "0 0 1 1 *", "timezone = \"Europe/Berlin\""),
        ],
    );
    world.node("node-a", &config).start();
    wait_for(Duration::from_secs(30), "both shards have a leader", || {
        world.shard_leaders(&config).iter().all(|(leader, _)| leader.is_some())
    });
    let config_arg = config.to_str().expect("path");
    let (_, stderr, code) = shardcron(
        world.dir.path(),
        &["trigger", "yearly", "--wait", "--config", config_arg],
    );
    assert_eq!(code, Some(0), "{stderr}");
    wait_for(Duration::from_secs(20), "the run's record is written", || {
        last_run(&world.status(&config), "yearly").is_some()
    });
    let filters = vec![
        (INSTANT, "[instant]"),
        (r"\b[0-9a-f]{16}\b", "[digest]"),
        // The etcd member a node talks to: a free port of this run.
        (r"http://127\.0\.0\.1:\d+", "[etcd]"),
        // Revisions and durations.
        (r#""(fence|term|duration_ms)": \d+"#, "\"$1\": [n]"),
        (r"(fence|term)=\d+", "$1=[n]"),
        (r"(?m)^(\d+ node-a) \d+", "$1 [n]"),
        (r"(?m)^(yearly 1 \[instant\] node-a )\d+", "$1[n]"),
        (r"(?m)^(\[instant\] manual )\d+( node-a exited 0 )\d+", "$1[n]$2[n]"),
    ];
    insta::with_settings!({ filters => filters }, {
        let (stdout, stderr, _) = shardcron(world.dir.path(), &["status", "--config", config_arg]);
        // Column widths follow the values: one space between columns is what is compared.
        let table = |text: &str| text.lines().map(|line| line.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>().join("\n");
        insta::assert_snapshot!("status", table(&format!("{stdout}{stderr}")));
        let (stdout, _, _) = shardcron(world.dir.path(), &["status", "--json", "--config", config_arg]);
        insta::assert_snapshot!("status_json", stdout);
        let (stdout, _, _) = shardcron(world.dir.path(), &["history", "yearly", "--config", config_arg]);
        insta::assert_snapshot!("history", table(&stdout));
        let (stdout, _, _) = shardcron(world.dir.path(), &["history", "yearly", "--json", "--config", config_arg]);
        insta::assert_snapshot!("history_json", stdout);
    });
}
