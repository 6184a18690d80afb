//! A randomized fault run against a real 3-member etcd and 3 nodes, each node in a network
//! namespace of its own reaching its own member through a proxy of its own. Faults drawn from a
//! seed land a few milliseconds around ticks: SIGKILL, SIGSTOP past the TTL, a cut connection,
//! the node's packets dropped silently, the node's etcd member killed, SIGTERM, and a restart on
//! the other shard count (a rolling change of `shards`, both counts running at once); each node
//! comes back before the next fault. Then every (job, tick) of the window is checked, and three
//! kinds of violation counted: a tick missing without a record, a tick run twice without a
//! higher fence, a fence going back. Needs root, like the packet-drop scenarios.
//!
//! Beside them the run carries every feature (`features`): skip and replace jobs longer than
//! their period, concurrency groups of 1 and 3, backfills, manual triggers, a pause and resume, a
//! blackout, a notifier, a pool and a fanned-out job; and three more kinds of fault: a SIGTERM
//! aimed at a node while a long run of it goes (20 s of shutdown grace), a SIGHUP reload that
//! lowers a group's limit from 3 to 1 or raises it back, and the replies of a group's tick held
//! back by the node's proxy. Its checkers are in `features::check`.
//!
//! ```text
//! cargo test --test main chaos                                   # the short run (40 s of faults, about 60 s)
//! SHARDCRON_CHAOS_SECS=600 SHARDCRON_CHAOS_SEED=42 \
//!   cargo test --release --test main chaos -- --nocapture        # a long run, replayable by seed
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::support::netns::Netns;
use crate::support::proxy::Proxy;
use crate::support::*;

mod features;

use features::check;
use features::Features;

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

fn restart(world: &mut World, id: &str, config: &std::path::Path, net: &Netns, proxy: &Proxy) {
    world
        .node(id, config)
        .under(&net.exec())
        .via(proxy)
        .args(&Features::node_args(id))
        .start();
}

/// Violations of one kind the checker found: how many, and the first few.
#[derive(Default, Debug)]
struct Found {
    count: usize,
    first: Vec<String>,
}

impl Found {
    fn note(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < 5 {
            self.first.push(what);
        }
    }
}

on_both_etcds! {
    fn a_randomized_fault_run_keeps_every_delivery_promise() {
        let seed = env_number("SHARDCRON_CHAOS_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |since| since.as_nanos() as u64)
        });
        let run_for = Duration::from_secs(env_number("SHARDCRON_CHAOS_SECS").unwrap_or(40));
        eprintln!("chaos: seed {seed}, {run_for:?} of faults (replay: SHARDCRON_CHAOS_SEED={seed})");
        let mut dice = Dice(seed | 1);
        // The features' own choices, from the seed too, apart from the faults'.
        let mut coin = Dice((seed ^ 0x9e37_79b9_7f4a_7c15) | 1);

        // Declared before the world, so they outlive its nodes.
        let nets: Vec<Netns> = IDS.iter().map(|_| Netns::create()).collect();
        let mut world = World::with_etcd_members(3);
        let least = job_names(4, 1);
        let most: Vec<String> = (0..4).map(|i| format!("once{i}")).collect();
        let mut jobs = every_second(&least, "catch_up = \"all\"");
        jobs.extend(every_second(&most, "catch_up = \"all\"\ndelivery = \"at-most-once\""));
        // Every namespace routes to the host's end of the first one's veth pair, where the
        // notifier's receiver listens.
        for net in &nets {
            net.route_to_host(nets[0].root_addr);
        }
        let mut features = Features::new(&world, nets[0].root_addr);
        // The fleet runs either shard count, and both at once while a change rolls; each with the
        // features, whose group `three` a reload changes in both.
        let write_configs = |world: &World, features: &Features| {
            let configs = [
                world.write_config("three.toml", 3, TTL, &jobs),
                world.write_config("five.toml", 5, TTL, &jobs),
            ];
            for config in &configs {
                features.add_to(config);
            }
            configs
        };
        let configs = write_configs(&world, &features);
        let mut runs_config = [0; IDS.len()];
        // When each node (by index) started on which config, for telling apart the leaders of the two
        // shard counts, which lead a job at once while a change rolls.
        let mut started_on: Vec<(f64, usize, usize)> = (0..IDS.len()).map(|index| (0.0, index, 0)).collect();
        // Each node in a network namespace of its own, reaching its own etcd member through a proxy
        // on the host's end of its veth pair: a cut holds bytes back in the proxy, a drop discards
        // packets on the veth.
        let proxies: Vec<Proxy> = (0..IDS.len())
            .map(|member| {
                let url = world.etcd.client_url_of(member);
                Proxy::start_on(nets[member].root_addr, url.trim_start_matches("http://"))
            })
            .collect();
        for (index, id) in IDS.iter().enumerate() {
            restart(&mut world, id, &configs[0], &nets[index], &proxies[index]);
        }
        let names: Vec<String> = least.iter().chain(&most).cloned().collect();
        wait_for(Duration::from_secs(30), "every job runs", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 2)
        });
        let window_start = Utc::now();
        if let Some(asked) = features.backfill_now_and_then(&configs[0]) {
            step(&asked);
        }

        let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
        let started = Instant::now();
        while started.elapsed() < run_for {
            let victim = dice.roll(IDS.len() as u64) as usize;
            let id = IDS[victim];
            let offset = dice.roll(151) as i64 - 50;
            let kind = dice.roll(10);
            let tick = sleep_to_tick_offset(offset);
            let node = latest(&world, id);
            let (net, proxy) = (&nets[victim], &proxies[victim]);
            let fault = match kind {
                0 => {
                    features.timeline.kills.push((id.to_string(), now_secs()));
                    world.nodes[node].signal(libc::SIGKILL);
                    std::thread::sleep(Duration::from_millis(500 + dice.roll(2000)));
                    restart(&mut world, id, &configs[runs_config[victim]], net, proxy);
                    "SIGKILL"
                }
                1 => {
                    let stopped = now_secs();
                    world.nodes[node].signal(libc::SIGSTOP);
                    std::thread::sleep(Duration::from_secs(TTL + 1));
                    world.nodes[node].signal(libc::SIGCONT);
                    features.timeline.stops.push((id.to_string(), stopped, now_secs()));
                    "SIGSTOP past the TTL"
                }
                2 => {
                    proxy.cut();
                    std::thread::sleep(Duration::from_millis(3 * TTL * 500));
                    proxy.heal();
                    "cut from etcd for 1.5×TTL"
                }
                3 => {
                    world.etcd.kill_member(victim);
                    std::thread::sleep(Duration::from_secs(3));
                    world.etcd.restart().expect("etcd member restarts");
                    "its etcd member killed"
                }
                4 => {
                    world.nodes[node].signal(libc::SIGTERM);
                    world.nodes[node].wait_exit(Duration::from_secs(10));
                    restart(&mut world, id, &configs[runs_config[victim]], net, proxy);
                    "SIGTERM"
                }
                5 => {
                    net.drop_packets();
                    std::thread::sleep(Duration::from_secs(2 * TTL));
                    net.heal();
                    "packets dropped for 2×TTL"
                }
                6 => {
                    let kill = dice.roll(2) == 0;
                    if kill {
                        features.timeline.kills.push((id.to_string(), now_secs()));
                    }
                    world.nodes[node].signal(if kill { libc::SIGKILL } else { libc::SIGTERM });
                    world.nodes[node].wait_exit(Duration::from_secs(10));
                    if kill {
                        // Not sooner: a run its commands stamp within 500 ms of the kill is the
                        // dead node's own (`SPAWN_IN_FLIGHT` in the checks).
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    runs_config[victim] = 1 - runs_config[victim];
                    started_on.push((now_secs(), victim, runs_config[victim]));
                    let shards = [3, 5][runs_config[victim]];
                    features
                        .timeline
                        .shard_counts
                        .push((now_secs(), id.to_string(), shards));
                    restart(&mut world, id, &configs[runs_config[victim]], net, proxy);
                    if kill {
                        "restarted on the other shard count after SIGKILL"
                    } else {
                        "restarted on the other shard count after SIGTERM"
                    }
                }
                7 => {
                    // At the node of a long run going now, so the run goes on through the grace
                    // while the others take its shards.
                    let aimed = features.a_going_run().map(|run| run.node);
                    let id = aimed.as_deref().unwrap_or(id);
                    let victim = IDS.iter().position(|each| *each == id).expect("a node of the test");
                    let node = latest(&world, id);
                    world.nodes[node].signal(libc::SIGTERM);
                    world.nodes[node].wait_exit(Duration::from_secs(30));
                    restart(
                        &mut world,
                        id,
                        &configs[runs_config[victim]],
                        &nets[victim],
                        &proxies[victim],
                    );
                    if aimed.is_some() {
                        "SIGTERM with a 20 s grace while a long run goes"
                    } else {
                        "SIGTERM with a 20 s grace (no long run going)"
                    }
                }
                8 => {
                    let before = features.limit;
                    features.limit = if before == 3 { 1 } else { 3 };
                    write_configs(&world, &features);
                    let sent = now_secs();
                    let landed = check::reload_every_node(&world, &IDS);
                    features.timeline.reloads.push((sent, landed, before, features.limit));
                    if features.limit == 1 {
                        "SIGHUP: group three's limit 3 -> 1"
                    } else {
                        "SIGHUP: group three's limit 1 -> 3"
                    }
                }
                _ => {
                    // The grouped jobs fire every 3 s: hold back what the node sends and gets around
                    // such a tick, its slot takes and their replies among them, past its calls'
                    // timeouts (the proxy of this branch cannot aim at one reply).
                    let now = Utc::now().timestamp();
                    let tick = (now / 3 + 1) * 3;
                    let at = tick as f64 + 0.005 + dice.roll(40) as f64 / 1000.0;
                    std::thread::sleep(Duration::from_secs_f64((at - now_secs()).max(0.0)));
                    proxy.cut();
                    std::thread::sleep(Duration::from_millis(2500));
                    proxy.heal();
                    "replies of a group's tick held back 2.5 s"
                }
            };
            step(&format!("{fault} on {id}, {offset:+} ms from {tick}"));
            *faults.entry(fault).or_default() += 1;
            // Now and then a feature's own action: a manual run, a pause or resume, a backfill.
            let action = match coin.roll(4) {
                0 | 1 => Some(features.trigger(&configs[0], coin.roll(5))),
                2 => Some(features.pause_or_resume(&configs[0])),
                _ => features.backfill_now_and_then(&configs[0]),
            };
            if let Some(action) = action {
                step(&action);
            }
            std::thread::sleep(Duration::from_millis(1000 + dice.roll(2000)));
        }
        features.resume_if_paused(&configs[0]);
        step("faults over: every node up; let catch-up and redelivery finish");
        let window_end = Utc::now() - chrono::Duration::seconds(1);
        let settled = now_secs();
        wait_for(Duration::from_secs(60), "every job runs again", || {
            every_job_ran_since(&world.runs(), &names, settled + 3.0, 1)
        });
        std::thread::sleep(Duration::from_secs(2 * TTL));

        let runs = world.runs();
        let logs: String = world.nodes.iter().map(Node::log_text).collect();
        // A tick that neither ran nor was recorded lost (only at-most-once ticks may be); a tick run
        // again without a higher fence and CRON_REDELIVERED, or an at-most-once tick run twice; a run
        // started with a lower fence than a run of its job before it.
        let (mut missing, mut twice, mut fence_back) = (Found::default(), Found::default(), Found::default());
        let (mut checked, mut doubled, mut lost, mut across_counts) = (0, 0, 0, 0);
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
                if ran.is_empty() {
                    if at_most_once && recorded_lost(&logs, name, tick) {
                        lost += 1;
                    } else {
                        missing.note(format!("{name}: tick {tick} neither ran nor was recorded lost"));
                    }
                } else if at_most_once && ran.len() > 1 {
                    twice.note(format!("{name} (at-most-once): tick {tick} ran twice: {ran:?}"));
                }
                if !at_most_once {
                    for pair in ran.windows(2) {
                        doubled += 1;
                        if !(pair[1].fence > pair[0].fence && pair[1].redelivered) {
                            twice.note(format!(
                                "{name}: tick {tick} ran again without a higher fence and CRON_REDELIVERED: {ran:?}"
                            ));
                        }
                    }
                }
                tick += chrono::Duration::seconds(1);
            }
            // Within one shard count, a job's runs start with fences that never go down: no stale
            // leader starts a run after a newer leader did. While a change of `shards` rolls, a
            // leader of each count leads the job at once; each tick is still claimed once, but
            // their runs of different ticks need not start in fence order (counted apart).
            let shard_count_of = |run: &Run| {
                let node = IDS.iter().position(|id| *id == run.node).expect("a node of the test");
                started_on
                    .iter()
                    .filter(|(at, index, _)| *index == node && *at <= run.started)
                    .map(|(_, _, config)| *config)
                    .next_back()
                    .unwrap_or(0)
            };
            let mut by_start: Vec<&Run> = runs.iter().filter(|run| &run.job == name).collect();
            by_start.sort_by(|a, b| a.started.total_cmp(&b.started));
            let mut highest = [(0, 0.0); 2];
            let mut highest_of_any = 0;
            for run in by_start {
                let count = shard_count_of(run);
                if run.fence < highest[count].0 {
                    fence_back.note(format!(
                        "{name}: a run with fence {} started at {:.3} after one with fence {} at {:.3}, both under the same shard count",
                        run.fence, run.started, highest[count].0, highest[count].1
                    ));
                } else if run.fence < highest_of_any {
                    across_counts += 1;
                }
                if run.fence > highest[count].0 {
                    highest[count] = (run.fence, run.started);
                }
                highest_of_any = highest_of_any.max(run.fence);
            }
        }
        // A skip job whose runs outlast its period leaves a backlog of redelivered ticks after
        // many takeovers (each runs: at-least-once), and its backfill waits behind it; a long run
        // leaves minutes of it.
        step("the features: let the backfills end, then check");
        let _ = wait_within(Duration::from_secs(90).max(run_for / 2), || {
            features.timeline.backfills.iter().all(|(job, ticks)| {
                let runs = features::stamps_of(&features.dir, job);
                ticks.iter().all(|tick| {
                    runs.iter()
                        .any(|run| run.trigger == "backfill" && run.tick == *tick && run.ended.is_some())
                })
            })
        });
        let mut verdict = check::check(&features);
        step("stop the fleet; its leases expire; list the groups' keys");
        check::stop_and_list_groups(&mut world, TTL, &mut verdict);
        eprintln!(
            "chaos: seed {seed}: features: {}; {}",
            check::counts(&features),
            verdict.figures()
        );
        eprintln!(
            "chaos: seed {seed}: faults {faults:?}; {checked} (job, tick) checked; missing without a record {}, run twice without a higher fence {}, fence back {}; {doubled} at-least-once repeats; {lost} at-most-once ticks recorded lost; {across_counts} runs out of fence order across the two shard counts",
            missing.count, twice.count, fence_back.count
        );
        assert_eq!(
            (missing.count, twice.count, fence_back.count),
            (0, 0, 0),
            "violations (seed {seed}): missing {missing:?}; twice {twice:?}; fence back {fence_back:?}"
        );
        assert_eq!(
            verdict.violations(),
            0,
            "feature violations (seed {seed}): {:#?}",
            verdict.found
        );
    }
}
