//! Concurrency groups against a real etcd: at most `limit` runs of a group's jobs at once across
//! the fleet, by the jobs' own start and end times; a tick that waits longer than the group's
//! `wait` is recorded `group_full`; a dead node's slot is freed with its lease.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shardcron::rules::record::Outcome;

use crate::support::*;

const TTL: u64 = 2;

/// One grouped run as its job wrote it: when it started and ended, by the job's own clock.
#[derive(Debug, Clone)]
struct Span {
    job: String,
    tick: String,
    node: String,
    started: f64,
    ended: f64,
}

/// A command that records its start as the world's runs do, runs `seconds`, and records its
/// end in `ends`.
fn lasting(world: &World, seconds: u32, ends: &Path) -> String {
    format!(
        "{}; sleep {seconds}; echo \"$CRON_JOB $CRON_SCHEDULED_AT $CRON_FENCE $(date +%s.%N)\" >> {}",
        world.record_command(),
        ends.display()
    )
}

/// Writes a config of `shards` with `groups` (TOML of `[groups.*]` tables) and `jobs` (name,
/// schedule, extra TOML), every job running `command`; `pool_shards` 1 for jobs with `run_on`.
fn write_grouped(world: &World, shards: u32, groups: &str, jobs: &[(String, &str, String)], command: &str) -> PathBuf {
    let tables: Vec<(&str, &str, &str)> = jobs
        .iter()
        .map(|(name, schedule, extra)| (name.as_str(), *schedule, extra.as_str()))
        .collect();
    let path = world.write_config_running("jobs.toml", shards, TTL, &tables, command);
    let text = std::fs::read_to_string(&path).expect("config");
    let text = text.replacen("\n\n[etcd]", "\npool_shards = 1\n\n[etcd]", 1);
    std::fs::write(&path, format!("{text}\n{groups}\n")).expect("config");
    path
}

/// Every run that both started and ended, from the runs file and `ends`.
fn spans(world: &World, ends: &Path) -> Vec<Span> {
    // By (job, tick, fence): a tick delivered again after its node died is a second run.
    let ended: BTreeMap<(String, String, i64), f64> = std::fs::read_to_string(ends)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let [job, tick, fence, at] = line.split_whitespace().collect::<Vec<_>>()[..] else {
                return None;
            };
            Some((
                (job.to_string(), tick.to_string(), fence.parse().ok()?),
                at.parse().ok()?,
            ))
        })
        .collect();
    world
        .runs()
        .into_iter()
        .filter_map(|run| {
            let tick = format_tick(run.tick);
            let ended = *ended.get(&(run.job.clone(), tick.clone(), run.fence))?;
            Some(Span {
                job: run.job,
                tick,
                node: run.node,
                started: run.started,
                ended,
            })
        })
        .collect()
}

/// What `shardcron` prints to stdout with `args`, which must succeed.
fn shardcron_output(args: &[&str]) -> String {
    let out = std::process::Command::new(SHARDCRON)
        .args(args)
        .output()
        .expect("run shardcron");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The most spans going at one moment.
fn most_of(spans: &[Span]) -> usize {
    most_at_once(spans.iter().map(|span| (span.started, span.ended)))
}

on_both_etcds! {
    fn a_group_of_two_runs_six_jobs_due_at_one_instant_two_at_a_time_across_three_nodes() {
        let mut world = World::new();
        let ends = world.runs_file().with_file_name("ends.log");
        let names = job_names(6, 1);
        let jobs: Vec<(String, &str, String)> = names
            .iter()
            .map(|name| (name.clone(), "*/12 * * * * *", "group = \"db\"".to_string()))
            .collect();
        let config = write_grouped(&world, 6, "[groups.db]\nlimit = 2", &jobs, &lasting(&world, 2, &ends));
        step("start three nodes; every job is due every 12 s and runs 2 s, in a group of 2");
        world.node("a", &config).start();
        world.node("b", &config).start();
        let port = world.node("c", &config).start_serving();
        let started = now_secs();
        wait_for(Duration::from_secs(70), "every job ran at two instants", || {
            let spans = spans(&world, &ends);
            names.iter().all(|name| {
                spans
                    .iter()
                    .filter(|span| &span.job == name && span.started > started)
                    .count()
                    >= 2
            })
        });
        let spans = spans(&world, &ends);
        let most = most_of(&spans);
        assert!(most <= 2, "{most} runs of the group went at once: {spans:#?}");
        let nodes: std::collections::BTreeSet<&str> = spans.iter().map(|span| span.node.as_str()).collect();
        let mut instants: BTreeMap<&str, Vec<&Span>> = BTreeMap::new();
        for span in &spans {
            instants.entry(span.tick.as_str()).or_default().push(span);
        }
        for (tick, mut runs) in instants {
            runs.sort_by(|a, b| a.started.total_cmp(&b.started));
            let jobs: Vec<&str> = runs.iter().map(|run| run.job.as_str()).collect();
            // The two that found free slots start at once, in whichever order their leaders
            // reached etcd; every run after them waited in the line, served by job name. Slots
            // freed together are handed on together: those runs start within moments of each other.
            let waited = &runs[2..];
            for (earlier, later) in waited.iter().flat_map(|x| waited.iter().map(move |y| (x, y))) {
                assert!(
                    earlier.job >= later.job || later.started >= earlier.started - 0.2,
                    "the line at {tick} was not served in order ({jobs:?}): {runs:#?}"
                );
            }
        }
        step("every run ended: the group's slots are all free again");
        let gauge = |name: &str| {
            sample(
                &http_get(port, "/metrics").1,
                &format!("shardcron_group_{name}{{group=\"db\"}}"),
            )
        };
        assert_eq!(gauge("limit"), Some(2.0));
        wait_for(
            Duration::from_secs(20),
            "no slot held and nobody waiting between instants",
            || gauge("running") == Some(0.0) && gauge("waiting") == Some(0.0),
        );
        let drain: f64 = spans.iter().map(|span| span.ended).fold(0.0, f64::max)
            - spans.iter().map(|span| span.started).fold(f64::MAX, f64::min);
        eprintln!(
            "{} grouped runs on nodes {nodes:?}: at most {most} at once; {drain:.1} s from the first start to the last end",
            spans.len()
        );
    }
}

on_both_etcds! {
    fn a_tick_that_waits_longer_than_the_groups_wait_is_recorded_group_full() {
        let mut world = World::new();
        let ends = world.runs_file().with_file_name("ends.log");
        let jobs = vec![
            ("hog".to_string(), "*/10 * * * * *", "group = \"one\"".to_string()),
            ("victim".to_string(), "2-59/10 * * * * *", "group = \"one\"".to_string()),
        ];
        let config = write_grouped(
            &world,
            2,
            "[groups.one]\nlimit = 1\nwait = \"1s\"",
            &jobs,
            &lasting(&world, 5, &ends),
        );
        step("hog holds the group's only slot for 5 s from each tenth second; victim is due 2 s in");
        world.node("a", &config).start();
        world.node("b", &config).start();
        wait_for(Duration::from_secs(40), "victim's tick recorded group_full", || {
            last_run(&world.status(&config), "victim").is_some_and(|run| run.outcome == Outcome::GroupFull)
        });
        let victim = last_run(&world.status(&config), "victim").expect("a record");
        assert_eq!(victim.attempts, 0, "a tick that got no slot never started");
        assert!(
            !world
                .runs()
                .iter()
                .any(|run| run.job == "victim" && run.tick == victim.scheduled_at),
            "the group_full tick did not run"
        );
    }
}

/// Two nodes, a (tagged a) and b (tagged b), each the only one to run its job of a group of 1:
/// both due every 15 s, 8 s long. Once one holds the slot and the other waits in line (as
/// `status` shows): the holder's first run, the holder node's index, and the waiting job.
struct Held {
    config: PathBuf,
    ends: PathBuf,
    first: Run,
    holder: usize,
    waiter: &'static str,
}

fn one_holds_the_other_waits(world: &mut World) -> Held {
    let ends = world.runs_file().with_file_name("ends.log");
    let jobs = vec![
        (
            "on-a".to_string(),
            "*/15 * * * * *",
            "group = \"one\"\nrun_on = [\"a\"]".to_string(),
        ),
        (
            "on-b".to_string(),
            "*/15 * * * * *",
            "group = \"one\"\nrun_on = [\"b\"]".to_string(),
        ),
    ];
    let config = write_grouped(world, 1, "[groups.one]\nlimit = 1", &jobs, &lasting(world, 8, &ends));
    step("on-a runs only on a, on-b only on b; both due every 15 s, 8 s long, in a group of 1");
    world.node("a", &config).args(&["--tags", "a"]).start();
    world.node("b", &config).args(&["--tags", "b"]).start();
    wait_for(Duration::from_secs(40), "one of them started", || {
        world.runs().iter().any(|run| run.job.starts_with("on-"))
    });
    let first = world
        .runs()
        .into_iter()
        .find(|run| run.job.starts_with("on-"))
        .expect("a run");
    let (holder, waiter) = match first.job.as_str() {
        "on-a" => (0, "on-b"),
        _ => (1, "on-a"),
    };
    wait_for(
        Duration::from_secs(5),
        "status shows the holder and the waiter in line",
        || {
            let status = world.status(&config);
            status.groups.first().is_some_and(|group| {
                group.running == 1
                    && group.holders.first().is_some_and(|holder| holder.job == first.job)
                    && group.line.first().is_some_and(|waiting| waiting.job == waiter)
            })
        },
    );
    let text = shardcron_output(&["status", "--config", config.to_str().expect("path")]);
    assert!(
        text.contains("GROUP") && text.contains(&format!("{}@", first.job)) && text.contains("group=one"),
        "{text}"
    );
    assert!(
        !world
            .runs()
            .iter()
            .any(|run| run.job == waiter && run.tick == first.tick),
        "{waiter} started beside the slot's holder"
    );
    Held {
        config,
        ends,
        first,
        holder,
        waiter,
    }
}

/// When `job`'s run of `tick` started, once it has, waiting at most `limit`.
fn started_within(world: &World, job: &str, tick: chrono::DateTime<chrono::Utc>, limit: Duration) -> f64 {
    let find = || world.runs().into_iter().find(|run| run.job == job && run.tick == tick);
    wait_for(limit, &format!("{job} started its run of {tick}"), || find().is_some());
    find().expect("its run").started
}

on_both_etcds! {
    fn a_slot_held_by_a_node_killed_with_sigkill_is_free_within_the_ttl() {
        let mut world = World::new();
        let held = one_holds_the_other_waits(&mut world);
        step(&format!(
            "SIGKILL the node running {} while it holds the slot",
            held.first.job
        ));
        world.nodes[held.holder].signal(libc::SIGKILL);
        let killed_at = now_secs();
        let started = started_within(&world, held.waiter, held.first.tick, Duration::from_secs(TTL + 4));
        eprintln!(
            "{} started {:.2} s after the slot's holder was killed (TTL {TTL} s)",
            held.waiter,
            started - killed_at
        );
        assert!(
            started - killed_at <= TTL as f64 + 1.0,
            "the slot was free only {:.2} s after the kill",
            started - killed_at
        );
    }
}

on_both_etcds! {
    /// The documented rule for a node that stalls past its TTL while its run holds a slot: the
    /// slot lapses with the lease and goes to the next in line; the stalled node cannot stop its
    /// run while it is stopped (the limit is passed meanwhile), and kills it the moment it wakes,
    /// recorded `killed`.
    fn a_node_stopped_past_its_ttl_loses_its_slot_and_kills_its_run_when_it_wakes() {
        let mut world = World::new();
        let held = one_holds_the_other_waits(&mut world);
        step(&format!("SIGSTOP the node running {} for TTL + 2 s", held.first.job));
        world.nodes[held.holder].signal(libc::SIGSTOP);
        let stopped_at = now_secs();
        let started = started_within(&world, held.waiter, held.first.tick, Duration::from_secs(TTL + 4));
        eprintln!(
            "{} started {:.2} s after the slot's holder was stopped (TTL {TTL} s)",
            held.waiter,
            started - stopped_at
        );
        let wake = Duration::from_secs_f64((stopped_at + TTL as f64 + 2.0 - now_secs()).max(0.0));
        std::thread::sleep(wake);
        step("SIGCONT: the node finds its slot lease expired and kills its run");
        world.nodes[held.holder].signal(libc::SIGCONT);
        wait_for(Duration::from_secs(15), "the stalled run recorded killed", || {
            last_run(&world.status(&held.config), &held.first.job)
                .is_some_and(|run| run.scheduled_at == held.first.tick && run.outcome == Outcome::Killed)
        });
        let ended = spans(&world, &held.ends);
        assert!(
            !ended
                .iter()
                .any(|span| span.job == held.first.job && span.tick == format_tick(held.first.tick)),
            "the stalled run went on to its end instead of being killed: {ended:#?}"
        );
        assert!(
            world.nodes[held.holder]
                .log_text()
                .contains("the lease of its group slot is lost"),
            "the node did not say why it killed the run"
        );
    }
}

fn format_tick(tick: chrono::DateTime<chrono::Utc>) -> String {
    tick.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Runs `shardcron ARGS --config CONFIG`, which must succeed; its stdout.
fn shardcron_on(config: &Path, args: &[&str]) -> String {
    let mut args = args.to_vec();
    args.extend(["--config", config.to_str().expect("path")]);
    shardcron_output(&args)
}

on_both_etcds! {
    fn no_slot_leaks_through_a_trigger_a_pause_a_failover_and_a_catch_up() {
        let mut world = World::new();
        let ends = world.runs_file().with_file_name("ends.log");
        let names = job_names(6, 1);
        let jobs: Vec<(String, &str, String)> = names
            .iter()
            .map(|name| {
                (
                    name.clone(),
                    "*/4 * * * * *",
                    "group = \"g\"\ncatch_up = \"all\"".to_string(),
                )
            })
            .collect();
        let config = write_grouped(&world, 3, "[groups.g]\nlimit = 2", &jobs, &lasting(&world, 1, &ends));
        step("three nodes; six jobs every 4 s of 1 s each in a group of 2: four wait at every instant");
        world.node("a", &config).start();
        world.node("b", &config).start();
        world.node("c", &config).start();
        wait_for(Duration::from_secs(30), "every job ran", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 1)
        });
        step("a run asked for by hand, and a pause of job5 (the last in line) for 5 s");
        let triggered = shardcron_on(&config, &["trigger", "job0", "--wait", "--timeout", "20s"]);
        assert!(triggered.contains("job0"), "{triggered}");
        shardcron_on(&config, &["pause", "job5", "--for", "5s"]);
        step("SIGKILL a, wait past the TTL, start it again: its shards fail over and come back");
        let leader = world.nodes.iter().position(|node| node.id == "a").expect("a");
        world.nodes[leader].signal(libc::SIGKILL);
        std::thread::sleep(Duration::from_secs(TTL + 2));
        world.node("a", &config).start();
        let restarted = now_secs();
        wait_for(Duration::from_secs(30), "every job ran after the restart", || {
            every_job_ran_since(&world.runs(), &names, restarted, 1)
        });
        step("pause every job: once the last runs end, no slot is held and nobody waits");
        shardcron_on(&config, &["pause", "--all"]);
        wait_for(Duration::from_secs(30), "the group empty in etcd", || {
            world
                .status(&config)
                .groups
                .first()
                .is_some_and(|group| group.running == 0 && group.waiting == 0)
        });
        let spans = spans(&world, &ends);
        let most = most_of(&spans);
        let outcomes: BTreeMap<String, usize> = names.iter().fold(BTreeMap::new(), |mut counts, name| {
            let history = shardcron_on(&config, &["history", name, "-n", "200", "--json"]);
            let runs: Vec<serde_json::Value> = serde_json::from_str(&history).expect("history JSON");
            for run in runs {
                *counts
                    .entry(run["outcome"].as_str().unwrap_or("?").to_string())
                    .or_default() += 1;
            }
            counts
        });
        eprintln!(
            "{} runs ended, at most {most} at once; outcomes {outcomes:?}",
            spans.len()
        );
        // The killed node's own run may go on beside its slot's next holder: one more at most.
        assert!(most <= 3, "{most} runs of a group of 2 at once: {spans:#?}");
        assert!(
            outcomes.get("paused").is_some_and(|count| *count > 0),
            "the pause settled no tick: {outcomes:?}"
        );
    }
}

on_both_etcds! {
    /// A tick's first take of the only slot of a group of 1 lands in etcd, but its reply comes
    /// back only past the call's timeout: the attempt holds the slot without knowing it. Whatever it
    /// does next, nothing of it may be left in the group once it ran: every later tick of the group
    /// runs, and the group ends empty.
    fn a_take_whose_reply_is_lost_leaves_nothing_behind_in_a_group_of_one() {
        let mut world = World::new();
        let ends = world.runs_file().with_file_name("ends.log");
        let jobs = vec![("solo".to_string(), "*/2 * * * * *", "group = \"one\"".to_string())];
        let config = write_grouped(&world, 1, "[groups.one]\nlimit = 1", &jobs, &lasting(&world, 0, &ends));
        // A lease that outlives the held-back replies: the node's own leases are not the fault here.
        let text = std::fs::read_to_string(&config).expect("config");
        std::fs::write(&config, text.replace("lease_ttl = \"2s\"", "lease_ttl = \"6s\"")).expect("config");
        let proxy = crate::support::proxy::Proxy::start(&world.etcd.client_address());
        step("one node, through a proxy; solo runs every 2 s in a group of 1");
        world.node("a", &config).via(&proxy).start();
        wait_for(Duration::from_secs(30), "solo ran twice", || {
            world.runs().iter().filter(|run| run.job == "solo").count() >= 2
        });
        let aimed = chrono::DateTime::from_timestamp(((now_secs() as i64 + 3) / 2 + 1) * 2, 0).expect("an instant");
        step(&format!(
            "hold back the reply to the take of the slot for solo's tick {aimed} for 2.6 s (the call gives up at 2 s)"
        ));
        let tick = format!("\"tick\":\"{}\"", format_tick(aimed));
        proxy.hold_reply_to(
            &[b"/shardcron/test/groups/one/slots/00000", tick.as_bytes()],
            Duration::from_millis(2600),
        );
        wait_for(Duration::from_secs(15), "the take's reply held back", || {
            proxy.replies_held() == 1
        });
        let held_at = now_secs();
        wait_for(
            Duration::from_secs(30),
            "solo ran three later ticks (none stopped by a slot nobody holds)",
            || {
                world
                    .runs()
                    .iter()
                    .filter(|run| run.job == "solo" && run.tick > aimed)
                    .count()
                    >= 3
            },
        );
        let later: Vec<Run> = world
            .runs()
            .into_iter()
            .filter(|run| run.job == "solo" && run.tick > aimed)
            .collect();
        eprintln!(
            "after the lost reply, solo's next run started {:.2} s later",
            later[0].started - held_at
        );
        step("pause solo: once its last run ended, no slot is held and nobody waits");
        shardcron_on(&config, &["pause", "solo"]);
        wait_for(Duration::from_secs(15), "the group empty in etcd", || {
            world
                .status(&config)
                .groups
                .first()
                .is_none_or(|group| group.running == 0 && group.waiting == 0)
        });
    }
}

on_both_etcds! {
    /// A busy group's limit lowered from 3 to 1 by a reload of every node: once the runs going at
    /// the reload have ended, never more than 1 run of the group goes at once, by the jobs' own
    /// start and end stamps, while its runs go on one at a time.
    fn a_limit_lowered_by_a_reload_holds_while_the_group_is_busy() {
        const LASTS: f64 = 3.0;
        let mut world = World::new();
        let ends = world.runs_file().with_file_name("ends.log");
        let names = job_names(6, 1);
        let jobs: Vec<(String, &str, String)> = names
            .iter()
            .map(|name| (name.clone(), "*/2 * * * * *", "group = \"pool\"".to_string()))
            .collect();
        let config = write_grouped(
            &world,
            2,
            "[groups.pool]\nlimit = 3",
            &jobs,
            &lasting(&world, LASTS as u32, &ends),
        );
        step("two nodes; six jobs due every 2 s, 3 s long, in a group of 3: always full, a line waiting");
        world.node("a", &config).start();
        world.node("b", &config).start();
        wait_for(Duration::from_secs(40), "3 runs of the group at once", || {
            most_of(&spans(&world, &ends)) >= 3
        });
        step("lower the limit to 1 and SIGHUP both nodes");
        let text = std::fs::read_to_string(&config).expect("config");
        std::fs::write(&config, text.replace("limit = 3", "limit = 1")).expect("config");
        for node in &world.nodes {
            node.signal(libc::SIGHUP);
        }
        wait_for(Duration::from_secs(10), "both nodes reloaded", || {
            world
                .nodes
                .iter()
                .all(|node| node.log_text().contains("reloaded jobs.toml: terms take"))
        });
        // The runs going at the reload go on to their ends: the window opens once they have.
        let from = now_secs() + LASTS + 1.5;
        let to = from + 12.0;
        std::thread::sleep(Duration::from_secs_f64(to - now_secs()));
        wait_for(Duration::from_secs(10), "every run started in the window ended", || {
            let ended = spans(&world, &ends);
            world.runs().iter().filter(|run| run.started < to).all(|run| {
                ended
                    .iter()
                    .any(|span| span.job == run.job && span.started == run.started)
            })
        });
        let window: Vec<(f64, f64)> = spans(&world, &ends)
            .iter()
            .filter(|span| span.ended > from && span.started < to)
            .map(|span| (span.started.max(from), span.ended.min(to)))
            .collect();
        let most = most_at_once(window.iter().copied());
        eprintln!(
            "{} runs of the group in the {:.0} s window from {LASTS} s after the reload: at most {most} at once",
            window.len(),
            to - from
        );
        assert!(
            window.len() >= 4,
            "the group ran only {} times in the window",
            window.len()
        );
        assert!(
            most <= 1,
            "{most} runs of a group lowered to 1 went at once: {window:?}"
        );
    }
}

on_both_etcds! {
    /// A place left in a group's line on a node's slot lease with no attempt waiting at it (what a
    /// lost reply or a failed call to leave the line leaves): its node takes it out, or frees the slot
    /// handed to it, so the group of 1 runs on instead of handing its only slot to nobody for good.
    fn a_place_nobody_waits_at_is_swept_and_the_group_of_one_runs_on() {
        let mut world = World::new();
        let ends = world.runs_file().with_file_name("ends.log");
        let jobs = vec![("solo".to_string(), "*/4 * * * * *", "group = \"one\"".to_string())];
        let config = write_grouped(&world, 1, "[groups.one]\nlimit = 1", &jobs, &lasting(&world, 2, &ends));
        step("one node; solo runs 2 s from every fourth second in a group of 1");
        world.node("a", &config).start();
        let (runtime, mut client) = world.etcd_client();
        let slot_key = "/shardcron/test/groups/one/slots/00000";
        let mut lease = 0;
        wait_for(Duration::from_secs(30), "solo holds the slot", || {
            lease = runtime
                .block_on(client.get(slot_key, None))
                .ok()
                .and_then(|read| read.kvs().first().map(|kv| kv.lease()))
                .unwrap_or(0);
            lease != 0
        });
        step("put a place for a ghost at the head of the line, on the node's slot lease");
        let due = chrono::Utc::now() - chrono::Duration::seconds(60);
        let place = shardcron::rules::groups::Place {
            due,
            job: "ghost".into(),
            fence: 1,
        };
        let ghost = shardcron::rules::groups::Holder {
            node: "a".into(),
            job: "ghost".into(),
            tick: due,
            fence: 1,
            since: due,
        };
        let place_key = format!("/shardcron/test/groups/one/waiting/{}", place.segment());
        runtime
            .block_on(client.put(
                place_key.as_str(),
                serde_json::to_vec(&ghost).expect("holder"),
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            ))
            .expect("put the ghost's place");
        let put_at = now_secs();
        wait_for(
            Duration::from_secs(30),
            "solo ran three more runs (the slot not left to the ghost)",
            || {
                world
                    .runs()
                    .iter()
                    .filter(|run| run.job == "solo" && run.started > put_at)
                    .count()
                    >= 3
            },
        );
        assert_eq!(world.etcd_value(&place_key), None, "the ghost's place is still in line");
        assert!(
            world.nodes[0].log_text().contains("no attempt of this node"),
            "the node did not say what it cleaned up"
        );
        let first = world
            .runs()
            .into_iter()
            .find(|run| run.job == "solo" && run.started > put_at)
            .expect("a run");
        eprintln!(
            "solo's first run after the ghost's place was put started {:.2} s later",
            first.started - put_at
        );
    }
}
