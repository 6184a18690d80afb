//! Nothing in etcd grows without a bound: a fleet runs every feature (a plain job, an
//! `overlap = "skip"` job, a concurrency group, a pause and resume, a manual run, a short
//! backfill, a fanned-out job with a notifier), its node ids change as pods' do, the new fleet
//! runs a while and stops, and then every key under the cluster's prefix is counted by the
//! prefix it is under (every prefix `src/coord/keys.rs` builds) and held to its bound, the one
//! docs/operating.md states for it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, DurationRound, SecondsFormat, Utc};

use crate::support::receiver::Receiver;
use crate::support::{on_both_etcds, shardcron, step, wait_for, World};

const EVERY_SECOND: &str = "* * * * * *";
/// `[cluster] history`: each job (and each instance) keeps at most this many runs.
const HISTORY: usize = 3;
/// `[etcd] gone_node_retention`, as short as the config allows.
const RETENTION: &str = "10s";
const CLUSTER_PREFIX: &str = "/shardcron/census/";

/// The jobs of the config, by name.
const JOBS: [&str; 8] = [
    "plain",
    "skipping",
    "grouped-1",
    "grouped-2",
    "paused",
    "manual",
    "backfilled",
    "fanned",
];

fn write_config(world: &World, receiver: &Receiver) -> PathBuf {
    let text = format!(
        r#"[cluster]
name = "census"
shards = 2
lease_ttl = "2s"
history = {HISTORY}

[etcd]
endpoints = {endpoints:?}
gone_node_retention = "{RETENTION}"

[groups.g]
limit = 1

[notify.ops]
url = "{url}"

[jobs.plain]
schedule = "{EVERY_SECOND}"
command = 'echo plain'

[jobs.skipping]
schedule = "{EVERY_SECOND}"
command = 'sleep 1.5'
overlap = "skip"

[jobs.grouped-1]
schedule = "{EVERY_SECOND}"
command = 'sleep 0.5'
group = "g"

[jobs.grouped-2]
schedule = "{EVERY_SECOND}"
command = 'sleep 0.5'
group = "g"

[jobs.paused]
schedule = "{EVERY_SECOND}"
command = 'true'

[jobs.manual]
schedule = "0 0 0 1 1 *"
command = 'echo by hand'

[jobs.backfilled]
schedule = "* * * * *"
command = 'true'

[jobs.fanned]
schedule = "{EVERY_SECOND}"
command = 'echo fanned; false'
fan_out = "all"
notify = ["ops"]
"#,
        endpoints = world.etcd.client_urls(),
        url = receiver.url("/hook"),
    );
    let path = world.dir.path().join("jobs.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Every key under the cluster's prefix (without it) and its value's size.
struct Keys {
    runtime: tokio::runtime::Runtime,
    client: etcd_client::Client,
}

impl Keys {
    fn new(world: &World) -> Keys {
        let (runtime, client) = world.etcd_client();
        Keys { runtime, client }
    }

    fn list(&self) -> Vec<(String, usize)> {
        let mut client = self.client.clone();
        let read = self
            .runtime
            .block_on(client.get(CLUSTER_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())))
            .expect("list the cluster's keys");
        read.kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key());
                let rest = key.strip_prefix(CLUSTER_PREFIX).unwrap_or(&key).to_string();
                (rest, kv.key().len() + kv.value().len())
            })
            .collect()
    }

    fn values_under(&self, prefix: &str) -> Vec<serde_json::Value> {
        let mut client = self.client.clone();
        let read = self
            .runtime
            .block_on(client.get(
                format!("{CLUSTER_PREFIX}{prefix}"),
                Some(etcd_client::GetOptions::new().with_prefix()),
            ))
            .expect("read a prefix");
        read.kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect()
    }

    fn count_under(&self, prefix: &str) -> usize {
        self.list().iter().filter(|(key, _)| key.starts_with(prefix)).count()
    }
}

/// Whether a key's segments after a name have a shape (a run's entry, its output, ...).
type KeyShape = fn(&[&str]) -> bool;

/// The prefix a key is counted under, as docs/operating.md names it: a name (job, node, group,
/// request) becomes its placeholder; a job's instance (`<job>@<node>`) is told apart.
fn prefix_of(key: &str) -> String {
    let segments: Vec<&str> = key.split('/').collect();
    let job_or_instance = |name: &str| match name.contains('@') {
        true => "<job>@<node>",
        false => "<job>",
    };
    match segments[..] {
        ["jobs", name, record] => format!("jobs/{}/{record}", job_or_instance(name)),
        ["runs", name, "+backfill", _tick] => format!("runs/{}/+backfill/<tick>", job_or_instance(name)),
        ["runs", name, _tick] => format!("runs/{}/<tick>", job_or_instance(name)),
        ["runs", name, _tick, "output"] => format!("runs/{}/<tick>/output", job_or_instance(name)),
        ["notify", name] => format!("notify/{}", job_or_instance(name)),
        ["backfills", _] => "backfills/<job>".into(),
        ["pauses", _] => "pauses/<job>".into(),
        ["triggers", ..] => "triggers/<job>/<id>".into(),
        ["triggered", _] => "triggered/<id>".into(),
        ["nodes", _] => "nodes/<node>".into(),
        ["activity", _] => "activity/<node>".into(),
        ["unserved", _] => "unserved/<tags>".into(),
        ["groups", _, "slots", _] => "groups/<group>/slots/<n>".into(),
        ["groups", _, "waiting", ..] => "groups/<group>/waiting/<place>".into(),
        ["asks", ..] => "asks/<node>/...".into(),
        ["shards", ..] => "shards/...".into(),
        ["compaction"] => "compaction".into(),
        ["format"] => "format".into(),
        _ => format!("UNKNOWN {key}"),
    }
}

/// The census: keys and bytes per prefix, printed as a table.
fn census(keys: &[(String, usize)]) -> BTreeMap<String, (usize, usize)> {
    let mut rows: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (key, bytes) in keys {
        let row = rows.entry(prefix_of(key)).or_default();
        row.0 += 1;
        row.1 += bytes;
    }
    eprintln!("{:<34} {:>6} {:>9}", "prefix", "keys", "bytes");
    for (prefix, (count, bytes)) in &rows {
        eprintln!("{prefix:<34} {count:>6} {bytes:>9}");
    }
    rows
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn ok(config: &Path, args: &[&str]) {
    let out = shardcron(config, args);
    assert!(
        out.status.success(),
        "shardcron {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The nodes that own an instance record under `prefix` (`jobs/` or `runs/`).
fn instance_nodes(keys: &[(String, usize)], prefix: &str) -> BTreeSet<String> {
    keys.iter()
        .filter_map(|(key, _)| key.strip_prefix(prefix)?.split('/').next()?.split_once('@'))
        .map(|(_, node)| node.to_string())
        .collect()
}

fn stop_all(world: &mut World) {
    for node in &world.nodes {
        node.signal(libc::SIGTERM);
    }
    for node in &mut world.nodes {
        assert!(node.wait_exit(Duration::from_secs(20)).is_some(), "{} stops", node.id);
    }
}

on_both_etcds! {
    fn every_prefix_is_gone_or_bounded_after_a_fleet_whose_node_ids_changed_stops() {
        let mut world = World::new();
        let receiver = Receiver::start();
        let config = write_config(&world, &receiver);
        let keys = Keys::new(&world);

        step("the first fleet, a and b, runs every feature");
        world.node("a", &config).start();
        world.node("b", &config).start();
        wait_for(
            Duration::from_secs(30),
            "each node ran its instance of fanned and plain ran",
            || {
                let listed = keys.list();
                instance_nodes(&listed, "runs/") == BTreeSet::from(["a".to_string(), "b".to_string()])
                    && listed.iter().filter(|(key, _)| key.starts_with("runs/plain/")).count() >= HISTORY
            },
        );
        ok(&config, &["pause", "paused"]);
        ok(&config, &["trigger", "manual", "--wait", "--timeout", "20s"]);
        let minute = Utc::now()
            .duration_trunc(chrono::Duration::minutes(1))
            .expect("a minute");
        ok(
            &config,
            &[
                "backfill",
                "backfilled",
                "--from",
                &rfc3339(minute - chrono::Duration::minutes(3)),
                "--to",
                &rfc3339(minute - chrono::Duration::minutes(1)),
            ],
        );
        wait_for(Duration::from_secs(30), "the backfill's runs", || {
            keys.values_under("runs/backfilled/")
                .iter()
                .filter(|run| run["trigger"] == "backfill")
                .count()
                >= 2
        });
        ok(&config, &["resume", "paused"]);
        wait_for(Duration::from_secs(20), "the failing fanned-out job told", || {
            !receiver.hits_on("/hook").is_empty()
        });

        step("the node ids change: a and b stop, c and d start");
        stop_all(&mut world);
        let gen_one_gone = std::time::Instant::now();
        world.node("c", &config).start();
        world.node("d", &config).start();
        wait_for(Duration::from_secs(30), "c and d run their instances", || {
            let nodes = instance_nodes(&keys.list(), "runs/");
            nodes.contains("c") && nodes.contains("d")
        });
        // Gone for the retention, seen gone on every look meanwhile, and a look or two later.
        wait_for(
            Duration::from_secs(45),
            "the records of a's and b's instances removed",
            || {
                let listed = keys.list();
                let left: BTreeSet<String> = instance_nodes(&listed, "jobs/")
                    .union(&instance_nodes(&listed, "runs/"))
                    .cloned()
                    .collect();
                left.iter().all(|node| node == "c" || node == "d")
            },
        );
        eprintln!(
            "gone nodes' instance records removed {:.1} s after they left (retention {RETENTION})",
            gen_one_gone.elapsed().as_secs_f64()
        );

        step("the fleet stops; its leases expire");
        stop_all(&mut world);
        wait_for(Duration::from_secs(10), "every lease-bound key gone", || {
            keys.list().iter().all(|(key, _)| {
                ![
                    "nodes/",
                    "shards/",
                    "activity/",
                    "groups/",
                    "asks/",
                    "triggers/",
                    "triggered/",
                ]
                .iter()
                .any(|leased| key.starts_with(leased))
            })
        });

        step("the census");
        let listed = keys.list();
        let rows = census(&listed);
        let unknown: Vec<&String> = rows.keys().filter(|prefix| prefix.starts_with("UNKNOWN")).collect();
        assert!(unknown.is_empty(), "keys under no documented prefix: {unknown:?}");
        // Per name under `prefix`, the keys whose rest after the name has `shape`.
        let per_name_shaped = |prefix: &str, shape: KeyShape| -> BTreeMap<String, usize> {
            let mut counts = BTreeMap::new();
            for (key, _) in &listed {
                let Some(rest) = key.strip_prefix(prefix) else { continue };
                let segments: Vec<&str> = rest.split('/').collect();
                if shape(&segments[1..]) {
                    *counts.entry(segments[0].to_string()).or_default() += 1;
                }
            }
            counts
        };
        let per_name = |prefix: &str| per_name_shaped(prefix, |_| true);
        let configured: BTreeSet<String> = JOBS.iter().map(|job| job.to_string()).collect();
        let of_a_configured_job = |name: &str| configured.contains(name.split('@').next().unwrap_or(name));
        // A job's live runs, its backfill runs (a bound of their own) and the outputs kept beside
        // either: each at most `history`.
        let shapes: [(&str, KeyShape); 3] = [
            ("runs", |rest| rest.len() == 1),
            ("backfill runs", |rest| rest.first() == Some(&"+backfill")),
            ("outputs", |rest| rest.last() == Some(&"output")),
        ];
        for (what, shape) in shapes {
            for (job, count) in per_name_shaped("runs/", shape) {
                assert!(
                    count <= HISTORY,
                    "runs/{job}/ holds {count} {what}, more than history = {HISTORY}"
                );
            }
        }
        for job in per_name("runs/").into_keys() {
            assert!(of_a_configured_job(&job), "runs/{job}/ of no job of the config");
        }
        for (job, count) in per_name("jobs/") {
            // last, result, success and manual: four records per job at most.
            assert!(count <= 4, "jobs/{job}/ holds {count} records");
            assert!(of_a_configured_job(&job), "jobs/{job}/ of no job of the config");
        }
        for (job, count) in per_name("backfills/").into_iter().chain(per_name("pauses/")) {
            assert!(count <= 1 && configured.contains(&job), "one record per job: {job}");
        }
        // A resume closes the pause rather than deleting it: one closed record per job name.
        for pause in keys.values_under("pauses/") {
            assert!(pause["until"].is_string(), "a resumed pause is closed: {pause}");
        }
        assert!(rows.get("compaction").is_none_or(|(count, _)| *count == 1));
        assert_eq!(rows.get("format").map(|(count, _)| *count), Some(1), "one format key");
        // Instances only of the last fleet: nodes gone for less than the retention when it stopped.
        let instance_owners: BTreeSet<String> = instance_nodes(&listed, "jobs/")
            .union(&instance_nodes(&listed, "runs/"))
            .cloned()
            .collect();
        assert_eq!(
            instance_owners,
            BTreeSet::from(["c".to_string(), "d".to_string()]),
            "instance records of nodes gone longer than the retention"
        );
        // `/notify/<job>@<node>`: removed with the instance's other records.
        let notify_owners = instance_nodes(&listed, "notify/");
        assert!(
            notify_owners.iter().all(|node| node == "c" || node == "d"),
            "notification records of instances of nodes gone longer than the retention: {notify_owners:?}"
        );
        assert_eq!(
            keys.count_under("txn-probe"),
            0,
            "the transaction probe key is never written"
        );
    }
}
