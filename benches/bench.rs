//! shardcron's benchmarks. Each section starts its own etcd and nodes on loopback and prints a
//! markdown table; none asserts, the figures are for reading beside their targets and floors.
//!
//! ```text
//! cargo bench --bench bench -- all          # every section
//! cargo bench --bench bench -- check        # check over a generated 100,000-job file
//! cargo bench --bench bench -- lateness     # firing lateness vs. direct spawn
//! cargo bench --bench bench -- failover     # SIGKILL / SIGSTOP / SIGTERM of a leader
//! cargo bench --bench bench -- etcd-cost    # etcd writes per run
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use support::*;

fn main() {
    let what: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with("--")).collect();
    let wants = |name: &str| what.is_empty() || what.iter().any(|w| w == "all" || w == name);
    if wants("check") {
        bench_check(100_000);
    }
    if wants("lateness") {
        bench_lateness();
    }
    if wants("failover") {
        bench_failover();
    }
    if wants("etcd-cost") {
        bench_etcd_cost();
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(values, 50.0)
}

fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1000.0)
}

/// Generates a `jobs.toml` of `jobs` jobs over a handful of distinct schedules and zones.
fn write_jobs_file(path: &Path, jobs: usize) {
    let schedules = [
        "*/5 * * * *",
        "0 * * * *",
        "30 2 * * *",
        "*/10 * * * * *",
        "0 0 * * MON-FRI",
        "15 4 1 * *",
    ];
    let zones = ["UTC", "Europe/Berlin", "America/New_York"];
    let mut text = String::from("[cluster]\nname = \"bench\"\nshards = 64\nlease_ttl = \"10s\"\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\n");
    for i in 0..jobs {
        text.push_str(&format!(
            "[jobs.job-{i:06}]\nschedule = \"{}\"\ncommand = \"echo {i}\"\ntimezone = \"{}\"\n\n",
            schedules[i % schedules.len()],
            zones[i % zones.len()]
        ));
    }
    std::fs::write(path, text).expect("write the generated jobs file");
}

/// Peak resident memory of all waited-for children so far, in MiB.
fn children_max_rss_mib() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss as f64 / 1024.0
}

fn bench_check(jobs: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.toml");
    write_jobs_file(&path, jobs);
    let size_mib = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0);
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let status = Command::new(SHARDCRON)
            .args(["check", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run shardcron check");
        times.push(started.elapsed().as_secs_f64());
        assert!(status.success(), "check failed on the generated file");
    }
    times.sort_by(f64::total_cmp);
    println!("\n### check over a generated {jobs}-job file ({size_mib:.1} MiB)\n");
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!("| wall time, median of 5 | {:.3} s | ≤ 1 s |", times[times.len() / 2]);
    println!("| wall time, max of 5 | {:.3} s | |", times[times.len() - 1]);
    println!("| peak resident memory | {:.1} MiB | |", children_max_rss_mib());
}

/// Spawns the same record command `count` times at each of `seconds` whole seconds, from a plain
/// program: the floor that shardcron's lateness is measured against.
fn direct_spawn_lateness(world: &World, count: usize, seconds: usize) -> Vec<f64> {
    let file = world.dir.path().join(format!("direct-{count}.log"));
    let command = world
        .record_command()
        .replace(&world.runs_file().display().to_string(), &file.display().to_string());
    for _ in 0..seconds {
        let now = Utc::now();
        let tick = DateTime::<Utc>::from_timestamp(now.timestamp() + 1, 0).expect("tick");
        std::thread::sleep((tick - now).to_std().unwrap_or_default());
        let mut children: Vec<_> = (0..count)
            .map(|i| {
                Command::new("sh")
                    .args(["-c", &command])
                    .env("CRON_JOB", format!("direct{i}"))
                    .env(
                        "CRON_SCHEDULED_AT",
                        tick.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    )
                    .env("CRON_FENCE", "0")
                    .env("CRON_NODE", "direct")
                    .env("CRON_SHARD", "0")
                    .spawn()
                    .expect("spawn sh")
            })
            .collect();
        for child in &mut children {
            let _ = child.wait();
        }
    }
    let mut lateness: Vec<f64> = read_runs(&file).iter().map(Run::lateness).collect();
    lateness.sort_by(f64::total_cmp);
    lateness
}

fn bench_lateness() {
    println!("\n### Firing lateness: a job's own clock at start minus its tick (one node)\n");
    println!("| jobs due at once | runs | shardcron p50 | p99 | max | direct spawn p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|");
    for (count, seconds) in [(1usize, 30usize), (20, 15), (200, 10)] {
        let mut world = World::new();
        let names: Vec<String> = (0..count).map(|i| format!("job{i}")).collect();
        let jobs: Vec<(&str, &str, &str)> = names.iter().map(|name| (name.as_str(), "* * * * * *", "")).collect();
        let config = world.write_config("jobs.toml", 16, 3, &jobs);
        world.start_node("a", &config);
        wait_for(Duration::from_secs(30), "first runs", || !world.runs().is_empty());
        let warmed = now_secs() + 1.0;
        let target = count * seconds;
        wait_for(Duration::from_secs(seconds as u64 * 3 + 30), "enough runs", || {
            world
                .runs()
                .iter()
                .filter(|run| run.tick.timestamp() as f64 > warmed)
                .count()
                >= target
        });
        let mut lateness: Vec<f64> = world
            .runs()
            .iter()
            .filter(|run| run.tick.timestamp() as f64 > warmed)
            .map(Run::lateness)
            .take(target)
            .collect();
        lateness.sort_by(f64::total_cmp);
        world.nodes[0].signal(libc::SIGTERM);
        world.nodes[0].wait_exit(Duration::from_secs(10));
        let floor = direct_spawn_lateness(&world, count, seconds);
        println!(
            "| {count} | {} | {} | {} | {} | {} | {} | {} |",
            lateness.len(),
            ms(percentile(&lateness, 50.0)),
            ms(percentile(&lateness, 99.0)),
            ms(percentile(&lateness, 100.0)),
            ms(percentile(&floor, 50.0)),
            ms(percentile(&floor, 99.0)),
            ms(percentile(&floor, 100.0)),
        );
    }
}

/// Wall-clock times of a node's log lines that contain `needle`.
fn log_times<'a>(log: &'a str, needle: &'a str) -> impl Iterator<Item = f64> + 'a {
    log.lines()
        .filter(move |line| line.contains(needle))
        .filter_map(|line| {
            let stamp = line.split_whitespace().next()?;
            let at = DateTime::parse_from_rfc3339(stamp).ok()?;
            Some(at.timestamp() as f64 + f64::from(at.timestamp_subsec_nanos()) / 1e9)
        })
}

/// When the node's lease was last granted or renewed at or before `before`: etcd drops the lease
/// one TTL after that, at the earliest.
fn last_renewal(log: &str, before: f64) -> Option<f64> {
    log_times(log, "lease renewed")
        .chain(log_times(log, "session open"))
        .filter(|at| *at <= before)
        .fold(None, |last: Option<f64>, at| Some(last.map_or(at, |last| last.max(at))))
}

struct Trial {
    leads: Option<f64>,
    takeover: f64,
    floor: Option<f64>,
    lost: usize,
    doubled: usize,
    stale: usize,
}

fn failover_trial(ttl: u64, signal: libc::c_int) -> Trial {
    let mut world = World::new();
    let config = world.write_config("jobs.toml", 1, ttl, &[("tick", "* * * * * *", "catch_up = \"all\"")]);
    world.start_node("a", &config);
    let target = shardcron::fleet::assign(1, &["a", "b"])[0].clone().expect("a target");
    wait_for(
        Duration::from_secs(20),
        "the target leads and the other node stands by",
        || {
            let status = world.status(&config);
            status["shards"][0]["leader"] == target.as_str() && status["shards"][0]["standby"] == 1
        },
    );
    let (leader_id, old_fence) = world.leader_of(&config, 0).expect("a leader");
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
        .filter(|run| run.fence == old_fence && run.started > takeover_at)
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

fn bench_failover() {
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

fn bench_etcd_cost() {
    println!("\n### etcd cost: raft proposals committed per run (one node, per-second jobs, 10 s window)\n");
    println!("| jobs | shards | runs | proposals | per run | per shard per instant | target |");
    println!("|---|---|---|---|---|---|---|");
    for (jobs, shards) in [(20usize, 4u32), (200, 16)] {
        let mut world = World::new();
        let names: Vec<String> = (0..jobs).map(|i| format!("job{i}")).collect();
        let list: Vec<(&str, &str, &str)> = names.iter().map(|name| (name.as_str(), "* * * * * *", "")).collect();
        let config = world.write_config("jobs.toml", shards, 3, &list);
        world.start_node("a", &config);
        wait_for(Duration::from_secs(30), "runs start", || world.runs().len() >= jobs * 2);
        sleep_to_mid_second();
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
        let runs = world.runs().len() - before_runs;
        let proposals = after - before;
        println!(
            "| {jobs} | {shards} | {runs} | {proposals:.0} | {:.3} | {:.2} | ≤ 0.25 per run, ≤ 1 per shard per instant |",
            proposals / runs as f64,
            proposals / (f64::from(shards) * 10.0),
        );
    }
}
