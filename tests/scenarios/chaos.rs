//! A randomized fault run against a real 3-member etcd and 3 nodes, each node reaching etcd
//! through a proxy of its own to its own member. Faults drawn from a seed land a few
//! milliseconds around ticks: SIGKILL, SIGSTOP past the TTL, a cut connection, the node's etcd
//! member killed, SIGTERM; each node comes back before the next fault. Then every (job, tick) of
//! the window is checked against its job's delivery promise.
//!
//! ```text
//! cargo test --test main chaos                                   # the short run (about 75 s)
//! SHARDCRON_CHAOS_SECS=1800 SHARDCRON_CHAOS_SEED=42 \
//!   cargo test --release --test main chaos -- --nocapture        # a long run, replayable by seed
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::support::proxy::Proxy;
use crate::support::*;

const TTL: u64 = 2;
const IDS: [&str; 3] = ["a", "b", "c"];

/// xorshift64: the faults only need to be spread and replayable from the seed.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides
    }
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// The node `id`'s newest process.
fn latest(world: &World, id: &str) -> usize {
    world.nodes.iter().rposition(|node| node.id == id).expect("the node")
}

fn restart(world: &mut World, id: &str, config: &std::path::Path, proxy: &Proxy) {
    world.node(id, config).via(proxy).start();
}

#[test]
fn a_randomized_fault_run_keeps_every_delivery_promise() {
    let seed = env_number("SHARDCRON_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |since| since.as_nanos() as u64)
    });
    let run_for = Duration::from_secs(env_number("SHARDCRON_CHAOS_SECS").unwrap_or(60));
    eprintln!("chaos: seed {seed}, {run_for:?} of faults (replay: SHARDCRON_CHAOS_SEED={seed})");
    let mut dice = Dice(seed | 1);

    let mut world = World::with_etcd_members(3);
    let least = job_names(4, 1);
    let most: Vec<String> = (0..4).map(|i| format!("once{i}")).collect();
    let mut jobs = every_second(&least, "catch_up = \"all\"");
    jobs.extend(every_second(&most, "catch_up = \"all\"\ndelivery = \"at-most-once\""));
    let config = world.write_config("jobs.toml", 3, TTL, &jobs);
    let proxies: Vec<Proxy> = (0..IDS.len())
        .map(|member| {
            let url = world.etcd.client_url_of(member);
            Proxy::start(url.trim_start_matches("http://"))
        })
        .collect();
    for (id, proxy) in IDS.iter().zip(&proxies) {
        world.node(id, &config).via(proxy).start();
    }
    let names: Vec<String> = least.iter().chain(&most).cloned().collect();
    wait_for(Duration::from_secs(30), "every job runs", || {
        every_job_ran_since(&world.runs(), &names, 0.0, 2)
    });
    let window_start = Utc::now();

    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    let started = Instant::now();
    while started.elapsed() < run_for {
        let victim = dice.roll(IDS.len() as u64) as usize;
        let id = IDS[victim];
        let offset = dice.roll(151) as i64 - 50;
        let kind = dice.roll(5);
        let tick = sleep_to_tick_offset(offset);
        let node = latest(&world, id);
        let fault = match kind {
            0 => {
                world.nodes[node].signal(libc::SIGKILL);
                std::thread::sleep(Duration::from_millis(500 + dice.roll(2000)));
                restart(&mut world, id, &config, &proxies[victim]);
                "SIGKILL"
            }
            1 => {
                world.nodes[node].signal(libc::SIGSTOP);
                std::thread::sleep(Duration::from_secs(TTL + 1));
                world.nodes[node].signal(libc::SIGCONT);
                "SIGSTOP past the TTL"
            }
            2 => {
                proxies[victim].cut();
                std::thread::sleep(Duration::from_millis(3 * TTL * 500));
                proxies[victim].heal();
                "cut from etcd for 1.5×TTL"
            }
            3 => {
                world.etcd.kill_member(victim);
                std::thread::sleep(Duration::from_secs(3));
                world.etcd.restart().expect("etcd member restarts");
                "its etcd member killed"
            }
            _ => {
                world.nodes[node].signal(libc::SIGTERM);
                world.nodes[node].wait_exit(Duration::from_secs(10));
                restart(&mut world, id, &config, &proxies[victim]);
                "SIGTERM"
            }
        };
        step(&format!("{fault} on {id}, {offset:+} ms from {tick}"));
        *faults.entry(fault).or_default() += 1;
        std::thread::sleep(Duration::from_millis(1000 + dice.roll(2000)));
    }
    step("faults over: every node up; let catch-up and redelivery finish");
    let window_end = Utc::now() - chrono::Duration::seconds(1);
    let settled = now_secs();
    wait_for(Duration::from_secs(60), "every job runs again", || {
        every_job_ran_since(&world.runs(), &names, settled + 3.0, 1)
    });
    std::thread::sleep(Duration::from_secs(2 * TTL));

    let runs = world.runs();
    let logs: String = world.nodes.iter().map(Node::log_text).collect();
    let recorded_lost = |job: &str, tick: DateTime<Utc>| {
        logs.lines().any(|line| {
            line.contains("lost:") && line.contains(&format!("job={job} ")) && line.contains(&format!("tick={tick}"))
        })
    };
    let (mut checked, mut doubled, mut lost) = (0, 0, 0);
    for name in &names {
        let mut by_tick: BTreeMap<DateTime<Utc>, Vec<&Run>> = BTreeMap::new();
        for run in runs.iter().filter(|run| &run.job == name) {
            by_tick.entry(run.tick).or_default().push(run);
        }
        let at_most_once = most.contains(name);
        let first = DateTime::<Utc>::from_timestamp(window_start.timestamp() + 1, 0).expect("a second");
        let mut tick = first;
        while tick <= window_end {
            checked += 1;
            let mut ran = by_tick.get(&tick).cloned().unwrap_or_default();
            ran.sort_by(|a, b| a.started.total_cmp(&b.started));
            if at_most_once {
                assert!(ran.len() <= 1, "{name} (at-most-once): tick {tick} ran twice: {ran:#?}");
                if ran.is_empty() {
                    assert!(
                        recorded_lost(name, tick),
                        "{name} (at-most-once): tick {tick} neither ran nor was recorded lost"
                    );
                    lost += 1;
                }
            } else {
                assert!(!ran.is_empty(), "{name} (at-least-once): tick {tick} never ran");
                for pair in ran.windows(2) {
                    doubled += 1;
                    assert!(
                        pair[1].fence > pair[0].fence && pair[1].redelivered,
                        "{name}: tick {tick} ran again without a higher fence and CRON_REDELIVERED: {ran:#?}"
                    );
                }
            }
            tick += chrono::Duration::seconds(1);
        }
        // A job's runs start with fences that never go down (its shard's leaders' fences only
        // grow): no stale leader starts a run after a newer leader did.
        let mut by_start: Vec<&Run> = runs.iter().filter(|run| &run.job == name).collect();
        by_start.sort_by(|a, b| a.started.total_cmp(&b.started));
        let mut highest = (0, 0.0);
        for run in by_start {
            assert!(
                run.fence >= highest.0,
                "{name}: a run with fence {} started at {:.3} after one with fence {} at {:.3}",
                run.fence,
                run.started,
                highest.0,
                highest.1
            );
            if run.fence > highest.0 {
                highest = (run.fence, run.started);
            }
        }
    }
    eprintln!(
        "chaos: seed {seed}: faults {faults:?}; {checked} (job, tick) checked; {doubled} at-least-once repeats, all fenced and flagged; {lost} at-most-once ticks recorded lost; 0 violations"
    );
}
