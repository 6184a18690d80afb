//! Concurrency groups under load: many jobs of one group due at one instant over several
//! nodes, drained `limit` at a time; the writes the group costs, and an ungrouped job's
//! lateness beside it.

use std::collections::BTreeMap;

use chrono::Timelike;
use etcd_client::WatchOptions;

use crate::common::*;

/// One grouped run as its job wrote it: started and ended by its own clock.
struct Span {
    started: f64,
    ended: f64,
}

/// Every key of the cluster's concurrency groups.
const GROUPS: &str = "/shardcron/test/groups/";

/// Every write under `prefix` from revision `from` on, until `until`, by its revision, with
/// what it did: keys put and deleted, slots and places apart. A transaction that frees a slot
/// and hands it on is one write however many keys it changes.
fn writes_under(world: &World, prefix: &str, from: i64, until: Instant) -> BTreeMap<i64, Write> {
    let (runtime, client) = world.etcd_client();
    runtime.block_on(async {
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut stream = client.clone().watch(prefix, Some(options)).await.expect("watch");
        let mut writes: BTreeMap<i64, Write> = BTreeMap::new();
        while let Ok(Ok(Some(response))) =
            tokio::time::timeout(until.saturating_duration_since(Instant::now()), stream.message()).await
        {
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let write = writes.entry(kv.mod_revision()).or_default();
                let slot = String::from_utf8_lossy(kv.key()).contains("/slots/");
                let put = event.event_type() == etcd_client::EventType::Put;
                match (slot, put) {
                    (true, true) => write.slot_put = true,
                    (true, false) => write.slot_freed = true,
                    (false, true) => write.place_put = true,
                    (false, false) => write.place_taken = true,
                }
            }
        }
        writes
    })
}

/// What one write to a group's keys did.
#[derive(Default)]
struct Write {
    slot_put: bool,
    slot_freed: bool,
    place_put: bool,
    place_taken: bool,
}

/// The writes by kind: a slot taken free, a place in line, a slot handed on (or taken from
/// the line), a slot freed.
fn kinds(writes: &BTreeMap<i64, Write>) -> String {
    let count = |test: fn(&Write) -> bool| writes.values().filter(|write| test(write)).count();
    format!(
        "{} slots taken free, {} places in line, {} hand-overs or takes from the line, {} slots freed",
        count(|write| write.slot_put && !write.place_taken),
        count(|write| write.place_put),
        count(|write| write.slot_put && write.place_taken),
        count(|write| write.slot_freed),
    )
}

fn revision(world: &World) -> i64 {
    let (runtime, client) = world.etcd_client();
    runtime
        .block_on(client.clone().get("revision", None))
        .ok()
        .and_then(|read| read.header().map(|header| header.revision()))
        .unwrap_or_default()
}

/// `jobs` jobs of a group of `limit`, each running `seconds`, all due at one instant, over
/// `nodes` nodes, beside `plain` ungrouped per-second jobs.
pub(crate) fn bench_groups(jobs: usize, limit: u32, nodes: usize, seconds: f64, plain: usize) {
    let mut world = World::new();
    let ends = world.runs_file().with_file_name("ends.log");
    // Far enough ahead for every node to start and lead: the instant all the group's jobs name.
    let due = Utc::now() + chrono::Duration::seconds(45);
    let instant = format!("{} {} {} * * *", due.second(), due.minute(), due.hour());
    let grouped_command = format!(
        "{}; sleep {seconds}; echo \"$CRON_JOB $CRON_SCHEDULED_AT $CRON_FENCE $(date +%s.%N)\" >> {}",
        world.record_command(),
        ends.display()
    );
    let mut tables: Vec<(String, String)> = (0..jobs)
        .map(|index| {
            (
                format!("g{index:04}"),
                format!("schedule = \"{instant}\"\ncommand = '{grouped_command}'\ngroup = \"drain\"\n"),
            )
        })
        .collect();
    for index in 0..plain {
        tables.push((
            format!("plain{index:02}"),
            format!(
                "schedule = \"* * * * * *\"\ncommand = '{}'\noverlap = \"allow\"\n",
                world.record_command()
            ),
        ));
    }
    let tables: Vec<(&str, String)> = tables
        .iter()
        .map(|(name, table)| (name.as_str(), table.clone()))
        .collect();
    let config = world.write_config_tables("jobs.toml", 16, 10, &tables);
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("{text}\n[groups.drain]\nlimit = {limit}\n")).expect("config");
    for index in 0..nodes {
        world.node(&format!("n{index}"), &config).start();
    }
    let plain_names: Vec<String> = (0..plain).map(|index| format!("plain{index:02}")).collect();
    wait_for(Duration::from_secs(40), "every ungrouped job ran", || {
        every_job_ran_since(&world.runs(), &plain_names, 0.0, 2)
    });

    // The ungrouped jobs alone first: their writes per run, and what the group's keys get.
    sleep_to_mid_second();
    let idle_from = now_secs();
    let (before, idle_runs_before) = (revision(&world), world.runs().len());
    let window = 10.0;
    std::thread::sleep(Duration::from_secs_f64(window));
    let (after, idle_runs) = (revision(&world), world.runs().len() - idle_runs_before);
    let idle_to = now_secs();
    let plain_writes_per_run = (after - before) as f64 / idle_runs as f64;
    // Replayed from etcd's history: the window's writes to the group's keys.
    let idle_group_writes = writes_under(&world, GROUPS, before + 1, Instant::now() + Duration::from_secs(2))
        .into_keys()
        .filter(|revision| *revision <= after)
        .count();

    // The drain: every grouped job due at `due`.
    let start_revision = revision(&world);
    wait_for(Duration::from_secs(600), "every grouped job ran to its end", || {
        std::fs::read_to_string(&ends).unwrap_or_default().lines().count() >= jobs
    });
    // The last hand-overs and frees land right after the last end.
    std::thread::sleep(Duration::from_secs(3));
    let drain_writes = writes_under(
        &world,
        GROUPS,
        start_revision + 1,
        Instant::now() + Duration::from_secs(2),
    );
    let group_writes = drain_writes.len();

    let runs = world.runs();
    let ended: BTreeMap<(String, i64), f64> = std::fs::read_to_string(&ends)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let [job, _, fence, at] = line.split_whitespace().collect::<Vec<_>>()[..] else {
                return None;
            };
            Some(((job.to_string(), fence.parse().ok()?), at.parse().ok()?))
        })
        .collect();
    let spans: Vec<Span> = runs
        .iter()
        .filter(|run| run.job.starts_with('g'))
        .filter_map(|run| {
            Some(Span {
                started: run.started,
                ended: *ended.get(&(run.job.clone(), run.fence))?,
            })
        })
        .collect();
    let most = most_at_once(spans.iter().map(|span| (span.started, span.ended)));
    let first = spans.iter().map(|span| span.started).fold(f64::MAX, f64::min);
    let last = spans.iter().map(|span| span.ended).fold(0.0, f64::max);
    let plain_lateness = |from: f64, to: f64| {
        let mut lateness: Vec<f64> = runs
            .iter()
            .filter(|run| run.job.starts_with("plain"))
            .filter(|run| (from..to).contains(&(run.tick.timestamp() as f64)))
            .map(Run::lateness)
            .collect();
        lateness.sort_by(f64::total_cmp);
        lateness
    };
    let during = plain_lateness(first.floor(), last);
    let idle = plain_lateness(idle_from, idle_to);
    let floor = crate::lateness::direct_spawn_lateness(&world, plain, 10, 1);
    let started = runs.iter().filter(|run| run.job.starts_with('g')).count();

    println!(
        "\n### {jobs} jobs of a group of {limit}, {seconds} s each, due at one instant over {nodes} nodes, beside {plain} ungrouped per-second jobs; one etcd on loopback\n"
    );
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!(
        "| grouped runs started / ended | {started} / {} | {jobs} |",
        spans.len()
    );
    println!(
        "| time to drain: first start to last end | {:.1} s | ≥ {:.1} s ({jobs} ÷ {limit} × {seconds} s) |",
        last - first,
        jobs as f64 / f64::from(limit) * seconds
    );
    println!("| most running at once, by the jobs' own clocks | {most} | ≤ {limit} |");
    println!(
        "| etcd writes to the group's keys per grouped run ({}) | {:.3} | ≤ 2 |",
        kinds(&drain_writes),
        group_writes as f64 / spans.len().max(1) as f64
    );
    println!(
        "| etcd writes per ungrouped run, the ungrouped jobs alone ({idle_runs} runs in {window:.0} s) | {plain_writes_per_run:.3} | unchanged |"
    );
    println!("| writes to the group's keys meanwhile | {idle_group_writes} | 0 |");
    println!(
        "| ungrouped job lateness during the drain: p50 / p99 / max ({} runs) | {} / {} / {} | |",
        during.len(),
        ms(percentile(&during, 50.0)),
        ms(percentile(&during, 99.0)),
        ms(percentile(&during, 100.0))
    );
    println!(
        "| the same before the drain ({} runs) | {} / {} / {} | |",
        idle.len(),
        ms(percentile(&idle, 50.0)),
        ms(percentile(&idle, 99.0)),
        ms(percentile(&idle, 100.0))
    );
    println!(
        "| floor: {plain} commands spawned straight at each tick ({} runs) | {} / {} / {} | |",
        floor.len(),
        ms(percentile(&floor, 50.0)),
        ms(percentile(&floor, 99.0)),
        ms(percentile(&floor, 100.0))
    );
}
