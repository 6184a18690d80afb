//! Runtime control against a real etcd: `pause` and `resume` seen by the nodes from the next
//! tick, kept across restarts, and paused ticks never caught up.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::support::*;
use shardcron::rules::record::Outcome;

fn shardcron(config: &Path, args: &[&str]) -> (String, String, Option<i32>) {
    let out = Command::new(SHARDCRON)
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run shardcron");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

fn stop(world: &mut World, node: usize) {
    world.nodes[node].signal(libc::SIGTERM);
    assert_eq!(
        world.nodes[node].wait_exit(Duration::from_secs(20)),
        Some(0),
        "the node stops cleanly"
    );
}

fn ticks_of(runs: &[Run], job: &str) -> Vec<DateTime<Utc>> {
    let mut ticks: Vec<DateTime<Utc>> = runs.iter().filter(|run| run.job == job).map(|run| run.tick).collect();
    ticks.sort();
    ticks
}

on_both_etcds! {
    fn a_paused_job_stays_paused_across_restarts_and_its_paused_ticks_are_never_caught_up() {
        let mut world = World::new();
        let names = ["held".to_string(), "free".to_string()];
        let config = world.write_config("jobs.toml", 2, 2, &every_second(&names, "catch_up = \"all\"\n"));
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "both jobs run", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 2)
        });

        step("pause held");
        let paused_at = Utc::now();
        let (stdout, stderr, code) = shardcron(&config, &["pause", "held", "--reason", "maintenance"]);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(stdout, "paused held until=- reason=\"maintenance\"\n");
        wait_for(Duration::from_secs(10), "a tick of held recorded paused", || {
            last_run(&world.status(&config), "held").is_some_and(|run| run.outcome == Outcome::Paused)
        });
        let status = world.status(&config);
        let pause_of = |name: &str| status.jobs.iter().find(|job| job.name == name).unwrap().paused.clone();
        assert_eq!(
            pause_of("held").and_then(|pause| pause.reason),
            Some("maintenance".into())
        );
        assert_eq!(pause_of("free"), None);

        step("restart the node while held is paused");
        stop(&mut world, 0);
        let restarted_at = now_secs();
        world.node("b", &config).start();
        wait_for(Duration::from_secs(20), "free runs on the restarted node", || {
            every_job_ran_a_tick_after(&world.runs(), &names[1..], restarted_at + 1.0)
        });

        step("stop every node, resume held while none runs, start again: the ticks missed while it was paused are not caught up");
        stop(&mut world, 1);
        std::thread::sleep(Duration::from_secs(2));
        let resumed_at = Utc::now();
        let (stdout, stderr, code) = shardcron(&config, &["resume", "held"]);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(stdout, "resumed held\n");
        std::thread::sleep(Duration::from_secs(2));
        let started_again = now_secs();
        world.node("c", &config).start();
        wait_for(Duration::from_secs(20), "both jobs run live ticks again", || {
            every_job_ran_a_tick_after(&world.runs(), &names, started_again + 1.0)
        });

        let runs = world.runs();
        // `free` never paused: every tick of the whole window once, the downtimes caught up.
        assert_each_tick_once(&runs, "free", 1);
        let held = ticks_of(&runs, "held");
        let mut seen = std::collections::HashSet::new();
        assert!(
            held.iter().all(|tick| seen.insert(*tick)),
            "a tick of held ran twice: {held:?}"
        );
        // The tick due as the pause was written may have run; none after it until the resume.
        let paused_from = paused_at + chrono::Duration::seconds(1);
        let inside: Vec<_> = held
            .iter()
            .filter(|tick| **tick >= paused_from && **tick < resumed_at)
            .collect();
        assert!(inside.is_empty(), "held ran paused ticks: {inside:?}");
        // Before the pause and from the resume on, every tick ran: the ones missed while no node
        // ran after the resume were caught up.
        let before: Vec<_> = held.iter().filter(|tick| **tick < paused_from).collect();
        let after: Vec<_> = held.iter().filter(|tick| **tick >= resumed_at).collect();
        for part in [&before, &after] {
            for pair in part.windows(2) {
                assert_eq!(
                    (*pair[1] - *pair[0]).num_seconds(),
                    1,
                    "a gap in held's ticks: {held:?}"
                );
            }
        }
        let first_after = after.first().expect("held ran after the resume");
        assert!(
            **first_after < resumed_at + chrono::Duration::seconds(1),
            "the ticks between the resume and the new node's start were caught up: first after the resume {first_after}, resumed at {resumed_at}"
        );
        let status = world.status(&config);
        assert_eq!(status.jobs.iter().find(|job| job.name == "held").unwrap().paused, None);
    }
}

#[test]
fn a_pause_of_every_job_for_a_while_ends_by_itself() {
    let mut world = World::new();
    let names = ["one".to_string(), "two".to_string()];
    let config = world.write_config("jobs.toml", 2, 2, &every_second(&names, ""));
    let port = shardcron::etcd_server::free_port().expect("free port");
    world
        .node("a", &config)
        .args(&["--metrics-addr", &format!("127.0.0.1:{port}")])
        .start();
    wait_for(Duration::from_secs(30), "both jobs run", || {
        every_job_ran_since(&world.runs(), &names, 0.0, 1)
    });
    let pauses_in_force = || sample(&http_get(port, "/metrics").1, "shardcron_pauses_in_force");
    assert_eq!(pauses_in_force(), Some(0.0));
    let paused_at = Utc::now();
    let (stdout, stderr, code) = shardcron(&config, &["pause", "--all", "--for", "4s"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("paused --all until="), "{stdout}");
    let until = paused_at + chrono::Duration::seconds(4);
    let status = world.status(&config);
    assert!(
        status
            .jobs
            .iter()
            .all(|job| job.paused.as_ref().is_some_and(|pause| pause.until.is_some())),
        "every job shows the pause and its end"
    );
    wait_for(Duration::from_secs(5), "the node counts the pause", || {
        pauses_in_force() == Some(1.0)
    });
    wait_for(Duration::from_secs(20), "both jobs run after the pause ended", || {
        every_job_ran_a_tick_after(&world.runs(), &names, until.timestamp() as f64 + 1.0)
    });
    assert_eq!(pauses_in_force(), Some(0.0), "the pause ended by itself");
    let runs = world.runs();
    let paused_runs = sample(
        &http_get(port, "/metrics").1,
        "shardcron_runs_total{job=\"one\",result=\"paused\"}",
    );
    assert!(
        paused_runs.is_some_and(|count| count >= 2.0),
        "paused ticks are counted: {paused_runs:?}"
    );
    for name in &names {
        let inside: Vec<_> = ticks_of(&runs, name)
            .into_iter()
            .filter(|tick| {
                *tick >= paused_at + chrono::Duration::seconds(1) && *tick < until - chrono::Duration::seconds(1)
            })
            .collect();
        assert!(inside.is_empty(), "{name} ran while every job was paused: {inside:?}");
    }
}

on_both_etcds! {
    fn history_keeps_each_jobs_last_runs_newest_first_and_no_more() {
        let mut world = World::new();
        let record = world.record_command();
        let config = world.write_config_tables(
            "jobs.toml",
            2,
            2,
            &[
                ("kept", format!("schedule = \"* * * * * *\"\ncommand = '{record}'")),
                (
                    "failing",
                    format!("schedule = \"*/2 * * * * *\"\ncommand = '{record}; exit 3'"),
                ),
            ],
        );
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, text.replacen("[cluster]\n", "[cluster]\nhistory = 5\n", 1)).unwrap();
        world.node("a", &config).start();
        wait_for(Duration::from_secs(40), "12 runs of kept and 6 of failing", || {
            let runs = world.runs();
            ticks_of(&runs, "kept").len() >= 12 && ticks_of(&runs, "failing").len() >= 6
        });
        // A clean stop writes every result and history entry still waiting.
        stop(&mut world, 0);

        let runs = world.runs();
        let (stdout, stderr, code) = shardcron(&config, &["history", "kept", "-n", "20", "--json"]);
        assert_eq!(code, Some(0), "{stderr}");
        let history: Vec<shardcron::rules::record::RunRecord> =
            serde_json::from_str(&stdout).expect("a JSON array of runs");
        let mut newest: Vec<&Run> = runs.iter().filter(|run| run.job == "kept").collect();
        newest.sort_by_key(|run| std::cmp::Reverse(run.tick));
        let expected: Vec<(DateTime<Utc>, i64)> = newest.iter().take(5).map(|run| (run.tick, run.fence)).collect();
        let shown: Vec<(DateTime<Utc>, i64)> = history.iter().map(|run| (run.scheduled_at, run.fence)).collect();
        assert_eq!(shown, expected, "the 5 newest runs, newest first, with their fences");
        assert!(history.iter().all(|run| run.outcome == Outcome::Exited
            && run.exit_code == Some(0)
            && run.trigger == shardcron::rules::record::Trigger::Schedule
            && run.node == "a"
            && run.attempts == 1));

        let (stdout, stderr, code) = shardcron(&config, &["history", "failing", "-n", "2"]);
        assert_eq!(code, Some(0), "{stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 3, "a header and 2 runs: {stdout}");
        assert!(
            lines[0].starts_with("SCHEDULED AT") && lines[0].contains("TRIGGER"),
            "{stdout}"
        );
        assert!(
            lines[1].contains(" schedule ") && lines[1].contains(" exited ") && lines[1].contains(" 3 "),
            "{stdout}"
        );

        // etcd holds the last 5 runs of each job, not every run: the trim rides each write.
        let held = tokio::runtime::Runtime::new().unwrap().block_on(async {
            let client = etcd_client::Client::connect(world.etcd.client_urls(), None)
                .await
                .unwrap();
            let mut held = Vec::new();
            for job in ["kept", "failing"] {
                let response = client
                    .clone()
                    .get(
                        format!("/shardcron/test/runs/{job}/"),
                        Some(etcd_client::GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
                    .unwrap();
                held.push(response.count());
            }
            held
        });
        assert_eq!(held, [5, 5], "history keys held in etcd for kept and failing");
    }
}

fn keys_under(world: &World, prefix: &str) -> i64 {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = etcd_client::Client::connect(world.etcd.client_urls(), None)
            .await
            .unwrap();
        client
            .clone()
            .get(
                prefix,
                Some(etcd_client::GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap()
            .count()
    })
}

on_both_etcds! {
    fn trigger_runs_a_job_now_through_its_claim_fence_and_overlap_policy() {
        let mut world = World::new();
        let log = world.dir.path().join("manual.log");
        let record = format!(
            "echo \"$CRON_JOB $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE $CRON_TRIGGER $(date +%s.%N)\" >> {}",
            log.display()
        );
        let config = world.write_config_tables(
            "jobs.toml",
            4,
            2,
            &[
                (
                    "yearly",
                    format!("schedule = \"0 0 1 1 *\"\ncommand = '{record}; exit 7'"),
                ),
                (
                    "slow",
                    format!("schedule = \"0 0 1 1 *\"\ncommand = '{record}; sleep 4'\noverlap = \"skip\""),
                ),
                (
                    "beside",
                    format!("schedule = \"0 0 1 1 *\"\ncommand = '{record}; sleep 3'\noverlap = \"allow\""),
                ),
            ],
        );
        world.node("a", &config).start();
        world.node("b", &config).start();
        wait_for(Duration::from_secs(30), "every shard led", || {
            world.shard_leaders(&config).iter().all(|(leader, _)| leader.is_some())
        });
        let lines = || -> Vec<Vec<String>> {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .map(|line| line.split(' ').map(String::from).collect())
                .collect()
        };

        step("trigger --wait exits with the run's own status");
        let asked_at = Utc::now();
        let (stdout, stderr, code) = shardcron(&config, &["trigger", "yearly", "--wait"]);
        assert_eq!(code, Some(7), "{stdout} {stderr}");
        let printed: Vec<&str> = stdout.trim().split(' ').collect();
        assert_eq!(printed[..2], ["triggered", "yearly"], "{stdout}");
        let node = printed[2].strip_prefix("node=").expect("node=").to_string();
        let fence: i64 = printed[3].strip_prefix("fence=").expect("fence=").parse().unwrap();
        let ran = lines();
        assert_eq!(ran.len(), 1, "one run: {ran:?}");
        assert_eq!(
            [&ran[0][0], &ran[0][2], &ran[0][3], &ran[0][4]],
            ["yearly", &fence.to_string(), &node, "manual"]
        );
        let requested_at = DateTime::parse_from_rfc3339(&ran[0][1])
            .expect("CRON_SCHEDULED_AT is RFC 3339")
            .with_timezone(&Utc);
        assert!(
            (requested_at - asked_at).num_milliseconds().abs() < 5_000,
            "CRON_SCHEDULED_AT is the request time: {requested_at} for a request at {asked_at}"
        );
        // Read your writes: the answer comes once the run is in etcd, read at once, no waiting.
        let (json, stderr, _) = shardcron(&config, &["history", "yearly", "--json"]);
        let history: Vec<shardcron::rules::record::RunRecord> =
            serde_json::from_str(&json).unwrap_or_else(|err| panic!("history --json: {err}: {json} {stderr}"));
        assert_eq!(
            history.len(),
            1,
            "the run trigger --wait returned is in the history at once"
        );
        assert_eq!(
            (history[0].trigger, history[0].fence, history[0].exit_code),
            (shardcron::rules::record::Trigger::Manual, fence, Some(7))
        );
        let status = world.status(&config);
        let yearly = status.jobs.iter().find(|job| job.name == "yearly").unwrap();
        assert_eq!(
            yearly.last_run.as_ref().map(|run| (run.fence, run.exit_code)),
            Some((fence, Some(7))),
            "the run trigger --wait returned is the job's last run in status at once"
        );
        assert_eq!(
            yearly.last_claim, None,
            "a run asked for by hand does not move the schedule's record"
        );

        step("a second request while the first run goes is skipped, as a tick would be (overlap = \"skip\")");
        let (_, stderr, code) = shardcron(&config, &["trigger", "slow"]);
        assert_eq!(code, Some(0), "{stderr}");
        wait_for(Duration::from_secs(10), "the slow run started", || {
            lines().iter().any(|line| line[0] == "slow")
        });
        let (_, stderr, code) = shardcron(&config, &["trigger", "slow", "--wait"]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("the run of slow ended: skipped"), "{stderr}");
        assert_eq!(lines().iter().filter(|line| line[0] == "slow").count(), 1);

        step("under overlap = \"allow\", a second request runs beside the first");
        let (_, stderr, code) = shardcron(&config, &["trigger", "beside"]);
        assert_eq!(code, Some(0), "{stderr}");
        wait_for(Duration::from_secs(10), "the first run of beside started", || {
            lines().iter().any(|line| line[0] == "beside")
        });
        let (_, stderr, code) = shardcron(&config, &["trigger", "beside", "--wait"]);
        assert_eq!(code, Some(0), "{stderr}");
        let started: Vec<f64> = lines()
            .iter()
            .filter(|line| line[0] == "beside")
            .map(|line| line[5].parse().unwrap())
            .collect();
        assert_eq!(started.len(), 2, "both ran");
        assert!(
            started[1] - started[0] < 3.0,
            "the second started while the first (3 s) still went: {started:?}"
        );
        wait_for(Duration::from_secs(10), "the answers are cleaned up", || {
            keys_under(&world, "/shardcron/test/triggered/") == 0
        });

        step("with no node running, a request is withdrawn after --timeout and never served");
        for node in 0..2 {
            stop(&mut world, node);
        }
        let (_, stderr, code) = shardcron(&config, &["trigger", "yearly", "--timeout", "1s"]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains("no leader took the run of yearly within 1s"),
            "{stderr}"
        );
        assert_eq!(
            keys_under(&world, "/shardcron/test/triggers/"),
            0,
            "the request was withdrawn"
        );
        world.node("c", &config).start();
        wait_for(Duration::from_secs(30), "every shard led again", || {
            world.shard_leaders(&config).iter().all(|(leader, _)| leader.is_some())
        });
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            lines().iter().filter(|line| line[0] == "yearly").count(),
            1,
            "the withdrawn request did not run"
        );
    }
}

on_both_etcds! {
    /// One shard, two nodes, the leader SIGKILLed: a pause holds on the new leader and no paused
    /// tick is caught up after the resume; a run asked for during the takeover runs once; the
    /// history keeps its order and cap across the failover.
    fn pause_trigger_and_history_hold_across_a_leader_sigkill() {
        let mut world = World::new();
        let record = world.record_command();
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            2,
            &[
                (
                    "held",
                    format!("schedule = \"* * * * * *\"\ncommand = '{record}'\ncatch_up = \"all\""),
                ),
                // A list whose expressions share every other second: each second fires once.
                (
                    "kept",
                    format!("schedule = [\"* * * * * *\", \"*/2 * * * * *\"]\ncommand = '{record}'\ncatch_up = \"all\""),
                ),
                ("manual", format!("schedule = \"0 0 1 1 *\"\ncommand = '{record}'")),
            ],
        );
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, text.replacen("[cluster]\n", "[cluster]\nhistory = 5\n", 1)).unwrap();
        let roles = world.leader_and_standby(&config);

        step("pause held, then SIGKILL the leader and ask for a run of manual during the takeover");
        let paused_at = Utc::now();
        let (_, stderr, code) = shardcron(&config, &["pause", "held"]);
        assert_eq!(code, Some(0), "{stderr}");
        wait_for(Duration::from_secs(10), "a tick of held recorded paused", || {
            last_run(&world.status(&config), "held").is_some_and(|run| run.outcome == Outcome::Paused)
        });
        world.nodes[roles.leader].signal(libc::SIGKILL);
        let killed_at = now_secs();
        let (stdout, stderr, code) = shardcron(&config, &["trigger", "manual", "--wait", "--timeout", "20s"]);
        assert_eq!(code, Some(0), "{stdout} {stderr}");
        assert!(
            stdout.contains(&format!("node={}", roles.standby_id)),
            "the new leader took it: {stdout}"
        );
        wait_for(Duration::from_secs(20), "kept runs on the new leader", || {
            world
                .runs()
                .iter()
                .any(|run| run.job == "kept" && run.node == roles.standby_id && run.started > killed_at + 2.0)
        });

        step("resume held: it runs from the resume on, no paused tick");
        let resumed_at = Utc::now();
        let (_, stderr, code) = shardcron(&config, &["resume", "held"]);
        assert_eq!(code, Some(0), "{stderr}");
        wait_for(Duration::from_secs(20), "held and kept run a few more ticks", || {
            let runs = world.runs();
            let after = |job: &str| {
                runs.iter()
                    .filter(|run| run.job == job && run.tick > resumed_at + chrono::Duration::seconds(1))
                    .count()
            };
            after("held") >= 3 && after("kept") >= 6
        });
        let survivor = world.nodes.iter().position(|node| node.id == roles.standby_id).unwrap();
        stop(&mut world, survivor);

        let runs = world.runs();
        let held = ticks_of(&runs, "held");
        let paused: Vec<_> = held
            .iter()
            .filter(|tick| **tick >= paused_at + chrono::Duration::seconds(1) && **tick < resumed_at)
            .collect();
        assert!(
            paused.is_empty(),
            "held ran paused ticks across the failover: {paused:?}"
        );
        assert_eq!(
            runs.iter().filter(|run| run.job == "manual").count(),
            1,
            "the run asked for during the takeover ran once"
        );

        // kept: every tick across the failover, each once but for a repeat with a higher fence of
        // a tick whose start the killed leader had not written (at-least-once).
        let mut kept: Vec<&Run> = runs.iter().filter(|run| run.job == "kept").collect();
        kept.sort_by_key(|run| (run.tick, run.fence));
        for pair in kept.windows(2) {
            let gap = (pair[1].tick - pair[0].tick).num_seconds();
            assert!(
                gap == 1 || (gap == 0 && pair[1].fence > pair[0].fence),
                "kept: {:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
        let (stdout, stderr, code) = shardcron(&config, &["history", "kept", "-n", "50", "--json"]);
        assert_eq!(code, Some(0), "{stderr}");
        let history: Vec<shardcron::rules::record::RunRecord> = serde_json::from_str(&stdout).unwrap();
        let mut newest: Vec<DateTime<Utc>> = kept.iter().map(|run| run.tick).collect();
        newest.dedup();
        newest.reverse();
        newest.truncate(5);
        assert_eq!(
            history.iter().map(|run| run.scheduled_at).collect::<Vec<_>>(),
            newest,
            "the 5 newest ticks, newest first"
        );
        for entry in &history {
            assert!(
                kept.iter()
                    .any(|run| run.tick == entry.scheduled_at && run.fence == entry.fence),
                "history's run of {} has the fence of a run of that tick",
                entry.scheduled_at
            );
        }
        assert_eq!(
            keys_under(&world, "/shardcron/test/runs/kept/"),
            5,
            "the cap holds across the failover"
        );
    }
}

on_both_etcds! {
    /// A `trigger` killed while it waits leaves no key behind: neither the request no leader took
    /// (which is then never served) nor the answer of a run it waited for. Both live on the asker's
    /// lease.
    fn a_trigger_killed_while_it_waits_leaves_no_key_behind() {
        let mut world = World::new();
        let log = world.dir.path().join("manual.log");
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            2,
            &[(
                "slow",
                format!(
                    "schedule = \"0 0 1 1 *\"\ncommand = 'echo ran >> {}; sleep 8'",
                    log.display()
                ),
            )],
        );
        let ask = |args: &[&str]| {
            Command::new(SHARDCRON)
                .args(args)
                .arg("--config")
                .arg(&config)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start trigger")
        };
        let killed = |mut child: std::process::Child| {
            child.kill().expect("SIGKILL the trigger");
            child.wait().expect("reap the trigger");
            now_secs()
        };

        step("no node runs: a request waits for a leader; its asker is SIGKILLed");
        let asker = ask(&["trigger", "slow", "--timeout", "1h"]);
        wait_for(Duration::from_secs(10), "the request is in etcd", || {
            keys_under(&world, "/shardcron/test/triggers/") == 1
        });
        let at = killed(asker);
        wait_for(
            Duration::from_secs(30),
            "the request went with its asker's lease",
            || keys_under(&world, "/shardcron/test/triggers/") == 0,
        );
        eprintln!("request gone {:.1} s after its asker died", now_secs() - at);

        step("a node takes a run asked for with --wait; its asker is SIGKILLed while the run goes on");
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "the shard is led", || {
            world.shard_leaders(&config).iter().all(|(leader, _)| leader.is_some())
        });
        assert!(!log.exists(), "the request whose asker died was never served");
        let asker = ask(&["trigger", "slow", "--wait"]);
        wait_for(
            Duration::from_secs(20),
            "the run started and its answer is in etcd",
            || log.exists() && keys_under(&world, "/shardcron/test/triggered/") == 1,
        );
        let at = killed(asker);
        wait_for(
            Duration::from_secs(30),
            "the answer went with its asker's lease",
            || keys_under(&world, "/shardcron/test/triggered/") == 0,
        );
        eprintln!("answer gone {:.1} s after its asker died", now_secs() - at);

        step("an API client asks for a run with \"wait\": true and hangs up while it goes on");
        let port = shardcron::etcd_server::free_port().expect("port");
        let token = "a-token-of-sixteen-bytes-or-more";
        world
            .node("b", &config)
            .args(&[
                "--http-addr",
                &port.to_string(),
                "--api-token-env",
                "TRIGGER_TEST_TOKEN",
            ])
            .env(&[("TRIGGER_TEST_TOKEN", token)])
            .start();
        // Ready, not only listening: until b is connected to etcd its API answers 503.
        wait_ready(port);
        wait_for(Duration::from_secs(60), "the first run ended", || {
            keys_under(&world, "/shardcron/test/jobs/slow/result") == 1
        });
        std::fs::remove_file(&log).expect("clear the run log");
        let body = r#"{"wait": true}"#;
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        std::io::Write::write_all(
            &mut client,
            format!(
                "POST /api/v1/jobs/slow/trigger HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .expect("send the request");
        wait_for(
            Duration::from_secs(20),
            "the run started and its answer is in etcd",
            || log.exists() && keys_under(&world, "/shardcron/test/triggered/") == 1,
        );
        drop(client);
        let at = now_secs();
        wait_for(
            Duration::from_secs(30),
            "the answer went when the client hung up",
            || keys_under(&world, "/shardcron/test/triggered/") == 0,
        );
        eprintln!("answer gone {:.1} s after the client hung up", now_secs() - at);
    }
}

on_both_etcds! {
    /// `trigger --wait` gets its answer even when the node's first write of it fails: the node cut
    /// off from etcd as the run ends tries again once etcd answers, and the command exits with the
    /// run's status.
    fn trigger_wait_gets_its_answer_after_a_failed_write() {
        let mut world = World::new();
        let log = world.dir.path().join("manual.log");
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            10,
            &[(
                "slow",
                format!(
                    "schedule = \"0 0 1 1 *\"\ncommand = 'echo ran >> {log}; sleep 2; echo done >> {log}; exit 5'",
                    log = log.display()
                ),
            )],
        );
        let proxies = world.start_behind_proxies(&["a"], &config);
        wait_for(Duration::from_secs(30), "the shard is led", || {
            world.shard_leaders(&config).iter().all(|(leader, _)| leader.is_some())
        });
        step("trigger --wait; cut the node off from etcd once the run started");
        let asker = Command::new(SHARDCRON)
            .args(["trigger", "slow", "--wait", "--config"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start trigger");
        wait_for(Duration::from_secs(20), "the run started", || log.exists());
        proxies[0].cut();
        wait_for(Duration::from_secs(20), "the node could not write the answer", || {
            world.nodes[0]
                .log_text()
                .contains("could not tell the command that asked for a run how it ended")
        });
        step("heal: the command gets the run's exit status");
        proxies[0].heal();
        let mut asker = asker;
        let healed = now_secs();
        let mut status = None;
        wait_for(Duration::from_secs(20), "the command exits", || {
            status = asker.try_wait().expect("trigger status");
            status.is_some()
        });
        assert_eq!(status.and_then(|status| status.code()), Some(5));
        eprintln!("answered {:.1} s after the heal", now_secs() - healed);
    }
}
