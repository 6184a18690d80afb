//! Faults against a real etcd: a leader cut off from etcd (lease stall), a split brain over a
//! fenced SQLite store, etcd's own leader killed, all of etcd down and back, and commands that
//! misbehave at run time. Every figure a scenario measures is printed for the closing notes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::*;

#[test]
fn a_leader_cut_off_from_etcd_stops_and_another_node_leads_within_two_ttl() {
    let mut world = World::new();
    let ttl = 2;
    let config = world.write_config("jobs.toml", 1, ttl, &[("tick", EVERY_SECOND, "catch_up = \"all\"")]);
    let proxies = world.start_behind_proxies(&["a", "b"], &config);
    let target = shardcron::assignment::assign(1, &["a", "b"])[0]
        .clone()
        .expect("a target");
    wait_for(Duration::from_secs(20), "the target leads and runs ticks", || {
        world.runs().iter().filter(|run| run.node == target).count() >= 2
            && world.status(&config)["shards"][0]["standby"] == 1
    });
    let leader = world.nodes.iter().position(|node| node.id == target).expect("ours");
    let other = world.nodes[1 - leader].id.clone();
    let (_, old_fence) = world.leader_of(&config, 0).expect("a leader");

    sleep_to_mid_second();
    step(&format!("cut {target} off from etcd for 1.5×TTL"));
    let cut_at = now_secs();
    proxies[leader].cut();
    let mut led_after = None;
    while now_secs() < cut_at + 1.5 * ttl as f64 {
        if led_after.is_none() && world.leader_of(&config, 0).is_some_and(|(id, _)| id == other) {
            led_after = Some(now_secs() - cut_at);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    step("heal");
    proxies[leader].heal();
    let healed_at = now_secs();
    wait_for(Duration::from_secs(20), "runs go on for 3 s after the heal", || {
        world.runs().iter().any(|run| run.started > healed_at + 3.0)
    });

    let runs = world.runs();
    let takeover = runs
        .iter()
        .filter(|run| run.node == other && run.started > cut_at)
        .map(|run| run.started)
        .fold(f64::MAX, f64::min)
        - cut_at;
    eprintln!(
        "lease stall: status shows {other} leading {:.3} s after the cut, its first run {takeover:.3} s after (TTL {ttl} s)",
        led_after.unwrap_or(f64::NAN)
    );
    assert!(
        takeover <= 2.0 * ttl as f64,
        "{other} ran its first tick {takeover:.3} s after the cut"
    );
    let stale: Vec<&Run> = runs
        .iter()
        .filter(|run| run.fence == old_fence && run.started > cut_at + takeover)
        .collect();
    assert!(
        stale.is_empty(),
        "runs with the cut leader's fence after the takeover: {stale:#?}"
    );
    assert_each_tick_once(&runs, "tick", 1);
    let log = world.nodes[leader].log_text();
    assert!(
        log.contains("session lost") && log.contains("reason=SessionLost"),
        "the cut leader logs why its term ended"
    );
}

/// The fenced-SQLite example's job, run against `db`, after recording the run as usual.
fn fenced_sqlite_command(world: &World, db: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fenced-sqlite/report.sh");
    format!("{} && {} {}", world.record_command(), script.display(), db.display())
}

fn sqlite(db: &Path, sql: &str) -> String {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
        .expect("run sqlite3 (apt-get install sqlite3)");
    assert!(
        out.status.success(),
        "sqlite3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `attempts` rows: (job, tick, fence, shard, started_at).
fn attempts(db: &Path) -> Vec<(String, String, i64, u32, f64)> {
    sqlite(
        db,
        "SELECT job, tick, fence, shard, started_at FROM attempts ORDER BY started_at",
    )
    .lines()
    .filter_map(|line| {
        let fields: Vec<&str> = line.split('|').collect();
        let [job, tick, fence, shard, started] = fields.as_slice() else {
            return None;
        };
        Some((
            job.to_string(),
            tick.to_string(),
            fence.parse().ok()?,
            shard.parse().ok()?,
            started.parse().ok()?,
        ))
    })
    .collect()
}

#[test]
fn a_split_brain_leaves_the_fenced_store_with_one_row_per_tick() {
    let mut world = World::new();
    let ttl = 5;
    let db: PathBuf = world.dir.path().join("reports.db");
    let names = job_names(6, 1);
    let jobs = every_second(&names, "catch_up = \"all\"");
    let config = world.write_config_running("jobs.toml", 6, ttl, &jobs, &fenced_sqlite_command(&world, &db));
    let ids = ["a", "b", "c"];
    let proxies = world.start_behind_proxies(&ids, &config);
    let each_leads_two = |world: &World| {
        let leaders = world.shard_leaders(&config);
        ids.iter().all(|id| {
            leaders
                .iter()
                .filter(|(leader, _)| leader.as_deref() == Some(*id))
                .count()
                == 2
        })
    };
    wait_for(Duration::from_secs(30), "each node leads 2 shards", || {
        each_leads_two(&world)
    });
    let settled = now_secs();
    wait_for(Duration::from_secs(20), "every job ran twice", || {
        every_job_ran_since(&world.runs(), &names, settled, 2)
    });

    // The busiest leader: the node whose shards hold the most jobs.
    let leaders = world.shard_leaders(&config);
    let jobs_led = |id: &str| {
        names
            .iter()
            .filter(|name| {
                let shard = shardcron::shard::shard_of(name, 6) as usize;
                leaders[shard].0.as_deref() == Some(id)
            })
            .count()
    };
    let busiest = (0..ids.len())
        .max_by_key(|&index| jobs_led(ids[index]))
        .expect("a node");
    let old_fences: BTreeSet<i64> = leaders
        .iter()
        .filter(|(leader, _)| leader.as_deref() == Some(ids[busiest]))
        .filter_map(|(_, fence)| *fence)
        .collect();
    sleep_to_mid_second();
    step(&format!(
        "cut {} (leads {} jobs) off for 2×TTL + 2 s",
        ids[busiest],
        jobs_led(ids[busiest])
    ));
    let cut_at = now_secs();
    proxies[busiest].cut();
    std::thread::sleep(Duration::from_secs(2 * ttl + 2));
    step("heal");
    proxies[busiest].heal();
    let healed_at = now_secs();
    wait_for(Duration::from_secs(30), "balanced again", || each_leads_two(&world));
    let balanced_after = now_secs() - healed_at;
    let resumed = now_secs();
    wait_for(Duration::from_secs(20), "3 more seconds of runs", || {
        every_job_ran_a_tick_after(&world.runs(), &names, resumed + 3.0)
    });
    step("stop every node, then read the store");
    for node in &world.nodes {
        node.signal(libc::SIGTERM);
    }
    for node in &mut world.nodes {
        node.wait_exit(Duration::from_secs(15));
    }

    let attempts = attempts(&db);
    let mut by_tick: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (job, tick, ..) in &attempts {
        *by_tick.entry((job.clone(), tick.clone())).or_default() += 1;
    }
    let doubled: Vec<_> = by_tick.iter().filter(|(_, count)| **count > 1).collect();
    assert!(doubled.is_empty(), "ticks run more than once: {doubled:?}");

    let mut missing = 0;
    for name in &names {
        // Every tick between the job's first and last run has exactly one row.
        let ticks: Vec<i64> = sqlite(
            &db,
            &format!("SELECT CAST(strftime('%s', tick) AS INTEGER) FROM reports WHERE job = '{name}' ORDER BY tick"),
        )
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect();
        let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
        assert!(
            (first as f64) < cut_at && (last as f64) > healed_at,
            "{name}'s rows span the cut"
        );
        let expected = (last - first + 1) as usize;
        missing += expected - ticks.len();
        assert_eq!(ticks.len(), expected, "{name}: one row per tick from {first} to {last}");
    }

    // Per shard, in the order runs started, the fence never goes back.
    let mut newest: BTreeMap<u32, i64> = BTreeMap::new();
    let mut stale = Vec::new();
    for (job, tick, fence, shard, _) in &attempts {
        let seen = newest.entry(*shard).or_default();
        if fence < seen {
            stale.push((job.clone(), tick.clone(), *fence, *seen));
        }
        *seen = (*seen).max(*fence);
    }
    assert!(
        stale.is_empty(),
        "runs that started with an older fence than their shard had run: {stale:?}"
    );
    let stale_after_cut = world
        .runs()
        .iter()
        .filter(|run| old_fences.contains(&run.fence) && run.started > cut_at + ttl as f64)
        .count();
    assert_eq!(
        stale_after_cut, 0,
        "the cut node started nothing with its old fences after its lease ran out"
    );

    step("a stale leader's late write is refused by the store");
    let (job, tick, newest_fence, shard, _) = attempts.last().expect("attempts").clone();
    let stale_fence = newest_fence - 1;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fenced-sqlite/report.sh");
    let status = Command::new(&script)
        .arg(&db)
        .arg("late write")
        .env("CRON_JOB", &job)
        .env("CRON_SCHEDULED_AT", &tick)
        .env("CRON_FENCE", stale_fence.to_string())
        .env("CRON_NODE", "stale")
        .env("CRON_SHARD", shard.to_string())
        .status()
        .expect("run report.sh");
    assert!(status.success());
    let row = sqlite(
        &db,
        &format!("SELECT fence, body FROM reports WHERE job = '{job}' AND tick = '{tick}'"),
    );
    assert!(!row.contains("late write"), "the older fence overwrote the row: {row}");
    let accepted = sqlite(&db, "SELECT accepted FROM attempts WHERE node = 'stale'");
    assert_eq!(accepted.trim(), "0");

    eprintln!(
        "split brain: {} ticks over {} jobs, {missing} rows missing, {} doubled, {} stale-fence runs; \
         balanced {balanced_after:.2} s after the heal",
        by_tick.len(),
        names.len(),
        doubled.len(),
        stale.len()
    );
    assert!(
        world.nodes[busiest].log_text().contains("session lost"),
        "the cut node logs why it stopped"
    );
}

/// Per job: the largest gap between two consecutive runs' start times, in seconds.
fn largest_start_gap(runs: &[Run], job: &str, after: f64) -> f64 {
    let mut starts: Vec<f64> = runs
        .iter()
        .filter(|run| run.job == job && run.started > after)
        .map(|run| run.started)
        .collect();
    starts.sort_by(f64::total_cmp);
    starts.windows(2).map(|pair| pair[1] - pair[0]).fold(0.0, f64::max)
}

#[test]
fn killing_the_etcd_leader_member_doubles_nothing_and_catches_up_delayed_ticks() {
    let mut world = World::with_etcd_members(3);
    let names = two_nodes_running(&mut world, 4, 3);
    let member = world.etcd.leader_member().expect("etcd has a leader");
    step(&format!("kill etcd member {member}, the raft leader"));
    let killed_at = now_secs();
    world.etcd.kill_member(member);
    wait_for(
        Duration::from_secs(30),
        "every job ran a tick 5 s after the kill",
        || every_job_ran_a_tick_after(&world.runs(), &names, killed_at + 5.0),
    );
    let runs = world.runs();
    for name in &names {
        let ticks = assert_each_tick_once(&runs, name, 1);
        assert!(
            ticks.first().is_some_and(|tick| (tick.timestamp() as f64) < killed_at),
            "{name} ran before the kill"
        );
    }
    let worst = names
        .iter()
        .map(|name| largest_start_gap(&runs, name, killed_at - 2.0))
        .fold(0.0, f64::max);
    let latest: f64 = runs
        .iter()
        .filter(|run| run.started > killed_at)
        .map(Run::lateness)
        .fold(0.0, f64::max);
    eprintln!(
        "etcd leader killed: largest gap between a job's runs {worst:.3} s, latest run {latest:.3} s after its tick, new etcd leader member {:?}",
        world.etcd.leader_member()
    );
}

/// Two nodes running `jobs` per-second `catch_up = "all"` jobs in as many shards; returns their
/// names at the middle of a second, so a fault lands between ticks.
fn two_nodes_running(world: &mut World, jobs: usize, ttl: u64) -> Vec<String> {
    let names = job_names(jobs, 1);
    let config = world.write_config(
        "jobs.toml",
        jobs as u32,
        ttl,
        &every_second(&names, "catch_up = \"all\""),
    );
    world.node("a", &config).start();
    world.node("b", &config).start();
    let started = now_secs();
    wait_for(Duration::from_secs(30), "every job ran twice", || {
        every_job_ran_since(&world.runs(), &names, started, 2)
    });
    sleep_to_mid_second();
    names
}

#[test]
fn etcd_restarted_on_its_data_nodes_resume_without_a_lost_or_doubled_tick() {
    let mut world = World::new();
    let names = two_nodes_running(&mut world, 2, 3);
    step("restart etcd on its data");
    let restarted_at = now_secs();
    world.etcd.kill();
    world.etcd.restart().expect("etcd restarts");
    wait_for(
        Duration::from_secs(30),
        "every job ran a tick 3 s after the restart",
        || every_job_ran_a_tick_after(&world.runs(), &names, restarted_at + 3.0),
    );
    let runs = world.runs();
    for name in &names {
        assert_each_tick_once(&runs, name, 1);
    }
    let resumed = runs
        .iter()
        .filter(|run| run.started > restarted_at)
        .map(|run| run.started)
        .fold(f64::MAX, f64::min);
    eprintln!(
        "etcd restarted: first run {:.3} s after the restart began",
        resumed - restarted_at
    );
}

#[test]
fn etcd_down_for_30s_stops_claims_quietly_and_catches_up_when_it_returns() {
    let mut world = World::new();
    let names = two_nodes_running(&mut world, 2, 3);
    step("stop etcd for 30 s");
    let down_at = now_secs();
    let cpu_before: Vec<f64> = world.nodes.iter().map(Node::cpu_seconds).collect();
    world.etcd.kill();
    std::thread::sleep(Duration::from_secs(30));
    let cpu_used: Vec<f64> = world
        .nodes
        .iter()
        .zip(&cpu_before)
        .map(|(node, before)| node.cpu_seconds() - before)
        .collect();
    let during: Vec<Run> = world
        .runs()
        .into_iter()
        .filter(|run| run.started > down_at + 1.0)
        .collect();
    assert!(during.is_empty(), "runs started while etcd was down: {during:#?}");
    for node in &mut world.nodes {
        assert!(
            node.child.try_wait().expect("wait").is_none(),
            "node {} is still running",
            node.id
        );
    }
    for (node, used) in world.nodes.iter().zip(&cpu_used) {
        assert!(
            *used < 5.0,
            "node {} used {used:.2} CPU-s in 30 s without etcd",
            node.id
        );
        assert!(
            node.log_text().contains("session lost"),
            "node {} logs that it lost its session",
            node.id
        );
    }

    step("start etcd again on the same data");
    let back_at = now_secs();
    world.etcd.restart().expect("etcd restarts");
    wait_for(
        Duration::from_secs(40),
        "every job ran a tick 3 s after etcd returned",
        || every_job_ran_a_tick_after(&world.runs(), &names, back_at + 3.0),
    );
    let runs = world.runs();
    let resumed = runs
        .iter()
        .filter(|run| run.started > back_at)
        .map(|run| run.started)
        .fold(f64::MAX, f64::min)
        - back_at;
    for name in &names {
        let ticks = assert_each_tick_once(&runs, name, 1);
        let outage_ticks = ticks
            .iter()
            .filter(|tick| (tick.timestamp() as f64) > down_at && (tick.timestamp() as f64) < back_at)
            .count();
        assert!(
            outage_ticks >= 29,
            "{name}: the outage's ticks were caught up ({outage_ticks})"
        );
    }
    eprintln!(
        "etcd down 30 s: CPU used during the outage {cpu_used:.2?} s per node; first run {resumed:.3} s after etcd returned; every outage tick caught up"
    );
}

#[test]
fn misbehaving_commands_are_recorded_and_the_node_keeps_running() {
    let mut world = World::new();
    let text = format!(
        r#"[cluster]
name = "test"
shards = 2
lease_ttl = "3s"

[etcd]
endpoints = ["{etcd}"]

[jobs.steady]
schedule = "* * * * * *"
command = '{record}'

[jobs.missing]
schedule = "*/2 * * * * *"
command = "shardcron-no-such-command --now"

[jobs.failing]
schedule = "*/2 * * * * *"
command = "echo failing on purpose >&2; exit 3"

[jobs.loud]
schedule = "*/5 * * * * *"
command = "head -c 3000000 /dev/zero | tr '\\000' x; echo; seq 1 20000"

[jobs.stubborn]
schedule = "*/15 * * * * *"
command = "trap '' TERM; sleep 60"
timeout = "1s"
"#,
        etcd = world.etcd.client_url(),
        record = world.record_command(),
    );
    let config = world.dir.path().join("jobs.toml");
    std::fs::write(&config, text).expect("write config");
    world.node("a", &config).start();

    wait_for(
        Duration::from_secs(60),
        "every misbehaving job has a recorded result",
        || {
            let status = world.status(&config);
            last_run(&status, "missing")["exit_code"] == 127
                && last_run(&status, "failing")["exit_code"] == 3
                && last_run(&status, "loud")["outcome"] == "exited"
                && last_run(&status, "stubborn")["outcome"] == "timeout"
        },
    );
    let status = world.status(&config);
    let stubborn = last_run(&status, "stubborn");
    let took = stubborn["duration_ms"].as_u64().unwrap_or_default();
    assert!(
        (11_000..20_000).contains(&took),
        "SIGTERM at 1 s, SIGKILL 10 s later: {stubborn}"
    );
    let loud = last_run(&status, "loud");
    assert_eq!(loud["exit_code"], 0, "{loud}");

    let node = &mut world.nodes[0];
    assert!(
        node.child.try_wait().expect("wait").is_none(),
        "the node is still running"
    );
    let rss = node.peak_rss_mib();
    let log = node.log_text();
    assert!(
        log.contains("SIGKILL to the process group"),
        "the stubborn job is killed"
    );
    assert!(
        log.contains("failing on purpose") && log.contains("stream=\"stderr\""),
        "the job's stderr lines are in the log, tagged"
    );
    let longest = log.lines().map(str::len).max().unwrap_or_default();
    assert!(
        longest < 10 * 1024,
        "output lines are cut at 8 KiB in the log, the longest is {longest} bytes"
    );
    assert!(rss < 100.0, "the node's peak resident memory is {rss:.1} MiB");
    assert_each_tick_once(&world.runs(), "steady", 1);
    eprintln!(
        "bad commands: missing → exit 127, failing → exit 3, loud (3 MB line + 20,000 lines) → exit 0, \
         stubborn → timeout after {took} ms; node peak RSS {rss:.1} MiB, longest log line {longest} bytes"
    );
}
