//! The distributed core against a real etcd: one leader per shard, failover on SIGKILL, no
//! stale fence after SIGSTOP, handoff on SIGTERM, fenced claims, on-time firing.

mod support;

use std::time::Duration;

use shardcron::shard::shard_of;
use support::*;

const EVERY_SECOND: &str = "* * * * * *";

#[test]
fn two_nodes_lead_each_shard_once_and_set_cron_variables() {
    let mut world = World::new();
    let jobs: Vec<(String, &str, &str)> = (0..6)
        .map(|i| (format!("job{i}"), EVERY_SECOND, ""))
        .collect();
    let jobs: Vec<(&str, &str, &str)> = jobs.iter().map(|(n, s, e)| (n.as_str(), *s, *e)).collect();
    let config = world.write_config("jobs.toml", 4, 3, &jobs);
    step("start nodes a and b");
    world.start_node("a", &config);
    world.start_node("b", &config);
    wait_for(Duration::from_secs(20), "every job ran 3 times", || {
        let runs = world.runs();
        jobs.iter()
            .all(|(name, _, _)| runs.iter().filter(|run| run.job == *name).count() >= 3)
    });
    step("every shard has exactly one leader and one standby");
    let status = world.status(&config);
    let mut fences = std::collections::HashMap::new();
    for shard in status["shards"].as_array().expect("shards") {
        let leader = shard["leader"].as_str().expect("a leader");
        assert!(leader == "a" || leader == "b", "{shard}");
        assert_eq!(shard["standby"], 1, "{shard}");
        fences.insert(
            shard["shard"].as_u64().unwrap() as u32,
            (leader.to_string(), shard["fence"].as_i64().unwrap()),
        );
    }
    for node in &world.nodes {
        node.signal(libc::SIGTERM);
    }
    for node in &mut world.nodes {
        assert_eq!(
            node.wait_exit(Duration::from_secs(15)),
            Some(0),
            "node {} exits cleanly on SIGTERM",
            node.id
        );
    }
    step("each tick ran once, with the variables of its shard's leader");
    let runs = world.runs();
    for (name, _, _) in &jobs {
        assert_each_tick_once(&runs, name, 1);
    }
    for run in &runs {
        assert_eq!(run.shard, shard_of(&run.job, 4), "{run:?}");
        let (leader, fence) = &fences[&run.shard];
        assert_eq!(
            (&run.node, run.fence),
            (leader, *fence),
            "{run:?} carries its leader's node and fence"
        );
        assert_eq!(
            run.tick.timestamp_subsec_nanos(),
            0,
            "{run:?}: CRON_SCHEDULED_AT is the tick"
        );
        assert!(
            (0.0..1.0).contains(&run.lateness()),
            "{run:?} started at its tick"
        );
    }
}

/// One shard, leader `a`, standby `b`; returns the config path once `a` runs ticks and `b` waits.
fn leader_and_standby(world: &mut World, ttl: u64, extra: &str) -> std::path::PathBuf {
    let config = world.write_config("jobs.toml", 1, ttl, &[("tick", EVERY_SECOND, extra)]);
    step("start a, wait for its runs");
    world.start_node("a", &config);
    wait_for(Duration::from_secs(15), "a runs ticks", || {
        world.runs().iter().filter(|run| run.node == "a").count() >= 2
    });
    step("start b as standby");
    world.start_node("b", &config);
    wait_for(Duration::from_secs(10), "b waits behind a", || {
        world.status(&config)["shards"][0]["standby"] == 1
    });
    assert_eq!(
        world.leader_of(&config, 0).map(|(node, _)| node),
        Some("a".to_string())
    );
    config
}

#[test]
fn sigkill_of_the_leader_moves_its_shard_within_ttl_and_loses_no_tick() {
    let mut world = World::new();
    let ttl = 2;
    leader_and_standby(&mut world, ttl, "catch_up = \"all\"");
    sleep_to_mid_second();
    step("SIGKILL a");
    let killed_at = now_secs();
    world.nodes[0].signal(libc::SIGKILL);
    wait_for(Duration::from_secs(15), "b runs 3 ticks", || {
        world.runs().iter().filter(|run| run.node == "b").count() >= 3
    });
    let runs = world.runs();
    let first_b = runs
        .iter()
        .filter(|run| run.node == "b")
        .map(|run| run.started)
        .fold(f64::MAX, f64::min);
    let takeover = first_b - killed_at;
    eprintln!("takeover after SIGKILL: {takeover:.3} s (TTL {ttl} s)");
    assert!(
        takeover <= ttl as f64 + 1.0,
        "b ran its first tick {takeover:.3} s after the kill"
    );
    let ticks = assert_each_tick_once(&runs, "tick", 1);
    assert!(ticks.len() >= 5);
    let fence_a = runs
        .iter()
        .find(|run| run.node == "a")
        .map(|run| run.fence)
        .unwrap();
    assert!(
        runs.iter()
            .filter(|run| run.node == "b")
            .all(|run| run.fence > fence_a),
        "the new leader's fence is larger"
    );
}

#[test]
fn sigstop_of_the_leader_never_runs_its_old_fence_after_takeover() {
    let mut world = World::new();
    let ttl = 2;
    leader_and_standby(&mut world, ttl, "catch_up = \"all\"");
    sleep_to_mid_second();
    step("SIGSTOP a for 2×TTL");
    world.nodes[0].signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(2 * ttl));
    step("SIGCONT a");
    world.nodes[0].signal(libc::SIGCONT);
    let resumed = now_secs();
    wait_for(
        Duration::from_secs(15),
        "runs go on for 3 s after the resume",
        || world.runs().iter().any(|run| run.started > resumed + 3.0),
    );
    let runs = world.runs();
    let fence_a = runs
        .iter()
        .find(|run| run.node == "a")
        .map(|run| run.fence)
        .unwrap();
    let takeover = runs
        .iter()
        .filter(|run| run.node == "b")
        .map(|run| run.started)
        .fold(f64::MAX, f64::min);
    assert!(takeover < resumed, "b took over while a was stopped");
    let stale: Vec<&Run> = runs
        .iter()
        .filter(|run| run.node == "a" && run.fence == fence_a && run.started > takeover)
        .collect();
    assert!(
        stale.is_empty(),
        "runs with a's old fence after the takeover: {stale:#?}"
    );
    assert_each_tick_once(&runs, "tick", 1);
    assert!(
        world.nodes[0].log_text().contains("session lost"),
        "a logs why its terms ended"
    );
}

#[test]
fn sigterm_of_the_leader_hands_over_without_missing_a_tick() {
    let mut world = World::new();
    // A long TTL: only the revoke on shutdown can make the handoff this fast.
    leader_and_standby(&mut world, 10, "");
    sleep_to_mid_second();
    step("SIGTERM a");
    let stopped_at = now_secs();
    world.nodes[0].signal(libc::SIGTERM);
    assert_eq!(world.nodes[0].wait_exit(Duration::from_secs(10)), Some(0));
    wait_for(Duration::from_secs(10), "b runs 3 ticks", || {
        world.runs().iter().filter(|run| run.node == "b").count() >= 3
    });
    let runs = world.runs();
    let first_b = runs
        .iter()
        .filter(|run| run.node == "b")
        .map(|run| run.started)
        .fold(f64::MAX, f64::min);
    eprintln!("first run on b {:.3} s after SIGTERM", first_b - stopped_at);
    assert!(first_b - stopped_at < 1.0, "b runs the next tick");
    assert_each_tick_once(&runs, "tick", 1);
}

#[test]
fn an_even_second_job_starts_within_50ms_of_its_tick() {
    let mut world = World::new();
    let config = world.write_config("jobs.toml", 2, 3, &[("even", "*/2 * * * * *", "")]);
    world.start_node("a", &config);
    wait_for(Duration::from_secs(20), "4 runs", || {
        world.runs().len() >= 4
    });
    for run in world.runs() {
        assert_eq!(run.tick.timestamp() % 2, 0, "{run:?}");
        let lateness = run.lateness();
        assert!(
            (0.0..0.050).contains(&lateness),
            "{run:?} started {lateness:.4} s after its tick"
        );
    }
}
