//! A small harness for scenario tests: a real etcd per test, node processes of the built binary,
//! jobs that append one line per run to a file, and waits on conditions with deadlines.
#![allow(dead_code)]

mod node;
pub mod proxy;

pub use node::{Node, NodeBuilder};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use shardcron::etcd_server::EtcdServer;

pub const SHARDCRON: &str = env!("CARGO_BIN_EXE_shardcron");

/// Prints a scenario step, so a failing test's output reads as a story.
pub fn step(what: &str) {
    eprintln!("--- {what}");
}

/// One test's world: an etcd, a temp dir for configs, logs and run records, and its nodes.
pub struct World {
    pub etcd: EtcdServer,
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
}

impl World {
    pub fn new() -> World {
        World::with_etcd_members(1)
    }

    /// A world whose etcd is a cluster of `members` on loopback.
    pub fn with_etcd_members(members: usize) -> World {
        let etcd =
            EtcdServer::start_cluster(Path::new("etcd"), members).expect("start etcd (apt-get install etcd-server)");
        World::with_etcd(etcd, tempfile::tempdir().expect("temp dir"))
    }

    /// A world around an etcd the test started itself, with `dir` for its files.
    pub fn with_etcd(etcd: EtcdServer, dir: tempfile::TempDir) -> World {
        World {
            etcd,
            dir,
            nodes: Vec::new(),
        }
    }

    pub fn runs_file(&self) -> PathBuf {
        self.dir.path().join("runs.log")
    }

    /// A job command that records who ran which tick and when it really started.
    pub fn record_command(&self) -> String {
        format!(
            "echo \"$CRON_JOB $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE $CRON_SHARD $(date +%s.%N)\" >> {}",
            self.runs_file().display()
        )
    }

    /// Writes a config with `jobs` (name, schedule, extra TOML lines) recording their runs.
    pub fn write_config(&self, file: &str, shards: u32, ttl_secs: u64, jobs: &[(&str, &str, &str)]) -> PathBuf {
        self.write_config_running(file, shards, ttl_secs, jobs, &self.record_command())
    }

    /// Like [`World::write_config`], with every job running `command`.
    pub fn write_config_running(
        &self,
        file: &str,
        shards: u32,
        ttl_secs: u64,
        jobs: &[(&str, &str, &str)],
        command: &str,
    ) -> PathBuf {
        let mut text = format!(
            "[cluster]\nname = \"test\"\nshards = {shards}\nlease_ttl = \"{ttl_secs}s\"\n\n[etcd]\nendpoints = {:?}\n\n",
            self.etcd.client_urls()
        );
        for (name, schedule, extra) in jobs {
            text.push_str(&format!(
                "[jobs.{name}]\nschedule = \"{schedule}\"\ncommand = '{command}'\n{extra}\n\n"
            ));
        }
        let path = self.dir.path().join(file);
        std::fs::write(&path, text).expect("write config");
        path
    }

    /// A node with `id` running `config`, to start after any options.
    pub fn node(&mut self, id: &str, config: &Path) -> NodeBuilder<'_> {
        NodeBuilder::new(self, id, config)
    }

    pub fn runs(&self) -> Vec<Run> {
        read_runs(&self.runs_file())
    }

    /// `shardcron status --json` against this world's etcd.
    pub fn status(&self, config: &Path) -> serde_json::Value {
        let out = Command::new(SHARDCRON)
            .args(["status", "--json", "--config"])
            .arg(config)
            .output()
            .expect("run status");
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// Leader and fence of every shard of `config`'s shard count, from `status --json`.
    pub fn shard_leaders(&self, config: &Path) -> Vec<(Option<String>, Option<i64>)> {
        self.status(config)["shards"]
            .as_array()
            .map(|shards| {
                shards
                    .iter()
                    .map(|shard| (shard["leader"].as_str().map(str::to_string), shard["fence"].as_i64()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The node id leading `shard`, if any.
    pub fn leader_of(&self, config: &Path, shard: u64) -> Option<(String, i64)> {
        let status = self.status(config);
        let entry = &status["shards"][shard as usize];
        Some((entry["leader"].as_str()?.to_string(), entry["fence"].as_i64()?))
    }

    /// Dumps every node's log, for a failing test's output.
    pub fn dump_logs(&self) {
        for node in &self.nodes {
            eprintln!("===== log of node {} =====", node.id);
            eprintln!("{}", std::fs::read_to_string(&node.log).unwrap_or_default());
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for node in &mut self.nodes {
            node.signal(libc::SIGCONT);
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
    }
}

/// One recorded run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub job: String,
    pub tick: DateTime<Utc>,
    pub fence: i64,
    pub node: String,
    pub shard: u32,
    /// The job's own clock when it started, seconds since the epoch.
    pub started: f64,
}

impl Run {
    pub fn lateness(&self) -> f64 {
        self.started - self.tick.timestamp() as f64 - f64::from(self.tick.timestamp_subsec_nanos()) / 1e9
    }
}

pub fn read_runs(path: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [job, tick, fence, node, shard, started] = parts.as_slice() else {
                return None;
            };
            Some(Run {
                job: job.to_string(),
                tick: DateTime::parse_from_rfc3339(tick).ok()?.with_timezone(&Utc),
                fence: fence.parse().ok()?,
                node: node.to_string(),
                shard: shard.parse().ok()?,
                started: started.parse().ok()?,
            })
        })
        .collect()
}

/// A job's `last_run` in a `status --json` document (`null` if none yet).
pub fn last_run(status: &serde_json::Value, job: &str) -> serde_json::Value {
    status["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|entry| entry["name"] == job))
        .map(|entry| entry["last_run"].clone())
        .unwrap_or_default()
}

/// Waits until `condition` holds, panicking with `what` after `limit`.
pub fn wait_for(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {limit:?} waiting for: {what}");
}

/// Sleeps until the middle of a wall-clock second, so a signal lands between ticks and not in
/// the few milliseconds around one.
pub fn sleep_to_mid_second() {
    let now = Utc::now();
    let into = f64::from(now.timestamp_subsec_nanos()) / 1e9;
    let wait = if into < 0.5 { 0.5 - into } else { 1.5 - into };
    std::thread::sleep(Duration::from_secs_f64(wait));
}

pub fn now_secs() -> f64 {
    let now = Utc::now();
    now.timestamp() as f64 + f64::from(now.timestamp_subsec_nanos()) / 1e9
}

/// Asserts every tick of `job` from its first to its last recorded run appears exactly once,
/// on whole seconds `step` apart, and returns the ticks.
pub fn assert_each_tick_once(runs: &[Run], job: &str, step_secs: i64) -> Vec<DateTime<Utc>> {
    let mut ticks: Vec<DateTime<Utc>> = runs.iter().filter(|run| run.job == job).map(|run| run.tick).collect();
    ticks.sort();
    let mut seen = std::collections::HashSet::new();
    for tick in &ticks {
        assert!(seen.insert(*tick), "tick {tick} of {job} ran more than once: {runs:#?}");
    }
    for pair in ticks.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_seconds(),
            step_secs,
            "tick missing between {} and {} of {job}",
            pair[0],
            pair[1]
        );
    }
    ticks
}
