//! etcd writes per run, per delivery mode.

use crate::common::*;

pub(crate) fn bench_etcd_cost() {
    println!("\n### etcd cost: raft proposals committed per run (one node, per-second jobs, 10 s window)\n");
    println!(
        "| delivery | jobs | shards | runs | proposals | per run | per shard per instant | lease renewals (one node) | target |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (delivery, jobs, shards) in [
        ("at-least-once", 20usize, 4u32),
        ("at-least-once", 200, 16),
        ("at-most-once", 20, 4),
        ("at-most-once", 200, 16),
    ] {
        let mut world = World::new();
        let names: Vec<String> = (0..jobs).map(|i| format!("job{i}")).collect();
        let extra = format!("delivery = \"{delivery}\"");
        let list: Vec<(&str, &str, &str)> = names
            .iter()
            .map(|name| (name.as_str(), "* * * * * *", extra.as_str()))
            .collect();
        let config = world.write_config("jobs.toml", shards, 3, &list);
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "runs start", || world.runs().len() >= jobs * 2);
        sleep_to_mid_second();
        let window_start = now_secs();
        let before_runs = world.runs().len();
        let before = world
            .etcd
            .metric("etcd_server_proposals_committed_total")
            .unwrap_or(f64::NAN);
        std::thread::sleep(Duration::from_secs(10));
        let after = world
            .etcd
            .metric("etcd_server_proposals_committed_total")
            .unwrap_or(f64::NAN);
        let window_end = now_secs();
        let runs = world.runs().len() - before_runs;
        let proposals = after - before;
        // One lease per node, renewed about every TTL/3, however many shards it campaigns in.
        let renewals = log_times(&world.nodes[0].log_text(), "lease renewed")
            .filter(|at| (window_start..window_end).contains(at))
            .count();
        println!(
            "| {delivery} | {jobs} | {shards} | {runs} | {proposals:.0} | {:.3} | {:.2} | {renewals} in 10 s | ≤ 1.25 per shard per instant |",
            proposals / runs as f64,
            proposals / (f64::from(shards) * 10.0),
        );
    }
}
