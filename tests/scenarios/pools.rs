//! Where a job runs, against a real etcd: jobs with `run_on` run only on nodes with those tags,
//! in their pool's own elections, and fail over among them; with none left, `status` and the
//! metrics say so until one comes back and catches up. A `fan_out = "all"` job runs each tick
//! once on every such node, each node's ticks its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;

const TTL: u64 = 2;

/// A config of `shards` fleet shards and `pool_shards` per pool, with `jobs` (name, extra TOML).
fn write_pools_config(world: &World, shards: u32, pool_shards: u32, jobs: &[(String, String)]) -> PathBuf {
    let tables: Vec<(&str, &str, &str)> = jobs
        .iter()
        .map(|(name, extra)| (name.as_str(), "* * * * * *", extra.as_str()))
        .collect();
    let path = world.write_config("jobs.toml", shards, TTL, &tables);
    let text = std::fs::read_to_string(&path).expect("config");
    let text = text.replacen("\n\n[etcd]", &format!("\npool_shards = {pool_shards}\n\n[etcd]"), 1);
    std::fs::write(&path, text).expect("config");
    path
}

fn named(prefix: &str, count: usize, extra: &str) -> Vec<(String, String)> {
    (0..count)
        .map(|index| (format!("{prefix}-{index}"), extra.to_string()))
        .collect()
}

/// Leader of each shard of `pool`, from `status --json`.
fn pool_leaders(world: &World, config: &Path, pool: &str) -> Vec<Option<String>> {
    world
        .status(config)
        .shards
        .into_iter()
        .filter(|shard| shard.pool.as_deref() == Some(pool))
        .map(|shard| shard.leader)
        .collect()
}

/// Whether every shard of `pool` is led, only by `nodes`, each leading within one of the others.
fn pool_spread(world: &World, config: &Path, pool: &str, nodes: &[&str]) -> bool {
    let leaders = pool_leaders(world, config, pool);
    let mut loads: BTreeMap<&str, usize> = nodes.iter().map(|node| (*node, 0)).collect();
    for leader in &leaders {
        match leader.as_deref().and_then(|leader| loads.get_mut(leader)) {
            Some(load) => *load += 1,
            None => return false,
        }
    }
    let (low, high) = (loads.values().min(), loads.values().max());
    !leaders.is_empty() && high.zip(low).is_some_and(|(high, low)| high - low <= 1)
}

fn runs_of<'r>(runs: &'r [Run], names: &[(String, String)]) -> Vec<&'r Run> {
    runs.iter()
        .filter(|run| names.iter().any(|(name, _)| *name == run.job))
        .collect()
}

#[test]
fn db_jobs_run_only_on_db_nodes_fail_over_and_wait_for_one_when_none_is_left() {
    let mut world = World::new();
    let db = named("db", 6, "run_on = [\"db\"]\ncatch_up = \"all\"");
    let plain = named("plain", 6, "catch_up = \"all\"");
    let config = write_pools_config(&world, 4, 2, &[db.clone(), plain.clone()].concat());
    step("start a and b tagged db, c untagged");
    world.node("a", &config).args(&["--tags", "db"]).start();
    world.node("b", &config).args(&["--tags", "db,ssd"]).start();
    let c_port = world.node("c", &config).start_serving();
    let every: Vec<String> = db.iter().chain(&plain).map(|(name, _)| name.clone()).collect();
    wait_for(Duration::from_secs(20), "every job ran twice", || {
        every_job_ran_since(&world.runs(), &every, 0.0, 2)
    });
    wait_for(Duration::from_secs(10), "a and b lead one db shard each", || {
        pool_spread(&world, &config, "db", &["a", "b"])
    });

    step("SIGKILL a 5 ms before a tick");
    let tick = sleep_to_tick_offset(-5);
    let killed_at = now_secs();
    world.nodes[0].signal(libc::SIGKILL);
    eprintln!("killed a 5 ms before {tick}");
    wait_for(Duration::from_secs(15), "b leads every db shard", || {
        pool_leaders(&world, &config, "db")
            .iter()
            .all(|leader| leader.as_deref() == Some("b"))
    });
    wait_for(Duration::from_secs(15), "every db job ran on b after the kill", || {
        every_job_ran_since(
            &world.runs(),
            &db.iter().map(|(name, _)| name.clone()).collect::<Vec<_>>(),
            killed_at + TTL as f64,
            1,
        )
    });
    let runs = world.runs();
    let a_shard_jobs: Vec<&str> = db
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| runs.iter().any(|run| run.job == *name && run.node == "a"))
        .collect();
    let takeover = a_shard_jobs
        .iter()
        .map(|job| {
            runs.iter()
                .filter(|run| run.job == *job && run.node == "b" && run.started > killed_at)
                .map(|run| run.started)
                .fold(f64::MAX, f64::min)
                - killed_at
        })
        .fold(0.0, f64::max);
    eprintln!("b ran every job of a's db shard {takeover:.3} s after the kill (TTL {TTL} s)");
    assert!(
        takeover <= TTL as f64 + 1.0,
        "b ran a's db jobs {takeover:.3} s after the kill"
    );

    step("SIGKILL b too: no node has the db tag");
    sleep_to_mid_second();
    world.nodes[1].signal(libc::SIGKILL);
    wait_for(
        Duration::from_secs(15),
        "status says no eligible node for every db job",
        || {
            let status = world.status(&config);
            status
                .jobs
                .iter()
                .filter(|job| job.pool.as_deref() == Some("db"))
                .all(|job| {
                    job.no_eligible_node
                        .as_ref()
                        .is_some_and(|unserved| unserved.since.is_some())
                })
                && status
                    .shards
                    .iter()
                    .filter(|shard| shard.pool.as_deref() == Some("db"))
                    .all(|shard| shard.leader.is_none() && shard.no_eligible_node.is_some())
        },
    );
    wait_for(
        Duration::from_secs(10),
        "c counts 6 jobs without an eligible node",
        || {
            let (_, page) = http_get(c_port, "/metrics");
            sample(&page, "shardcron_jobs_without_eligible_node") == Some(6.0)
        },
    );
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_shardcron"))
        .args(["status", "--config"])
        .arg(&config)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("no eligible node since"), "{text}");
    let plain_names: Vec<String> = plain.iter().map(|(name, _)| name.clone()).collect();
    let gone = now_secs();
    wait_for(Duration::from_secs(10), "c alone runs the plain jobs 3 times", || {
        every_job_ran_since(&world.runs(), &plain_names, gone, 3)
    });

    step("restart a: it catches up every db tick missed");
    let restarted = now_secs();
    world.node("a", &config).args(&["--tags", "db"]).start();
    let db_names: Vec<String> = db.iter().map(|(name, _)| name.clone()).collect();
    wait_for(
        Duration::from_secs(20),
        "every db job ran a tick after the restart",
        || every_job_ran_a_tick_after(&world.runs(), &db_names, restarted + 1.0),
    );
    wait_for(
        Duration::from_secs(10),
        "status no longer says no eligible node",
        || {
            world
                .status(&config)
                .jobs
                .iter()
                .all(|job| job.no_eligible_node.is_none())
        },
    );
    let runs = world.runs();
    for run in runs_of(&runs, &db) {
        assert!(
            ["a", "b"].contains(&run.node.as_str()),
            "a db job ran on {}: {run:?}",
            run.node
        );
    }
    let mut repeats = 0;
    for (name, _) in db.iter().chain(&plain) {
        repeats += assert_each_tick_at_least_once(&runs, name, 1);
    }
    eprintln!("every tick of 12 jobs ran, the db jobs' across two kills; {repeats} redelivered");
    assert_fences_never_go_down(&runs);
}
