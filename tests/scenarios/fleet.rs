//! The fleet against a real etcd: shards spread evenly over live nodes, a join moves few of them
//! without losing or doubling a tick, a departure spreads its shards, and nodes whose configs
//! disagree on the shard count still run each tick at most once.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

const TTL: u64 = 2;

/// Leader of every shard, from `status --json`.
fn leaders(world: &World, config: &Path) -> Vec<Option<String>> {
    world
        .shard_leaders(config)
        .into_iter()
        .map(|(leader, _)| leader)
        .collect()
}

fn loads(leaders: &[Option<String>]) -> BTreeMap<String, usize> {
    let mut loads = BTreeMap::new();
    for leader in leaders.iter().flatten() {
        *loads.entry(leader.clone()).or_default() += 1;
    }
    loads
}

/// Waits until every shard has a leader and exactly `nodes` lead between `low` and `high` each.
fn wait_balanced(world: &World, config: &Path, nodes: &[&str], low: usize, high: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    wait_for(limit, &format!("{nodes:?} each lead {low}..={high} shards"), || {
        let leaders = leaders(world, config);
        let loads = loads(&leaders);
        leaders.iter().all(Option::is_some)
            && loads.len() == nodes.len()
            && nodes
                .iter()
                .all(|node| loads.get(*node).is_some_and(|load| (low..=high).contains(load)))
    });
    started.elapsed()
}

on_both_etcds! {
    fn three_nodes_share_16_shards_and_a_fourth_takes_its_share_without_a_lost_tick() {
        let mut world = World::new();
        let names = job_names(24, 2);
        let config = world.write_config("jobs.toml", 16, TTL, &every_second(&names, "catch_up = \"all\""));
        for id in ["a", "b", "c"] {
            step(&format!("start {id}"));
            world.node(id, &config).start();
            std::thread::sleep(Duration::from_millis(500));
        }
        let took = wait_balanced(&world, &config, &["a", "b", "c"], 5, 6, Duration::from_secs(6 * TTL));
        let before = leaders(&world, &config);
        eprintln!(
            "3 nodes: loads {:?}, balanced {:.2} s after the last start",
            loads(&before),
            took.as_secs_f64()
        );

        // A job whose shard changed hands before its first claim has no record to catch up from,
        // so wait until every job has run before the join that this test is about.
        wait_for(Duration::from_secs(6 * TTL), "every job ran before the join", || {
            let runs = world.runs();
            names.iter().all(|name| runs.iter().any(|run| &run.job == name))
        });
        step("start d");
        let joined = now_secs();
        world.node("d", &config).start();
        let took = wait_balanced(
            &world,
            &config,
            &["a", "b", "c", "d"],
            4,
            4,
            Duration::from_secs(6 * TTL),
        );
        let after = leaders(&world, &config);
        let moved = before.iter().zip(&after).filter(|(old, new)| old != new).count();
        eprintln!(
            "4 nodes: loads {:?}, {moved} shards moved, balanced {:.2} s after the join",
            loads(&after),
            took.as_secs_f64()
        );
        assert!(moved <= 6, "a join moved {moved} of 16 shards");

        let settled = now_secs();
        wait_for(Duration::from_secs(10), "3 more seconds of runs", || {
            world.runs().iter().any(|run| run.started > settled + 3.0)
        });
        step("SIGKILL everything; every tick of every job ran exactly once");
        for node in &world.nodes {
            node.signal(libc::SIGKILL);
        }
        let runs = world.runs();
        for name in &names {
            let ticks = assert_each_tick_once(&runs, name, 1);
            assert!(
                ticks.first().is_some_and(|first| (first.timestamp() as f64) < joined),
                "{name} ran before the join"
            );
        }
    }
}

on_both_etcds! {
    fn a_node_that_stops_or_dies_leaves_its_shards_spread_evenly() {
        let mut world = World::new();
        let names = job_names(8, 2);
        let config = world.write_config("jobs.toml", 16, TTL, &every_second(&names, "catch_up = \"all\""));
        for id in ["a", "b", "c", "d"] {
            world.node(id, &config).start();
        }
        wait_balanced(
            &world,
            &config,
            &["a", "b", "c", "d"],
            4,
            4,
            Duration::from_secs(6 * TTL),
        );

        step("SIGTERM d");
        world.nodes[3].signal(libc::SIGTERM);
        assert_eq!(world.nodes[3].wait_exit(Duration::from_secs(10)), Some(0));
        let took = wait_balanced(&world, &config, &["a", "b", "c"], 5, 6, Duration::from_secs(6 * TTL));
        eprintln!("after SIGTERM: balanced in {:.2} s", took.as_secs_f64());

        step("SIGKILL c");
        world.nodes[2].signal(libc::SIGKILL);
        let took = wait_balanced(&world, &config, &["a", "b"], 8, 8, Duration::from_secs(6 * TTL));
        eprintln!("after SIGKILL: balanced in {:.2} s", took.as_secs_f64());
        let runs = world.runs();
        // The SIGKILL may land between a run's start and the write that records it: those jobs are
        // at-least-once, so that tick runs again, fenced and flagged. Nothing else may repeat.
        let repeats: usize = names
            .iter()
            .map(|name| assert_each_tick_at_least_once(&runs, name, 1))
            .sum();
        eprintln!("ticks run again after the SIGKILL, fenced and flagged: {repeats}");
    }
}

on_both_etcds! {
    fn nodes_with_different_shard_counts_never_run_a_tick_twice() {
        let mut world = World::new();
        let names = job_names(12, 2);
        let four = world.write_config("four.toml", 4, TTL, &every_second(&names, "catch_up = \"all\""));
        let seven = world.write_config("seven.toml", 7, TTL, &every_second(&names, "catch_up = \"all\""));
        step("a runs 4 shards, b runs 7: separate elections over the same jobs");
        world.node("a", &four).start();
        world.node("b", &seven).start();
        wait_for(Duration::from_secs(20), "both nodes lead all their shards", || {
            leaders(&world, &four)
                .iter()
                .all(|leader| leader.as_deref() == Some("a"))
                && leaders(&world, &seven)
                    .iter()
                    .all(|leader| leader.as_deref() == Some("b"))
        });
        let started = now_secs();
        wait_for(Duration::from_secs(20), "5 s of runs", || {
            world.runs().iter().any(|run| run.started > started + 5.0)
        });
        for node in &world.nodes {
            node.signal(libc::SIGKILL);
        }
        let runs = world.runs();
        for name in &names {
            assert_each_tick_once(&runs, name, 1);
        }
        // A job moving between the two elections keeps a fence that only grows.
        assert_fences_never_go_down(&runs);
        let by_node = |id: &str| runs.iter().filter(|run| run.node == id).count();
        eprintln!("runs: a {}, b {}", by_node("a"), by_node("b"));
        let status = world.status(&four);
        let drifted: Vec<&str> = status
            .nodes
            .iter()
            .filter(|node| node.drift)
            .map(|node| node.id.as_str())
            .collect();
        assert_eq!(drifted, vec!["b"], "status flags the node whose config differs");
        assert!(
            world.nodes[0].log_text().contains("config drift"),
            "a warns about b's config"
        );
    }
}

on_both_etcds! {
    /// Keys under a shard's election prefix that no member put (one without a lease, one on a lease
    /// no member holds) never lead: once the real leader campaigns again behind them, a member
    /// leads the shard within a TTL, its job fires again, and the node names each key in its log.
    fn keys_no_member_put_never_lead_an_election() {
        let mut world = World::new();
        let names = job_names(1, 1);
        let config = world.write_config("jobs.toml", 1, TTL, &every_second(&names, ""));
        step("start a; wait until it leads and runs");
        world.node("a", &config).start();
        wait_for(Duration::from_secs(15), "a leads and runs", || {
            world.leader_of(&config, 0).is_some_and(|(leader, _)| leader == "a") && !world.runs().is_empty()
        });

        step("put two foreign keys in shard 0's election, behind a's key");
        let prefix = "/shardcron/test/shards/0/n1/";
        let (runtime, mut client) = world.etcd_client();
        let leaseless = format!("{prefix}ffffffff");
        // Named for its own live lease, as a member's key is, but no member registered on that lease.
        let on_a_stray_lease = runtime.block_on(async {
            client.put(leaseless.as_str(), "intruder", None).await.expect("put");
            let lease = client.lease_grant(300, None).await.expect("grant").id();
            let key = format!("{prefix}{lease:x}");
            let on_lease = etcd_client::PutOptions::new().with_lease(lease);
            client
                .put(key.as_str(), "intruder", Some(on_lease))
                .await
                .expect("put on the lease");
            key
        });

        step("stop a gracefully, so both keys are first in line, and start it again");
        world.nodes[0].signal(libc::SIGTERM);
        assert_eq!(
            world.nodes[0].wait_exit(Duration::from_secs(20)),
            Some(0),
            "a stops cleanly"
        );
        let restarted = now_secs();
        let again = world.node("a", &config).start();
        wait_for(
            Duration::from_secs(6 * TTL),
            "a member leads shard 0 and its job runs again",
            || {
                world.leader_of(&config, 0).is_some_and(|(leader, _)| leader == "a")
                    && world.runs().iter().any(|run| run.started > restarted)
            },
        );
        let first_run = world
            .runs()
            .iter()
            .filter(|run| run.started > restarted)
            .map(|run| run.started)
            .fold(f64::MAX, f64::min);
        eprintln!("first run {:.2} s after the restart", first_run - restarted);
        for key in [&leaseless, &on_a_stray_lease] {
            assert_eq!(world.etcd_value(key), None, "{key} was removed");
            assert!(
                world.nodes[again].log_text().contains(key.as_str()),
                "the log names {key}"
            );
        }
    }
}
