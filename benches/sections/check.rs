//! `check` over generated job files.

use crate::common::*;

/// `check` over a generated file of `jobs` jobs, `runs` times.
pub(crate) fn bench_check(jobs: usize, runs: usize, time_target: &str, memory_target: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.toml");
    write_jobs_file(&path, jobs, &EVERYDAY);
    let size_mib = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0);
    let mut times = Vec::new();
    let mut peaks = Vec::new();
    for _ in 0..runs {
        let (seconds, peak, succeeded) = run_measured(
            Command::new(SHARDCRON)
                .args(["check", "--config"])
                .arg(&path)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        assert!(succeeded, "check failed on the generated file");
        times.push(seconds);
        peaks.push(peak);
    }
    times.sort_by(f64::total_cmp);
    peaks.sort_by(f64::total_cmp);
    println!("\n### check over a generated {jobs}-job file ({size_mib:.1} MiB)\n");
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!(
        "| wall time, median of {runs} | {:.3} s | {time_target} |",
        times[times.len() / 2]
    );
    println!("| wall time, max of {runs} | {:.3} s | |", times[times.len() - 1]);
    println!(
        "| peak resident memory, max of {runs} | {:.1} MiB | {memory_target} |",
        peaks[peaks.len() - 1]
    );
}
