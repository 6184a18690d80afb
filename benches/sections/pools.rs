//! Where jobs run, at scale: many pools of many shards over nodes with mixed tags, and jobs that
//! fan out to every node.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::*;

/// The tags of node `index`: pool `p`'s tag `t<p>` on about two nodes in three.
fn tags_of(index: usize, pools: usize) -> String {
    (0..pools)
        .filter(|pool| !(index + pool).is_multiple_of(3))
        .map(|pool| format!("t{pool}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Writes `jobs` (name, schedule, extra) with `[cluster] pool_shards`.
fn write_config(world: &World, shards: u32, pool_shards: u32, jobs: &[(String, &str, String)]) -> std::path::PathBuf {
    let tables: Vec<(&str, &str, &str)> = jobs
        .iter()
        .map(|(name, schedule, extra)| (name.as_str(), *schedule, extra.as_str()))
        .collect();
    let path = world.write_config("jobs.toml", shards, 10, &tables);
    let text = std::fs::read_to_string(&path).expect("config");
    let text = text.replacen("\n\n[etcd]", &format!("\npool_shards = {pool_shards}\n\n[etcd]"), 1);
    std::fs::write(&path, text).expect("config");
    path
}

/// etcd's revision: it grows by one at every committed write (a claim, a result, a campaign),
/// and not at a lease renewal. Read over the client: etcd's metrics page, where the raft
/// proposals are, takes longer than its reader waits while ten nodes keep etcd busy.
fn revision(world: &World) -> f64 {
    let (runtime, client) = world.etcd_client();
    runtime
        .block_on(client.clone().get("revision", None))
        .ok()
        .and_then(|read| read.header().map(|header| header.revision() as f64))
        .unwrap_or(f64::NAN)
}

/// Whether every election of `status` is led, and each family (the fleet's, each pool's) is
/// spread within one shard among the nodes that campaign in it.
fn led_and_spread(status: &shardcron::serving::status::Status) -> (bool, bool) {
    let every_led = status.shards.iter().all(|shard| shard.leader.is_some());
    let mut loads: BTreeMap<Option<&str>, BTreeMap<&str, usize>> = BTreeMap::new();
    for node in &status.nodes {
        loads.entry(None).or_default().insert(&node.id, 0);
        for pool in &node.pools {
            loads.entry(Some(pool.as_str())).or_default().insert(&node.id, 0);
        }
    }
    for shard in &status.shards {
        if let Some(leader) = &shard.leader {
            *loads
                .entry(shard.pool.as_deref())
                .or_default()
                .entry(leader.as_str())
                .or_default() += 1;
        }
    }
    let spread = loads.values().all(|family| {
        let (low, high) = (family.values().min(), family.values().max());
        high.zip(low).is_none_or(|(high, low)| high - low <= 1)
    });
    (every_led, every_led && spread)
}

/// `pools` pools of `pool_shards` shards and 64 fleet shards over `nodes` nodes started
/// together, each pool's tag on about two nodes in three; 4 per-second jobs per pool and 16
/// plain ones: until every election is led and spread, session losses, and etcd writes per run.
pub(crate) fn bench_pools(pools: usize, pool_shards: u32, nodes: usize) {
    let mut world = World::new();
    let mut jobs: Vec<(String, &str, String)> = Vec::new();
    for pool in 0..pools {
        for index in 0..4 {
            jobs.push((
                format!("p{pool}-{index}"),
                "* * * * * *",
                format!("run_on = [\"t{pool}\"]"),
            ));
        }
    }
    for index in 0..16 {
        jobs.push((format!("plain-{index}"), "* * * * * *", String::new()));
    }
    let config = write_config(&world, 64, pool_shards, &jobs);
    let started = Instant::now();
    for index in 0..nodes {
        let tags = tags_of(index, pools);
        world
            .node(&format!("n{index}"), &config)
            .args(&["--tags", &tags])
            .start();
    }
    let (mut all_led, mut spread) = (None, None);
    wait_for(Duration::from_secs(300), "every election led and spread", || {
        let status = world.status(&config);
        let (led, even) = led_and_spread(&status);
        if led && all_led.is_none() {
            all_led = Some(started.elapsed().as_secs_f64());
        }
        if even {
            spread = Some(started.elapsed().as_secs_f64());
        }
        even
    });
    let status = world.status(&config);
    let elections = status.shards.len();
    let due: BTreeSet<(Option<String>, u32)> = status.jobs.iter().map(|job| (job.pool.clone(), job.shard)).collect();
    wait_for(Duration::from_secs(60), "every job ran", || {
        let runs = world.runs();
        jobs.iter().all(|(name, _, _)| runs.iter().any(|run| &run.job == name))
    });
    sleep_to_mid_second();
    let before_runs = world.runs().len();
    let before = revision(&world);
    let window = 10.0;
    std::thread::sleep(Duration::from_secs_f64(window));
    let after = revision(&world);
    let runs = world.runs().len() - before_runs;
    let writes = after - before;
    let losses: usize = world
        .nodes
        .iter()
        .map(|node| log_lines(&node.log_text(), "session lost"))
        .sum();
    let warnings: usize = world.nodes.iter().map(|node| log_lines(&node.log_text(), "WARN")).sum();

    println!(
        "\n### {pools} pools × {pool_shards} shards and 64 fleet shards over {nodes} nodes with mixed tags, one etcd on loopback\n"
    );
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!("| elections | {elections} | ≤ 4,096 |");
    println!(
        "| nodes started together: until every election has a leader | {:.2} s | ≤ 5 s |",
        all_led.unwrap_or(f64::NAN)
    );
    println!(
        "| until the fleet and each pool are spread within one shard among their nodes | {:.2} s | |",
        spread.unwrap_or(f64::NAN)
    );
    println!("| session losses, in all | {losses} | 0 |");
    println!("| warnings logged, in all | {warnings} | |");
    println!(
        "| etcd writes per run ({} per-second jobs in {} elections, {window:.0} s: {runs} runs) | {:.3} | |",
        jobs.len(),
        due.len(),
        writes / runs as f64
    );
    println!(
        "| etcd writes per election-instant with a job due | {:.2} | ≤ 1 |",
        writes / (due.len() as f64 * window)
    );
}

/// `nodes` nodes each running its instance of `jobs` per-second `fan_out = "all"` jobs: the
/// lateness of every run of a 10 s window beside the floor (the same number of commands spawned
/// straight at each tick), and etcd writes per run.
pub(crate) fn bench_fan_out(nodes: usize, jobs: usize) {
    let mut world = World::new();
    let list: Vec<(String, &str, String)> = (0..jobs)
        .map(|index| {
            (
                format!("everywhere-{index}"),
                "* * * * * *",
                // Every tick runs, however late: a skipped overlap would hide lateness.
                "run_on = [\"web\"]\nfan_out = \"all\"\noverlap = \"allow\"".to_string(),
            )
        })
        .collect();
    let config = write_config(&world, 16, 16, &list);
    for index in 0..nodes {
        world
            .node(&format!("w{index}"), &config)
            .args(&["--tags", "web"])
            .start();
    }
    wait_for(Duration::from_secs(120), "every node ran every job", || {
        let runs = world.runs();
        let per_node: BTreeSet<&str> = runs.iter().map(|run| run.node.as_str()).collect();
        per_node.len() == nodes && runs.len() >= nodes * jobs * 2
    });
    sleep_to_mid_second();
    let warmed = now_secs();
    let before = revision(&world);
    let window = 10.0;
    std::thread::sleep(Duration::from_secs_f64(window));
    let after = revision(&world);
    let ended = warmed + window;
    let expected = nodes * jobs * window as usize;
    let in_window = |run: &&Run| (warmed..ended).contains(&(run.tick.timestamp() as f64));
    // Every run of the window's ticks, however late: a tick that never runs is a loss, not
    // lateness.
    let mut runs = Vec::new();
    let all_ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(Duration::from_secs(120), "every run of the window's ticks", || {
            runs = world.runs();
            runs.iter().filter(in_window).count() >= expected
        })
    }))
    .is_ok();
    let window_runs: Vec<&Run> = runs.iter().filter(in_window).collect();
    let mut lateness: Vec<f64> = window_runs.iter().map(|run| run.lateness()).collect();
    lateness.sort_by(f64::total_cmp);
    for node in world.nodes.iter_mut() {
        node.signal(libc::SIGTERM);
    }
    for node in world.nodes.iter_mut() {
        node.wait_exit(Duration::from_secs(30));
    }
    let floor = crate::lateness::direct_spawn_lateness(&world, nodes * jobs, 5, 1);
    println!(
        "\n### fan_out = \"all\": {jobs} per-second jobs on each of {nodes} nodes ({} runs a second), one etcd on loopback\n",
        nodes * jobs
    );
    println!("| measure | value | floor |");
    println!("|---|---|---|");
    println!(
        "| runs of a {window:.0} s window's ticks | {} of {expected}{} | |",
        window_runs.len(),
        if all_ran {
            ""
        } else {
            " (the rest not within 2 minutes)"
        }
    );
    println!(
        "| lateness p50 / p99 / max | {} / {} / {} | {} / {} / {} |",
        ms(percentile(&lateness, 50.0)),
        ms(percentile(&lateness, 99.0)),
        ms(percentile(&lateness, 100.0)),
        ms(percentile(&floor, 50.0)),
        ms(percentile(&floor, 99.0)),
        ms(percentile(&floor, 100.0)),
    );
    println!(
        "| etcd writes per run | {:.3} | |",
        (after - before) / window_runs.len() as f64
    );
}
