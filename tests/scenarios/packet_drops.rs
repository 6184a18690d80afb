//! Packets dropped silently, the way etcd's functional tester drops them: a node (or an etcd
//! member) runs in a network namespace of its own, and a BPF filter on the host's end of its
//! veth pair discards everything, both ways (see `support::netns`). Unlike the TCP proxy of the
//! other fault scenarios, nothing is closed or refused: the dropped side's connections hang
//! until they time out. Every (job, tick) of each window is checked, not a sample.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::support::fenced::*;
use crate::support::netns::Netns;
use crate::support::*;

const TTL: u64 = 3;

/// How long a drop lasts: past two leases, so the dropped side's lease is gone for certain.
const DROP_SECS: f64 = (2 * TTL + 2) as f64;

/// The port of etcd's first member, which nodes in a namespace reach at the host's end.
fn etcd_port(world: &World) -> u16 {
    world
        .etcd
        .client_address()
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .expect("a port")
}

/// Drops `net`'s packets at 0.9 s into a second and checks the drop is silent: a connection
/// from inside hangs, neither made nor refused. Returns when the drop began.
fn drop_at_nine_tenths(world: &World, net: &Netns, what: &str) -> f64 {
    let tick = sleep_to_tick_offset(-100);
    net.drop_packets();
    let dropped_at = now_secs();
    step(&format!("drop every packet of {what}, 100 ms before {tick}"));
    assert!(
        net.connect_hangs(net.root_addr, etcd_port(world), 1),
        "a connection from {} to etcd is made or refused while its packets are dropped",
        net.name
    );
    dropped_at
}

/// Asserts no two runs of one (job, tick) carry the same fence: a repeat is a new claim.
fn assert_no_fence_twice(runs: &[Run]) {
    let mut seen: HashMap<(&str, DateTime<Utc>, i64), &Run> = HashMap::new();
    for run in runs {
        if let Some(before) = seen.insert((run.job.as_str(), run.tick, run.fence), run) {
            panic!("two runs of one tick with one fence: {before:#?} and {run:#?}");
        }
    }
}

/// Asserts `job`'s runs span `from` to `to`: the window checked holds the fault.
fn assert_spans(runs: &[Run], job: &str, from: f64, to: f64) {
    let ticks: Vec<f64> = runs
        .iter()
        .filter(|run| run.job == job)
        .map(|run| run.tick.timestamp() as f64)
        .collect();
    let first = ticks.iter().copied().fold(f64::MAX, f64::min);
    let last = ticks.iter().copied().fold(f64::MIN, f64::max);
    assert!(
        first < from && last > to,
        "{job}'s runs ({first}..{last}) do not span the fault ({from:.1}..{to:.1})"
    );
}

/// Sends SIGTERM to every node and waits for each to exit: the runs file and the store are
/// then final.
fn stop_every_node(world: &mut World) {
    for node in &world.nodes {
        node.signal(libc::SIGTERM);
    }
    for node in &mut world.nodes {
        node.wait_exit(Duration::from_secs(15));
    }
}

/// The fenced store's rows of `job`, as seconds since the epoch.
fn stored_ticks(db: &Path, job: &str) -> Vec<i64> {
    sqlite(
        db,
        &format!("SELECT CAST(strftime('%s', tick) AS INTEGER) FROM reports WHERE job = '{job}' ORDER BY tick"),
    )
    .lines()
    .filter_map(|line| line.trim().parse().ok())
    .collect()
}

#[test]
fn a_leader_whose_packets_drop_for_two_ttl_leaves_every_tick_run_and_no_stale_write() {
    let nets = [Netns::create(), Netns::create()];
    let mut world = World::reachable_from(&[&nets[0], &nets[1]]);
    let db = world.dir.path().join("reports.db");
    let names = job_names(4, 1);
    let config = world.write_config_running(
        "jobs.toml",
        1,
        TTL,
        &every_second(&names, "catch_up = \"all\""),
        &fenced_sqlite_command(&world, &db),
    );
    step("start a and b, each in a network namespace of its own");
    world.node("a", &config).in_netns(&nets[0]).start();
    world.node("b", &config).in_netns(&nets[1]).start();
    let roles = world.wait_leader_and_standby(&config);
    let leader = world.nodes[roles.leader].id.clone();
    let (_, old_term) = world.leader_of(&config, 0).expect("a leader");
    let settled = now_secs();
    wait_for(Duration::from_secs(20), "every job ran twice", || {
        every_job_ran_since(&world.runs(), &names, settled, 2)
    });

    let dropped_at = drop_at_nine_tenths(&world, &nets[roles.leader], &format!("the leader {leader}"));
    let mut led_after = None;
    while now_secs() < dropped_at + DROP_SECS {
        if led_after.is_none()
            && world
                .leader_of(&config, 0)
                .is_some_and(|(id, _)| id == roles.standby_id)
        {
            led_after = Some(now_secs() - dropped_at);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    step("heal");
    nets[roles.leader].heal();
    let healed_at = now_secs();
    wait_for(
        Duration::from_secs(30),
        "the target leads again, the other stands by",
        || {
            world
                .status(&config)
                .shards
                .first()
                .is_some_and(|shard| shard.leader.as_deref() == Some(leader.as_str()) && shard.standby == 1)
        },
    );
    let balanced_after = now_secs() - healed_at;
    let resumed = now_secs();
    wait_for(Duration::from_secs(20), "3 more seconds of runs", || {
        every_job_ran_a_tick_after(&world.runs(), &names, resumed + 3.0)
    });
    step("stop every node, then check every (job, tick)");
    stop_every_node(&mut world);

    let runs = world.runs();
    let mut repeats = 0;
    for name in &names {
        assert_spans(&runs, name, dropped_at, healed_at);
        repeats += assert_each_tick_at_least_once(&runs, name, 1);
    }
    let checked: usize = names
        .iter()
        .map(|name| {
            let ticks: std::collections::BTreeSet<_> =
                runs.iter().filter(|run| &run.job == name).map(|run| run.tick).collect();
            ticks.len()
        })
        .sum();
    let redelivered = runs.iter().filter(|run| run.redelivered).count();
    assert_no_fence_twice(&runs);
    let takeover = first_start_after(&runs, &roles.standby_id, dropped_at);
    assert_no_run_of_term_after(&runs, old_term, takeover);
    assert_fences_never_go_down(&runs);

    // The store: one row per tick, each carrying the highest fence any run of the tick had, and
    // no attempt of one tick with a fence seen before.
    let attempts = attempts(&db);
    let mut highest: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut fences_seen = HashMap::new();
    for (job, tick, fence, _, _) in &attempts {
        let entry = highest.entry((job.clone(), tick.clone())).or_default();
        *entry = (*entry).max(*fence);
        let twice = fences_seen.insert((job.clone(), tick.clone(), *fence), ()).is_some();
        assert!(!twice, "{job} {tick}: two attempts with fence {fence}");
    }
    for name in &names {
        let ticks = stored_ticks(&db, name);
        let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
        assert_eq!(
            ticks.len() as i64,
            last - first + 1,
            "{name}: one row per tick from {first} to {last}"
        );
    }
    let stale = sqlite(&db, "SELECT job, tick, fence FROM reports")
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split('|').collect();
            let [job, tick, fence] = fields.as_slice() else {
                return true;
            };
            highest.get(&(job.to_string(), tick.to_string())).map(|f| f.to_string()) != Some(fence.to_string())
        })
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert!(
        stale.is_empty(),
        "rows not written by their tick's newest fence: {stale:?}"
    );
    eprintln!(
        "packet drop of the leader for 2×TTL + 2 s (TTL {TTL} s): status shows {} leading {:.2} s after the drop, its first run {:.2} s after; \
         {checked} (job, tick) checked, 0 lost, {redelivered} redelivered, {repeats} of them ran twice (fenced and flagged), 0 stale rows; balanced {balanced_after:.1} s after the heal",
        roles.standby_id,
        led_after.unwrap_or(f64::NAN),
        takeover - dropped_at
    );
    assert!(
        world.nodes[roles.leader].log_text().contains("session lost"),
        "the dropped leader logs why it stopped"
    );
}
