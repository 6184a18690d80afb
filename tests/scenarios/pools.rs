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

on_both_etcds! {
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
}

/// The runs of `job` on `node`, as if they were a job of their own: each node's instance.
fn instance_runs(runs: &[Run], job: &str, node: &str) -> Vec<Run> {
    runs.iter()
        .filter(|run| run.job == job && run.node == node)
        .map(|run| Run {
            job: format!("{job}@{node}"),
            ..run.clone()
        })
        .collect()
}

on_both_etcds! {
    fn a_fanned_out_job_runs_each_tick_once_on_every_web_node_and_a_killed_nodes_ticks_stay_its_own() {
        let mut world = World::new();
        let jobs = vec![
            (
                "rotate".to_string(),
                "run_on = [\"web\"]\nfan_out = \"all\"\ncatch_up = \"all\"".to_string(),
            ),
            (
                "warm".to_string(),
                "run_on = [\"web\"]\nfan_out = \"all\"\ncatch_up = \"all\"\ndelivery = \"at-most-once\"".to_string(),
            ),
            ("plain".to_string(), String::new()),
        ];
        let config = write_pools_config(&world, 2, 2, &jobs);
        step("start w1 and w2 tagged web, and c untagged");
        world.node("w1", &config).args(&["--tags", "web"]).start();
        world.node("w2", &config).args(&["--tags", "web,eu"]).start();
        world.node("c", &config).start();
        wait_for(Duration::from_secs(20), "w1 and w2 each ran rotate 3 times", || {
            let runs = world.runs();
            ["w1", "w2"].iter().all(|node| {
                runs.iter()
                    .filter(|run| run.job == "rotate" && run.node == *node)
                    .count()
                    >= 3
            })
        });

        step("w3 joins");
        let joined = now_secs();
        world.node("w3", &config).args(&["--tags", "web"]).start();
        wait_for(Duration::from_secs(20), "w3 ran rotate and warm 3 times", || {
            let runs = world.runs();
            ["rotate", "warm"]
                .iter()
                .all(|job| runs.iter().filter(|run| run.job == *job && run.node == "w3").count() >= 3)
        });
        let runs = world.runs();
        let w3_first = runs
            .iter()
            .filter(|run| run.node == "w3" && run.job == "rotate")
            .map(|run| run.tick.timestamp() as f64)
            .fold(f64::MAX, f64::min);
        assert!(
            w3_first >= joined.floor(),
            "w3 ran a tick from before it joined: {w3_first} < {joined}"
        );

        step("SIGKILL w1 5 ms after a tick");
        let tick = sleep_to_tick_offset(5);
        world.nodes[0].signal(libc::SIGKILL);
        let killed_at = now_secs();
        eprintln!("killed w1 5 ms after {tick}");
        wait_for(Duration::from_secs(10), "w2 and w3 run 3 more ticks", || {
            every_job_ran_since(
                &instance_runs(&world.runs(), "rotate", "w2"),
                &["rotate@w2".to_string()],
                killed_at,
                3,
            )
        });
        step("restart w1");
        let restarted = now_secs();
        world.node("w1", &config).args(&["--tags", "web"]).start();
        wait_for(Duration::from_secs(20), "w1 runs rotate and warm again", || {
            let runs = world.runs();
            ["rotate", "warm"].iter().all(|job| {
                runs.iter()
                    .any(|run| run.job == *job && run.node == "w1" && run.tick.timestamp() as f64 > restarted + 1.0)
            })
        });
        let runs = world.runs();
        for run in runs.iter().filter(|run| run.job != "plain") {
            assert!(run.node.starts_with('w'), "a web job ran on {}: {run:?}", run.node);
        }
        for node in ["w2", "w3"] {
            for job in ["rotate", "warm"] {
                let ticks = assert_each_tick_once(&instance_runs(&runs, job, node), &format!("{job}@{node}"), 1);
                assert!(ticks.len() >= 5, "{job} on {node} ran {} ticks", ticks.len());
            }
        }
        let rotate_w1 = instance_runs(&runs, "rotate", "w1");
        let repeats = assert_each_tick_at_least_once(&rotate_w1, "rotate@w1", 1);
        let killed_tick_runs = rotate_w1.iter().filter(|run| run.tick == tick).count();
        eprintln!("rotate (at-least-once) on w1: every tick ran, {repeats} again as a redelivery; the tick of the kill ran {killed_tick_runs} time(s)");
        // At-most-once on w1: each tick ran at most once, and a tick that did not run is recorded
        // lost in w1's own history.
        let warm_w1 = instance_runs(&runs, "warm", "w1");
        let history = std::process::Command::new(SHARDCRON)
            .args(["history", "warm", "--json", "-n", "500", "--config"])
            .arg(&config)
            .output()
            .expect("history");
        assert!(history.status.success(), "{}", String::from_utf8_lossy(&history.stderr));
        let history: Vec<serde_json::Value> = serde_json::from_slice(&history.stdout).expect("history JSON");
        let lost: Vec<i64> = history
            .iter()
            .filter(|run| run["node"] == "w1" && run["outcome"] == "lost")
            .filter_map(|run| chrono::DateTime::parse_from_rfc3339(run["scheduled_at"].as_str()?).ok())
            .map(|at| at.timestamp())
            .collect();
        let mut ran: Vec<i64> = warm_w1.iter().map(|run| run.tick.timestamp()).collect();
        ran.sort_unstable();
        let before = ran.len();
        ran.dedup();
        assert_eq!(before, ran.len(), "an at-most-once tick ran twice on w1: {warm_w1:#?}");
        let (first, last) = (ran[0], ran[ran.len() - 1]);
        for second in first..=last {
            assert!(
                ran.contains(&second) || lost.contains(&second),
                "warm's tick {second} on w1 neither ran nor was recorded lost (lost: {lost:?})"
            );
        }
        eprintln!(
            "warm (at-most-once) on w1: {} ticks ran, {} recorded lost",
            ran.len(),
            lost.len()
        );
        for run in history.iter().filter(|run| run["node"] != "w1") {
            assert_ne!(run["outcome"], "lost", "another node's tick was recorded lost: {run}");
        }
        // Per instance: each node's fences only grow (the instances of one job claim apart, and one
        // node may start its run a moment before another's with a lower fence).
        let by_instance: Vec<Run> = ["w1", "w2", "w3"]
            .iter()
            .flat_map(|node| ["rotate", "warm"].map(|job| instance_runs(&runs, job, node)))
            .flatten()
            .collect();
        assert_fences_never_go_down(&by_instance);

        step("status shows each node's instance; a trigger runs on every web node");
        let status = world.status(&config);
        let rotate = status.jobs.iter().find(|job| job.name == "rotate").expect("rotate");
        let nodes: Vec<&str> = rotate.instances.iter().map(|instance| instance.node.as_str()).collect();
        assert_eq!(nodes, ["w1", "w2", "w3"]);
        let triggered = std::process::Command::new(SHARDCRON)
            .args(["trigger", "rotate", "--wait", "--config"])
            .arg(&config)
            .output()
            .expect("trigger");
        let out = String::from_utf8_lossy(&triggered.stdout);
        assert!(
            triggered.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&triggered.stderr)
        );
        assert!(
            out.contains("rotate fans out: asked each of its 3 eligible nodes"),
            "{out}"
        );
        for node in ["w1", "w2", "w3"] {
            assert!(out.contains(&format!("triggered rotate node={node} fence=")), "{out}");
        }

        step("a pause of the job holds on every node");
        let paused = std::process::Command::new(SHARDCRON)
            .args(["pause", "rotate", "--config"])
            .arg(&config)
            .output()
            .expect("pause");
        assert!(paused.status.success(), "{}", String::from_utf8_lossy(&paused.stderr));
        // A tick claimed before the pause was seen may still start.
        let from = now_secs() + 2.0;
        wait_for(
            Duration::from_secs(15),
            "warm ran 3 ticks on every node after the pause",
            || {
                let runs = world.runs();
                ["w1", "w2", "w3"].iter().all(|node| {
                    runs.iter()
                        .filter(|run| run.job == "warm" && run.node == *node && run.tick.timestamp() as f64 > from)
                        .count()
                        >= 3
                })
            },
        );
        let after: Vec<Run> = world
            .runs()
            .into_iter()
            .filter(|run| run.job == "rotate" && run.tick.timestamp() as f64 > from)
            .collect();
        assert!(after.is_empty(), "rotate ran while paused: {after:#?}");
    }
}

on_both_etcds! {
    fn each_pool_stays_spread_within_one_through_joins_and_leaves_and_a_retagged_node_loses_no_tick() {
        let mut world = World::new();
        let db = named("db", 8, "run_on = [\"db\"]\ncatch_up = \"all\"");
        let web = named("web", 8, "run_on = [\"web\"]\ncatch_up = \"all\"");
        let plain = named("plain", 4, "catch_up = \"all\"");
        let jobs = [db.clone(), web.clone(), plain.clone()].concat();
        let config = write_pools_config(&world, 4, 6, &jobs);
        let names: Vec<String> = jobs.iter().map(|(name, _)| name.clone()).collect();
        let spread = |world: &World, db_nodes: &[&str], web_nodes: &[&str]| {
            wait_for(
                Duration::from_secs(8 * TTL),
                &format!("db spread over {db_nodes:?}, web over {web_nodes:?}"),
                || pool_spread(world, &config, "db", db_nodes) && pool_spread(world, &config, "web", web_nodes),
            );
            eprintln!(
                "db: {:?}, web: {:?}",
                pool_leaders(world, &config, "db"),
                pool_leaders(world, &config, "web")
            );
        };
        step("start a (db), b (db, web), c (web)");
        world.node("a", &config).args(&["--tags", "db"]).start();
        let b = world.node("b", &config).args(&["--tags", "web,db"]).start();
        world.node("c", &config).args(&["--tags", "web"]).start();
        spread(&world, &["a", "b"], &["b", "c"]);
        wait_for(Duration::from_secs(20), "every job ran twice", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 2)
        });

        step("d (db) joins");
        world.node("d", &config).args(&["--tags", "db"]).start();
        spread(&world, &["a", "b", "d"], &["b", "c"]);

        step("b leaves (SIGTERM)");
        world.nodes[b].signal(libc::SIGTERM);
        assert_eq!(world.nodes[b].wait_exit(Duration::from_secs(20)), Some(0));
        spread(&world, &["a", "d"], &["c"]);

        step("a restarts tagged web instead of db");
        world.nodes[0].signal(libc::SIGTERM);
        assert_eq!(world.nodes[0].wait_exit(Duration::from_secs(20)), Some(0));
        let restarted = now_secs();
        world.node("a", &config).args(&["--tags", "web"]).start();
        spread(&world, &["d"], &["a", "c"]);
        wait_for(
            Duration::from_secs(20),
            "every job ran a tick after a's restart",
            || every_job_ran_a_tick_after(&world.runs(), &names, restarted + 2.0),
        );
        let runs = world.runs();
        for (name, _) in &jobs {
            assert_each_tick_once(&runs, name, 1);
        }
        for run in runs_of(&runs, &db) {
            let tagged_db = match run.node.as_str() {
                "a" => run.started < restarted,
                node => ["b", "d"].contains(&node),
            };
            assert!(tagged_db, "a db job ran on a node without the db tag: {run:?}");
        }
        for run in runs_of(&runs, &web) {
            let tagged_web = match run.node.as_str() {
                "a" => run.started > restarted,
                node => ["b", "c"].contains(&node),
            };
            assert!(tagged_web, "a web job ran on a node without the web tag: {run:?}");
        }
        assert_fences_never_go_down(&runs);
    }
}
