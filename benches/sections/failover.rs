//! How long a shard is leaderless after its leader is killed, stopped or stopped gracefully.

use crate::common::*;

pub(crate) struct Trial {
    leads: Option<f64>,
    takeover: f64,
    floor: Option<f64>,
    lost: usize,
    doubled: usize,
    stale: usize,
}
pub(crate) fn failover_trial(ttl: u64, signal: libc::c_int) -> Trial {
    let mut world = World::new();
    let config = world.write_config("jobs.toml", 1, ttl, &[("tick", "* * * * * *", "catch_up = \"all\"")]);
    world.node("a", &config).start();
    world.node("b", &config).start();
    let target = shardcron::rules::assignment::assign(1, &["a", "b"])[0]
        .clone()
        .expect("a target");
    wait_for(
        Duration::from_secs(20),
        "the target leads and the other node stands by",
        || {
            world
                .status(&config)
                .shards
                .first()
                .is_some_and(|shard| shard.leader.as_deref() == Some(target.as_str()) && shard.standby == 1)
        },
    );
    let (leader_id, old_term) = world.leader_of(&config, 0).expect("a leader");
    let leader = world
        .nodes
        .iter()
        .position(|node| node.id == leader_id)
        .expect("our node");
    let standby_id = world.nodes[1 - leader].id.clone();
    wait_for(Duration::from_secs(20), "the leader runs", || {
        world.runs().iter().filter(|run| run.node == leader_id).count() >= 2
    });
    sleep_to_mid_second();
    let signalled = now_secs();
    world.nodes[leader].signal(signal);
    if signal == libc::SIGSTOP {
        std::thread::sleep(Duration::from_secs(2 * ttl));
        world.nodes[leader].signal(libc::SIGCONT);
    }
    wait_for(Duration::from_secs(4 * ttl + 20), "the standby runs 3 ticks", || {
        world
            .runs()
            .iter()
            .filter(|run| run.node == standby_id && run.started > signalled)
            .count()
            >= 3
    });
    let runs = world.runs();
    let takeover_at = runs
        .iter()
        .filter(|run| run.node == standby_id && run.started > signalled)
        .map(|run| run.started)
        .fold(f64::MAX, f64::min);
    let mut ticks: Vec<i64> = runs.iter().map(|run| run.tick.timestamp()).collect();
    ticks.sort();
    let doubled = ticks.windows(2).filter(|pair| pair[0] == pair[1]).count();
    ticks.dedup();
    let lost = ticks.windows(2).map(|pair| (pair[1] - pair[0] - 1) as usize).sum();
    let stale = runs
        .iter()
        .filter(|run| run.term == old_term && run.started > takeover_at)
        .count();
    let floor = (signal != libc::SIGTERM)
        .then(|| {
            last_renewal(&world.nodes[leader].log_text(), signalled).map(|renewed| renewed + ttl as f64 - signalled)
        })
        .flatten();
    let leads = log_times(&world.nodes[1 - leader].log_text(), "leading shard").find(|at| *at > signalled);
    Trial {
        leads: leads.map(|at| at - signalled),
        takeover: takeover_at - signalled,
        floor,
        lost,
        doubled,
        stale,
    }
}
pub(crate) fn bench_failover() {
    println!("\n### Failover of a leader (one shard, per-second job, catch_up = \"all\"; median of 5)\n");
    println!("| TTL | event | until another node leads | until it runs a tick | floor: lease expiry | ticks lost | ticks doubled | stale-fence runs |");
    println!("|---|---|---|---|---|---|---|---|");
    for ttl in [3u64, 10] {
        for (name, signal) in [
            ("SIGKILL", libc::SIGKILL),
            ("SIGSTOP 2×TTL", libc::SIGSTOP),
            ("SIGTERM", libc::SIGTERM),
        ] {
            let trials: Vec<Trial> = (0..5).map(|_| failover_trial(ttl, signal)).collect();
            let mut takeovers: Vec<f64> = trials.iter().map(|t| t.takeover).collect();
            let mut leads: Vec<f64> = trials.iter().filter_map(|t| t.leads).collect();
            let leads = if leads.is_empty() {
                "—".to_string()
            } else {
                format!("{:.3} s", median(&mut leads))
            };
            let mut floors: Vec<f64> = trials.iter().filter_map(|t| t.floor).collect();
            let floor = if floors.is_empty() {
                "—".to_string()
            } else {
                format!("{:.3} s", median(&mut floors))
            };
            println!(
                "| {ttl} s | {name} | {leads} | {:.3} s | {floor} | {} | {} | {} |",
                median(&mut takeovers),
                trials.iter().map(|t| t.lost).sum::<usize>(),
                trials.iter().map(|t| t.doubled).sum::<usize>(),
                trials.iter().map(|t| t.stale).sum::<usize>(),
            );
        }
    }
}
