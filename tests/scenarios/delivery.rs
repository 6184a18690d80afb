//! Claimed ticks at the worst moments: a leader killed a few milliseconds before or after a tick
//! or stopped just after one, with many jobs due at that instant. Every (job, tick) of the
//! window is checked, not a sample.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::support::*;

/// Jobs due at every instant, so an instant's spawns take a while on a small machine.
const JOBS: usize = 8;
const TTL: u64 = 2;

/// Two nodes on one shard of `JOBS` per-second jobs with `extra`, and `catch_up = "none"`: a
/// tick at the fault's instant can then only run because it was claimed and delivered, never
/// as a missed tick caught up.
fn world_with(extra: &str) -> (World, Roles, Vec<String>) {
    let mut world = World::new();
    let names = job_names(JOBS, 1);
    let extra = format!("catch_up = \"none\"\n{extra}");
    let config = world.write_config("jobs.toml", 1, TTL, &every_second(&names, &extra));
    let roles = world.leader_and_standby(&config);
    wait_for(Duration::from_secs(15), "every job ran on the leader", || {
        every_job_ran_since(&world.runs(), &names, 0.0, 1)
    });
    (world, roles, names)
}

/// The runs of each job, by tick.
fn by_tick(runs: &[Run], job: &str) -> BTreeMap<DateTime<Utc>, Vec<Run>> {
    let mut ticks: BTreeMap<DateTime<Utc>, Vec<Run>> = BTreeMap::new();
    for run in runs.iter().filter(|run| run.job == job) {
        ticks.entry(run.tick).or_default().push(run.clone());
    }
    for runs in ticks.values_mut() {
        runs.sort_by(|a, b| a.started.total_cmp(&b.started));
    }
    ticks
}

/// Kills the leader `offset_ms` around a tick, waits for the standby to run 3 ticks of every
/// job, and returns the tick aimed at.
fn kill_around_a_tick(world: &mut World, roles: &Roles, names: &[String], offset_ms: i64) -> DateTime<Utc> {
    let tick = sleep_to_tick_offset(offset_ms);
    world.nodes[roles.leader].signal(libc::SIGKILL);
    step(&format!("SIGKILL the leader {offset_ms:+} ms from {tick}"));
    let killed_at = now_secs();
    wait_for(Duration::from_secs(20), "the standby runs 3 ticks of every job", || {
        let runs = world.runs();
        names.iter().all(|name| {
            runs.iter()
                .filter(|run| &run.job == name && run.node == roles.standby_id && run.started > killed_at)
                .count()
                >= 3
        })
    });
    tick
}

#[test]
fn a_kill_a_few_milliseconds_around_a_tick_loses_no_claimed_tick() {
    for offset_ms in [-5, 1, 30] {
        let (mut world, roles, names) = world_with("");
        let killed = kill_around_a_tick(&mut world, &roles, &names, offset_ms);
        let runs = world.runs();
        let (mut duplicates, mut redelivered) = (0, 0);
        for name in &names {
            let ticks = by_tick(&runs, name);
            let first = *ticks.keys().next().expect("runs");
            // Up to the tick aimed at, every tick was claimed: each runs, none is lost.
            let mut expected = first;
            while expected <= killed {
                assert!(
                    ticks.contains_key(&expected),
                    "{name}: tick {expected} was lost (kill {offset_ms:+} ms from {killed}): {ticks:#?}"
                );
                expected += chrono::Duration::seconds(1);
            }
            for (tick, runs) in &ticks {
                redelivered += runs.iter().filter(|run| run.redelivered).count();
                for pair in runs.windows(2) {
                    duplicates += 1;
                    assert!(
                        pair[1].fence > pair[0].fence && pair[1].redelivered,
                        "{name}: tick {tick} ran again without a higher fence and CRON_REDELIVERED: {runs:#?}"
                    );
                }
            }
        }
        eprintln!(
            "kill {offset_ms:+} ms from a tick, {JOBS} jobs due: 0 lost, {redelivered} redelivered, {duplicates} of them had started (ran twice, fenced)"
        );
    }
}

#[test]
fn an_at_most_once_tick_claimed_by_a_killed_leader_runs_once_or_is_recorded_lost() {
    let (mut world, roles, names) = world_with("delivery = \"at-most-once\"");
    let killed = kill_around_a_tick(&mut world, &roles, &names, 1);
    let runs = world.runs();
    let standby = world
        .nodes
        .iter()
        .find(|node| node.id == roles.standby_id)
        .expect("the standby")
        .log_text();
    let mut lost = 0;
    for name in &names {
        let ticks = by_tick(&runs, name);
        for (tick, runs) in &ticks {
            assert_eq!(runs.len(), 1, "{name}: tick {tick} ran twice: {runs:#?}");
        }
        let first = *ticks.keys().next().expect("runs");
        let mut expected = first;
        while expected <= killed {
            if !ticks.contains_key(&expected) {
                let recorded = standby.lines().any(|line| {
                    line.contains("lost:")
                        && line.contains(&format!("job={name} "))
                        && line.contains(&format!("tick={expected}"))
                });
                assert!(recorded, "{name}: tick {expected} neither ran nor was recorded lost");
                lost += 1;
            }
            expected += chrono::Duration::seconds(1);
        }
    }
    eprintln!("at-most-once, kill +1 ms from a tick, {JOBS} jobs due: 0 duplicates, {lost} ticks recorded lost");
}

#[test]
fn a_leader_stopped_just_after_a_tick_starts_nothing_when_it_resumes() {
    let (world, roles, _names) = world_with("");
    let old_term = newest_term(&world.runs());
    let tick = sleep_to_tick_offset(3);
    world.nodes[roles.leader].signal(libc::SIGSTOP);
    step(&format!("SIGSTOP the leader 3 ms after {tick} for 2×TTL"));
    std::thread::sleep(Duration::from_secs(2 * TTL));
    world.nodes[roles.leader].signal(libc::SIGCONT);
    let resumed = now_secs();
    step("SIGCONT the leader");
    wait_for(Duration::from_secs(15), "runs go on for 2 s after the resume", || {
        world.runs().iter().any(|run| run.started > resumed + 2.0)
    });
    let runs = world.runs();
    let takeover = first_start_after(&runs, &roles.standby_id, 0.0);
    assert_no_run_of_term_after(&runs, old_term, takeover);
    assert_fences_never_go_down(&runs);
}
