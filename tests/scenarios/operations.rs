//! What an operator runs day to day, against a real etcd: retries, `overlap = "replace"`,
//! `kill_grace`, Prometheus metrics scraped over HTTP, JSON logs.

use std::time::Duration;

use crate::support::*;
use shardcron::rules::record::Outcome;

on_both_etcds! {
    fn retries_replace_and_kill_grace_do_what_the_config_says() {
        let mut world = World::new();
        let record = world.record_command();
        let config = world.write_config_tables(
            "jobs.toml",
            2,
            3,
            &[
                (
                    "flaky",
                    format!(
                        "schedule = \"*/4 * * * * *\"\ncommand = '[ \"$CRON_ATTEMPT\" -ge 3 ] || exit 1; {record}'\nretries = 3\nretry_backoff = \"200ms\""
                    ),
                ),
                (
                    "replaced",
                    "schedule = \"*/3 * * * * *\"\ncommand = 'sleep 30'\noverlap = \"replace\"\nkill_grace = \"1s\"".into(),
                ),
                (
                    "stubborn",
                    "schedule = \"*/5 * * * * *\"\ncommand = \"trap '' TERM; sleep 30\"\ntimeout = \"1s\"\nkill_grace = \"1s\"".into(),
                ),
            ],
        );
        world.node("a", &config).start();
        wait_for(Duration::from_secs(40), "each job's result is recorded", || {
            let status = world.status(&config);
            last_run(&status, "flaky").is_some_and(|run| run.attempts == 3)
                && last_run(&status, "replaced").is_some_and(|run| run.outcome == Outcome::Replaced)
                && last_run(&status, "stubborn").is_some_and(|run| run.outcome == Outcome::Timeout)
        });

        step("flaky: two failed attempts, retried within the tick, the third succeeds");
        let flaky = last_run(&world.status(&config), "flaky").expect("flaky's last run");
        assert_eq!(
            (flaky.outcome, flaky.exit_code),
            (Outcome::Exited, Some(0)),
            "{flaky:?}"
        );
        let runs = world.runs();
        let flaky_ticks: Vec<_> = runs
            .iter()
            .filter(|run| run.job == "flaky")
            .map(|run| run.tick)
            .collect();
        let mut unique = flaky_ticks.clone();
        unique.dedup();
        assert_eq!(flaky_ticks, unique, "one successful attempt per tick");
        let log = world.nodes[0].log_text();
        for attempt in [1, 2] {
            assert!(
                log.lines()
                    .any(|line| line.contains("attempt failed; retrying") && line.contains(&format!("attempt={attempt}"))),
                "attempt {attempt} is logged as retried"
            );
        }

        step("replaced: each tick stops the previous run after SIGTERM");
        let replaced = last_run(&world.status(&config), "replaced").expect("replaced's last run");
        assert!(replaced.duration_ms < 5_000, "{replaced:?}");
        assert!(log.contains("replaced by a newer tick"));

        step("stubborn: SIGTERM at the 1 s timeout, SIGKILL after the 1 s kill_grace");
        let stubborn = last_run(&world.status(&config), "stubborn").expect("stubborn's last run");
        let took = stubborn.duration_ms;
        assert!((2_000..5_000).contains(&took), "{stubborn:?}");
    }
}

#[test]
fn metrics_are_scraped_over_http_and_json_logs_carry_the_run_fields() {
    let mut world = World::new();
    let record = world.record_command();
    let config = world.write_config_tables(
        "jobs.toml",
        2,
        3,
        &[
            (
                "ok",
                format!("schedule = \"* * * * * *\"\ncommand = 'echo hello; {record}'"),
            ),
            ("bad", "schedule = \"* * * * * *\"\ncommand = \"exit 4\"".into()),
        ],
    );
    let port = shardcron::etcd_server::free_port().expect("free port");
    let addr = format!("127.0.0.1:{port}");
    world
        .node("a", &config)
        .args(&["--metrics-addr", &addr, "--log-format", "json"])
        .start();
    wait_for(Duration::from_secs(30), "3 runs of ok", || world.runs().len() >= 3);

    let mut page = String::new();
    wait_for(Duration::from_secs(10), "the metrics show both jobs' runs", || {
        page = http_get(port, "/metrics").1;
        sample(&page, "shardcron_runs_total{job=\"ok\",result=\"success\"}").is_some_and(|n| n >= 2.0)
            && sample(&page, "shardcron_runs_total{job=\"bad\",result=\"failure\"}").is_some_and(|n| n >= 2.0)
    });
    assert_eq!(sample(&page, "shardcron_shards_led"), Some(2.0), "{page}");
    assert!(sample(&page, "shardcron_firing_lateness_seconds_count").is_some_and(|n| n >= 2.0));
    assert!(sample(&page, "shardcron_run_duration_seconds_count").is_some_and(|n| n >= 2.0));
    for counter in [
        "shardcron_claim_failures_total",
        "shardcron_catch_up_runs_total",
        "shardcron_skipped_overlaps_total",
        "shardcron_session_losses_total",
        "shardcron_etcd_errors_total",
    ] {
        assert!(sample(&page, counter).is_some(), "{counter} missing from:\n{page}");
    }
    let (status, _) = http_get(port, "/other");
    assert!(status.contains("404"), "{status}");

    step("status prints readable tables by default");
    let out = std::process::Command::new(SHARDCRON)
        .args(["status", "--config"])
        .arg(&config)
        .output()
        .expect("run status");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for heading in [
        "NODE",
        "LEADS",
        "SHARD",
        "LEADER",
        "TERM",
        "FENCE",
        "JOB",
        "LAST TICK",
        "OUTCOME",
        "NEXT",
    ] {
        assert!(table.contains(heading), "{heading} missing from:\n{table}");
    }
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("bad ") && line.contains("exited") && line.contains(" 4 ")),
        "the failing job's row shows its exit code:\n{table}"
    );

    step("every log line is one JSON object; job output carries job, tick, stream and fence");
    let log = world.nodes[0].log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}")))
        .collect();
    let output = lines
        .iter()
        .find(|line| line["fields"]["message"] == "hello")
        .expect("the job's output line");
    assert_eq!(output["fields"]["job"], "ok");
    assert_eq!(output["fields"]["stream"], "stdout");
    assert!(output["fields"]["tick"]
        .as_str()
        .is_some_and(|tick| tick.ends_with('Z')));
    assert!(
        output["fields"]["fence"].as_i64().is_some_and(|fence| fence > 0),
        "{output}"
    );
}

#[test]
fn sighup_reloads_jobs_without_giving_up_shards_and_rejects_bad_files() {
    let mut world = World::new();
    let record = world.record_command();
    let ticking = |name: &str| {
        (
            name.to_string(),
            format!("schedule = \"* * * * * *\"\ncommand = '{record}'"),
        )
    };
    let (first, second) = (ticking("first"), ticking("second"));
    let config = world.write_config_tables("jobs.toml", 2, 3, &[(&first.0, first.1.clone())]);
    world.node("a", &config).start();
    wait_for(Duration::from_secs(30), "first runs", || {
        world.runs().iter().any(|run| run.job == "first")
    });
    // `status` reads its own copy: the node's file is about to be broken on purpose.
    let status_config = world.dir.path().join("status.toml");
    std::fs::copy(&config, &status_config).unwrap();
    let terms = |world: &World| -> Vec<Option<i64>> {
        world
            .shard_leaders(&status_config)
            .into_iter()
            .map(|(_, term)| term)
            .collect()
    };
    let before = terms(&world);
    assert!(before.iter().all(Option::is_some), "{before:?}");

    step("swap first for second, SIGHUP");
    world.write_config_tables("jobs.toml", 2, 3, &[(&second.0, second.1.clone())]);
    world.nodes[0].signal(libc::SIGHUP);
    let reloaded_at = now_secs();
    wait_for(Duration::from_secs(15), "second runs", || {
        world.runs().iter().any(|run| run.job == "second")
    });
    wait_for(Duration::from_secs(10), "2 s with the new jobs", || {
        now_secs() > reloaded_at + 2.0
    });
    let runs = world.runs();
    assert!(
        runs.iter()
            .filter(|run| run.job == "first")
            .all(|run| run.started < reloaded_at + 1.5),
        "the removed job stopped"
    );
    assert_eq!(terms(&world), before, "every shard kept its leader and term");
    assert_each_tick_once(&runs, "second", 1);

    step("an invalid file is rejected and the jobs go on");
    std::fs::write(
        &config,
        "[cluster]\nname = \"test\"\nshards = 2\n[jobs.broken]\ncomand = \"true\"\n",
    )
    .unwrap();
    world.nodes[0].signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "the rejection is logged", || {
        world.nodes[0].log_text().contains("reload rejected")
    });
    let rejected_at = now_secs();

    step("a changed [cluster] asks for a restart");
    world.write_config_tables("jobs.toml", 2, 3, &[(&second.0, second.1.clone())]);
    let more_shards = std::fs::read_to_string(&config)
        .unwrap()
        .replace("shards = 2", "shards = 3");
    std::fs::write(&config, more_shards).unwrap();
    world.nodes[0].signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "the refusal is logged", || {
        world.nodes[0].log_text().contains("restart the node to apply it")
    });
    wait_for(Duration::from_secs(10), "second runs on", || {
        world
            .runs()
            .iter()
            .any(|run| run.job == "second" && run.started > rejected_at + 2.0)
    });
    assert_eq!(terms(&world), before, "no reload gave up a shard");
    assert_each_tick_once(&world.runs(), "second", 1);

    step("the file the node runs, unchanged: a SIGHUP does nothing");
    world.write_config_tables("jobs.toml", 2, 3, &[(&second.0, second.1.clone())]);
    let terms_ended = |world: &World| world.nodes[0].log_text().matches("term ended").count();
    let reloads = |world: &World| world.nodes[0].log_text().matches("reloaded jobs.toml").count();
    let (ended_before, reloads_before) = (terms_ended(&world), reloads(&world));
    world.nodes[0].signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "the reload is logged", || {
        reloads(&world) > reloads_before
    });
    // A term ends between ticks, within a second of the reload.
    let logged = now_secs();
    wait_for(Duration::from_secs(5), "2 s after the reload", || {
        now_secs() > logged + 2.0
    });
    assert_eq!(terms_ended(&world), ended_before, "no term ended for an unchanged file");
    assert!(world.nodes[0].log_text().contains("unchanged, nothing to do"));
}

#[test]
fn a_log_destination_that_stops_reading_holds_up_neither_runs_nor_the_lease() {
    let mut world = World::new();
    let names = job_names(4, 1);
    // Each run prints 2,000 lines, more than a pipe holds once logged: the node's log write would block
    // within the first second if it wrote on the runtime's threads.
    let noisy = format!("seq 1 2000; {}", world.record_command());
    let jobs: Vec<(&str, &str, &str)> = names.iter().map(|name| (name.as_str(), "* * * * * *", "")).collect();
    let config = world.write_config_running("jobs.toml", 1, 2, &jobs, &noisy);
    let port = shardcron::etcd_server::free_port().expect("free port");
    // Its log goes to a pipe this test holds and never reads.
    let child = std::process::Command::new(SHARDCRON)
        .args([
            "run",
            "--node-id",
            "a",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--config",
        ])
        .arg(&config)
        .env("SHARDCRON_LOG", "info,shardcron=debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start shardcron run");
    let log = world.dir.path().join("unread.log");
    world.adopt("a", child, log);
    wait_for(Duration::from_secs(30), "every job runs", || {
        every_job_ran_since(&world.runs(), &names, 0.0, 1)
    });
    let first = now_secs().ceil();
    wait_for(Duration::from_secs(30), "8 more seconds of ticks", || {
        every_job_ran_a_tick_after(&world.runs(), &names, first + 8.0)
    });
    let runs = world.runs();
    for name in &names {
        for second in 0..8 {
            let tick = first as i64 + second;
            assert!(
                runs.iter().any(|run| &run.job == name && run.tick.timestamp() == tick),
                "{name} did not run its tick {tick} while the log pipe was full"
            );
        }
    }
    let page = http_get(port, "/metrics").1;
    assert!(
        sample(&page, "shardcron_log_lines_dropped_total").is_some_and(|dropped| dropped > 0.0),
        "the lines that did not fit are counted:\n{page}"
    );
    assert_eq!(sample(&page, "shardcron_session_losses_total"), Some(0.0), "{page}");
}
