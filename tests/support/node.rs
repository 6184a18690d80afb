//! Node processes of the built binary: how a test starts one, signals it and reads what it used.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::Netns;
use super::proxy::Proxy;
use super::{World, SHARDCRON};

/// A node about to start: [`World::node`], then its options, then [`NodeBuilder::start`].
#[must_use = "the node starts only with .start()"]
pub struct NodeBuilder<'w> {
    world: &'w mut World,
    id: String,
    config: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    wrapper: Vec<String>,
}

impl<'w> NodeBuilder<'w> {
    pub(super) fn new(world: &'w mut World, id: &str, config: &Path) -> NodeBuilder<'w> {
        NodeBuilder {
            world,
            id: id.to_string(),
            config: config.to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            wrapper: Vec::new(),
        }
    }

    /// Reaches etcd through `proxy` instead of the config's endpoints.
    pub fn via(self, proxy: &Proxy) -> Self {
        self.args(&["--endpoints", &proxy.url()])
    }

    /// Runs in `net`, reaching etcd's first member at the host's end of `net`'s veth pair
    /// instead of the config's endpoints (see [`World::reachable_from`]).
    pub fn in_netns(self, net: &Netns) -> Self {
        let url = self.world.etcd.client_url_on(0, &net.root_addr.to_string());
        self.under(&net.exec()).args(&["--endpoints", &url])
    }

    /// Extra arguments after `run --config …`.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|arg| arg.to_string()));
        self
    }

    /// Starts the node through `wrapper` (a program and its arguments, such as `setpriv ...
    /// --`), which then execs the node.
    pub fn under(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|arg| arg.to_string()).collect();
        self
    }

    /// Extra environment variables.
    pub fn env(mut self, vars: &[(&str, &str)]) -> Self {
        self.env
            .extend(vars.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        self
    }

    /// Runs the node with `RLIMIT_NOFILE` at `limit`, soft and hard: the node raises its soft
    /// limit to the hard one, so only a hard limit holds it.
    pub fn descriptor_limit(self, limit: u64) -> Self {
        // prlimit(1) sets the limit and execs the node: the child's pid is the node's.
        self.under(&["prlimit", &format!("--nofile={limit}:{limit}"), "--"])
    }

    /// Starts the node with its HTTP listener on a free loopback port, waits until it is ready,
    /// and returns the port.
    pub fn start_serving(self) -> u16 {
        let port = shardcron::etcd_server::free_port().expect("port");
        self.args(&["--http-addr", &port.to_string()]).start();
        super::wait_ready_within(port, std::time::Duration::from_secs(60));
        port
    }

    /// Starts the node process, its output appended to `<id>.log`, and returns its index in
    /// `World::nodes`.
    pub fn start(self) -> usize {
        let NodeBuilder {
            world,
            id,
            config,
            args,
            env,
            wrapper,
        } = self;
        let log = world.dir.path().join(format!("{id}.log"));
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("node log");
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(SHARDCRON);
                command
            }
            None => Command::new(SHARDCRON),
        };
        // 5 s of shutdown grace unless the test asks for another.
        let grace: &[&str] = if args.iter().any(|arg| arg == "--shutdown-grace") {
            &[]
        } else {
            &["--shutdown-grace", "5s"]
        };
        let child = command
            .args(["run", "--node-id", &id])
            .args(grace)
            .arg("--config")
            .arg(&config)
            .args(&args)
            .envs(env)
            .env("SHARDCRON_LOG", "info,shardcron=debug")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start shardcron run");
        world.adopt(&id, child, log)
    }
}

impl World {
    /// Makes `child`, a node the test started itself, one of this world's nodes, logging to `log`.
    pub fn adopt(&mut self, id: &str, child: Child, log: PathBuf) -> usize {
        let faults_allowed = self.faults_allowed;
        self.nodes.push(Node {
            id: id.to_string(),
            child,
            log,
            faults_allowed,
        });
        self.nodes.len() - 1
    }
}

/// A node process of this world; the world kills it when the test ends.
pub struct Node {
    pub id: String,
    pub child: Child,
    pub log: PathBuf,
    faults_allowed: bool,
}

impl Node {
    pub fn signal(&self, signal: libc::c_int) {
        if [libc::SIGKILL, libc::SIGSTOP, libc::SIGTERM, libc::SIGINT].contains(&signal) {
            super::etcds::allow_fault(self.faults_allowed, &format!("signal {signal} to node {}", self.id));
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// CPU seconds (user + system) the process has used so far, exited threads included, from
    /// `/proc` (10 ms clock ticks).
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks: f64 = fields
            .iter()
            .skip(11)
            .take(2)
            .filter_map(|f| f.parse::<f64>().ok())
            .sum();
        // SAFETY: sysconf only reads a system constant.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// Peak resident memory of the process so far, in MiB, from `/proc`.
    pub fn peak_rss_mib(&self) -> f64 {
        self.memory_mib("VmHWM:")
    }

    /// Resident memory of the process now, in MiB, from `/proc`.
    // Only the benchmarks read it; the tests bound the peak instead.
    #[allow(dead_code)]
    pub fn rss_mib(&self) -> f64 {
        self.memory_mib("VmRSS:")
    }

    fn memory_mib(&self, field: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
