//! A small harness for scenario tests: a real etcd per test, node processes of the built binary,
//! jobs that append one line per run to a file, and waits on conditions with deadlines.
//!
//! The [`World`] (its etcd, configs, nodes and status) is here; node processes are in `node`,
//! the recorded runs and the checks on them in `runs`, the proxy that cuts a node off from
//! etcd in `proxy`, the fenced-SQLite downstream in `fenced`, and the network namespaces whose packets a test drops in `netns`.

pub mod browser;
pub mod etcds;
pub mod fenced;
pub mod netns;
mod node;
pub mod proxy;
pub mod receiver;
mod runs;

pub use etcds::etcd_bin;
pub(crate) use etcds::on_both_etcds;
pub use node::{Node, NodeBuilder};
pub use runs::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use shardcron::etcd_server::EtcdServer;
use shardcron::rules::record::RunRecord;
use shardcron::serving::status::Status;

use proxy::Proxy;

pub const SHARDCRON: &str = env!("CARGO_BIN_EXE_shardcron");

pub const EVERY_SECOND: &str = "* * * * * *";

/// `count` job names, `job0`, `job1`, … with at least `digits` digits. The names pick each
/// job's shard, so a scenario keeps the names its figures were measured with.
pub fn job_names(count: usize, digits: usize) -> Vec<String> {
    (0..count).map(|i| format!("job{i:0digits$}")).collect()
}

/// Jobs named `names` that fire every second, each with `extra` TOML lines, for
/// [`World::write_config`].
pub fn every_second<'a>(names: &'a [String], extra: &'a str) -> Vec<(&'a str, &'a str, &'a str)> {
    names.iter().map(|name| (name.as_str(), EVERY_SECOND, extra)).collect()
}

/// The version `bin --version` prints (`3.4.23`), for the figures a scenario prints.
pub fn etcd_version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("etcd Version: "))
        .map(|version| version.trim().to_string())
}

/// Prints a scenario step, so a failing test's output reads as a story.
pub fn step(what: &str) {
    eprintln!("--- {what}");
}

/// The two nodes of a one-shard world, by role.
pub struct Roles {
    /// The leader's index in [`World::nodes`].
    pub leader: usize,
    pub standby_id: String,
}

/// One test's world: an etcd, a temp dir for configs, logs and run records, and its nodes.
pub struct World {
    pub etcd: EtcdServer,
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
    /// Whether this world's scenario may inject faults: it runs on both etcds (`etcds`).
    faults_allowed: bool,
}

impl World {
    pub fn new() -> World {
        World::with_etcd_members(1)
    }

    /// A world whose etcd is a cluster of `members` on loopback.
    pub fn with_etcd_members(members: usize) -> World {
        let bin = etcd_bin();
        step(&format!(
            "etcd {} ({}), {members} member(s)",
            etcd_version(&bin).unwrap_or_else(|| "of unknown version".into()),
            bin.display()
        ));
        let etcd = EtcdServer::start_cluster(&etcd_bin(), members).expect("start etcd (apt-get install etcd-server)");
        World::with_etcd(etcd, tempfile::tempdir().expect("temp dir"))
    }

    /// A world around an etcd the test started itself, with `dir` for its files.
    pub fn with_etcd(etcd: EtcdServer, dir: tempfile::TempDir) -> World {
        World {
            etcd,
            dir,
            nodes: Vec::new(),
            faults_allowed: etcds::declared_on_both(),
        }
    }

    pub fn runs_file(&self) -> PathBuf {
        self.dir.path().join("runs.log")
    }

    /// A job command that records who ran which tick and when it really started.
    pub fn record_command(&self) -> String {
        format!(
            "echo \"$CRON_JOB $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE $CRON_SHARD $(date +%s.%N) ${{CRON_REDELIVERED:-0}} $CRON_TERM\" >> {}",
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
        let tables: Vec<(&str, String)> = jobs
            .iter()
            .map(|(name, schedule, extra)| {
                (
                    *name,
                    format!("schedule = \"{schedule}\"\ncommand = '{command}'\n{extra}"),
                )
            })
            .collect();
        self.write_config_tables(file, shards, ttl_secs, &tables)
    }

    /// Writes a config on this world's etcd with `jobs` given as (name, the TOML of its
    /// `[jobs.NAME]` table).
    pub fn write_config_tables(&self, file: &str, shards: u32, ttl_secs: u64, jobs: &[(&str, String)]) -> PathBuf {
        let mut text = format!(
            "[cluster]\nname = \"test\"\nshards = {shards}\nlease_ttl = \"{ttl_secs}s\"\n\n[etcd]\nendpoints = {:?}\n\n",
            self.etcd.client_urls()
        );
        for (name, table) in jobs {
            text.push_str(&format!("[jobs.{name}]\n{table}\n\n"));
        }
        let path = self.dir.path().join(file);
        std::fs::write(&path, text).expect("write config");
        path
    }

    /// Writes, for each of `names` in `cluster`, the record a leader of long ago would have left:
    /// `last` claimed, nothing pending.
    pub fn seed_job_records(&self, cluster: &str, names: &[String], last: DateTime<Utc>) {
        use etcd_client::{Client, Txn, TxnOp};
        let record = shardcron::rules::record::Claim {
            scheduled_at: last,
            term: 1,
            node: "gone".into(),
            ..Default::default()
        };
        let value = serde_json::to_string(&record).expect("record");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let client = Client::connect([self.etcd.client_url()], None).await.expect("etcd");
            for chunk in names.chunks(100) {
                let puts: Vec<TxnOp> = chunk
                    .iter()
                    .map(|name| TxnOp::put(format!("/shardcron/{cluster}/jobs/{name}/last"), value.clone(), None))
                    .collect();
                client
                    .clone()
                    .txn(Txn::new().and_then(puts))
                    .await
                    .expect("seed records");
            }
        });
    }

    /// A client of this world's etcd, on a runtime of its own, for a test that writes to etcd as
    /// someone other than a node would.
    pub fn etcd_client(&self) -> (tokio::runtime::Runtime, etcd_client::Client) {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let client = runtime
            .block_on(etcd_client::Client::connect([self.etcd.client_url()], None))
            .expect("etcd");
        (runtime, client)
    }

    /// The value etcd holds at `key`, if any.
    pub fn etcd_value(&self, key: &str) -> Option<Vec<u8>> {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let mut client = etcd_client::Client::connect([self.etcd.client_url()], None)
                .await
                .ok()?;
            let read = client.get(key, None).await.ok()?;
            read.kvs().first().map(|kv| kv.value().to_vec())
        })
    }

    /// Starts nodes `a` and `b` on a one-shard `config` and returns their roles once the shard's
    /// target leads and runs ticks and the other node stands by.
    pub fn leader_and_standby(&mut self, config: &Path) -> Roles {
        step("start a and b");
        self.node("a", config).start();
        self.node("b", config).start();
        self.wait_leader_and_standby(config)
    }

    /// [`World::leader_and_standby`] for nodes `a` and `b` the test started itself.
    pub fn wait_leader_and_standby(&self, config: &Path) -> Roles {
        // Both nodes compute the same target for the shard; wait until it leads and the other
        // waits.
        let target = shardcron::rules::assignment::assign(1, &["a", "b"])[0]
            .clone()
            .expect("a target");
        wait_for(
            Duration::from_secs(15),
            "the target leads and the other node stands by",
            || {
                self.status(config)
                    .shards
                    .first()
                    .is_some_and(|shard| shard.leader.as_deref() == Some(target.as_str()) && shard.standby == 1)
            },
        );
        let leader = self
            .nodes
            .iter()
            .position(|node| node.id == target)
            .expect("leader is ours");
        wait_for(Duration::from_secs(15), "the leader runs ticks", || {
            self.runs().iter().filter(|run| run.node == target).count() >= 2
        });
        let standby_id = self.nodes[1 - leader].id.clone();
        step(&format!("{target} leads, {standby_id} stands by"));
        Roles { leader, standby_id }
    }

    /// A world whose one etcd member serves clients on loopback and on the host's end of each of
    /// `nets`, for nodes started [`NodeBuilder::in_netns`].
    pub fn reachable_from(nets: &[&netns::Netns]) -> World {
        let bin = etcd_bin();
        step(&format!(
            "etcd {} ({}), reachable from {} network namespace(s)",
            etcd_version(&bin).unwrap_or_else(|| "of unknown version".into()),
            bin.display(),
            nets.len()
        ));
        let member = shardcron::etcd_server::MemberNet {
            extra_client_hosts: nets.iter().map(|net| net.root_addr.to_string()).collect(),
            ..Default::default()
        };
        let etcd = EtcdServer::start_cluster_on(&bin, &[member]).expect("start etcd (apt-get install etcd-server)");
        World::with_etcd(etcd, tempfile::tempdir().expect("temp dir"))
    }

    /// Starts one node per id, each reaching etcd through a proxy of its own.
    pub fn start_behind_proxies(&mut self, ids: &[&str], config: &Path) -> Vec<Proxy> {
        ids.iter()
            .map(|id| {
                let proxy = Proxy::start(&self.etcd.client_address());
                self.node(id, config).via(&proxy).start();
                proxy
            })
            .collect()
    }

    /// A node with `id` running `config`, to start after any options.
    pub fn node(&mut self, id: &str, config: &Path) -> NodeBuilder<'_> {
        NodeBuilder::new(self, id, config)
    }

    pub fn runs(&self) -> Vec<Run> {
        read_runs(&self.runs_file())
    }

    /// `shardcron status --json` against this world's etcd, read back as the library's `Status`.
    pub fn status(&self, config: &Path) -> Status {
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

    /// Leader and term of every shard of `config`'s shard count, from `status --json`.
    pub fn shard_leaders(&self, config: &Path) -> Vec<(Option<String>, Option<i64>)> {
        self.status(config)
            .shards
            .into_iter()
            .map(|shard| (shard.leader, shard.term))
            .collect()
    }

    /// The node leading `shard` and its term, if the shard has a leader.
    pub fn leader_of(&self, config: &Path, shard: u32) -> Option<(String, i64)> {
        let entry = self
            .status(config)
            .shards
            .into_iter()
            .find(|entry| entry.shard == shard)?;
        Some((entry.leader?, entry.term?))
    }

    /// Dumps every node's log, for a failing test's output.
    fn dump_logs(&self) {
        for node in &self.nodes {
            eprintln!("===== log of node {} =====", node.id);
            eprintln!("{}", std::fs::read_to_string(&node.log).unwrap_or_default());
        }
        for tail in self.etcd.log_tails() {
            eprintln!("===== end of the log of etcd {tail}");
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

/// A job's last finished run in `status`, if it has one yet.
pub fn last_run(status: &Status, job: &str) -> Option<RunRecord> {
    status.jobs.iter().find(|entry| entry.name == job)?.last_run.clone()
}

impl World {
    /// etcd's revision: every write bumps it once, a transaction of many operations too.
    pub fn revision(&self) -> i64 {
        let (runtime, mut client) = self.etcd_client();
        runtime.block_on(async {
            let read = client.get("/", None).await.expect("a read");
            read.header().expect("a header").revision()
        })
    }

    /// etcd writes per run while `jobs` per-second jobs that record their runs run, after
    /// their first runs.
    pub fn writes_per_run(&self, jobs: usize) -> f64 {
        let runs = || self.runs().len();
        let settled = runs() + 3 * jobs;
        wait_for(Duration::from_secs(30), "the first runs", || runs() >= settled);
        let (revision_before, runs_before) = (self.revision(), runs());
        wait_for(Duration::from_secs(30), "eight instants of runs", || {
            runs() >= runs_before + 8 * jobs
        });
        let (revision_after, runs_after) = (self.revision(), runs());
        (revision_after - revision_before) as f64 / (runs_after - runs_before) as f64
    }
}

/// Runs the `shardcron` command with `args` and `--config config`.
pub fn shardcron(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(SHARDCRON)
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run shardcron")
}

/// Waits until `condition` holds or `limit` passes; whether it held.
pub fn wait_within(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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

/// Sleeps until `offset` after the next whole wall-clock second (before it, if negative): a
/// fault aimed at the few milliseconds around a tick. Returns that second.
pub fn sleep_to_tick_offset(offset_ms: i64) -> DateTime<Utc> {
    let now = Utc::now();
    let mut tick = DateTime::<Utc>::from_timestamp(now.timestamp() + 1, 0).expect("a second");
    if (tick + chrono::Duration::milliseconds(offset_ms) - now).num_milliseconds() < 100 {
        tick += chrono::Duration::seconds(1);
    }
    let at = tick + chrono::Duration::milliseconds(offset_ms);
    std::thread::sleep((at - Utc::now()).to_std().unwrap_or_default());
    tick
}

pub fn now_secs() -> f64 {
    let now = Utc::now();
    now.timestamp() as f64 + f64::from(now.timestamp_subsec_nanos()) / 1e9
}

/// Waits up to `limit` until the node serving HTTP on `port` answers `/readyz` with 200.
pub fn wait_ready_within(port: u16, limit: Duration) {
    wait_for(limit, "the node is ready", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok() && http_get(port, "/readyz").0.contains(" 200 ")
    });
}

/// [`wait_ready_within`] 30 s.
pub fn wait_ready(port: u16) {
    wait_ready_within(port, Duration::from_secs(30));
}

/// `GET path` on `port`; returns the status line and the body.
pub fn http_get(port: u16, path: &str) -> (String, String) {
    let response = http_request(port, "GET", path, &[], "");
    (response.status_line, response.body)
}

/// One HTTP answer: its status line, headers (names lowercased) and body.
pub struct HttpResponse {
    pub status_line: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {} {}", self.status_line, self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// One HTTP/1.1 request to `127.0.0.1:port`, read to the end (the connection is closed).
pub fn http_request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> HttpResponse {
    let host = if headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        ""
    } else {
        "Host: 127.0.0.1\r\n"
    };
    let mut request = format!("{method} {path} HTTP/1.1\r\n{host}Connection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    http_exchange(port, request.as_bytes(), Duration::from_secs(60)).expect("an HTTP answer")
}

/// Sends `request` as it is to `127.0.0.1:port` and reads the answer, waiting at most `limit`
/// for each read; `None` if the answer did not come in time.
pub fn http_exchange(port: u16, request: &[u8], limit: Duration) -> Option<HttpResponse> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the HTTP listener");
    stream.set_read_timeout(Some(limit)).expect("timeout");
    // A reset before the request went out is no answer either.
    if let Err(err) = stream.write_all(request) {
        match err.kind() {
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => return None,
            _ => panic!("send: {err}"),
        }
    }
    // Read by Content-Length where there is one: a server may keep the connection open
    // (chromedriver does) whatever the request asked.
    let mut received = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    let mut expected = None;
    loop {
        if expected.is_none() {
            if let Some(end) = received.windows(4).position(|window| window == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|length| length.trim().parse::<usize>().ok());
                expected = Some(length.map(|length| end + 4 + length));
            }
        }
        if let Some(Some(total)) = expected {
            if received.len() >= total {
                break;
            }
        }
        let read = match stream.read(&mut buffer) {
            Ok(read) => read,
            // A node shedding connections it has no room for (a full accept queue, its
            // descriptor limit) resets them: no answer, as a timeout is.
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                return None
            }
            Err(err) => panic!("read: {err}"),
        };
        if read == 0 {
            break;
        }
        received.extend_from_slice(&buffer[..read]);
    }
    let response = String::from_utf8_lossy(&received).to_string();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default().to_string();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    Some(HttpResponse {
        status_line,
        status,
        headers,
        body: body.to_string(),
    })
}

/// The value of the sample `name` (with its labels, as printed) in a metrics page.
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}
