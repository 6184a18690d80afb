//! The distributed core against a real etcd: one leader per shard, failover on SIGKILL, no
//! stale fence after SIGSTOP, handoff on SIGTERM, fenced claims, on-time firing.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::support::*;
use shardcron::rules::shard::shard_of;

on_both_etcds! {
    fn two_nodes_lead_each_shard_once_and_set_cron_variables() {
        let mut world = World::new();
        let names = job_names(6, 1);
        let config = world.write_config("jobs.toml", 4, 3, &every_second(&names, ""));
        step("start nodes a and b");
        world.node("a", &config).start();
        world.node("b", &config).start();
        step("wait until each leads two shards and stands by for the other two");
        wait_for(Duration::from_secs(20), "a balanced fleet", || {
            let shards = world.status(&config).shards;
            let leads = |id: &str| {
                shards
                    .iter()
                    .filter(|shard| shard.leader.as_deref() == Some(id))
                    .count()
            };
            shards.iter().all(|shard| shard.standby == 1) && leads("a") == 2 && leads("b") == 2
        });
        let settled = now_secs();
        let mut leaders = std::collections::HashMap::new();
        for shard in world.status(&config).shards {
            leaders.insert(shard.shard, (shard.leader.unwrap(), shard.term.unwrap()));
        }
        wait_for(Duration::from_secs(20), "every job ran 3 times since", || {
            every_job_ran_since(&world.runs(), &names, settled, 3)
        });
        for node in &world.nodes {
            node.signal(libc::SIGTERM);
        }
        for node in &mut world.nodes {
            assert_eq!(
                node.wait_exit(Duration::from_secs(15)),
                Some(0),
                "node {} exits cleanly on SIGTERM",
                node.id
            );
        }
        step("each tick ran once, with the variables of its shard's leader");
        let runs = world.runs();
        for name in &names {
            assert_each_tick_once(&runs, name, 1);
        }
        for run in &runs {
            assert_eq!(run.shard, shard_of(&run.job, 4), "{run:?}");
            assert_eq!(
                run.tick.timestamp_subsec_nanos(),
                0,
                "{run:?}: CRON_SCHEDULED_AT is the tick"
            );
            assert!((0.0..1.0).contains(&run.lateness()), "{run:?} started at its tick");
            if run.started > settled {
                let (leader, term) = &leaders[&run.shard];
                assert_eq!(
                    (&run.node, run.term),
                    (leader, *term),
                    "{run:?} carries its leader's node and term"
                );
            }
        }
    }
}

/// One shard with a per-second job `tick` and two nodes, the target leading.
fn leader_and_standby(world: &mut World, ttl: u64, extra: &str) -> Roles {
    let config = world.write_config("jobs.toml", 1, ttl, &[("tick", EVERY_SECOND, extra)]);
    world.leader_and_standby(&config)
}

on_both_etcds! {
    fn sigkill_of_the_leader_moves_its_shard_within_ttl_and_loses_no_tick() {
        let mut world = World::new();
        let ttl = 2;
        let roles = leader_and_standby(&mut world, ttl, "catch_up = \"all\"");
        let old_fence = world.runs().iter().map(|run| run.fence).max().unwrap();
        let old_term = newest_term(&world.runs());
        sleep_to_mid_second();
        step("SIGKILL the leader");
        let killed_at = now_secs();
        world.nodes[roles.leader].signal(libc::SIGKILL);
        wait_for(Duration::from_secs(15), "the standby runs 3 ticks", || {
            world
                .runs()
                .iter()
                .filter(|run| run.node == roles.standby_id && run.started > killed_at)
                .count()
                >= 3
        });
        let runs = world.runs();
        let takeover = first_start_after(&runs, &roles.standby_id, killed_at) - killed_at;
        eprintln!("takeover after SIGKILL: {takeover:.3} s (TTL {ttl} s)");
        assert!(
            takeover <= ttl as f64 + 1.0,
            "the standby ran its first tick {takeover:.3} s after the kill"
        );
        let ticks = assert_each_tick_once(&runs, "tick", 1);
        assert!(ticks.len() >= 5);
        assert!(
            runs.iter()
                .filter(|run| run.started > killed_at)
                .all(|run| run.fence > old_fence && run.term > old_term),
            "the new leader's fences and term are larger"
        );
        assert_fences_never_go_down(&runs);
    }
}

on_both_etcds! {
    fn sigstop_of_the_leader_never_runs_its_old_term_after_takeover() {
        let mut world = World::new();
        let ttl = 2;
        let roles = leader_and_standby(&mut world, ttl, "catch_up = \"all\"");
        let old_term = newest_term(&world.runs());
        sleep_to_mid_second();
        step("SIGSTOP the leader for 2×TTL");
        let stopped_at = now_secs();
        world.nodes[roles.leader].signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_secs(2 * ttl));
        step("SIGCONT the leader");
        world.nodes[roles.leader].signal(libc::SIGCONT);
        let resumed = now_secs();
        wait_for(Duration::from_secs(15), "runs go on for 3 s after the resume", || {
            world.runs().iter().any(|run| run.started > resumed + 3.0)
        });
        let runs = world.runs();
        let takeover = first_start_after(&runs, &roles.standby_id, stopped_at);
        assert!(takeover < resumed, "the standby took over while the leader was stopped");
        assert_no_run_of_term_after(&runs, old_term, takeover);
        assert_fences_never_go_down(&runs);
        assert_each_tick_once(&runs, "tick", 1);
        assert!(
            world.nodes[roles.leader].log_text().contains("session lost"),
            "the stopped leader logs why its terms ended"
        );
    }
}

on_both_etcds! {
    fn sigterm_of_the_leader_hands_over_without_missing_a_tick() {
        let mut world = World::new();
        // A long TTL: only the revoke on shutdown can make the handoff this fast.
        let roles = leader_and_standby(&mut world, 10, "");
        sleep_to_mid_second();
        step("SIGTERM the leader");
        let stopped_at = now_secs();
        world.nodes[roles.leader].signal(libc::SIGTERM);
        assert_eq!(world.nodes[roles.leader].wait_exit(Duration::from_secs(10)), Some(0));
        wait_for(Duration::from_secs(10), "the standby runs 3 ticks", || {
            world
                .runs()
                .iter()
                .filter(|run| run.node == roles.standby_id && run.started > stopped_at)
                .count()
                >= 3
        });
        let runs = world.runs();
        let first = first_start_after(&runs, &roles.standby_id, stopped_at);
        eprintln!("first run on the standby {:.3} s after SIGTERM", first - stopped_at);
        assert!(first - stopped_at < 1.0, "the standby runs the next tick");
        assert_each_tick_once(&runs, "tick", 1);
    }
}

/// How late a run starts is a benchmark's figure (docs/benchmarks.md, "Firing lateness": p99
/// against the floor of spawning alone), not this test's: beside five other scenarios on two
/// cores a start 57 ms late is the machine, not the schedule. What the schedule promises is
/// asserted here: every even second runs, none before its tick and each before the next one.
#[test]
fn an_even_second_job_runs_at_every_even_second_never_before_its_tick() {
    let mut world = World::new();
    let config = world.write_config("jobs.toml", 2, 3, &[("even", "*/2 * * * * *", "")]);
    world.node("a", &config).start();
    wait_for(Duration::from_secs(20), "4 runs", || world.runs().len() >= 4);
    let mut runs = world.runs();
    runs.sort_by_key(|run| run.tick);
    for run in &runs {
        assert_eq!(run.tick.timestamp() % 2, 0, "{run:?}");
        let lateness = run.lateness();
        assert!(
            (0.0..1.0).contains(&lateness),
            "{run:?} started {lateness:.4} s after its tick"
        );
    }
    for pair in runs.windows(2) {
        assert_eq!(
            (pair[1].tick - pair[0].tick).num_seconds(),
            2,
            "an even second skipped or run twice: {pair:#?}"
        );
    }
    let mut lateness: Vec<f64> = runs.iter().map(Run::lateness).collect();
    lateness.sort_by(f64::total_cmp);
    eprintln!(
        "lateness of {} runs: median {:.4} s, max {:.4} s",
        lateness.len(),
        lateness[lateness.len() / 2],
        lateness[lateness.len() - 1]
    );
}

#[test]
fn overlap_skip_skips_ticks_while_a_run_goes_and_allow_runs_them_all() {
    let mut world = World::new();
    let record = world.record_command();
    let text = format!(
        "[cluster]\nname = \"test\"\nshards = 1\nlease_ttl = \"3s\"\n\n[etcd]\nendpoints = [\"{}\"]\n\n\
         [jobs.slow]\nschedule = \"{EVERY_SECOND}\"\ncommand = '{record}; sleep 2.5'\n\n\
         [jobs.slow-parallel]\nschedule = \"{EVERY_SECOND}\"\ncommand = '{record}; sleep 2.5'\noverlap = \"allow\"\n",
        world.etcd.client_url()
    );
    let config = world.dir.path().join("jobs.toml");
    std::fs::write(&config, text).unwrap();
    world.node("a", &config).start();
    wait_for(Duration::from_secs(30), "slow ran 3 times", || {
        world.runs().iter().filter(|run| run.job == "slow").count() >= 3
    });
    let runs = world.runs();
    let mut slow: Vec<&Run> = runs.iter().filter(|run| run.job == "slow").collect();
    slow.sort_by_key(|run| run.tick);
    for pair in slow.windows(2) {
        assert!(
            pair[1].started - pair[0].started >= 2.5,
            "a skip job started while its previous run went on: {pair:#?}"
        );
        assert!((pair[1].tick - pair[0].tick).num_seconds() >= 3, "{pair:#?}");
    }
    let first_slow = slow[0].tick;
    let parallel = assert_each_tick_once(&runs, "slow-parallel", 1);
    assert!(
        parallel.iter().filter(|tick| **tick >= first_slow).count() >= 5,
        "the allow job ran every tick: {parallel:?}"
    );
    // Skipped as soon as the run going has run the time between the ticks, not left waiting
    // for it to end: a run that hangs keeps no queue of ticks behind it.
    assert!(world.nodes[0]
        .log_text()
        .contains("skipped: the previous run of this job on this node was still going at this tick"));
}

on_both_etcds! {
    fn a_skip_job_longer_than_its_period_drains_a_caught_up_backlog() {
        let mut world = World::new();
        let names = vec!["slow".to_string()];
        let config = world.write_config_running(
            "jobs.toml",
            1,
            2,
            &every_second(&names, "catch_up = \"all\""),
            &format!("{}; sleep 1.4", world.record_command()),
        );
        world.node("a", &config).start();
        wait_for(Duration::from_secs(20), "slow ran twice", || world.runs().len() >= 2);
        step("stop a for 6 s: b catches up the missed ticks, 1.4 s each, while live ticks come due");
        world.nodes[0].signal(libc::SIGTERM);
        assert_eq!(world.nodes[0].wait_exit(Duration::from_secs(15)), Some(0));
        std::thread::sleep(Duration::from_secs(6));
        let restarted = now_secs();
        world.node("b", &config).start();
        // Run in turn, the backlog and the ticks queued behind it would start ever later: each run
        // outlasts the period by 0.4 s. Skipping the queued ticks their next tick has outrun lets a
        // live tick start on time again once the caught-up ticks have run.
        wait_for(
            Duration::from_secs(40),
            "a run after the catch-up starts within 1 s of its tick",
            || {
                let runs = world.runs();
                let caught_up = runs
                    .iter()
                    .filter(|run| run.node == "b" && run.tick.timestamp() as f64 <= restarted)
                    .count();
                caught_up >= 5
                    && runs
                        .iter()
                        .any(|run| run.node == "b" && run.tick.timestamp() as f64 > restarted + 1.0 && run.lateness() < 1.0)
            },
        );
        let runs = world.runs();
        let late: Vec<f64> = runs.iter().filter(|run| run.node == "b").map(Run::lateness).collect();
        eprintln!("slow on b, lateness of each run in start order: {late:.2?}");
        assert!(world.nodes[1]
            .log_text()
            .contains("skipped: it waited behind a backlog"));
    }
}

on_both_etcds! {
    fn a_takeover_runs_a_large_backlog_a_few_at_a_time_and_all_of_it() {
        let mut world = World::new();
        // The node lets 4 late runs per core go at once; more jobs than that owe a backlog.
        let limit = 4 * std::thread::available_parallelism().map_or(2, usize::from);
        let names = job_names(limit + 16, 2);
        let config = world.write_config_running(
            "jobs.toml",
            1,
            2,
            &every_second(&names, "catch_up = \"all\"\noverlap = \"allow\""),
            &format!("{}; sleep 0.5", world.record_command()),
        );
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "every job ran", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 1)
        });
        world.nodes[0].signal(libc::SIGTERM);
        assert_eq!(world.nodes[0].wait_exit(Duration::from_secs(15)), Some(0));
        std::thread::sleep(Duration::from_secs(4));
        let restarted = now_secs();
        world.node("b", &config).start();
        let last_on_a = |runs: &[Run], name: &str| {
            runs.iter()
                .filter(|run| run.job == name && run.node == "a")
                .map(|run| run.tick.timestamp())
                .max()
                .expect("a ran it")
        };
        let missed = |runs: &[Run], name: &str| (last_on_a(runs, name) + 1..=restarted as i64).collect::<Vec<i64>>();
        wait_for(Duration::from_secs(60), "every missed tick ran on b", || {
            let runs = world.runs();
            names.iter().all(|name| {
                missed(&runs, name)
                    .iter()
                    .all(|tick| runs.iter().any(|run| &run.job == name && run.tick.timestamp() == *tick))
            })
        });
        let runs = world.runs();
        let mut late: Vec<f64> = runs
            .iter()
            .filter(|run| run.node == "b" && (run.tick.timestamp() as f64) < restarted)
            .map(|run| run.started)
            .collect();
        late.sort_by(f64::total_cmp);
        assert!(late.len() > limit, "{} late runs", late.len());
        // Each run holds its permit for at least 0.5 s, so no more than `limit` start within any
        // shorter window.
        let most = late
            .iter()
            .enumerate()
            .map(|(index, start)| late[index..].iter().take_while(|other| **other < start + 0.45).count())
            .max()
            .unwrap_or(0);
        assert!(
            most <= limit,
            "{most} late runs started within 0.45 s; at most {limit} may run at once"
        );
        for name in &names {
            for tick in missed(&runs, name) {
                let ran = runs
                    .iter()
                    .filter(|run| &run.job == name && run.tick.timestamp() == tick)
                    .count();
                assert_eq!(ran, 1, "{name} ran its tick {tick} {ran} times");
            }
        }
    }
}

#[test]
fn a_backlog_larger_than_the_nodes_room_is_claimed_in_parts_while_other_jobs_fire_on_time() {
    let mut world = World::new();
    // 250 jobs owing 100 ticks each: more late ticks than a node lets wait at once (10,000), so
    // the third part of 100 jobs finds no room. A builtin echo keeps 25,000 runs cheap.
    let behind = job_names(250, 3);
    let fresh: Vec<String> = (0..4).map(|index| format!("fresh{index}")).collect();
    // "allow": live ticks run beside the backlog rather than being skipped behind it.
    let mut jobs = every_second(&behind, "catch_up = \"all\"\noverlap = \"allow\"");
    jobs.extend(every_second(&fresh, ""));
    let file = world.dir.path().join("ticks.log");
    let command = format!("echo \"$CRON_JOB $CRON_SCHEDULED_AT\" >> {}", file.display());
    let config = world.write_config_running("jobs.toml", 1, 3, &jobs, &command);
    let seeded = Utc::now().timestamp() - 150;
    world.seed_job_records("test", &behind, DateTime::from_timestamp(seeded, 0).expect("instant"));
    let started = Utc::now().timestamp();
    world.node("a", &config).start();
    let ticks_of = |text: &str| -> std::collections::HashMap<String, Vec<i64>> {
        let mut ticks: std::collections::HashMap<String, Vec<i64>> = Default::default();
        for line in text.lines() {
            if let Some((job, tick)) = line.split_once(' ') {
                if let Ok(tick) = DateTime::parse_from_rfc3339(tick) {
                    ticks.entry(job.to_string()).or_default().push(tick.timestamp());
                }
            }
        }
        ticks
    };
    // Each job's backlog runs in order while its live ticks run beside it: drained once its
    // ticks have no gap.
    let contiguous = |ticks: &[i64]| {
        let mut ticks = ticks.to_vec();
        ticks.sort();
        ticks.windows(2).all(|pair| pair[1] == pair[0] + 1)
    };
    let mut ran = Default::default();
    wait_for(
        Duration::from_secs(300),
        "every backlog drained: 100 caught up, no gap, a live tick each",
        || {
            ran = ticks_of(&std::fs::read_to_string(&file).unwrap_or_default());
            behind.iter().all(|name| {
                ran.get(name)
                    .is_some_and(|ticks| ticks.len() >= 101 && contiguous(ticks))
            })
        },
    );
    assert!(
        world.nodes[0].log_text().contains("no room for more late runs"),
        "the backlog was claimed in parts"
    );
    for name in &behind {
        let mut ticks = ran[name].clone();
        ticks.sort();
        assert!(
            ticks.windows(2).all(|pair| pair[1] == pair[0] + 1),
            "{name}: from its first caught-up tick on, every tick runs once: {ticks:?}"
        );
        assert!(ticks[0] > seeded, "{name} ran {} before its record", ticks[0]);
        assert!(
            ticks[0] < started - 50,
            "{name} caught up nothing from before the start: first tick {}",
            ticks[0]
        );
    }
    // However late its part was claimed, a job catches up the newest 100 ticks missed before the
    // takeover, and every tick due since: the ticks that came while its part waited for room
    // push none of the missed ones out.
    let firsts: std::collections::BTreeSet<i64> = behind
        .iter()
        .map(|name| *ran[name].iter().min().expect("ran"))
        .collect();
    assert_eq!(
        firsts.len(),
        1,
        "the parts claimed later caught up from later ticks: first ticks {firsts:?}"
    );
    // The jobs that owed nothing fired every second from the start, backlogs or not.
    let now = Utc::now().timestamp();
    for name in &fresh {
        let mut ticks = ran.get(name).cloned().unwrap_or_default();
        ticks.sort();
        ticks.retain(|tick| *tick < now - 2);
        let first = *ticks.first().expect("it ran");
        assert!(first < started + 10, "{name} first ran at {first}, started {started}");
        let expected: Vec<i64> = (first..first + ticks.len() as i64).collect();
        assert_eq!(
            ticks, expected,
            "{name} ran every second once while the backlogs drained"
        );
        assert_eq!(*ticks.last().expect("ran"), now - 3, "{name} kept firing to the end");
    }
}

on_both_etcds! {
    /// A leader stalled within its lease still leads: the ticks due while it was stopped came due
    /// while it led, so it owes every one, whatever `catch_up` says (that is for time no leader
    /// had). They are claimed together after the stall and run late, each once.
    fn a_leader_stalled_within_its_lease_runs_every_tick_due_meanwhile_once() {
        let mut world = World::new();
        // The lease outlasts the stall, so the leader goes on leading.
        let ttl = 12;
        let names = vec!["none".to_string()];
        let config = world.write_config("jobs.toml", 1, ttl, &every_second(&names, "catch_up = \"none\""));
        world.node("a", &config).start();
        wait_for(Duration::from_secs(20), "a runs ticks", || world.runs().len() >= 2);
        sleep_to_mid_second();
        let stopped_at = now_secs();
        world.nodes[0].signal(libc::SIGSTOP);
        step("SIGSTOP the leader for 5 s, within its lease");
        std::thread::sleep(Duration::from_secs(5));
        world.nodes[0].signal(libc::SIGCONT);
        let resumed = now_secs();
        wait_for(Duration::from_secs(20), "runs go on for 2 s after the resume", || {
            world.runs().iter().any(|run| run.started > resumed + 2.0)
        });
        let runs = world.runs();
        let ticks = assert_each_tick_once(&runs, "none", 1);
        let stalled: Vec<&DateTime<Utc>> = ticks
            .iter()
            .filter(|tick| (tick.timestamp() as f64) > stopped_at && (tick.timestamp() as f64) < resumed)
            .collect();
        assert!(stalled.len() >= 4, "the ticks of the stall ran: {stalled:?}");
        assert!(world.nodes[0].log_text().contains("this leader fell behind"));
    }
}

on_both_etcds! {
    fn a_schedule_change_catches_up_no_tick_the_old_schedule_never_had() {
        let mut world = World::new();
        let every_five = world.write_config("five.toml", 1, 2, &[("j", "*/5 * * * * *", "catch_up = \"all\"")]);
        world.node("a", &every_five).start();
        wait_for(Duration::from_secs(20), "j ran once", || !world.runs().is_empty());
        world.nodes[0].signal(libc::SIGTERM);
        assert_eq!(world.nodes[0].wait_exit(Duration::from_secs(15)), Some(0));
        let last_old = world.runs().iter().map(|run| run.tick).max().expect("a run");
        // Long enough after the last tick that the new schedule would have had ticks in between.
        let start_after = last_old.timestamp() as f64 + 3.5;
        std::thread::sleep(Duration::from_secs_f64((start_after - now_secs()).max(0.0)));
        step("b starts with j every second");
        let every_second = world.write_config("second.toml", 1, 2, &[("j", EVERY_SECOND, "catch_up = \"all\"")]);
        let started = now_secs();
        world.node("b", &every_second).start();
        wait_for(Duration::from_secs(20), "b runs j twice", || {
            world.runs().iter().filter(|run| run.node == "b").count() >= 2
        });
        let caught_up: Vec<Run> = world
            .runs()
            .into_iter()
            .filter(|run| run.node == "b" && (run.tick.timestamp() as f64) < started)
            .collect();
        assert!(
            caught_up.is_empty(),
            "ticks of the new schedule from before it was in force ran: {caught_up:#?}"
        );
        assert!(world.nodes[1]
            .log_text()
            .contains("the schedule changed since the last claim"));
    }
}

/// Late runs that never end (no `timeout`) on every late permit of the node: another job's
/// backlog still runs, since a late run gives its permit back after a while.
#[test]
fn late_runs_that_never_end_do_not_stop_another_jobs_backlog() {
    let mut world = World::new();
    let permits = 4 * std::thread::available_parallelism().map_or(2, usize::from);
    let hung: Vec<String> = (0..permits).map(|index| format!("hung{index:02}")).collect();
    let mut tables: Vec<(&str, String)> = hung
        .iter()
        .map(|name| {
            (
                name.as_str(),
                // Once a year: the one late tick each owes is its only run, and it never ends.
                "schedule = \"0 0 0 1 1 *\"\ncommand = \"sleep 600\"\ncatch_up = \"latest\"\noverlap = \"allow\""
                    .to_string(),
            )
        })
        .collect();
    tables.push((
        "behind",
        format!(
            "schedule = \"* * * * * *\"\ncommand = '{}'\ncatch_up = \"all\"",
            world.record_command()
        ),
    ));
    let config = world.write_config_tables("jobs.toml", 1, 3, &tables);
    let long_ago = Utc::now() - chrono::Duration::days(400);
    world.seed_job_records("test", &hung, long_ago);
    // Seeded after the hung jobs, so its backlog is claimed after theirs took every permit.
    world.seed_job_records(
        "test",
        &["behind".to_string()],
        Utc::now() - chrono::Duration::seconds(20),
    );
    world.node("a", &config).start();
    wait_for(
        Duration::from_secs(60),
        "the backlog of `behind` ran beside the hung runs",
        || world.runs().iter().filter(|run| run.job == "behind").count() >= 20,
    );
    let log = world.nodes[0].log_text();
    assert!(
        log.contains("gives its permit back"),
        "the hung late runs gave their permits back"
    );
    assert_each_tick_once(&world.runs(), "behind", 1);
}
