//! etcd itself failing under a running fleet: its raft leader member killed, the whole of it
//! restarted on its data, and the whole of it down for 30 s. No tick is lost or doubled, and
//! delayed ticks are caught up.

use std::time::Duration;

use crate::support::*;

/// Per job: the largest gap between two consecutive runs' start times, in seconds.
fn largest_start_gap(runs: &[Run], job: &str, after: f64) -> f64 {
    let mut starts: Vec<f64> = runs
        .iter()
        .filter(|run| run.job == job && run.started > after)
        .map(|run| run.started)
        .collect();
    starts.sort_by(f64::total_cmp);
    starts.windows(2).map(|pair| pair[1] - pair[0]).fold(0.0, f64::max)
}

on_both_etcds! {
    fn killing_the_etcd_leader_member_doubles_nothing_and_catches_up_delayed_ticks() {
        let mut world = World::with_etcd_members(3);
        let names = two_nodes_running(&mut world, 4, 3);
        let unwell = world.etcd.unwell_members();
        assert!(unwell.is_empty(), "etcd members down before the fault: {unwell:#?}");
        let member = world.etcd.leader_member().expect("etcd has a leader");
        step(&format!("kill etcd member {member}, the raft leader"));
        let killed_at = now_secs();
        world.etcd.kill_member(member);
        wait_for(
            Duration::from_secs(30),
            "every job ran a tick 5 s after the kill",
            || every_job_ran_a_tick_after(&world.runs(), &names, killed_at + 5.0),
        );
        let runs = world.runs();
        for name in &names {
            let ticks = assert_each_tick_once(&runs, name, 1);
            assert!(
                ticks.first().is_some_and(|tick| (tick.timestamp() as f64) < killed_at),
                "{name} ran before the kill"
            );
        }
        // Without this, a third of every node's calls went on to the dead member: sessions needed
        // several calls in a row and rarely opened, and the fleet stopped firing (1 run in 10).
        for node in &world.nodes {
            assert!(
                node.log_text().contains("etcd member does not answer in time"),
                "a node kept calling the killed member"
            );
        }
        let worst = names
            .iter()
            .map(|name| largest_start_gap(&runs, name, killed_at - 2.0))
            .fold(0.0, f64::max);
        let latest: f64 = runs
            .iter()
            .filter(|run| run.started > killed_at)
            .map(Run::lateness)
            .fold(0.0, f64::max);
        eprintln!(
            "etcd leader killed: largest gap between a job's runs {worst:.3} s, latest run {latest:.3} s after its tick, new etcd leader member {:?}",
            world.etcd.leader_member()
        );
    }
}

/// Two nodes running `jobs` per-second `catch_up = "all"` jobs in as many shards; returns their
/// names at the middle of a second, so a fault lands between ticks.
fn two_nodes_running(world: &mut World, jobs: usize, ttl: u64) -> Vec<String> {
    let names = job_names(jobs, 1);
    let config = world.write_config(
        "jobs.toml",
        jobs as u32,
        ttl,
        &every_second(&names, "catch_up = \"all\""),
    );
    world.node("a", &config).start();
    world.node("b", &config).start();
    let started = now_secs();
    wait_for(Duration::from_secs(30), "every job ran twice", || {
        every_job_ran_since(&world.runs(), &names, started, 2)
    });
    sleep_to_mid_second();
    names
}

on_both_etcds! {
    fn etcd_restarted_on_its_data_nodes_resume_without_a_lost_or_doubled_tick() {
        let mut world = World::new();
        let names = two_nodes_running(&mut world, 2, 3);
        step("restart etcd on its data");
        let restarted_at = now_secs();
        world.etcd.kill();
        world.etcd.restart().expect("etcd restarts");
        wait_for(
            Duration::from_secs(30),
            "every job ran a tick 3 s after the restart",
            || every_job_ran_a_tick_after(&world.runs(), &names, restarted_at + 3.0),
        );
        let runs = world.runs();
        for name in &names {
            assert_each_tick_once(&runs, name, 1);
        }
        let resumed = runs
            .iter()
            .filter(|run| run.started > restarted_at)
            .map(|run| run.started)
            .fold(f64::MAX, f64::min);
        eprintln!(
            "etcd restarted: first run {:.3} s after the restart began",
            resumed - restarted_at
        );
    }
}

on_both_etcds! {
    fn etcd_down_for_30s_stops_claims_quietly_and_catches_up_when_it_returns() {
        let mut world = World::new();
        let names = two_nodes_running(&mut world, 2, 3);
        step("stop etcd for 30 s");
        let down_at = now_secs();
        let cpu_before: Vec<f64> = world.nodes.iter().map(Node::cpu_seconds).collect();
        world.etcd.kill();
        std::thread::sleep(Duration::from_secs(30));
        let cpu_used: Vec<f64> = world
            .nodes
            .iter()
            .zip(&cpu_before)
            .map(|(node, before)| node.cpu_seconds() - before)
            .collect();
        let during: Vec<Run> = world
            .runs()
            .into_iter()
            .filter(|run| run.started > down_at + 1.0)
            .collect();
        assert!(during.is_empty(), "runs started while etcd was down: {during:#?}");
        for node in &mut world.nodes {
            assert!(
                node.child.try_wait().expect("wait").is_none(),
                "node {} is still running",
                node.id
            );
        }
        for (node, used) in world.nodes.iter().zip(&cpu_used) {
            assert!(
                *used < 5.0,
                "node {} used {used:.2} CPU-s in 30 s without etcd",
                node.id
            );
            assert!(
                node.log_text().contains("session lost"),
                "node {} logs that it lost its session",
                node.id
            );
        }

        step("start etcd again on the same data");
        let back_at = now_secs();
        world.etcd.restart().expect("etcd restarts");
        wait_for(
            Duration::from_secs(40),
            "every job ran a tick 3 s after etcd returned",
            || every_job_ran_a_tick_after(&world.runs(), &names, back_at + 3.0),
        );
        let runs = world.runs();
        let resumed = runs
            .iter()
            .filter(|run| run.started > back_at)
            .map(|run| run.started)
            .fold(f64::MAX, f64::min)
            - back_at;
        for name in &names {
            let ticks = assert_each_tick_once(&runs, name, 1);
            let outage_ticks = ticks
                .iter()
                .filter(|tick| (tick.timestamp() as f64) > down_at && (tick.timestamp() as f64) < back_at)
                .count();
            assert!(
                outage_ticks >= 29,
                "{name}: the outage's ticks were caught up ({outage_ticks})"
            );
        }
        eprintln!(
            "etcd down 30 s: CPU used during the outage {cpu_used:.2?} s per node; first run {resumed:.3} s after etcd returned; every outage tick caught up"
        );
    }
}

on_both_etcds! {
    fn a_node_that_leads_again_after_an_outage_does_not_rerun_what_it_started_before_it() {
        let mut world = World::new();
        let ttl = 2;
        let names = job_names(8, 1);
        let config = world.write_config("jobs.toml", 1, ttl, &every_second(&names, "catch_up = \"all\""));
        world.node("a", &config).start();
        let started = now_secs();
        wait_for(Duration::from_secs(20), "every job ran twice", || {
            every_job_ran_since(&world.runs(), &names, started, 2)
        });
        // The runs of the tick start while etcd is already gone: their starts cannot be written,
        // and the record still lists the tick as pending when the node leads again.
        let tick = sleep_to_tick_offset(5);
        world.etcd.kill();
        step(&format!(
            "etcd stopped 5 ms after {tick}; down for TTL + 2 s: the session is lost"
        ));
        std::thread::sleep(Duration::from_secs(ttl + 2));
        let back_at = now_secs();
        world.etcd.restart().expect("etcd restarts");
        wait_for(
            Duration::from_secs(30),
            "every job ran a tick 2 s after etcd returned",
            || every_job_ran_a_tick_after(&world.runs(), &names, back_at + 2.0),
        );
        let runs = world.runs();
        let at_tick = runs.iter().filter(|run| run.tick == tick).count();
        assert_eq!(at_tick, names.len(), "each job ran {tick} once: {runs:#?}");
        for name in &names {
            assert_each_tick_once(&runs, name, 1);
        }
    }
}

on_both_etcds! {
    fn the_lease_of_a_session_lost_in_an_outage_is_revoked_once_etcd_returns() {
        let mut world = World::new();
        let ttl = 10;
        let names = job_names(1, 1);
        let config = world.write_config("jobs.toml", 1, ttl, &every_second(&names, ""));
        world.node("a", &config).start();
        wait_for(Duration::from_secs(20), "a runs ticks", || world.runs().len() >= 2);
        step("stop etcd for TTL + 2 s: the node's session is lost by its own clock");
        world.etcd.kill();
        std::thread::sleep(Duration::from_secs(ttl + 2));
        step("start etcd again: it gives the old lease a fresh TTL");
        let back_at = now_secs();
        world.etcd.restart().expect("etcd restarts");
        wait_for(Duration::from_secs(3 * ttl), "a runs again", || {
            world.runs().iter().any(|run| run.started > back_at)
        });
        let resumed = world
            .runs()
            .iter()
            .filter(|run| run.started > back_at)
            .map(|run| run.started)
            .fold(f64::MAX, f64::min)
            - back_at;
        eprintln!("a session lost in an outage: first run {resumed:.3} s after etcd returned (TTL {ttl} s)");
        // Left alone, the revived lease's election key would lead the shard for a whole TTL with no
        // term behind it; only the node's reconnect backoff (at most 5 s) may pass.
        assert!(
            resumed < 0.8 * ttl as f64,
            "the first run came {resumed:.3} s after etcd returned: the old lease led for its TTL"
        );
    }
}

/// Four per-second jobs, each running `before` and then recording its run, on one node whose
/// etcd is slowed to 700 ms each way for 5 s: its claims and lease renewals come late, so its
/// runs start late together. Returns once every job has run live ticks again; each tick ran once.
fn every_tick_once_through_a_slow_etcd(before: &str) -> World {
    let mut world = World::new();
    let names = job_names(4, 1);
    let jobs = every_second(&names, "catch_up = \"all\"");
    let command = format!("{before}{}", world.record_command());
    let config = world.write_config_running("jobs.toml", 1, 3, &jobs, &command);
    let proxies = world.start_behind_proxies(&["a"], &config);
    wait_for(Duration::from_secs(30), "every job runs", || {
        every_job_ran_since(&world.runs(), &names, 0.0, 2)
    });
    step("slow etcd to 700 ms each way for 5 s");
    sleep_to_mid_second();
    proxies[0].slow(Duration::from_millis(700));
    std::thread::sleep(Duration::from_secs(5));
    proxies[0].slow(Duration::ZERO);
    let healed = now_secs();
    wait_for(Duration::from_secs(30), "every job runs live ticks again", || {
        every_job_ran_a_tick_after(&world.runs(), &names, healed + 2.0)
    });
    let runs = world.runs();
    for name in &names {
        assert_each_tick_once(&runs, name, 1);
    }
    world
}

on_both_etcds! {
    /// Runs of 500 ms: a claim that lands late often starts a run late enough to still be going at
    /// the next tick. The next tick waits for it instead of being skipped (`overlap = "skip"`): the
    /// run is shorter than the time between the ticks.
    fn short_runs_that_start_late_never_make_the_next_tick_skip() {
        let world = every_tick_once_through_a_slow_etcd("sleep 0.5; ");
        let log = world.nodes[0].log_text();
        let skipped = log.lines().filter(|line| line.contains("skipped:")).count();
        assert_eq!(
            skipped, 0,
            "ticks skipped behind runs shorter than the time between ticks:\n{log}"
        );
    }
}

on_both_etcds! {
    /// Short runs delayed together: none is skipped as if it had waited behind a long run
    /// (`overlap = "skip"`, the default).
    fn ticks_delayed_together_by_a_slow_etcd_all_run_once() {
        let world = every_tick_once_through_a_slow_etcd("");
        assert!(
            !world.nodes[0]
                .log_text()
                .contains("skipped: it waited behind a backlog"),
            "a tick was skipped behind runs shorter than the period"
        );
    }
}

on_both_etcds! {
    /// An etcd started with `--max-txn-ops` below the 100 records a claim writes: the node learns
    /// the limit at its session's start and claims in smaller transactions, where every full claim
    /// used to be refused for ever.
    fn an_etcd_that_takes_fewer_operations_per_transaction_still_gets_every_tick_claimed() {
        let etcd = shardcron::etcd_server::EtcdServer::start_with_flags(&etcd_bin(), &["--max-txn-ops=32"]).expect("etcd");
        let mut world = World::with_etcd(etcd, tempfile::tempdir().expect("temp dir"));
        // 60 jobs due at each instant on one shard: more than one transaction of 32 takes.
        let names = job_names(60, 2);
        let config = world.write_config("jobs.toml", 1, 3, &every_second(&names, ""));
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "every job ran 3 times", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 3)
        });
        assert!(
            world.nodes[0]
                .log_text()
                .contains("etcd takes fewer operations in a transaction"),
            "the node said why its claims are smaller"
        );
        let runs = world.runs();
        for name in &names {
            assert_each_tick_once(&runs, name, 1);
        }
    }
}
