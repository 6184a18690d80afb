//! Every kind of run of an `overlap = "skip"` job keeps the rule that no run starts beside a
//! going run, across a graceful stop: a manual run (`trigger`) and a backfill run, each going on
//! under its node's shutdown grace after a SIGTERM a second into it, while the other node takes
//! the shard within milliseconds. Checked from the jobs' own start and end stamps, over every
//! run of the window.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, DurationRound, SecondsFormat, Utc};

use crate::support::*;

const TTL: u64 = 2;

/// One run as the job stamped it: its trigger, tick, fence, node, whether it was flagged
/// redelivered, when it started and, once it ended, when.
#[derive(Debug, Clone)]
struct Stamped {
    trigger: String,
    tick: DateTime<Utc>,
    fence: i64,
    node: String,
    redelivered: bool,
    started: f64,
    ended: Option<f64>,
}

fn stamped(path: &Path) -> Vec<Stamped> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: Vec<Stamped> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [what, trigger, tick, fence, node, redelivered, at] = fields[..] else {
            continue;
        };
        let (Ok(tick), Ok(fence), Ok(at)) = (
            DateTime::parse_from_rfc3339(tick),
            fence.parse::<i64>(),
            at.parse::<f64>(),
        ) else {
            continue;
        };
        match what {
            "start" => runs.push(Stamped {
                trigger: trigger.to_string(),
                tick: tick.with_timezone(&Utc),
                fence,
                node: node.to_string(),
                redelivered: redelivered == "1",
                started: at,
                ended: None,
            }),
            _ => {
                if let Some(run) = runs.iter_mut().find(|run| run.fence == fence && run.node == node) {
                    run.ended = Some(at);
                }
            }
        }
    }
    runs
}

/// Two nodes, one shard, 60 s of shutdown grace each: `long`, `overlap = "skip"`, due every
/// `period` seconds; a scheduled run takes 0.3 s, a manual or backfill run `long_secs`.
fn skip_job(world: &mut World, period: u32, long_secs: u32) -> (PathBuf, PathBuf) {
    skip_job_long_when(world, period, long_secs, "manual|backfill")
}

/// As [`skip_job`], with the runs of the `case` pattern `long` taking `long_secs`.
fn skip_job_long_when(world: &mut World, period: u32, long_secs: u32, long: &str) -> (PathBuf, PathBuf) {
    let stamps = world.runs_file().with_file_name("stamps.log");
    let mark = |what: &str| {
        format!(
            "echo \"{what} $CRON_TRIGGER $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE ${{CRON_REDELIVERED:-0}} $(date +%s.%N)\" >> {}",
            stamps.display()
        )
    };
    let command = format!(
        "{}; case $CRON_TRIGGER in {long}) sleep {long_secs};; *) sleep 0.3;; esac; {}",
        mark("start"),
        mark("end")
    );
    let config = world.write_config_tables(
        "jobs.toml",
        1,
        TTL,
        &[(
            "long",
            format!("schedule = \"*/{period} * * * * *\"\noverlap = \"skip\"\ncommand = '{command}'\n"),
        )],
    );
    for node in ["a", "b"] {
        world.node(node, &config).args(&["--shutdown-grace", "60s"]).start();
    }
    (config, stamps)
}

/// Waits for the first run of `trigger`, then SIGTERMs its node a second into it; returns it.
fn sigterm_a_second_into(world: &mut World, stamps: &Path, trigger: &str) -> Stamped {
    wait_for(Duration::from_secs(30), &format!("a {trigger} run of long"), || {
        stamped(stamps).iter().any(|run| run.trigger == trigger)
    });
    let first = stamped(stamps)
        .into_iter()
        .find(|run| run.trigger == trigger)
        .expect("the run");
    let node = world
        .nodes
        .iter()
        .position(|node| node.id == first.node)
        .expect("its node");
    std::thread::sleep(Duration::from_secs_f64((first.started + 1.0 - now_secs()).max(0.0)));
    step(&format!(
        "SIGTERM {} a second into its {trigger} run of {}",
        first.node, first.tick
    ));
    world.nodes[node].signal(libc::SIGTERM);
    first
}

/// How many runs of other nodes than `run`'s started after it ended and have ended; 0 while it goes.
fn other_nodes_runs_after(stamps: &Path, run: &Stamped) -> usize {
    let runs = stamped(stamps);
    let Some(ended) = runs
        .iter()
        .find(|each| each.fence == run.fence)
        .and_then(|each| each.ended)
    else {
        return 0;
    };
    runs.iter()
        .filter(|each| each.node != run.node && each.started > ended && each.ended.is_some())
        .count()
}

/// No two runs of the job went at once: each run started after every earlier one ended.
fn assert_one_at_a_time(runs: &[Stamped]) {
    let mut runs = runs.to_vec();
    runs.sort_by(|a, b| a.started.total_cmp(&b.started));
    for pair in runs.windows(2) {
        let (earlier, later) = (&pair[0], &pair[1]);
        let ended = earlier.ended.unwrap_or(f64::INFINITY);
        assert!(
            later.started >= ended,
            "the {} run of tick {} (fence {}) on {} started at {:.3}, beside the {} run of tick {} (fence {}) on {} that went from {:.3} to {ended:.3}",
            later.trigger,
            later.tick,
            later.fence,
            later.node,
            later.started,
            earlier.trigger,
            earlier.tick,
            earlier.fence,
            earlier.node,
            earlier.started
        );
    }
}

on_both_etcds! {
    fn a_manual_run_going_on_under_the_grace_keeps_the_successors_ticks_from_starting_beside_it() {
        let mut world = World::new();
        let (config, stamps) = skip_job(&mut world, 2, 8);
        wait_for(Duration::from_secs(30), "a scheduled run of long", || {
            !stamped(&stamps).is_empty()
        });
        // Between two scheduled runs, so the manual one is not skipped beside one on its node.
        let odd = (now_secs().floor() as i64) | 1;
        std::thread::sleep(Duration::from_secs_f64((odd as f64 + 2.0 + 0.1 - now_secs()).max(0.0)));
        step("trigger long by hand");
        let out = shardcron(&config, &["trigger", "long"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let manual = sigterm_a_second_into(&mut world, &stamps, "manual");
        wait_for(
            Duration::from_secs(40),
            "the manual run ended and the successor ran two ticks after it",
            || other_nodes_runs_after(&stamps, &manual) >= 2,
        );
        let runs = stamped(&stamps);
        let ended = runs
            .iter()
            .find(|run| run.fence == manual.fence)
            .and_then(|run| run.ended)
            .expect("ended");
        eprintln!(
            "manual run {:.2} s, {} runs in the window; the successor's first start {:.2} s after it ended",
            ended - manual.started,
            runs.len(),
            runs.iter()
                .filter(|run| run.node != manual.node && run.started >= manual.started)
                .map(|run| run.started - ended)
                .fold(f64::INFINITY, f64::min)
        );
        assert_one_at_a_time(&runs);
    }
}

on_both_etcds! {
    fn a_run_going_on_under_the_grace_is_not_taken_for_ended_by_its_nodes_later_records() {
        let mut world = World::new();
        // Scheduled runs of 9 s every 2 s: before its SIGTERM the node skips a tick beside its run
        // and records a manual run skipped beside it, each with a higher fence than the run's.
        let (config, stamps) = skip_job_long_when(&mut world, 2, 9, "schedule");
        let first = {
            wait_for(Duration::from_secs(30), "a scheduled run of long", || {
                !stamped(&stamps).is_empty()
            });
            stamped(&stamps).remove(0)
        };
        std::thread::sleep(Duration::from_secs_f64((first.started + 2.5 - now_secs()).max(0.0)));
        step("trigger long by hand beside its going run");
        let out = shardcron(&config, &["trigger", "long"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_secs_f64((first.started + 3.5 - now_secs()).max(0.0)));
        let node = world
            .nodes
            .iter()
            .position(|node| node.id == first.node)
            .expect("its node");
        step(&format!("SIGTERM {} 3.5 s into its run of {}", first.node, first.tick));
        world.nodes[node].signal(libc::SIGTERM);
        wait_for(
            Duration::from_secs(40),
            "the run ended and the successor ran a tick after it",
            || other_nodes_runs_after(&stamps, &first) >= 1,
        );
        let runs = stamped(&stamps);
        eprintln!(
            "{} runs in the window: {:?}",
            runs.len(),
            runs.iter()
                .map(|run| (
                    run.trigger.as_str(),
                    run.node.as_str(),
                    run.fence,
                    run.started,
                    run.ended
                ))
                .collect::<Vec<_>>()
        );
        assert_one_at_a_time(&runs);
    }
}

on_both_etcds! {
    fn a_backfill_run_going_on_under_the_grace_is_neither_run_again_nor_joined_by_live_ticks() {
        let mut world = World::new();
        // A backfill waits while a live tick of the job runs or waits on its node: live ticks 10 s
        // apart leave it room.
        let (config, stamps) = skip_job(&mut world, 10, 6);
        wait_for(Duration::from_secs(30), "a scheduled run of long", || {
            !stamped(&stamps).is_empty()
        });
        let from = (Utc::now() - chrono::Duration::seconds(120))
            .duration_trunc(chrono::Duration::seconds(10))
            .expect("whole ten seconds");
        let range: Vec<DateTime<Utc>> = (0..3).map(|at| from + chrono::Duration::seconds(10 * at)).collect();
        let to = from + chrono::Duration::seconds(30);
        step(&format!("backfill long's 3 ticks from {from}"));
        let rfc3339 = |at: DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Secs, true);
        let out = shardcron(
            &config,
            &[
                "backfill",
                "long",
                "--from",
                &rfc3339(from),
                "--to",
                &rfc3339(to),
                "--detach",
            ],
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let first = sigterm_a_second_into(&mut world, &stamps, "backfill");
        wait_for(Duration::from_secs(60), "each backfill tick ran to its end", || {
            let runs = stamped(&stamps);
            range.iter().all(|tick| {
                runs.iter()
                    .any(|run| run.trigger == "backfill" && run.tick == *tick && run.ended.is_some())
            })
        });
        // Two more live runs after the last backfill run, so a live tick that started beside it
        // would be in the window.
        let last_end = stamped(&stamps)
            .iter()
            .filter(|run| run.trigger == "backfill")
            .filter_map(|run| run.ended)
            .fold(0.0, f64::max);
        wait_for(Duration::from_secs(40), "two live runs after the backfill", || {
            stamped(&stamps)
                .iter()
                .filter(|run| run.trigger == "schedule" && run.started > last_end && run.ended.is_some())
                .count()
                >= 2
        });
        let runs = stamped(&stamps);
        for tick in &range {
            let of_tick: Vec<&Stamped> = runs
                .iter()
                .filter(|run| run.trigger == "backfill" && run.tick == *tick)
                .collect();
            eprintln!(
                "backfill tick {tick}: {:?}",
                of_tick
                    .iter()
                    .map(|run| (run.node.as_str(), run.fence, run.redelivered))
                    .collect::<Vec<_>>()
            );
            assert_eq!(
                of_tick.len(),
                1,
                "backfill tick {tick} ran {} times (the first on {} went on under the grace): {of_tick:?}",
                of_tick.len(),
                first.node
            );
        }
        assert_one_at_a_time(&runs);
    }
}
