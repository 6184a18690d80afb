//! When not to run and who hears about it, against a real etcd: ticks inside a blackout window
//! claimed and recorded `skipped` with its name (also those a catch-up finds), the same ticks
//! noted by `plan`; a failing job's transitions POSTed once each to a receiver on loopback,
//! also when the receiver is down for 5 s and when the leader is SIGKILLed between a failure and
//! its notification; and one success ping per successful run.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use shardcron::rules::record::{Outcome, RunRecord};

use crate::support::receiver::{Hit, Receiver};
use crate::support::*;

fn history(config: &Path, job: &str) -> Vec<RunRecord> {
    let out = shardcron(config, &["history", job, "--json", "-n", "200"]);
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

fn append(config: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new().append(true).open(config).expect("config");
    std::io::Write::write_all(&mut file, text.as_bytes()).expect("append");
}

on_both_etcds! {
    fn ticks_in_a_blackout_window_are_recorded_skipped_with_its_name_also_by_a_catch_up_and_plan_notes_them() {
        let mut world = World::new();
        // The window opens at seconds `open`, `open + 20` and `open + 40` of each minute, 3 s
        // long: ticks open, open+1, open+2. Far enough ahead for a node to start and lead before
        // the first one.
        let open = (Utc::now().second() + 10) % 20;
        let runs = world.runs_file();
        let record = world.record_command();
        let tables = [
            (
                "live",
                format!("schedule = \"{EVERY_SECOND}\"\ncommand = '{record}'\nblackouts = [\"window\"]"),
            ),
            (
                "caught",
                format!(
                    "schedule = \"{EVERY_SECOND}\"\ncommand = '{record}'\ncatch_up = \"all\"\nblackouts = [\"window\"]"
                ),
            ),
        ];
        let config = world.write_config_tables("jobs.toml", 1, 2, &tables);
        append(
            &config,
            &format!(
                "[blackouts.window]\nwindows = [{{ start = \"{open},{},{} * * * * *\", duration = \"3s\" }}]\n",
                open + 20,
                open + 40
            ),
        );

        step("plan: the three ticks of each window noted, the others not, text and JSON");
        let from = Utc::now().with_nanosecond(0).expect("a second");
        let to = from + chrono::Duration::seconds(120);
        let out = shardcron(
            &config,
            &[
                "plan",
                "--job",
                "live",
                "--from",
                &from.to_rfc3339(),
                "--to",
                &to.to_rfc3339(),
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let noted: Vec<&str> = text
            .lines()
            .filter(|line| line.contains("note=\"blackout window\""))
            .collect();
        assert_eq!(noted.len(), 18, "six windows of three ticks in two minutes:\n{text}");
        for line in &noted {
            let second: u32 = line[17..19].parse().expect("the instant's second");
            assert!((0..3).contains(&((second + 60 - open) % 20)), "{line}");
        }
        let out = shardcron(
            &config,
            &[
                "plan",
                "--json",
                "--job",
                "live",
                "--from",
                &from.to_rfc3339(),
                "--to",
                &to.to_rfc3339(),
            ],
        );
        let planned: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("plan --json");
        assert_eq!(
            planned.iter().filter(|fire| fire["note"] == "blackout window").count(),
            18
        );
        let checked = String::from_utf8_lossy(&shardcron(&config, &["check"]).stdout).into_owned();
        assert!(checked.contains("blackouts=window"), "{checked}");

        let port = world.node("a", &config).start_serving();

        step("the first window passes with the node leading: its ticks recorded skipped, not run");
        let window_at = |after: DateTime<Utc>| -> DateTime<Utc> {
            let mut at = after.with_nanosecond(0).expect("a second");
            while at.second() % 20 != open || at <= after {
                at += chrono::Duration::seconds(1);
            }
            at
        };
        let first = window_at(Utc::now() + chrono::Duration::seconds(1));
        let inside =
            |at: DateTime<Utc>| -> BTreeSet<DateTime<Utc>> { (0..3).map(|s| at + chrono::Duration::seconds(s)).collect() };
        wait_for(
            Duration::from_secs(70),
            "status shows the blackout in force during the window",
            || {
                let status = world.status(&config);
                status
                    .jobs
                    .iter()
                    .any(|job| job.name == "live" && job.blackouts_now == ["window"])
            },
        );
        let after_first = first + chrono::Duration::seconds(5);
        std::thread::sleep((after_first - Utc::now()).to_std().unwrap_or_default());
        let skipped = |job: &str, window: DateTime<Utc>| -> BTreeSet<DateTime<Utc>> {
            history(&config, job)
                .into_iter()
                .filter(|run| run.outcome == Outcome::Skipped && run.blackout.as_deref() == Some("window"))
                .map(|run| run.scheduled_at)
                .filter(|tick| inside(window).contains(tick))
                .collect()
        };
        wait_for(Duration::from_secs(15), "the window's ticks in the history", || {
            skipped("live", first) == inside(first)
        });
        let ran: Vec<Run> = read_runs(&runs).into_iter().filter(|run| run.job == "live").collect();
        assert!(
            ran.iter().all(|run| !inside(first).contains(&run.tick)),
            "a tick inside the window ran"
        );
        for edge in [
            first - chrono::Duration::seconds(1),
            first + chrono::Duration::seconds(3),
        ] {
            assert!(
                ran.iter().any(|run| run.tick == edge),
                "the tick at {edge}, next to the window, did not run"
            );
        }
        let metrics = http_get(port, "/metrics").1;
        let counted = sample(&metrics, "shardcron_blackout_skips_total{blackout=\"window\"}").unwrap_or_default();
        assert!(counted >= 6.0, "two jobs × three ticks: {counted}\n{metrics}");
        let shown = String::from_utf8_lossy(&shardcron(&config, &["history", "live", "-n", "60"]).stdout).into_owned();
        assert!(shown.contains("skipped(blackout=window)"), "{shown}");
        let logged = world.nodes[0].log_text();
        assert!(
            logged.contains("skipped: the tick falls inside a blackout"),
            "no log line"
        );

        step("SIGKILL the node before the next window, start it again after: the catch-up skips the window's ticks");
        let second = window_at(Utc::now() + chrono::Duration::seconds(3));
        std::thread::sleep(
            ((second - chrono::Duration::seconds(2)) - Utc::now())
                .to_std()
                .unwrap_or_default(),
        );
        world.nodes[0].signal(libc::SIGKILL);
        let killed_at = Utc::now();
        std::thread::sleep(
            ((second + chrono::Duration::seconds(4)) - Utc::now())
                .to_std()
                .unwrap_or_default(),
        );
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "the catch-up of the window's ticks", || {
            skipped("caught", second) == inside(second)
        });
        let ran: Vec<Run> = read_runs(&runs).into_iter().filter(|run| run.job == "caught").collect();
        assert!(
            ran.iter().all(|run| !inside(second).contains(&run.tick)),
            "a caught-up tick inside the window ran"
        );
        let after_window = second + chrono::Duration::seconds(3);
        wait_for(
            Duration::from_secs(20),
            "the ticks missed outside the window caught up",
            || {
                let ran: BTreeSet<DateTime<Utc>> = read_runs(&runs)
                    .into_iter()
                    .filter(|run| run.job == "caught")
                    .map(|run| run.tick)
                    .collect();
                ran.contains(&after_window)
            },
        );
        eprintln!(
            "killed {:.3} s before the window, started again {:.1} s after it opened",
            (second - killed_at).num_milliseconds() as f64 / 1000.0,
            4.0
        );
    }
}

/// The events the receiver took on `/hook`, as (event, dedupe key).
fn events(receiver: &Receiver) -> Vec<(String, String)> {
    receiver
        .hits_on("/hook")
        .iter()
        .map(Hit::json)
        .map(|body| {
            (
                body["event"].as_str().unwrap_or_default().to_string(),
                body["dedupe_key"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn wait_events(receiver: &Receiver, count: usize, what: &str) {
    wait_for(Duration::from_secs(60), what, || events(receiver).len() >= count);
}

/// Waits until the job's notification record holds an undelivered event.
fn wait_pending(world: &World, job: &str) {
    wait_for(
        Duration::from_secs(30),
        "an undelivered event in the job's record",
        || {
            world
                .etcd_value(&format!("/shardcron/test/notify/{job}"))
                .and_then(|value| serde_json::from_slice::<serde_json::Value>(&value).ok())
                .is_some_and(|record| record["pending"].as_array().is_some_and(|pending| !pending.is_empty()))
        },
    );
}

on_both_etcds! {
    fn a_failing_job_is_told_once_per_transition_through_a_receiver_outage_and_a_leader_kill_and_each_success_pings() {
        let mut world = World::new();
        let receiver = Receiver::start();
        let failing = world.dir.path().join("failing");
        let pinged_runs = world.dir.path().join("pinged.log");
        let tables = [
            (
                "switch",
                format!(
                    "schedule = \"{EVERY_SECOND}\"\ncommand = 'test ! -f {}'\nnotify = [\"ops\"]",
                    failing.display()
                ),
            ),
            (
                "nocatch",
                format!("schedule = \"{EVERY_SECOND}\"\ncommand = 'true'\ncatch_up = \"none\"\nnotify = [\"pager\"]"),
            ),
            (
                "pinged",
                format!(
                    "schedule = \"{EVERY_SECOND}\"\ncommand = 's=$(date -d \"$CRON_SCHEDULED_AT\" +%s); [ $((s % 2)) -eq 0 ] && echo \"$CRON_SCHEDULED_AT\" >> {}'\nping_url = \"{}\"",
                    pinged_runs.display(),
                    receiver.url("/ping/secret-uuid-4c1d")
                ),
            ),
        ];
        let config = world.write_config_tables("jobs.toml", 1, 2, &tables);
        append(
            &config,
            &format!(
                "[notify.ops]\nurl = \"{}\"\nheaders = {{ Authorization = {{ env = \"HOOK_TOKEN\" }} }}\n\n[notify.pager]\nurl = \"{}\"\non = [\"missed\"]\n",
                receiver.url("/hook"),
                receiver.url("/pager")
            ),
        );
        let token = [("HOOK_TOKEN", "Bearer s3cret-t0ken")];
        let port_a = world.node("a", &config).env(&token).start_serving();
        let port_b = world.node("b", &config).env(&token).start_serving();

        step("the job fails for 4 s, then succeeds: one failure, one recovery");
        std::fs::write(&failing, "").expect("fail");
        wait_events(&receiver, 1, "the failure");
        std::thread::sleep(Duration::from_secs(3));
        std::fs::remove_file(&failing).expect("succeed");
        wait_events(&receiver, 2, "the recovery");
        // Time for a second failure or recovery to arrive, were one told.
        std::thread::sleep(Duration::from_secs(2));
        let told = events(&receiver);
        assert_eq!(
            told.iter().map(|(event, _)| event.as_str()).collect::<Vec<_>>(),
            ["failure", "recovered"]
        );
        let hit = &receiver.hits_on("/hook")[0];
        assert_eq!(hit.method, "POST");
        assert_eq!(hit.header("authorization"), Some("Bearer s3cret-t0ken"));
        let body = hit.json();
        for field in [
            "job",
            "tick",
            "fence",
            "node",
            "outcome",
            "exit",
            "duration_ms",
            "dedupe_key",
        ] {
            assert!(!body[field].is_null(), "{field} missing from {body}");
        }
        assert_eq!(
            (body["job"].as_str(), body["outcome"].as_str(), body["exit"].as_i64()),
            (Some("switch"), Some("exited"), Some(1))
        );

        step("success pings: pause the pinged job, then one ping per successful run, none for a failed one");
        assert!(shardcron(&config, &["pause", "pinged"]).status.success());
        std::thread::sleep(Duration::from_secs(2));
        let successes = std::fs::read_to_string(&pinged_runs)
            .unwrap_or_default()
            .lines()
            .count();
        wait_for(Duration::from_secs(15), "a ping for each success", || {
            receiver.hits_on("/ping/").len() >= successes
        });
        std::thread::sleep(Duration::from_secs(1));
        let pings = receiver.hits_on("/ping/");
        assert_eq!(pings.len(), successes, "pings against successful runs");
        assert!(successes >= 3, "too few runs to say: {successes}");
        assert!(pings.iter().all(|ping| ping.method == "GET"));
        eprintln!("{successes} successful runs, {} pings", pings.len());

        step("the receiver down for 5 s as the job fails: told once it is back, once");
        receiver.down();
        let down_at = std::time::Instant::now();
        std::fs::write(&failing, "").expect("fail");
        wait_pending(&world, "switch");
        std::thread::sleep(Duration::from_secs(5).saturating_sub(down_at.elapsed()));
        receiver.up();
        wait_events(&receiver, 3, "the failure told after the outage");
        std::fs::remove_file(&failing).expect("succeed");
        wait_events(&receiver, 4, "the recovery");
        std::thread::sleep(Duration::from_secs(2));
        let told = events(&receiver);
        assert_eq!(
            told.iter().map(|(event, _)| event.as_str()).collect::<Vec<_>>(),
            ["failure", "recovered", "failure", "recovered"]
        );
        let failed_attempts = [port_a, port_b]
            .iter()
            .filter_map(|port| {
                sample(
                    &http_get(*port, "/metrics").1,
                    "shardcron_notifications_total{result=\"failed\"}",
                )
            })
            .sum::<f64>();
        assert!(failed_attempts >= 1.0, "attempts against the closed port counted");

        step("the leader SIGKILLed between a failure and its notification: its successor tells it, once");
        receiver.down();
        std::fs::write(&failing, "").expect("fail");
        wait_pending(&world, "switch");
        let (leader, _) = world.leader_of(&config, 0).expect("a leader");
        let killed = world
            .nodes
            .iter()
            .position(|node| node.id == leader)
            .expect("the leader's node");
        world.nodes[killed].signal(libc::SIGKILL);
        let killed_at = now_secs();
        receiver.up();
        wait_events(&receiver, 5, "the failure told by the successor");
        let told_after = now_secs() - killed_at;
        std::fs::remove_file(&failing).expect("succeed");
        wait_events(&receiver, 6, "the recovery");
        std::thread::sleep(Duration::from_secs(2));
        let told = events(&receiver);
        assert_eq!(
            told.iter().map(|(event, _)| event.as_str()).collect::<Vec<_>>(),
            ["failure", "recovered", "failure", "recovered", "failure", "recovered"]
        );
        let keys: BTreeSet<&String> = told.iter().map(|(_, key)| key).collect();
        assert_eq!(keys.len(), told.len(), "a dedupe key told twice: {told:?}");
        let fifth = receiver.hits_on("/hook")[4].json();
        assert_eq!(
            fifth["node"].as_str(),
            Some(leader.as_str()),
            "the failed run was the killed leader's"
        );
        eprintln!("the killed leader's failure told {told_after:.1} s after the kill (TTL 2 s)");

        step("the whole fleet down for 4 s: the ticks of catch_up = \"none\" passed meanwhile told as missed, once");
        // A takeover on a leader's death may miss no tick (the dead leader had claimed them ahead,
        // and they are redelivered): the fleet down for longer than its claims reach misses some.
        let survivor = world
            .nodes
            .iter()
            .position(|node| node.id != leader)
            .expect("the survivor");
        let survivor_id = world.nodes[survivor].id.clone();
        world.nodes[survivor].signal(libc::SIGKILL);
        let down_from = Utc::now();
        std::thread::sleep(Duration::from_secs(4));
        world.node("c", &config).env(&token).start();
        let missed = || -> Vec<serde_json::Value> {
            receiver
                .hits_on("/pager")
                .iter()
                .map(Hit::json)
                .filter(|body| body["event"] == "missed")
                .collect()
        };
        let tick_of = |body: &serde_json::Value| -> Option<DateTime<Utc>> {
            let tick = DateTime::parse_from_rfc3339(body["tick"].as_str()?).ok()?;
            Some(tick.with_timezone(&Utc))
        };
        wait_for(Duration::from_secs(30), "a missed event for the outage", || {
            missed()
                .iter()
                .any(|body| tick_of(body).is_some_and(|tick| tick >= down_from))
        });
        std::thread::sleep(Duration::from_secs(3));
        let told_missed = missed();
        let keys: BTreeSet<&str> = told_missed
            .iter()
            .filter_map(|body| body["dedupe_key"].as_str())
            .collect();
        assert_eq!(
            keys.len(),
            told_missed.len(),
            "a missed event told twice: {told_missed:?}"
        );
        let outage: Vec<&serde_json::Value> = told_missed
            .iter()
            .filter(|body| tick_of(body).is_some_and(|tick| tick >= down_from))
            .collect();
        assert_eq!(outage.len(), 1, "one missed event for the outage: {told_missed:?}");
        assert!(
            outage[0]["missed"].as_u64().is_some_and(|count| count >= 2) && outage[0]["outcome"].is_null(),
            "{}",
            outage[0]
        );
        eprintln!(
            "missed events: {} (node {survivor_id} killed 4 s before c started)",
            told_missed
                .iter()
                .map(|body| format!("{} ticks up to {}", body["missed"], body["tick"]))
                .collect::<Vec<_>>()
                .join("; ")
        );

        step("status shows the last notification; no secret in any log");
        let status = world.status(&config);
        let job = status.jobs.iter().find(|job| job.name == "switch").expect("switch");
        let last = job
            .notification
            .as_ref()
            .and_then(|told| told.last.clone())
            .expect("a last notification");
        assert_eq!((last.event.as_str(), last.result.as_str()), ("recovered", "delivered"));
        for node in &world.nodes {
            let log = node.log_text();
            for secret in ["s3cret-t0ken", "secret-uuid-4c1d"] {
                assert!(!log.contains(secret), "{secret} in the log of {}", node.id);
            }
        }
    }
}

on_both_etcds! {
    fn runs_that_end_in_the_shutdown_grace_are_told_and_pinged() {
        let mut world = World::new();
        let receiver = Receiver::start();
        let failing = world.dir.path().join("failing");
        let pinged_runs = world.dir.path().join("pinged.log");
        // Each run takes 3 s and decides at its end: at a SIGTERM, about three of each are going.
        let tables = [
            (
                "slow",
                format!(
                    "schedule = \"{EVERY_SECOND}\"\ncommand = 'sleep 3; test ! -f {}'\noverlap = \"allow\"\nnotify = [\"ops\"]",
                    failing.display()
                ),
            ),
            (
                "pinged",
                format!(
                    "schedule = \"{EVERY_SECOND}\"\ncommand = 'sleep 3; echo \"$CRON_SCHEDULED_AT\" >> {}'\noverlap = \"allow\"\nping_url = \"{}\"",
                    pinged_runs.display(),
                    receiver.url("/ping/")
                ),
            ),
        ];
        let config = world.write_config_tables("jobs.toml", 1, 2, &tables);
        append(&config, &format!("[notify.ops]\nurl = \"{}\"\n", receiver.url("/hook")));
        world
            .node("a", &config)
            .args(&["--shutdown-grace", "20s"])
            .start_serving();

        step("both jobs run: the first success pinged");
        wait_for(Duration::from_secs(30), "a first ping", || {
            !receiver.hits_on("/ping/").is_empty()
        });
        assert!(events(&receiver).is_empty(), "no failure yet: {:?}", events(&receiver));

        step("the runs going from now on fail; SIGTERM while they go: they end in the grace");
        std::fs::write(&failing, "").expect("fail");
        world.nodes[0].signal(libc::SIGTERM);
        let stopped_at = std::time::Instant::now();
        assert_eq!(
            world.nodes[0].wait_exit(Duration::from_secs(60)),
            Some(0),
            "a clean stop"
        );
        let took = stopped_at.elapsed();

        step("the failure that ended in the grace was told, and each success pinged");
        wait_for(Duration::from_secs(5), "the failure told", || {
            events(&receiver).iter().any(|(event, _)| event == "failure")
        });
        let successes = std::fs::read_to_string(&pinged_runs)
            .unwrap_or_default()
            .lines()
            .count();
        wait_for(Duration::from_secs(5), "a ping for each success", || {
            receiver.hits_on("/ping/").len() >= successes
        });
        assert_eq!(
            receiver.hits_on("/ping/").len(),
            successes,
            "pings against successful runs"
        );
        let told = events(&receiver);
        assert_eq!(
            told.iter().map(|(event, _)| event.as_str()).collect::<Vec<_>>(),
            ["failure"],
            "{told:?}"
        );
        eprintln!(
            "stopped {:.1} s after SIGTERM; {successes} successes pinged; told {told:?}",
            took.as_secs_f64()
        );
    }
}
