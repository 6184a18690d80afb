//! A backlog watched until every owed tick ran exactly once, beside the plain spawn rate.

use crate::common::*;

/// A backlog watched until it is gone: `jobs` per-minute jobs whose records are 100 minutes old
/// (`catch_up = "all"` owes each its 100 newest missed ticks), one node. Each run appends its
/// job and tick to a file with shell builtins only; every (job, tick) from the records on to the
/// end of the watch, missed or live, must have run exactly once.
pub(crate) fn bench_drain(jobs: usize) {
    let mut world = World::new();
    let names: Vec<String> = (0..jobs).map(|i| format!("job-{i:06}")).collect();
    let file = world.dir.path().join("drain-runs.log");
    let command = format!("echo \"$CRON_JOB $CRON_SCHEDULED_AT\" >> {}", file.display());
    let path = write_per_minute_jobs(&world, "drain", &names, &command);
    let minute = |at: DateTime<Utc>| at.timestamp() - at.timestamp().rem_euclid(60);
    let last = minute(Utc::now()) - 99 * 60;
    world.seed_job_records(
        "drain",
        &names,
        DateTime::<Utc>::from_timestamp(last, 0).expect("instant"),
    );
    let floor = plain_spawn_rate(&command.replace("$CRON_JOB", "floor"), Duration::from_secs(10));
    let _ = std::fs::remove_file(&file);

    let started = Instant::now();
    let started_at = Utc::now();
    // Ticks due before the node started were missed; the newest 100 of them are owed.
    let missed_through = minute(started_at);
    let first_owed = (last + 60).max(missed_through - 99 * 60);
    let owed = jobs * ((missed_through - first_owed) / 60 + 1) as usize;
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("a", &path)
        .args(&["--metrics-addr", &format!("127.0.0.1:{port}")])
        .start();
    let mut runs = RunsFile::new(file);
    let (drained, samples) = watch_until_drained(&world, &mut runs, started, missed_through, owed);
    // Live ticks up to the minute before the last read must have run too.
    let watched_through = minute(Utc::now()) - 60;
    std::thread::sleep(Duration::from_secs(5));
    runs.read_more();
    let (checked, missing, twice) = count_each_ran_once(&runs.runs, &names, first_owed, watched_through);
    let node = &world.nodes[0];
    let session_losses = metric(&metrics_page(port), "shardcron_session_losses_total");
    println!("\n### Drain: {jobs} per-minute jobs over 64 shards owing their 100 newest missed ticks, one node\n");
    println!("{owed} missed ticks owed, and {jobs} live ticks a minute ({:.0} runs/s) due meanwhile. Each run appends its job and tick to a file with shell builtins.\n", jobs as f64 / 60.0);
    println!("| after | missed ticks run | live ticks run | resident memory |");
    println!("|---|---|---|---|");
    let every = (samples.len() / 12).max(1);
    for (index, (at, missed, live, rss)) in samples.iter().enumerate() {
        if index % every == 0 || index + 1 == samples.len() {
            println!("| {at:.0} s | {missed} | {live} | {rss:.0} MiB |");
        }
    }
    println!("\n| measure | value | floor |");
    println!("|---|---|---|");
    match drained {
        Some(at) => println!(
            "| every missed tick run, after the node started | {at:.0} s ({:.0} missed runs/s) | {:.0} s at the plain spawner's {floor:.0} runs/s less the live ticks' |",
            owed as f64 / at,
            owed as f64 / (floor - jobs as f64 / 60.0),
        ),
        None => println!("| every missed tick run | not within {} s | |", DRAIN_LIMIT.as_secs()),
    }
    println!("| (job, tick) checked, missed and live, through the end of the watch | {checked} | |");
    println!("| of them not run / run more than once | {missing} / {twice} | 0 / 0 |");
    println!("| peak resident memory | {:.0} MiB | |", node.peak_rss_mib());
    println!("| session losses | {session_losses} | 0 |");
}

/// The longest a drain is watched.
const DRAIN_LIMIT: Duration = Duration::from_secs(3600);

/// The runs file the jobs append `job tick` lines to, read as it grows: only the lines added
/// since the last read are parsed.
struct RunsFile {
    path: std::path::PathBuf,
    read_to: u64,
    runs: Vec<(String, i64)>,
}

impl RunsFile {
    fn new(path: std::path::PathBuf) -> RunsFile {
        RunsFile {
            path,
            read_to: 0,
            runs: Vec::new(),
        }
    }

    fn read_more(&mut self) {
        use std::io::{Read, Seek};
        let Ok(mut opened) = std::fs::File::open(&self.path) else {
            return;
        };
        let mut bytes = Vec::new();
        if opened.seek(std::io::SeekFrom::Start(self.read_to)).is_err() || opened.read_to_end(&mut bytes).is_err() {
            return;
        }
        let complete = bytes.iter().rposition(|byte| *byte == b'\n').map_or(0, |at| at + 1);
        self.read_to += complete as u64;
        for line in String::from_utf8_lossy(&bytes[..complete]).lines() {
            let Some((job, tick)) = line.split_once(' ') else {
                continue;
            };
            if let Ok(tick) = DateTime::parse_from_rfc3339(tick) {
                self.runs.push((job.to_string(), tick.timestamp()));
            }
        }
    }
}

/// A sample of the drain: seconds since the start, missed and live ticks run, resident MiB.
type Sample = (f64, usize, usize, f64);

/// Reads the runs every second until the `owed` missed ticks (those through `missed_through`)
/// ran, sampling every 10 s; when, after `started`, they had all run, if within [`DRAIN_LIMIT`].
fn watch_until_drained(
    world: &World,
    runs: &mut RunsFile,
    started: Instant,
    missed_through: i64,
    owed: usize,
) -> (Option<f64>, Vec<Sample>) {
    let mut samples = Vec::new();
    let mut next_sample = Duration::from_secs(10);
    let (mut counted, mut missed_run) = (0, 0);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        runs.read_more();
        missed_run += runs.runs[counted..]
            .iter()
            .filter(|(_, tick)| *tick <= missed_through)
            .count();
        counted = runs.runs.len();
        if started.elapsed() >= next_sample || missed_run >= owed {
            samples.push((
                started.elapsed().as_secs_f64(),
                missed_run,
                runs.runs.len() - missed_run,
                world.nodes[0].rss_mib(),
            ));
            next_sample += Duration::from_secs(10);
        }
        if missed_run >= owed {
            return (Some(started.elapsed().as_secs_f64()), samples);
        }
        if started.elapsed() > DRAIN_LIMIT {
            return (None, samples);
        }
    }
}

/// Of every (job, tick) of `names` from `first_owed` through `watched_through`: how many were
/// checked, never ran, and ran more than once.
fn count_each_ran_once(
    runs: &[(String, i64)],
    names: &[String],
    first_owed: i64,
    watched_through: i64,
) -> (usize, usize, usize) {
    let mut count: std::collections::HashMap<(&str, i64), usize> = std::collections::HashMap::new();
    for (job, tick) in runs {
        *count.entry((job.as_str(), *tick)).or_default() += 1;
    }
    let (mut checked, mut missing, mut twice) = (0, 0, 0);
    for name in names {
        let mut tick = first_owed;
        while tick <= watched_through {
            checked += 1;
            match count.get(&(name.as_str(), tick)).copied().unwrap_or(0) {
                0 => missing += 1,
                1 => {}
                _ => twice += 1,
            }
            tick += 60;
        }
    }
    (checked, missing, twice)
}
