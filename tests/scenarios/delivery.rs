//! Claimed ticks at the worst moments: a leader killed a few milliseconds before or after a tick
//! or stopped just after one, with many jobs due at that instant. Every (job, tick) of the
//! window is checked, not a sample.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::support::*;

/// Jobs due at every instant, so an instant's spawns take a while on a small machine.
const JOBS: usize = 8;
const TTL: u64 = 2;

/// Two nodes on one shard of `JOBS` per-second jobs with `extra`, and `catch_up = "none"`
/// unless `extra` says otherwise: a tick at the fault's instant can then only run because it
/// was claimed and delivered, never as a missed tick caught up.
fn world_with(extra: &str) -> (World, Roles, Vec<String>) {
    let mut world = World::new();
    let names = job_names(JOBS, 1);
    let extra = if extra.contains("catch_up") {
        extra.to_string()
    } else {
        format!("catch_up = \"none\"\n{extra}")
    };
    let config = world.write_config("jobs.toml", 1, TTL, &every_second(&names, &extra));
    let roles = world.leader_and_standby(&config);
    wait_for(Duration::from_secs(15), "every job ran on the leader", || {
        every_job_ran_since(&world.runs(), &names, 0.0, 1)
    });
    (world, roles, names)
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

on_both_etcds! {
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
}

on_both_etcds! {
    /// Killed 5 ms before a tick, the leader may have claimed it or not (an at-most-once instant is
    /// claimed three times the claim latency before it, at least 3 ms) and started none of its
    /// runs: each claimed one must be recorded lost, each unclaimed one is missed and caught up
    /// (`catch_up = "all"`). Killed 1 ms after, some runs have started and must not run again.
    fn an_at_most_once_tick_claimed_by_a_killed_leader_runs_once_or_is_recorded_lost() {
        for offset_ms in [-5, 1] {
            let (mut world, roles, names) = world_with("delivery = \"at-most-once\"\ncatch_up = \"all\"");
            let killed = kill_around_a_tick(&mut world, &roles, &names, offset_ms);
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
                        assert!(
                            recorded_lost(&standby, name, expected),
                            "{name}: tick {expected} neither ran nor was recorded lost (kill {offset_ms:+} ms)"
                        );
                        lost += 1;
                    }
                    expected += chrono::Duration::seconds(1);
                }
            }
            eprintln!(
                "at-most-once, kill {offset_ms:+} ms from a tick, {JOBS} jobs due: 0 duplicates, {lost} ticks recorded lost"
            );
        }
    }
}

on_both_etcds! {
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
}

/// Asserts each of `names` ran every tick from its first run to its last at least once, and
/// that a tick run again carries a higher fence and `CRON_REDELIVERED`; returns the repeats.
fn assert_every_tick_ran(runs: &[Run], names: &[String]) -> usize {
    let mut repeats = 0;
    for name in names {
        let ticks = by_tick(runs, name);
        let (Some(first), Some(last)) = (ticks.keys().next(), ticks.keys().last()) else {
            panic!("{name} never ran");
        };
        let mut expected = *first;
        while expected <= *last {
            assert!(
                ticks.contains_key(&expected),
                "{name}: tick {expected} never ran: {ticks:#?}"
            );
            expected += chrono::Duration::seconds(1);
        }
        for (tick, runs) in &ticks {
            for pair in runs.windows(2) {
                repeats += 1;
                assert!(
                    pair[1].fence > pair[0].fence && pair[1].redelivered,
                    "{name}: tick {tick} ran again without a higher fence and CRON_REDELIVERED: {runs:#?}"
                );
            }
        }
    }
    repeats
}

on_both_etcds! {
    fn a_takeover_through_a_slow_etcd_that_straddles_ticks_loses_none() {
        let mut world = World::new();
        // Twice the round trip fits in the lease, so the slowed node keeps its session.
        let ttl = 4;
        let names = job_names(JOBS, 1);
        let config = world.write_config("jobs.toml", 1, ttl, &every_second(&names, "catch_up = \"all\""));
        let ids = ["a", "b"];
        let proxies = world.start_behind_proxies(&ids, &config);
        let target = shardcron::rules::assignment::assign(1, &ids)[0]
            .clone()
            .expect("a target");
        wait_for(Duration::from_secs(20), "the target leads, the other stands by", || {
            world
                .status(&config)
                .shards
                .first()
                .is_some_and(|shard| shard.leader.as_deref() == Some(target.as_str()) && shard.standby == 1)
        });
        wait_for(Duration::from_secs(15), "every job ran", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 1)
        });
        let leader = ids.iter().position(|id| *id == target).expect("ours");
        let standby = 1 - leader;
        // Every etcd call of the standby takes at least 1.2 s: its read of the records and its
        // catch-up claim each straddle a tick, whatever the phase of the takeover.
        proxies[standby].slow(Duration::from_millis(600));
        std::thread::sleep(Duration::from_secs(2));
        sleep_to_mid_second();
        step(&format!(
            "slow the standby's etcd to 1.2 s a round trip; SIGKILL {target}"
        ));
        let killed_at = now_secs();
        world.nodes[leader].signal(libc::SIGKILL);
        // Its first runs are the ticks it caught up; the ticks to check run after them.
        wait_for(
            Duration::from_secs(40),
            "the standby runs ticks due 2 s after its first run",
            || {
                let runs = world.runs();
                let first = first_start_after(&runs, ids[standby], killed_at);
                first < f64::MAX && every_job_ran_a_tick_after(&runs, &names, first + 2.0)
            },
        );
        let runs = world.runs();
        let repeats = assert_every_tick_ran(&runs, &names);
        let takeover = first_start_after(&runs, ids[standby], killed_at) - killed_at;
        eprintln!(
            "takeover through a slow etcd: first run {takeover:.3} s after the kill (TTL {ttl} s), every tick of {JOBS} jobs ran, {repeats} repeats"
        );
    }
}

on_both_etcds! {
    fn a_sigterm_while_an_instants_claims_span_several_transactions_loses_no_tick() {
        // More jobs due at one instant than one claim transaction takes (100).
        const MANY: usize = 150;
        for offset_ms in [55, 110] {
            let mut world = World::new();
            let names = job_names(MANY, 3);
            let config = world.write_config("jobs.toml", 1, TTL, &every_second(&names, "catch_up = \"none\""));
            let roles = world.leader_and_standby(&config);
            wait_for(Duration::from_secs(20), "every job ran on the leader", || {
                every_job_ran_since(&world.runs(), &names, 0.0, 1)
            });
            // The next instant is claimed once this one's runs have started: with 150 of them the
            // claims go out as two transactions, about when the signal lands.
            let tick = sleep_to_tick_offset(offset_ms);
            world.nodes[roles.leader].signal(libc::SIGTERM);
            step(&format!(
                "SIGTERM the leader {offset_ms} ms after {tick}, {MANY} jobs due every second"
            ));
            let signalled = now_secs();
            wait_for(Duration::from_secs(30), "the standby runs 2 ticks of every job", || {
                let runs = world.runs();
                let mut counts = std::collections::HashMap::new();
                for run in runs
                    .iter()
                    .filter(|run| run.node == roles.standby_id && run.started > signalled)
                {
                    *counts.entry(run.job.as_str()).or_insert(0) += 1;
                }
                names
                    .iter()
                    .all(|name| counts.get(name.as_str()).is_some_and(|count| *count >= 2))
            });
            assert_eq!(
                world.nodes[roles.leader].wait_exit(Duration::from_secs(15)),
                Some(0),
                "the leader exits cleanly"
            );
            let runs = world.runs();
            let repeats = assert_every_tick_ran(&runs, &names);
            assert_eq!(repeats, 0, "a graceful stop delivers nothing twice");
            eprintln!("SIGTERM {offset_ms} ms after a tick, {MANY} jobs due: every tick of every job ran once");
        }
    }
}

on_both_etcds! {
    fn ticks_queued_behind_a_caught_up_run_are_delivered_when_their_leader_dies() {
        let mut world = World::new();
        let names = vec!["slow".to_string()];
        let config = world.write_config_running(
            "jobs.toml",
            1,
            TTL,
            &every_second(&names, "catch_up = \"all\"\noverlap = \"allow\""),
            &format!("{}; sleep 0.8", world.record_command()),
        );
        for id in ["a", "b", "c"] {
            world.node(id, &config).start();
        }
        // The first node to enter may lead for a moment before it hands the shard to its target:
        // the leader is the one that runs while two stand by.
        let mut first = None;
        wait_for(Duration::from_secs(20), "one node leads and runs, two stand by", || {
            let shard = world.status(&config).shards.into_iter().next();
            first = shard
                .filter(|shard| shard.standby == 2)
                .and_then(|shard| shard.leader)
                .filter(|leader| world.runs().iter().any(|run| &run.node == leader));
            first.is_some()
        });
        let first = first.expect("a leader");
        sleep_to_mid_second();
        let index = |id: &str| world.nodes.iter().position(|node| node.id == id).expect("ours");
        world.nodes[index(&first)].signal(libc::SIGKILL);
        let killed_at = now_secs();
        step(&format!(
            "SIGKILL {first}: its successor catches up the missed ticks one after another, 0.8 s each"
        ));
        let mut second = None;
        wait_for(Duration::from_secs(20), "another node runs a caught-up tick", || {
            second = world
                .runs()
                .iter()
                .find(|run| run.node != first && run.started > killed_at)
                .map(|run| run.node.clone());
            second.is_some()
        });
        let second = second.expect("a successor");
        std::thread::sleep(Duration::from_millis(300));
        world.nodes[index(&second)].signal(libc::SIGKILL);
        let second_killed = now_secs();
        step(&format!(
            "SIGKILL {second} 0.3 s into its catch-up: the ticks it queued are still owed"
        ));
        // The third node runs the queued ticks one after another, 0.8 s each, while live ticks run
        // beside them: done once no tick from the first to the newest is missing, the newest 3 s
        // or more after the second kill.
        let until = second_killed as i64 + 3;
        wait_for(
            Duration::from_secs(30),
            "every tick up to 3 s after the second kill ran, and none since missing",
            || {
                let runs = world.runs();
                let ran: std::collections::BTreeSet<i64> = runs.iter().map(|run| run.tick.timestamp()).collect();
                ran.first().zip(ran.last()).is_some_and(|(first, last)| {
                    (*first..=until.max(*last)).all(|tick| ran.contains(&tick))
                })
            },
        );
        let runs = world.runs();
        let repeats = assert_every_tick_ran(&runs, &names);
        eprintln!("queued caught-up ticks after two kills: every tick ran, {repeats} repeats (fenced and flagged)");
    }
}

on_both_etcds! {
    fn a_retry_never_starts_after_a_stall_that_outlasted_the_lease() {
        let mut world = World::new();
        let names = vec!["failing".to_string()];
        let config = world.write_config_running(
            "jobs.toml",
            1,
            TTL,
            &every_second(
                &names,
                "catch_up = \"none\"\nretries = 5\nretry_backoff = \"1s\"\noverlap = \"allow\"",
            ),
            &format!("{}; exit 1", world.record_command()),
        );
        let roles = world.leader_and_standby(&config);
        let old_term = newest_term(&world.runs());
        // The attempt of the tick has failed; its retry is waiting out its backoff.
        let tick = sleep_to_tick_offset(200);
        world.nodes[roles.leader].signal(libc::SIGSTOP);
        step(&format!(
            "SIGSTOP the leader 200 ms after {tick}, during a retry's backoff, for 2×TTL"
        ));
        std::thread::sleep(Duration::from_secs(2 * TTL));
        world.nodes[roles.leader].signal(libc::SIGCONT);
        let resumed = now_secs();
        wait_for(Duration::from_secs(15), "runs go on for 3 s after the resume", || {
            world.runs().iter().any(|run| run.started > resumed + 3.0)
        });
        let runs = world.runs();
        let takeover = first_start_after(&runs, &roles.standby_id, 0.0);
        assert_no_run_of_term_after(&runs, old_term, takeover);
        assert!(world.nodes[roles.leader].log_text().contains("no more retries"));
    }
}

on_both_etcds! {
    /// A claim record that cannot be read is never taken for "no record": what it claimed is
    /// unknown. Its shard claims nothing, the node names the record, and once an operator deletes
    /// it the job fires again.
    fn an_unreadable_claim_record_stops_its_claims_instead_of_a_fresh_start() {
        let mut world = World::new();
        let names = job_names(1, 1);
        let config = world.write_config("jobs.toml", 1, TTL, &every_second(&names, ""));
        let record = "/shardcron/test/jobs/job0/last";
        let (runtime, mut client) = world.etcd_client();
        runtime.block_on(client.put(record, "not a claim", None)).expect("put");

        step("start a on a record it cannot read");
        world.node("a", &config).start();
        wait_for(Duration::from_secs(15), "a names the record", || {
            world.nodes[0].log_text().contains(record)
        });
        wait_for(Duration::from_secs(15), "a leads the shard", || {
            world.leader_of(&config, 0).is_some()
        });
        let leading = now_secs();
        wait_for(Duration::from_secs(10), "3 s of ticks", || now_secs() > leading + 3.0);
        assert!(world.runs().is_empty(), "nothing ran from a fresh start");
        assert_eq!(
            world.etcd_value(record).as_deref(),
            Some(&b"not a claim"[..]),
            "the record was not overwritten"
        );

        step("the operator deletes it: the job fires again");
        runtime.block_on(client.delete(record, None)).expect("delete");
        wait_for(Duration::from_secs(20), "job0 runs", || !world.runs().is_empty());
    }
}

on_both_etcds! {
    /// The child checks the lease's deadline as it was at the spawn. A child that reaches its check
    /// late (here: an `sh` on the node's PATH that sleeps past the TTL before its first run) is
    /// refused although the node renewed its lease meanwhile: the node spawns it again rather than
    /// leave the tick owed until another leader takes the shard, which with one node is never.
    fn a_child_refused_by_its_lease_check_while_the_lease_was_renewed_runs_all_the_same() {
        let mut world = World::new();
        let names = job_names(1, 1);
        let config = world.write_config("jobs.toml", 1, TTL, &every_second(&names, "catch_up = \"none\""));
        let slow = world.dir.path().join("slow-sh");
        std::fs::create_dir(&slow).expect("dir");
        let delayed = world.dir.path().join("delayed");
        let wrapper = slow.join("sh");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nif [ ! -e {delayed} ]; then echo \"$CRON_SCHEDULED_AT\" > {delayed}; sleep {late}; fi\nexec /bin/sh \"$@\"\n",
                delayed = delayed.display(),
                late = TTL + 1
            ),
        )
        .expect("wrapper");
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let path = format!("{}:{}", slow.display(), std::env::var("PATH").unwrap_or_default());
        world.node("a", &config).env(&[("PATH", &path)]).start();
        wait_for(Duration::from_secs(20), "a spawn was held past the TTL", || {
            std::fs::read_to_string(&delayed).is_ok_and(|text| !text.trim().is_empty())
        });
        let tick = std::fs::read_to_string(&delayed).expect("delayed tick");
        let tick: DateTime<Utc> = tick.trim().parse().expect("a tick");
        wait_for(Duration::from_secs(20), "the held tick ran", || {
            world.runs().iter().any(|run| run.tick == tick)
        });
        assert!(
            world.nodes[0].log_text().contains("spawning it again"),
            "the refusal was seen and the spawn made again"
        );
        assert_each_tick_once(&world.runs(), "job0", 1);
    }
}
