//! Firing lateness against the floor (a plain spawn at each tick): bursts of jobs due at once,
//! with the ratio of the p99s, and the sustained ceiling.

use crate::common::*;

/// The floor: the same command spawned straight at each tick, `count` at once, spread over a
/// thread per core (std's `posix_spawn`, no shell or runtime between), for `seconds` ticks.
pub(crate) fn direct_spawn_lateness(world: &World, count: usize, bursts: usize, period: i64) -> Vec<f64> {
    let file = world.dir.path().join(format!("direct-{count}.log"));
    let command = world
        .record_command()
        .replace(&world.runs_file().display().to_string(), &file.display().to_string());
    let threads = std::thread::available_parallelism().map_or(2, usize::from).min(count);
    for _ in 0..bursts {
        let now = Utc::now();
        let next = (now.timestamp() / period + 1) * period;
        let tick = DateTime::<Utc>::from_timestamp(next, 0).expect("tick");
        std::thread::sleep((tick - now).to_std().unwrap_or_default());
        let scheduled_at = tick.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let (command, scheduled_at) = (&command, &scheduled_at);
                scope.spawn(move || {
                    spawn_all_then_wait((thread..count).step_by(threads).map(|i| {
                        let mut sh = sh(command);
                        sh.env("CRON_JOB", format!("direct{i}"))
                            .env("CRON_SCHEDULED_AT", scheduled_at)
                            .env("CRON_FENCE", "0")
                            .env("CRON_TERM", "0")
                            .env("CRON_NODE", "direct")
                            .env("CRON_SHARD", "0");
                        sh
                    }));
                });
            }
        });
    }
    let mut lateness: Vec<f64> = read_runs(&file).iter().map(Run::lateness).collect();
    lateness.sort_by(f64::total_cmp);
    lateness
}
/// One node firing `count` jobs due together every `period` seconds, for `bursts` instants after
/// a warm-up: the lateness of each run, sorted.
pub(crate) fn node_lateness(count: usize, bursts: usize, period: i64) -> (World, Vec<f64>) {
    let mut world = World::new();
    let names: Vec<String> = (0..count).map(|i| format!("job{i}")).collect();
    let schedule = if period == 1 {
        "* * * * * *".to_string()
    } else {
        format!("*/{period} * * * * *")
    };
    let jobs: Vec<(&str, &str, &str)> = names
        .iter()
        .map(|name| (name.as_str(), schedule.as_str(), ""))
        .collect();
    let config = world.write_config("jobs.toml", 16, 3, &jobs);
    world.node("a", &config).start();
    wait_for(Duration::from_secs(60), "first runs", || !world.runs().is_empty());
    let warmed = now_secs() + 1.0;
    let target = count * bursts;
    let mut runs = Vec::new();
    wait_for(
        Duration::from_secs(bursts as u64 * period as u64 * 3 + 60),
        "enough runs",
        || {
            runs = world.runs();
            runs.iter().filter(|run| run.tick.timestamp() as f64 > warmed).count() >= target
        },
    );
    let mut lateness: Vec<f64> = runs
        .iter()
        .filter(|run| run.tick.timestamp() as f64 > warmed)
        .map(Run::lateness)
        .take(target)
        .collect();
    lateness.sort_by(f64::total_cmp);
    world.nodes[0].signal(libc::SIGTERM);
    world.nodes[0].wait_exit(Duration::from_secs(10));
    (world, lateness)
}
/// The burst sizes in `SHARDCRON_BENCH_BURSTS` (comma-separated), or every size of the table.
pub(crate) fn burst_sizes() -> Vec<usize> {
    let every = vec![1, 20, 200, 2000];
    match std::env::var("SHARDCRON_BENCH_BURSTS") {
        Ok(list) => list.split(',').filter_map(|size| size.trim().parse().ok()).collect(),
        Err(_) => every,
    }
}
pub(crate) fn bench_bursts(sizes: &[usize]) {
    println!("\n### Firing lateness: a job's own clock at start minus its tick (one node)\n");
    println!("The floor spawns the same command at each tick from a thread per core, nothing between. 2,000 at once is more than this machine starts in a second, so those jobs fire every 10 s: each burst is measured on its own, not behind the last one's backlog.\n");
    println!("p99 / floor's p99 is the figure to read: its target is ≤ 1.3 at every size.\n");
    println!(
        "| jobs due at once | every | runs | shardcron p50 | p99 | max | floor p50 | p99 | max | p99 / floor's p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &count in sizes {
        let (bursts, period) = match count {
            1 => (30, 1),
            2..=20 => (15, 1),
            21..=200 => (10, 1),
            _ => (3, 10),
        };
        let (world, lateness) = node_lateness(count, bursts, period);
        let floor = direct_spawn_lateness(&world, count, bursts, period);
        let (p99, floor_p99) = (percentile(&lateness, 99.0), percentile(&floor, 99.0));
        println!(
            "| {count} | {period} s | {} | {} | {} | {} | {} | {} | {} | ×{:.2} |",
            lateness.len(),
            ms(percentile(&lateness, 50.0)),
            ms(p99),
            ms(percentile(&lateness, 100.0)),
            ms(percentile(&floor, 50.0)),
            ms(floor_p99),
            ms(percentile(&floor, 100.0)),
            p99 / floor_p99,
        );
    }
}
pub(crate) fn bench_ceiling() {
    println!(
        "\n### Sustained ceiling: per-second jobs on one node, 10 s a step, doubled until p99 lateness passes 100 ms\n"
    );
    println!("| runs per second | shardcron p99 | floor p99 |");
    println!("|---|---|---|");
    let mut count = 50;
    let mut kept = None;
    loop {
        let (world, lateness) = node_lateness(count, 10, 1);
        let floor = direct_spawn_lateness(&world, count, 10, 1);
        let p99 = percentile(&lateness, 99.0);
        println!("| {count} | {} | {} |", ms(p99), ms(percentile(&floor, 99.0)));
        if p99 >= 0.1 {
            break;
        }
        kept = Some(count);
        if count >= 3200 {
            break;
        }
        count *= 2;
    }
    match kept {
        Some(kept) => println!("\nCeiling: {kept} runs per second kept p99 lateness under 100 ms; the next step did not (or was not tried past 3,200)."),
        None => println!("\nCeiling: under 50 runs per second."),
    }
}
