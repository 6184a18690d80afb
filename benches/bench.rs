//! shardcron's benchmarks. Each prints a markdown table; none asserts, the figures are for
//! reading beside their targets.
//!
//! `cargo bench --bench bench -- check`: `shardcron check` over a generated 100,000-job file.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const SHARDCRON: &str = env!("CARGO_BIN_EXE_shardcron");

fn main() {
    let what: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let all = what.is_empty() || what.iter().any(|w| w == "all");
    if all || what.iter().any(|w| w == "check") {
        bench_check(100_000);
    }
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
    let size_mib =
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0);
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
    println!(
        "| wall time, median of 5 | {:.3} s | ≤ 1 s |",
        times[times.len() / 2]
    );
    println!(
        "| wall time, max of 5 | {:.3} s | |",
        times[times.len() - 1]
    );
    println!(
        "| peak resident memory | {:.1} MiB | |",
        children_max_rss_mib()
    );
}
