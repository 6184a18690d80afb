//! A change of `shards` rolled out as docs/operating.md (Rolling restart) says, one node at a time, while per-second jobs
//! of both delivery modes fire: every (job, tick) of the window runs, or is recorded `lost` for
//! an at-most-once job, whichever shard count claimed it and whichever node stopped last.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::support::*;

const TTL: u64 = 2;
const NODES: [&str; 3] = ["a", "b", "c"];
const EVERY_OTHER_SECOND: &str = "*/2 * * * * *";

/// Whether some job record lists a tick `node` claimed that is not due yet, so it has not
/// started it.
fn owes_claimed_ticks(runtime: &tokio::runtime::Runtime, client: &mut etcd_client::Client, node: &str) -> bool {
    runtime.block_on(async {
        let options = etcd_client::GetOptions::new().with_prefix();
        let read = client
            .get("/shardcron/test/jobs/", Some(options))
            .await
            .expect("read the records");
        read.kvs().iter().any(|kv| {
            kv.key_str().is_ok_and(|key| key.ends_with("/last"))
                && serde_json::from_slice::<shardcron::rules::record::Claim>(kv.value()).is_ok_and(|claim| {
                    claim
                        .debts()
                        .any(|debt| debt.node == node && debt.pending.iter().any(|tick| *tick > Utc::now()))
                })
        })
    })
}

/// Three nodes on 4 shards, restarted one at a time on 7 with `signal`, each restart aimed a few
/// milliseconds before an instant of at-least-once jobs, claimed ahead and not started yet.
fn roll_from_four_to_seven_shards(signal: libc::c_int) {
    let mut world = World::new();
    let at_least_once = job_names(10, 2);
    let at_most_once: Vec<String> = job_names(10, 2).iter().map(|name| format!("once-{name}")).collect();
    // At-most-once jobs on even seconds only: an odd instant is then all at-least-once, claimed
    // ahead, so a node stopped just before it leaves its claims pending.
    let mut jobs = every_second(&at_least_once, "catch_up = \"all\"");
    jobs.extend(at_most_once.iter().map(|name| {
        (
            name.as_str(),
            EVERY_OTHER_SECOND,
            "catch_up = \"all\"\ndelivery = \"at-most-once\"",
        )
    }));
    let four = world.write_config("four.toml", 4, TTL, &jobs);
    let seven = world.write_config("seven.toml", 7, TTL, &jobs);
    let names: Vec<String> = at_least_once.iter().chain(&at_most_once).cloned().collect();
    for id in NODES {
        world.node(id, &four).start_serving();
    }
    wait_for(Duration::from_secs(20), "every job ran on 4 shards", || {
        every_job_ran_since(&world.runs(), &names, 0.0, 2)
    });
    let started = now_secs();
    let (runtime, mut client) = world.etcd_client();
    for id in NODES {
        // The last node of the old count is stopped only while it owes claimed ticks: no
        // successor of its elections will ever deliver them.
        let mut tick = sleep_to_tick_offset(-300);
        while tick.timestamp() % 2 == 0 || (id == "c" && !owes_claimed_ticks(&runtime, &mut client, id)) {
            tick = sleep_to_tick_offset(-300);
        }
        std::thread::sleep(
            (tick - chrono::Duration::milliseconds(5) - Utc::now())
                .to_std()
                .unwrap_or_default(),
        );
        let index = world.nodes.iter().rposition(|node| node.id == id).expect("the node");
        world.nodes[index].signal(signal);
        step(&format!(
            "signal {signal} to {id} 5 ms before {tick}; restart it on 7 shards"
        ));
        world.nodes[index].wait_exit(Duration::from_secs(15));
        world.node(id, &seven).start_serving();
    }
    let rolled = now_secs();
    wait_for(Duration::from_secs(30), "every job ran 5 ticks after the roll", || {
        every_job_ran_a_tick_after(&world.runs(), &names, rolled + 5.0)
    });
    let runs = world.runs();
    let logs: String = NODES
        .iter()
        .filter_map(|id| world.nodes.iter().find(|node| node.id == *id))
        .map(|node| node.log_text())
        .collect();
    let window_start = DateTime::<Utc>::from_timestamp(started as i64, 0).expect("a second");
    let window_end = DateTime::<Utc>::from_timestamp(rolled as i64 + 3, 0).expect("a second");
    let (mut checked, mut lost, mut repeats) = (0, 0, 0);
    for name in &names {
        let ticks = by_tick(&runs, name);
        let at_most = at_most_once.contains(name);
        let step_secs = if at_most { 2 } else { 1 };
        let mut tick = window_start + chrono::Duration::seconds(window_start.timestamp() % step_secs);
        while tick <= window_end {
            checked += 1;
            match ticks.get(&tick) {
                None => {
                    assert!(
                        at_most && recorded_lost(&logs, name, tick),
                        "{name}: tick {tick} neither ran nor was recorded lost across the change of shards"
                    );
                    lost += 1;
                }
                Some(runs) if at_most => {
                    assert_eq!(runs.len(), 1, "{name}: at-most-once tick {tick} ran twice: {runs:#?}")
                }
                Some(runs) => {
                    for pair in runs.windows(2) {
                        repeats += 1;
                        assert!(
                            pair[1].fence > pair[0].fence && pair[1].redelivered,
                            "{name}: tick {tick} ran again without a higher fence and CRON_REDELIVERED: {runs:#?}"
                        );
                    }
                }
            }
            tick += chrono::Duration::seconds(step_secs);
        }
    }
    assert_fences_never_go_down(&runs);
    if signal == libc::SIGTERM {
        assert_eq!(
            repeats, 0,
            "a graceful stop writes its starts before it leaves: nothing runs twice"
        );
    }
    eprintln!(
        "4 -> 7 shards, signal {signal}: {checked} (job, tick) checked, 0 missing without a record, {lost} at-most-once recorded lost, {repeats} at-least-once repeats, all fenced"
    );
}

on_both_etcds! {
    fn a_rolling_change_of_shards_with_sigterm_runs_or_records_every_tick() {
        roll_from_four_to_seven_shards(libc::SIGTERM);
    }
}

on_both_etcds! {
    fn a_rolling_change_of_shards_with_sigkill_runs_or_records_every_tick() {
        roll_from_four_to_seven_shards(libc::SIGKILL);
    }
}
