//! etcd's space: a node compacts etcd's history, a watch of ours goes on across a compaction,
//! and etcd's NOSPACE alarm, raised under running nodes, is said by each of them and loses no
//! tick.

use std::time::Duration;

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, GetOptions};
use shardcron::etcd_server::EtcdServer;

use crate::support::*;

/// The node's log lines at WARN level that contain `text`.
fn warnings_with(log: &str, text: &str) -> usize {
    log.lines()
        .filter(|line| line.contains(" WARN ") && line.contains(text))
        .count()
}

/// Puts 1 MiB values until etcd refuses one for want of space, which raises its NOSPACE alarm.
fn fill(world: &World) -> usize {
    let (runtime, mut client) = world.etcd_client();
    let value = vec![b'x'; 1 << 20];
    runtime.block_on(async {
        for index in 0..256 {
            match client.put(format!("/fill/{index}"), value.clone(), None).await {
                Ok(_) => {}
                Err(err) if err.to_string().contains("space exceeded") => return index,
                Err(err) => panic!("filling etcd: {err}"),
            }
        }
        panic!("etcd took 256 MiB under a quota of a few");
    })
}

/// Frees what [`fill`] took the way an operator would: delete, compact, defragment, then
/// disarm the alarm.
fn free_and_disarm(world: &World) {
    let (runtime, mut client) = world.etcd_client();
    runtime.block_on(async {
        let deleted = client
            .delete("/fill/", Some(etcd_client::DeleteOptions::new().with_prefix()))
            .await
            .expect("delete the filler");
        let revision = deleted.header().expect("a header").revision();
        client
            .compact(revision, Some(etcd_client::CompactionOptions::new().with_physical()))
            .await
            .expect("compact");
        client.defragment().await.expect("defragment");
        let alarms = client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .expect("alarms");
        for alarm in alarms.alarms() {
            let mut options = AlarmOptions::new();
            options.with_member(alarm.member_id());
            client
                .alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
                .await
                .expect("disarm");
        }
    });
}

on_both_etcds! {
    fn etcd_out_of_space_is_said_by_every_node_and_no_tick_is_lost() {
        // A quota of a few MiB: the filler raises the alarm in a few puts.
        let etcd = EtcdServer::start_with_flags(&etcd_bin(), &["--quota-backend-bytes=8388608"]).expect("etcd");
        let mut world = World::with_etcd(etcd, tempfile::tempdir().expect("temp dir"));
        let names = job_names(4, 1);
        let config = world.write_config("jobs.toml", 2, 5, &every_second(&names, "catch_up = \"all\""));
        let ports = [
            shardcron::etcd_server::free_port().expect("port"),
            shardcron::etcd_server::free_port().expect("port"),
        ];
        step("start a and b, each with its HTTP listener");
        for (id, port) in ["a", "b"].iter().zip(ports) {
            world
                .node(id, &config)
                .args(&["--http-addr", &port.to_string()])
                .start();
            wait_ready(port);
        }
        wait_for(Duration::from_secs(20), "every job runs", || {
            every_job_ran_since(&world.runs(), &names, 0.0, 2)
        });
        for port in ports {
            wait_for(
                Duration::from_secs(15),
                "each node exports etcd's size and quota",
                || {
                    let page = http_get(port, "/metrics").1;
                    sample(&page, "shardcron_etcd_quota_bytes") == Some(8_388_608.0)
                        && sample(&page, "shardcron_etcd_db_bytes").is_some_and(|bytes| bytes > 0.0)
                        && sample(&page, "shardcron_etcd_db_in_use_bytes").is_some_and(|bytes| bytes > 0.0)
                        && sample(&page, "shardcron_etcd_nospace") == Some(0.0)
                },
            );
        }

        step("fill etcd until it raises NOSPACE");
        let filled = fill(&world);
        let raised = now_secs();
        step(&format!("NOSPACE after {filled} MiB"));
        for port in ports {
            wait_for(
                Duration::from_secs(15),
                "each node's /readyz says etcd is out of space",
                || {
                    let (status, body) = http_get(port, "/readyz");
                    status.contains(" 503 ") && body.contains("NOSPACE")
                },
            );
            wait_for(Duration::from_secs(15), "each node's metric says NOSPACE", || {
                sample(&http_get(port, "/metrics").1, "shardcron_etcd_nospace") == Some(1.0)
            });
        }
        step("start c, of another cluster on the same etcd, under the alarm: it cannot get a lease");
        let other = world.write_config("other.toml", 1, 5, &[]);
        let text = std::fs::read_to_string(&other).expect("config");
        std::fs::write(&other, text.replace("name = \"test\"", "name = \"other\"")).expect("config");
        let late_port = shardcron::etcd_server::free_port().expect("port");
        world
            .node("c", &other)
            .args(&["--http-addr", &late_port.to_string()])
            .start();
        wait_for(
            Duration::from_secs(15),
            "c's /readyz says etcd is out of space, not the refused lease",
            || {
                std::net::TcpStream::connect(("127.0.0.1", late_port)).is_ok() && {
                    let (status, body) = http_get(late_port, "/readyz");
                    status.contains(" 503 ") && body.contains("NOSPACE")
                }
            },
        );

        step("hold the alarm for 5 s of ticks");
        wait_for(Duration::from_secs(10), "5 s under the alarm", || {
            now_secs() > raised + 5.0
        });
        let during = world.runs().iter().filter(|run| run.started > raised + 2.0).count();

        step("free the space and disarm the alarm");
        free_and_disarm(&world);
        let disarmed = now_secs();
        wait_for(
            Duration::from_secs(20),
            "every job runs a live tick after the disarm",
            || every_job_ran_a_tick_after(&world.runs(), &names, disarmed.ceil()),
        );
        let runs = world.runs();
        let resumed = names
            .iter()
            .map(|name| {
                runs.iter()
                    .filter(|run| &run.job == name && run.tick.timestamp() as f64 > disarmed.ceil())
                    .map(|run| run.started)
                    .fold(f64::MAX, f64::min)
            })
            .fold(0.0, f64::max);
        for port in ports.into_iter().chain([late_port]) {
            wait_for(Duration::from_secs(15), "each node is ready again", || {
                http_get(port, "/readyz").0.contains(" 200 ")
            });
            assert_eq!(
                sample(&http_get(port, "/metrics").1, "shardcron_etcd_nospace"),
                Some(0.0)
            );
        }

        step("check every (job, tick) from the first run on");
        let runs = world.runs();
        let mut late = 0;
        for name in &names {
            let ticks = assert_each_tick_once(&runs, name, 1);
            late += ticks
                .iter()
                .filter(|tick| (tick.timestamp() as f64) > raised && (tick.timestamp() as f64) < disarmed)
                .count();
        }
        for node in &world.nodes {
            let log = node.log_text();
            assert_eq!(
                warnings_with(&log, "NOSPACE"),
                1,
                "node {}: one warning of the alarm, not one per claim:\n{log}",
                node.id
            );
            assert_eq!(
                warnings_with(&log, "space exceeded"),
                0,
                "node {}: no warning per refused write:\n{log}",
                node.id
            );
        }
        eprintln!(
            "NOSPACE: {filled} MiB filled; {during} runs started under the alarm; {late} ticks of the alarm ran after it; every job's first live run {:.2} s after the disarm",
            resumed - disarmed
        );
    }
}

on_both_etcds! {
    fn the_leader_of_shard_0_compacts_etcds_history_and_watches_go_on() {
        let mut world = World::new();
        let config = world.write_config("jobs.toml", 1, 5, &[("tick", EVERY_SECOND, "")]);
        let text = std::fs::read_to_string(&config).expect("config");
        let text = text.replace("[etcd]\n", "[etcd]\ncompaction = \"10s\"\n");
        std::fs::write(&config, text).expect("config");
        step("one node leads shard 0 and runs a per-second job");
        let started = now_secs();
        world
            .node("a", &config)
            .env(&[("SHARDCRON_LOG", "info,shardcron=debug")])
            .start();
        wait_for(Duration::from_secs(20), "the job runs", || world.runs().len() >= 2);
        let (runtime, mut client) = world.etcd_client();
        let first_key_revision = || {
            runtime.block_on(async {
                // A read at revision 1 fails once etcd's history is compacted past it.
                client
                    .clone()
                    .get(
                        "/",
                        Some(GetOptions::new().with_revision(1).with_keys_only().with_limit(1)),
                    )
                    .await
                    .is_err_and(|err| err.to_string().contains("compacted"))
            })
        };
        step("wait for the node's compaction");
        wait_for(Duration::from_secs(60), "etcd's history compacted", first_key_revision);
        let compacted = now_secs() - started;
        // The log is written by a thread of its own: the line may follow etcd's answer a little.
        wait_for(Duration::from_secs(10), "the compaction logged at debug level", || {
            world.nodes[0].log_text().contains("compacted etcd's history")
        });

        step("compact to the newest revision under the running node, then pause a job");
        runtime.block_on(async {
            let revision = client
                .put("/unrelated", "x", None)
                .await
                .expect("put")
                .header()
                .expect("header")
                .revision();
            client.compact(revision, None).await.expect("compact");
        });
        let paused = std::process::Command::new(SHARDCRON)
            .args(["pause", "tick", "--config"])
            .arg(&config)
            .output()
            .expect("pause");
        assert!(paused.status.success(), "{}", String::from_utf8_lossy(&paused.stderr));
        let after_pause = now_secs() + 1.0;
        wait_for(
            Duration::from_secs(10),
            "the node sees the pause through its watch",
            || world.runs().iter().all(|run| run.started < after_pause) && now_secs() > after_pause + 3.0,
        );
        drop(runtime);
        eprintln!("compaction = \"10s\": etcd's history compacted {compacted:.1} s after the node started");
    }
}
