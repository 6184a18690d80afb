//! What the sections share: numbers from the environment, percentiles, generated job files,
//! measured commands, node logs and metrics, plain spawns; and the imports every section uses.

pub(crate) use std::path::Path;
pub(crate) use std::process::{Command, Stdio};
pub(crate) use std::time::{Duration, Instant};

pub(crate) use chrono::{DateTime, Utc};

pub(crate) use crate::support::*;

/// The number in the environment variable `name`, or `default` when it is unset or no number.
pub(crate) fn number_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(values, 50.0)
}
pub(crate) fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1000.0)
}
/// A mix of everyday schedules, one of them per-10-seconds.
pub(crate) const EVERYDAY: [&str; 6] = [
    "*/5 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "*/10 * * * * *",
    "0 0 * * MON-FRI",
    "15 4 1 * *",
];
/// Schedules that do not fire during a benchmark (unless it runs across New Year).
pub(crate) const YEARLY: [&str; 3] = ["0 0 1 1 *", "30 12 1 1 *", "0 6 1 JAN *"];
/// Generates a `jobs.toml` of `jobs` jobs over a handful of distinct schedules and zones.
pub(crate) fn write_jobs_file(path: &Path, jobs: usize, schedules: &[&str]) {
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
/// Runs `command` to its end: wall seconds, the process's own peak resident memory in MiB, and
/// whether it succeeded.
pub(crate) fn run_measured(command: &mut Command) -> (f64, f64, bool) {
    let started = Instant::now();
    // Reaped by wait4 below, which std's Child cannot do with the child's resource usage.
    #[allow(clippy::zombie_processes)]
    let child = command.spawn().expect("spawn");
    let mut status = 0;
    // SAFETY: wait4 on our own child writes only into the status and the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let succeeded = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (
        started.elapsed().as_secs_f64(),
        usage.ru_maxrss as f64 / 1024.0,
        succeeded,
    )
}
/// Wall-clock times of a node's log lines that contain `needle`.
pub(crate) fn log_times<'a>(log: &'a str, needle: &'a str) -> impl Iterator<Item = f64> + 'a {
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
pub(crate) fn last_renewal(log: &str, before: f64) -> Option<f64> {
    log_times(log, "lease renewed")
        .chain(log_times(log, "session open"))
        .filter(|at| *at <= before)
        .fold(None, |last: Option<f64>, at| Some(last.map_or(at, |last| last.max(at))))
}
/// Lines of a node log at `level` (`WARN`, `ERROR`).
pub(crate) fn log_lines(log: &str, level: &str) -> usize {
    log.lines().filter(|line| line.contains(level)).count()
}
/// `GET /metrics` of a node on `port`, or an empty page.
pub(crate) fn metrics_page(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(stream, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut page = String::new();
    let _ = stream.read_to_string(&mut page);
    page
}
/// The value of the unlabelled sample `name` in a metrics page.
pub(crate) fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}
/// Writes `<cluster>.toml`: `names` as per-minute jobs over 64 shards running `command`, with
/// `catch_up = "all"`, on `world`'s etcd.
pub(crate) fn write_per_minute_jobs(
    world: &World,
    cluster: &str,
    names: &[String],
    command: &str,
) -> std::path::PathBuf {
    let mut text = format!(
        "[cluster]\nname = \"{cluster}\"\nshards = 64\nlease_ttl = \"10s\"\n\n[etcd]\nendpoints = [\"{}\"]\n\n",
        world.etcd.client_url()
    );
    for name in names {
        text.push_str(&format!(
            "[jobs.{name}]\nschedule = \"* * * * *\"\ncommand = '{command}'\ncatch_up = \"all\"\n\n"
        ));
    }
    let path = world.dir.path().join(format!("{cluster}.toml"));
    std::fs::write(&path, text).expect("write the jobs file");
    path
}
/// `sh -c command`, as the node runs a job's command.
pub(crate) fn sh(command: &str) -> Command {
    let mut sh = Command::new("sh");
    sh.args(["-c", command]);
    sh
}
/// A plain spawner's batch: spawns every one of `commands`, then waits for them all. Returns how
/// many ran.
pub(crate) fn spawn_all_then_wait(commands: impl Iterator<Item = Command>) -> usize {
    let mut children: Vec<_> = commands
        .map(|mut command| command.stdin(Stdio::null()).spawn().expect("spawn sh"))
        .collect();
    for child in &mut children {
        let _ = child.wait();
    }
    children.len()
}

/// Runs per second of `command` from a plain spawner on every core for `window`: the most this
/// machine starts of it, with nothing between.
pub(crate) fn plain_spawn_rate(command: &str, window: Duration) -> f64 {
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let started = Instant::now();
    let runs: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut runs = 0;
                    while started.elapsed() < window {
                        runs += spawn_all_then_wait((0..50).map(|_| sh(command)));
                    }
                    runs
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().expect("spawner")).sum()
    });
    runs as f64 / started.elapsed().as_secs_f64()
}
