//! Backfill against a real etcd: every tick of a past range of a per-minute job run once, in
//! order, each with its historic `CRON_SCHEDULED_AT`, `CRON_TRIGGER=backfill` and a fresh
//! fence; the leader SIGKILLed after five, the rest run once on the next leader; a second
//! backfill cancelled part way; and what is refused before anything is written.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, DurationRound, SecondsFormat, Utc};

use crate::support::*;

/// One line a run of the job wrote: at its start or its end.
#[derive(Debug, Clone)]
struct Mark {
    start: bool,
    trigger: String,
    tick: DateTime<Utc>,
    fence: i64,
    node: String,
    redelivered: bool,
}

fn marks(path: &Path) -> Vec<Mark> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let [what, trigger, tick, fence, node, redelivered] = fields[..] else {
                return None;
            };
            Some(Mark {
                start: what == "start",
                trigger: trigger.to_string(),
                tick: DateTime::parse_from_rfc3339(tick).ok()?.with_timezone(&Utc),
                fence: fence.parse().ok()?,
                node: node.to_string(),
                redelivered: redelivered == "1",
            })
        })
        .collect()
}

fn backfill_marks(path: &Path, range: &[DateTime<Utc>]) -> Vec<Mark> {
    marks(path)
        .into_iter()
        .filter(|mark| mark.trigger == "backfill" && range.contains(&mark.tick))
        .collect()
}

/// `shardcron backfill report` of `[from, to)` with `flag`.
fn backfill_range(config: &Path, from: DateTime<Utc>, to: DateTime<Utc>, flag: &str) -> std::process::Output {
    shardcron(
        config,
        &[
            "backfill",
            "report",
            "--from",
            &rfc3339(from),
            "--to",
            &rfc3339(to),
            flag,
        ],
    )
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The job's backfill record as etcd holds it.
fn record(world: &World) -> Option<serde_json::Value> {
    let value = world.etcd_value("/shardcron/test/backfills/report")?;
    serde_json::from_slice(&value).ok()
}

fn done(world: &World) -> u64 {
    record(world).and_then(|record| record["done"].as_u64()).unwrap_or(0)
}

fn over(world: &World, id: &str) -> bool {
    record(world).is_some_and(|record| {
        record["id"] == id
            && record["in_flight"].as_array().is_some_and(Vec::is_empty)
            && (record["cancelled"] == true
                || (record["claimed"] == record["total"] && record["again"].as_array().is_none_or(Vec::is_empty)))
    })
}

on_both_etcds! {
    fn a_backfill_runs_each_past_tick_once_in_order_through_a_leader_kill_and_stops_when_cancelled() {
        let mut world = World::new();
        let marks_file = world.runs_file();
        let command = format!(
            "echo \"start $CRON_TRIGGER $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE ${{CRON_REDELIVERED:-0}}\" >> {file}; sleep 0.4; echo \"end $CRON_TRIGGER $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE ${{CRON_REDELIVERED:-0}}\" >> {file}",
            file = marks_file.display()
        );
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            2,
            &[("report", format!("schedule = \"* * * * *\"\ncommand = '{command}'\n"))],
        );
        let now = Utc::now()
            .duration_trunc(chrono::Duration::minutes(1))
            .expect("a minute");
        let from = now - chrono::Duration::minutes(40);
        let to = from + chrono::Duration::minutes(20);
        let range: Vec<DateTime<Utc>> = (0..20).map(|minute| from + chrono::Duration::minutes(minute)).collect();

        step("refused before anything is written: the future, more than --max, an unknown job, a dry run prints the ticks");
        let future = rfc3339(Utc::now() + chrono::Duration::hours(1));
        for (args, says) in [
            (
                vec!["backfill", "report", "--from", &rfc3339(from), "--to", &future],
                "in the future",
            ),
            (
                vec![
                    "backfill",
                    "report",
                    "--from",
                    &rfc3339(from),
                    "--to",
                    &rfc3339(to),
                    "--max",
                    "5",
                ],
                "--max",
            ),
            (
                vec!["backfill", "nobody", "--from", &rfc3339(from), "--to", &rfc3339(to)],
                "no job \"nobody\"",
            ),
        ] {
            let out = shardcron(&config, &args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success() && stderr.contains(says), "{args:?}: {stderr}");
        }
        let dry = backfill_range(&config, from, to, "--dry-run");
        let printed = String::from_utf8_lossy(&dry.stdout);
        assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
        assert_eq!(printed.lines().count(), 20, "{printed}");
        assert!(
            printed.lines().all(|line| line.contains(" report shard=0")),
            "{printed}"
        );
        assert!(record(&world).is_none(), "a refusal or a dry run wrote a record");

        step("start a and b; ask for 20 ticks");
        let token = "a-token-of-sixteen-bytes-or-more";
        let mut ports = BTreeMap::new();
        for id in ["a", "b"] {
            let port = shardcron::etcd_server::free_port().expect("port");
            world
                .node(id, &config)
                .args(&[
                    "--http-addr",
                    &port.to_string(),
                    "--api-token-env",
                    "BACKFILL_TEST_TOKEN",
                ])
                .env(&[("BACKFILL_TEST_TOKEN", token)])
                .start();
            ports.insert(id.to_string(), port);
        }
        wait_for(Duration::from_secs(20), "a leader of the shard", || {
            world.leader_of(&config, 0).is_some()
        });
        let asked = backfill_range(&config, from, to, "--detach");
        let said = String::from_utf8_lossy(&asked.stdout);
        assert!(
            asked.status.success() && said.contains("20 ticks"),
            "{said} {}",
            String::from_utf8_lossy(&asked.stderr)
        );
        let id = record(&world).expect("the record")["id"]
            .as_str()
            .expect("an id")
            .to_string();
        let going = world.status(&config).backfills;
        assert!(going.len() == 1 && going[0].job == "report" && going[0].backfill.total == 20 && !going[0].over);

        step("SIGKILL the leader once 5 ticks are done");
        wait_for(Duration::from_secs(30), "5 backfill ticks done", || done(&world) >= 5);
        let (leader, _) = world.leader_of(&config, 0).expect("a leader");
        let killed = world.nodes.iter().position(|node| node.id == leader).expect("ours");
        world.nodes[killed].signal(libc::SIGKILL);
        let survivor = world.nodes[1 - killed].id.clone();
        step(&format!(
            "{leader} killed with {} done; {survivor} serves the rest",
            done(&world)
        ));
        wait_for(Duration::from_secs(60), "the backfill over", || over(&world, &id));
        let record = record(&world).expect("the record");
        assert_eq!(record["done"], 20, "{record}");

        step("every tick ran to its end once, in order, with a fresh fence; the rest on the survivor");
        let seen = backfill_marks(&marks_file, &range);
        let starts: Vec<&Mark> = seen.iter().filter(|mark| mark.start).collect();
        let mut by_tick: BTreeMap<DateTime<Utc>, Vec<&Mark>> = BTreeMap::new();
        for start in &starts {
            by_tick.entry(start.tick).or_default().push(start);
        }
        assert_eq!(
            by_tick.keys().copied().collect::<Vec<_>>(),
            range,
            "every tick of the range started"
        );
        let first_starts: Vec<DateTime<Utc>> = {
            let mut firsts = Vec::new();
            for start in &starts {
                if !firsts.contains(&start.tick) {
                    firsts.push(start.tick);
                }
            }
            firsts
        };
        assert_eq!(first_starts, range, "oldest first");
        let mut repeated = 0;
        for (tick, runs) in &by_tick {
            if runs.len() > 1 {
                // Only a tick in flight on the killed node at the kill may start again: flagged, fenced
                // higher, on the survivor.
                repeated += 1;
                assert_eq!(runs.len(), 2, "{tick}: {runs:?}");
                assert!(
                    runs[0].node == leader && runs[1].node == survivor && runs[1].redelivered,
                    "{tick}: {runs:?}"
                );
                assert!(runs[1].fence > runs[0].fence, "{tick}: {runs:?}");
            } else {
                assert!(!runs[0].redelivered, "{tick}: {runs:?}");
            }
        }
        assert!(repeated <= 1, "{repeated} ticks ran twice");
        let ended: Vec<DateTime<Utc>> = seen.iter().filter(|mark| !mark.start).map(|mark| mark.tick).collect();
        assert!(
            range.iter().all(|tick| ended.contains(tick)),
            "a tick never ran to its end: {ended:?}"
        );
        step(&format!("{repeated} tick in flight at the kill ran again, flagged"));
        let fences: Vec<i64> = starts.iter().map(|start| start.fence).collect();
        assert!(
            fences.windows(2).all(|pair| pair[0] < pair[1]),
            "fences grow: {fences:?}"
        );
        let ends = seen.iter().filter(|mark| !mark.start && mark.node == survivor).count();
        assert!(
            ends >= 15,
            "{ends} ticks ended on the survivor, expected the 15 after the kill at least"
        );
        let late = starts.iter().skip(6).all(|start| start.node == survivor);
        assert!(late, "ticks after the kill ran on the killed node: {starts:?}");

        step("history shows the runs with trigger backfill");
        let history = shardcron(&config, &["history", "report", "--json", "-n", "5"]);
        let records: Vec<serde_json::Value> = serde_json::from_slice(&history.stdout).expect("history JSON");
        assert!(
            records.iter().any(|entry| entry["trigger"] == "backfill"),
            "{}",
            String::from_utf8_lossy(&history.stdout)
        );

        step("a second backfill through the API (a dry run first; a third refused while it goes)");
        let port = ports[&survivor];
        let auth = format!("Bearer {token}");
        let post = |path: &str, body: &str| {
            http_request(
                port,
                "POST",
                path,
                &[("Authorization", auth.as_str()), ("Content-Type", "application/json")],
                body,
            )
        };
        let earlier_from = from - chrono::Duration::minutes(20);
        let earlier: Vec<DateTime<Utc>> = (0..20)
            .map(|minute| earlier_from + chrono::Duration::minutes(minute))
            .collect();
        let body = format!(r#"{{"from": "{}", "to": "{}"}}"#, rfc3339(earlier_from), rfc3339(from));
        let dry = post(
            "/api/v1/jobs/report/backfill",
            &body.replace('}', r#", "dry_run": true}"#),
        );
        assert_eq!(dry.status, 200, "{}", dry.body);
        assert_eq!(dry.json()["ticks"].as_array().map(Vec::len), Some(20), "{}", dry.body);
        let future = post(
            "/api/v1/jobs/report/backfill",
            &format!(r#"{{"from": "{}", "to": "{future}"}}"#, rfc3339(from)),
        );
        assert_eq!(future.status, 400, "{}", future.body);
        let asked = post("/api/v1/jobs/report/backfill", &body);
        assert_eq!(asked.status, 202, "{}", asked.body);
        let second = asked.json()["backfill"]["id"].as_str().expect("an id").to_string();
        assert_ne!(second, id);
        let again = post("/api/v1/jobs/report/backfill", &body);
        assert_eq!(again.status, 409, "{}", again.body);
        let progress = http_request(port, "GET", "/api/v1/jobs/report/backfill", &[], "");
        assert_eq!(progress.json()["backfill"]["id"], second.as_str(), "{}", progress.body);
        step("a pause holds the backfill; a resume lets it go on");
        let paused = shardcron(&config, &["pause", "report"]);
        assert!(paused.status.success(), "{}", String::from_utf8_lossy(&paused.stderr));
        let starts = || {
            backfill_marks(&marks_file, &earlier)
                .iter()
                .filter(|mark| mark.start)
                .count()
        };
        // The run going when the pause landed ends; none starts after it.
        std::thread::sleep(Duration::from_millis(1500));
        let held = starts();
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(starts(), held, "a backfill tick started while the job was paused");
        assert!(held < 20, "{held}");
        let resumed = shardcron(&config, &["resume", "report"]);
        assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
        wait_for(
            Duration::from_secs(30),
            "the backfill going on after the resume",
            || starts() > held,
        );
        wait_for(Duration::from_secs(30), "3 ticks of the second backfill done", || {
            done(&world) >= 3
        });
        step("cancelled after 3: the rest never start");
        let before_cancel = starts();
        let cancel = shardcron(&config, &["backfill", "report", "--cancel"]);
        let said = String::from_utf8_lossy(&cancel.stdout);
        assert!(cancel.status.success() && said.contains("cancelled"), "{said}");
        wait_for(Duration::from_secs(30), "the cancelled backfill over", || {
            over(&world, &second)
        });
        let started = starts();
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(started, starts(), "a tick started after the cancel was over");
        // One claim may have been on its way as the cancel landed.
        assert!(
            started <= before_cancel + 1,
            "{started} ticks started, {before_cancel} before the cancel"
        );
        let done_then = done(&world);
        assert!((3..20).contains(&done_then), "{done_then}");
        assert_eq!(done_then as usize, started, "every tick that started was counted");
    }
}

on_both_etcds! {
    /// Through an etcd 60 ms away each way (another region), a backfill still runs: the leader's
    /// look at it makes two or three etcd calls before it may claim a tick, more than the look's
    /// budget.
    fn a_backfill_runs_through_a_slow_etcd() {
        let mut world = World::new();
        let marks_file = world.runs_file();
        let command = format!(
            "echo \"start $CRON_TRIGGER $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE ${{CRON_REDELIVERED:-0}}\" >> {file}",
            file = marks_file.display()
        );
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            5,
            &[("report", format!("schedule = \"* * * * *\"\ncommand = '{command}'\n"))],
        );
        let proxies = world.start_behind_proxies(&["a"], &config);
        wait_for(Duration::from_secs(30), "a leads the shard", || {
            world.status(&config).shards.iter().any(|shard| shard.leader.is_some())
        });
        step("etcd 60 ms away from the node, each way");
        proxies[0].slow(Duration::from_millis(60));
        let from = Utc::now()
            .duration_trunc(chrono::Duration::minutes(1))
            .expect("a minute")
            - chrono::Duration::minutes(10);
        let range: Vec<DateTime<Utc>> = (0..3).map(|minute| from + chrono::Duration::minutes(minute)).collect();
        let out = backfill_range(&config, from, from + chrono::Duration::minutes(3), "--detach");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let asked = now_secs();
        wait_for(Duration::from_secs(60), "the 3 backfill ticks ran", || {
            backfill_marks(&marks_file, &range).len() >= 3
        });
        eprintln!(
            "3 backfill ticks ran within {:.1} s through the slow etcd",
            now_secs() - asked
        );
    }
}
