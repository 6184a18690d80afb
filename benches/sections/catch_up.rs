//! A takeover of records hours old: how soon the new leader claims, and how fast it drains.

use crate::common::*;

/// `jobs` per-minute jobs over 64 shards whose records are `hours` old, `catch_up = "all"`, on
/// one node: how soon it claims, how fast it drains the backlog, what that costs.
pub(crate) fn bench_catch_up(jobs: usize, hours: i64, watch: Duration) {
    let mut world = World::new();
    let names: Vec<String> = (0..jobs).map(|i| format!("job-{i:06}")).collect();
    let path = write_per_minute_jobs(&world, "catchup", &names, ":");
    let now = Utc::now();
    let last =
        DateTime::<Utc>::from_timestamp(now.timestamp() - now.timestamp() % 60 - hours * 3600, 0).expect("instant");
    world.seed_job_records("catchup", &names, last);
    let owed = jobs * ((hours * 60) as usize).min(100);
    // The most this machine starts of the jobs' command, measured before the node runs.
    let floor = plain_spawn_rate(":", Duration::from_secs(10));

    let port = shardcron::etcd_server::free_port().expect("port");
    let started = Instant::now();
    let started_at = Utc::now();
    world
        .node("a", &path)
        .args(&["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env(&[("SHARDCRON_LOG", "info")])
        .start();
    let (samples, page) = scrape_every_10s(&world, port, started, watch);
    let start_seconds = started_at.timestamp_millis() as f64 / 1000.0;
    // The first claim is read from the node's log.
    let log = world.nodes[0].log_text();
    let first = |needle: &str| log_times(&log, needle).map(|at| at - start_seconds).reduce(f64::min);
    let first_claim = first("catching up missed ticks");
    let steps = [
        ("config read, connecting", first("connecting to etcd")),
        ("session open", first("session open")),
        ("first shard led", first("leading shard")),
    ];
    let node = &world.nodes[0];
    println!(
        "\n### Catch-up: {jobs} per-minute jobs over 64 shards, records {hours} h old, catch_up = \"all\", one node\n"
    );
    println!(
        "{owed} ticks are owed (at most 100 per job). Watched for {} s.\n",
        watch.as_secs()
    );
    print_samples(&samples);
    let finished = metric(&page, "shardcron_run_duration_seconds_count");
    let elapsed = started.elapsed().as_secs_f64();
    let rate = samples
        .first()
        .map(|(at, _, done, _, _)| (finished - done) / (elapsed - at))
        .unwrap_or(0.0);
    println!("\n| measure | value | target, floor |");
    println!("|---|---|---|");
    match first_claim {
        Some(at) => println!("| first missed tick claimed, after the node started | {at:.2} s | ≤ 1 s |"),
        None => println!(
            "| first missed tick claimed, after the node started | not within {} s | ≤ 1 s |",
            watch.as_secs()
        ),
    }
    for (step, at) in steps {
        if let Some(at) = at {
            println!("| of which: {step} | {at:.2} s | |");
        }
    }
    println!("| runs finished per second, after the first sample | {rate:.0} | |");
    // The live ticks keep coming while the backlog drains: only what the node runs beyond them
    // drains it.
    let live = jobs as f64 / 60.0;
    let drain = |rate: f64| {
        if rate > live {
            format!("{:.0} min", owed as f64 / (rate - live) / 60.0)
        } else {
            format!("never: the live ticks alone need {live:.0} runs/s")
        }
    };
    println!(
        "| time to drain every owed tick at that rate, beside {live:.0} live runs/s | {} | {} at the plain spawner's {floor:.0} runs/s |",
        drain(rate),
        drain(floor)
    );
    println!("| peak resident memory | {:.0} MiB | bounded |", node.peak_rss_mib());
    println!(
        "| session losses | {} | 0 |",
        metric(&page, "shardcron_session_losses_total")
    );
}

/// Seconds since the start, missed ticks claimed, runs finished, resident MiB, and results and
/// history entries not in etcd yet.
type Sample = (f64, f64, f64, f64, f64);

/// Scrapes the node on `port` every 10 s until `watch` after `started`, as a Prometheus would: a
/// scrape renders three gauges per job (300,000 series at 100,000 jobs). The samples and the
/// last page.
fn scrape_every_10s(world: &World, port: u16, started: Instant, watch: Duration) -> (Vec<Sample>, String) {
    let mut samples = Vec::new();
    let mut page = String::new();
    let mut next_sample = Duration::from_secs(10);
    while started.elapsed() < watch {
        std::thread::sleep(next_sample.saturating_sub(started.elapsed()));
        page = metrics_page(port);
        samples.push((
            started.elapsed().as_secs_f64(),
            metric(&page, "shardcron_catch_up_runs_total"),
            metric(&page, "shardcron_run_duration_seconds_count"),
            world.nodes[0].rss_mib(),
            metric(&page, "shardcron_results_unwritten") + metric(&page, "shardcron_history_unwritten"),
        ));
        next_sample += Duration::from_secs(10);
    }
    (samples, page)
}

fn print_samples(samples: &[Sample]) {
    println!("| after | missed ticks claimed | runs finished | results and history entries not in etcd yet | resident memory |");
    println!("|---|---|---|---|---|");
    for (at, claimed, finished, rss, unwritten) in samples {
        println!("| {at:.0} s | {claimed:.0} | {finished:.0} | {unwritten:.0} | {rss:.0} MiB |");
    }
}
