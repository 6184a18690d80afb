//! What a run keeps of its output, against a real etcd: the last `output_tail` bytes of each
//! stream in its history entry (cut where a character starts, flagged), bytes that are not
//! UTF-8 stored safely, `history --output` and `--json`, one run from the API, what
//! `log_output` leaves in the node's log, and no etcd write added per run.

use std::time::Duration;

use shardcron::rules::record::RunRecord;

use crate::support::*;

/// `job`'s history records, newest first, once one holds kept output.
fn runs_with_output(config: &std::path::Path, job: &str) -> Vec<RunRecord> {
    let read = || -> Option<Vec<RunRecord>> {
        let out = std::process::Command::new(SHARDCRON)
            .args(["history", job, "--json", "--config"])
            .arg(config)
            .output()
            .ok()?;
        let records: Vec<RunRecord> = serde_json::from_slice(&out.stdout).ok()?;
        records.iter().any(|record| record.output.is_some()).then_some(records)
    };
    wait_for(
        Duration::from_secs(30),
        &format!("a run of {job} with its output"),
        || read().is_some(),
    );
    read().expect("records")
}

#[test]
fn a_run_keeps_the_tail_of_each_stream_in_its_history_and_the_api_serves_one_run() {
    let mut world = World::new();
    // 10,000 bytes of "😀" (4 bytes each) then "\nend\n": the last 4 KiB start with the last
    // three bytes of a "😀".
    let chatty = r#"yes 😀 | head -n 2500 | tr -d "\n"; printf "\nend\n"; echo "a line on stderr" >&2"#;
    let binary = r#"printf "\377\376 \033[31mred\n""#;
    let quiet = r#"echo quiet-marker"#;
    // Its second line and what follows its "\r" are made to pass for lines of the node's own.
    let tailed = r#"printf "tail-1\n2099-01-01T00:00:00.000000Z  WARN shardcron: forged-line\ntail-3 \r2099-01-01T00:00:01.000000Z  WARN shardcron: forged-cr\n""#;
    let tables: Vec<(&str, String)> = [
        ("chatty", chatty, ""),
        ("binary", binary, ""),
        ("quiet", quiet, "log_output = \"none\""),
        ("tailed", tailed, "log_output = \"tail\""),
    ]
    .iter()
    .map(|(name, command, extra)| {
        (
            *name,
            format!("schedule = \"*/2 * * * * *\"\ncommand = '{command}'\n{extra}"),
        )
    })
    .collect();
    let config = world.write_config_tables("jobs.toml", 1, 2, &tables);
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("a", &config)
        .args(&["--http-addr", &port.to_string()])
        .start();
    wait_ready(port);

    step("chatty: the last 4 KiB of stdout, cut where a character starts, and the stderr line");
    let records = runs_with_output(&config, "chatty");
    let run = records
        .iter()
        .find(|record| record.output.is_some())
        .expect("a run with output");
    let output = run.output.as_ref().expect("output");
    assert!(output.stdout_truncated && !output.stderr_truncated, "{output:?}");
    assert_eq!(
        output.stdout.len(),
        4093,
        "4,096 bytes less the cut character's leftover bytes"
    );
    assert!(output.stdout.starts_with('😀') && output.stdout.ends_with("😀\nend\n"));
    assert_eq!(output.stderr, "a line on stderr\n");

    step("binary: stored with what is not UTF-8 replaced; --output escapes control characters");
    let output = runs_with_output(&config, "binary")
        .into_iter()
        .find_map(|record| record.output)
        .expect("output");
    assert_eq!(output.stdout, "\u{FFFD}\u{FFFD} \u{1b}[31mred\n");
    let shown = std::process::Command::new(SHARDCRON)
        .args(["history", "binary", "--output", "-n", "1", "--config"])
        .arg(&config)
        .output()
        .expect("history --output");
    let shown = String::from_utf8(shown.stdout).expect("UTF-8");
    assert!(shown.contains("| \u{FFFD}\u{FFFD} \\u{1b}[31mred"), "{shown}");
    assert!(
        !shown.contains('\u{1b}'),
        "a raw escape reached the terminal: {shown:?}"
    );

    step("one run from the API, with its output; the history page without");
    let tick = run.scheduled_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (status, body) = http_get(port, &format!("/api/v1/jobs/chatty/runs/{tick}"));
    assert!(status.contains(" 200 "), "{status}: {body}");
    let served: RunRecord = serde_json::from_str(&body).expect("a run record");
    assert_eq!(served.fence, run.fence);
    assert_eq!(served.output, run.output);
    let page: Vec<RunRecord> =
        serde_json::from_str(&http_get(port, "/api/v1/jobs/chatty/history").1).expect("history JSON");
    assert!(!page.is_empty() && page.iter().all(|record| record.output.is_none()));
    let with: Vec<RunRecord> =
        serde_json::from_str(&http_get(port, "/api/v1/jobs/chatty/history?output=true").1).expect("history JSON");
    assert!(with.iter().any(|record| record.output.is_some()));
    for (path, code) in [
        ("/api/v1/jobs/chatty/runs/not-a-time", " 400 "),
        ("/api/v1/jobs/chatty/runs/2001-01-01T00:00:00Z", " 404 "),
        ("/api/v1/jobs/nobody/runs/2001-01-01T00:00:00Z", " 404 "),
    ] {
        let (status, body) = http_get(port, path);
        assert!(status.contains(code), "{path}: {status} {body}");
    }

    step("log_output: none leaves the log without the run's lines, tail logs the tail once");
    runs_with_output(&config, "quiet");
    runs_with_output(&config, "tailed");
    let log = world.nodes[0].log_text();
    assert!(!log.contains("quiet-marker"), "log_output = \"none\" logged a line");
    assert!(
        log.contains("tail-1") && log.contains("forged-line") && log.contains("forged-cr"),
        "the tail was not logged:\n{log}"
    );
    assert!(
        !log.lines().any(|line| line.starts_with("2099-")),
        "a job's output started a line of the node's log:\n{log}"
    );
    assert!(!log.contains('\r'), "a carriage return reached the log:\n{log}");
    assert!(log.contains("a line on stderr"), "log_output = \"all\" logs each line");
}

on_both_etcds! {
    /// Neither the output a run keeps nor a notifier that wants every event adds an etcd write to a
    /// run that changes nothing (a success after a success): with both against neither.
    fn keeping_output_or_having_a_notifier_adds_no_etcd_write_per_run() {
        let mut world = World::new();
        let receiver = crate::support::receiver::Receiver::start();
        let command = format!("{}; yes 0123456789 | head -n 1000", world.record_command());
        let names: Vec<String> = (0..4).map(|index| format!("print{index}")).collect();
        let tables = |extra: &'static str| -> Vec<(&str, &str, &str)> {
            names.iter().map(|name| (name.as_str(), "* * * * * *", extra)).collect()
        };
        let kept = world.write_config_running("kept.toml", 1, 2, &tables("notify = [\"ops\"]"), &command);
        let hook = format!(
            "[notify.ops]\nurl = \"{}\"\non = [\"failure\", \"recovered\", \"lost\", \"skipped\", \"group_full\", \"missed\"]\n",
            receiver.url("/hook")
        );
        std::fs::write(&kept, std::fs::read_to_string(&kept).expect("config") + &hook).expect("config");
        let none = world.write_config_running("none.toml", 1, 2, &tables("output_tail = 0"), &command);
        step("4 per-second jobs printing 11 KB each, keeping the default 4 KiB tail, with a notifier wanting every event");
        world.node("a", &kept).start();
        let with_tail = world.writes_per_run(4);
        world.nodes[0].signal(libc::SIGTERM);
        assert!(
            world.nodes[0].wait_exit(Duration::from_secs(30)).is_some(),
            "node a stopped"
        );
        step("the same keeping none (output_tail = 0)");
        world.node("b", &none).start();
        let without = world.writes_per_run(4);
        eprintln!(
            "etcd writes per run: {with_tail:.3} keeping 4 KiB of output with a notifier, {without:.3} keeping none without"
        );
        assert!(
            with_tail <= without + 0.1,
            "keeping output or a notifier costs etcd writes: {with_tail:.3} per run against {without:.3}"
        );
        assert!(
            receiver.hits().is_empty(),
            "successes after successes told: {:?}",
            receiver.hits().len()
        );
    }
}
