//! Throwaway etcd on free loopback ports in a temp dir: one member for `shardcron dev` and most
//! tests, three for the tests that kill etcd's own leader. Killed and removed on drop. The
//! packet-drop tests put a member on other addresses, or in a network namespace ([`MemberNet`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd cluster of one or more members.
pub struct EtcdServer {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    initial_cluster: String,
    tls: Option<ServerTls>,
    /// More command-line flags for every member.
    flags: Vec<String>,
}

/// Certificates for an etcd that serves its clients over TLS and asks them for a certificate
/// signed by `ca`: what the tests of `[etcd.tls]` run against.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

struct Member {
    name: String,
    /// The address its peer, client and metrics URLs are on.
    host: String,
    /// More addresses it serves clients on, at the same port.
    extra_client_hosts: Vec<String>,
    /// A program and its arguments that exec etcd (`ip netns exec NS`), if any.
    wrapper: Vec<String>,
    client_port: u16,
    peer_port: u16,
    /// Plain-HTTP `/health` and `/metrics`, also when clients speak TLS.
    metrics_port: u16,
    /// The etcd binary it runs, when it is not the server's (a member upgraded in place).
    bin: Option<PathBuf>,
    child: Option<Child>,
}

/// Where one member of a test's cluster listens and how it is started: what the packet-drop
/// scenarios need to put a member in a network namespace, or to serve clients that run in one.
#[derive(Debug, Clone)]
pub struct MemberNet {
    /// The address of its peer, client and metrics URLs (`127.0.0.1` by default).
    pub host: String,
    /// More addresses it serves clients on, at the same port, and advertises.
    pub extra_client_hosts: Vec<String>,
    /// A program and its arguments that exec etcd, such as `ip netns exec NS`.
    pub wrapper: Vec<String>,
    /// The port it serves clients on; a free one when `None`.
    pub client_port: Option<u16>,
}

impl Default for MemberNet {
    fn default() -> MemberNet {
        MemberNet {
            host: "127.0.0.1".into(),
            extra_client_hosts: Vec::new(),
            wrapper: Vec::new(),
            client_port: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    #[error("cannot start {bin}: {source} (install etcd with: apt-get install -y etcd-server)")]
    Spawn { bin: String, source: std::io::Error },
    #[error("etcd did not become healthy within {0:?}; its log is in {1}")]
    NotReady(Duration, String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A loopback port that was free a moment ago and that this process has not handed out before:
/// the kernel may offer a port again as soon as it is released, and tests running side by side
/// in one process would then start two servers on it.
pub fn free_port() -> std::io::Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut given = GIVEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if given.insert(port) {
            return Ok(port);
        }
    }
}

/// The variable naming the etcd binary that tests start: `scripts/test` runs the fault scenarios
/// a second time with it set to etcd 3.5.1, so each fault is tried on both versions we support.
#[cfg(any(test, feature = "test-support"))]
pub const TEST_ETCD_VAR: &str = "SHARDCRON_TEST_ETCD";

/// The etcd binary tests start: the one [`TEST_ETCD_VAR`] names, else `etcd` on the `PATH`
/// (Debian's 3.4).
#[cfg(any(test, feature = "test-support"))]
pub fn test_etcd_bin() -> PathBuf {
    std::env::var_os(TEST_ETCD_VAR)
        .filter(|bin| !bin.is_empty())
        .map_or_else(|| PathBuf::from("etcd"), PathBuf::from)
}

impl EtcdServer {
    /// Starts a single-member etcd and waits until it is healthy.
    pub fn start(bin: &Path) -> Result<EtcdServer, EtcdServerError> {
        Self::start_with(bin, 1, None, &[])
    }

    /// Starts a single-member etcd serving its clients on loopback at `client_port`, and waits
    /// until it is healthy: `dev` puts it where the config's endpoint points.
    pub fn start_at(bin: &Path, client_port: u16) -> Result<EtcdServer, EtcdServerError> {
        let member = MemberNet {
            client_port: Some(client_port),
            ..MemberNet::default()
        };
        Self::start_members(bin, &[member], None, &[])
    }

    #[cfg(feature = "test-support")]
    /// Starts a single-member etcd whose clients must use TLS with a client certificate.
    pub fn start_tls(bin: &Path, tls: ServerTls) -> Result<EtcdServer, EtcdServerError> {
        Self::start_with(bin, 1, Some(tls), &[])
    }

    #[cfg(feature = "test-support")]
    /// Starts `size` members on loopback and waits until each is healthy.
    pub fn start_cluster(bin: &Path, size: usize) -> Result<EtcdServer, EtcdServerError> {
        Self::start_with(bin, size, None, &[])
    }

    /// Starts a single-member etcd with more command-line flags, such as `--auth-token-ttl=2`.
    #[cfg(feature = "test-support")]
    pub fn start_with_flags(bin: &Path, flags: &[&str]) -> Result<EtcdServer, EtcdServerError> {
        Self::start_with(bin, 1, None, flags)
    }

    /// Starts one member per entry of `nets`, each listening and started as it says.
    #[cfg(feature = "test-support")]
    pub fn start_cluster_on(bin: &Path, nets: &[MemberNet]) -> Result<EtcdServer, EtcdServerError> {
        Self::start_members(bin, nets, None, &[])
    }

    fn start_with(
        bin: &Path,
        size: usize,
        tls: Option<ServerTls>,
        flags: &[&str],
    ) -> Result<EtcdServer, EtcdServerError> {
        let loopback = vec![MemberNet::default(); size];
        Self::start_members(bin, &loopback, tls, flags)
    }

    fn start_members(
        bin: &Path,
        nets: &[MemberNet],
        tls: Option<ServerTls>,
        flags: &[&str],
    ) -> Result<EtcdServer, EtcdServerError> {
        let size = nets.len();
        let mut members = Vec::with_capacity(size);
        for (index, net) in nets.iter().enumerate() {
            members.push(Member {
                name: format!("member{index}"),
                host: net.host.clone(),
                extra_client_hosts: net.extra_client_hosts.clone(),
                wrapper: net.wrapper.clone(),
                client_port: match net.client_port {
                    Some(port) => port,
                    None => free_port()?,
                },
                peer_port: free_port()?,
                metrics_port: free_port()?,
                bin: None,
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|member| format!("{}=http://{}:{}", member.name, member.host, member.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut server = EtcdServer {
            members,
            dir: tempfile::Builder::new().prefix("shardcron-etcd-").tempdir()?,
            bin: bin.to_path_buf(),
            initial_cluster,
            tls,
            flags: flags.iter().map(|flag| flag.to_string()).collect(),
        };
        for index in 0..size {
            server.spawn(index)?;
        }
        for index in 0..size {
            server.wait_healthy(index, Duration::from_secs(30))?;
        }
        Ok(server)
    }

    fn spawn(&mut self, index: usize) -> Result<(), EtcdServerError> {
        let member = &self.members[index];
        let clients = std::iter::once(self.client_url_of(index))
            .chain(
                member
                    .extra_client_hosts
                    .iter()
                    .map(|host| self.client_url_on(index, host)),
            )
            .collect::<Vec<_>>()
            .join(",");
        let peer = format!("http://{}:{}", member.host, member.peer_port);
        let tls_args: Vec<String> = self
            .tls
            .iter()
            .flat_map(|tls| {
                [
                    format!("--cert-file={}", tls.cert.display()),
                    format!("--key-file={}", tls.key.display()),
                    format!("--trusted-ca-file={}", tls.ca.display()),
                    "--client-cert-auth".to_string(),
                ]
            })
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path_of(index))?;
        let bin = self.bin_of(index);
        let mut command = match member.wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(bin);
                command
            }
            None => Command::new(bin),
        };
        let child = command
            .arg(format!("--name={}", member.name))
            .arg(format!("--data-dir={}", self.dir.path().join(&member.name).display()))
            .arg(format!("--listen-client-urls={clients}"))
            .arg(format!("--advertise-client-urls={clients}"))
            .arg(format!(
                "--listen-metrics-urls=http://{}:{}",
                member.host, member.metrics_port
            ))
            .args(tls_args)
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg("--initial-cluster-token=shardcron-throwaway")
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .args(&self.flags)
            .stdin(Stdio::null())
            // Its own process group: a Ctrl-C in the terminal reaches the node, which then
            // needs etcd to resign its shards, not etcd itself.
            .process_group(0)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|source| EtcdServerError::Spawn {
                bin: self.bin_of(index).display().to_string(),
                source,
            })?;
        self.members[index].child = Some(child);
        Ok(())
    }

    /// The first member's client URL.
    pub fn client_url(&self) -> String {
        self.client_url_of(0)
    }

    pub fn client_url_of(&self, index: usize) -> String {
        self.client_url_on(index, &self.members[index].host)
    }

    /// The client URL of member `index` at `host`: its own address or one of its extra ones.
    pub fn client_url_on(&self, index: usize, host: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{host}:{}", self.members[index].client_port)
    }

    #[cfg(feature = "test-support")]
    /// Every member's client URL.
    pub fn client_urls(&self) -> Vec<String> {
        (0..self.members.len()).map(|index| self.client_url_of(index)).collect()
    }

    #[cfg(feature = "test-support")]
    /// host:port of the first member, for proxies.
    pub fn client_address(&self) -> String {
        format!("{}:{}", self.members[0].host, self.members[0].client_port)
    }

    /// The first member's log.
    pub fn log_path(&self) -> PathBuf {
        self.log_path_of(0)
    }

    fn log_path_of(&self, index: usize) -> PathBuf {
        self.dir.path().join(format!("{}.log", self.members[index].name))
    }

    #[cfg(feature = "test-support")]
    /// Kills every member and keeps the data, so [`EtcdServer::restart`] comes back with the same
    /// state.
    pub fn kill(&mut self) {
        for index in 0..self.members.len() {
            self.kill_member(index);
        }
    }

    #[cfg(feature = "test-support")]
    pub fn kill_member(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    #[cfg(feature = "test-support")]
    /// Stalls member `index` (SIGSTOP): it keeps its connections and answers nothing, as a
    /// member hung on a slow disk does.
    pub fn stall_member(&self, index: usize) {
        self.signal_member(index, libc::SIGSTOP);
    }

    #[cfg(feature = "test-support")]
    /// Lets a member stalled by [`EtcdServer::stall_member`] go on (SIGCONT).
    pub fn resume_member(&self, index: usize) {
        self.signal_member(index, libc::SIGCONT);
    }

    #[cfg(feature = "test-support")]
    fn signal_member(&self, index: usize, signal: libc::c_int) {
        if let Some(child) = &self.members[index].child {
            // SAFETY: kill(2) on the pid of a child this server spawned and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    #[cfg(feature = "test-support")]
    /// Starts every stopped member again on the same ports and data.
    pub fn restart(&mut self) -> Result<(), EtcdServerError> {
        for index in 0..self.members.len() {
            self.restart_member(index)?;
        }
        Ok(())
    }

    #[cfg(feature = "test-support")]
    /// Stops member `index` as an operator does (SIGTERM: it hands raft leadership on if it
    /// holds it) and waits for it to exit; its data stays for [`EtcdServer::restart_member`].
    pub fn terminate_member(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            // SAFETY: kill(2) on the pid of a child this server spawned and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    #[cfg(feature = "test-support")]
    /// Starts a stopped member again on its ports and data, and waits until it answers healthy.
    pub fn restart_member(&mut self, index: usize) -> Result<(), EtcdServerError> {
        if self.members[index].child.is_none() {
            self.spawn(index)?;
            self.wait_healthy(index, Duration::from_secs(30))?;
        }
        Ok(())
    }

    #[cfg(feature = "test-support")]
    /// Upgrades member `index` in place, as an operator does: stops it with SIGTERM, starts
    /// `bin` on its ports and data, and waits until it answers healthy.
    pub fn upgrade_member(&mut self, index: usize, bin: &Path) -> Result<(), EtcdServerError> {
        self.terminate_member(index);
        self.members[index].bin = Some(bin.to_path_buf());
        self.restart_member(index)
    }

    fn bin_of(&self, index: usize) -> &Path {
        self.members[index].bin.as_deref().unwrap_or(&self.bin)
    }

    #[cfg(feature = "test-support")]
    /// The index of the member that is raft leader now, if any answers so.
    pub fn leader_member(&self) -> Option<usize> {
        (0..self.members.len()).find(|&index| self.metric_of(index, "etcd_server_is_leader") == Some(1.0))
    }

    #[cfg(feature = "test-support")]
    /// Members whose process has exited or that do not answer healthy, each with its log's tail:
    /// what a test checks before it injects a fault of its own.
    pub fn unwell_members(&mut self) -> Vec<String> {
        (0..self.members.len())
            .filter_map(|index| {
                let exited = self.members[index]
                    .child
                    .as_mut()
                    .is_none_or(|child| !matches!(child.try_wait(), Ok(None)));
                let healthy = self
                    .http_get(index, "/health")
                    .is_some_and(|body| body.contains("\"health\":\"true\""));
                (exited || !healthy).then(|| self.log_tail(index, exited))
            })
            .collect()
    }

    #[cfg(feature = "test-support")]
    /// Every member's log tail, for a failing test's output.
    pub fn log_tails(&self) -> Vec<String> {
        (0..self.members.len())
            .map(|index| self.log_tail(index, false))
            .collect()
    }

    #[cfg(feature = "test-support")]
    fn log_tail(&self, index: usize, exited: bool) -> String {
        let log = std::fs::read_to_string(self.log_path_of(index)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        format!(
            "{}{}:\n{tail}",
            self.members[index].name,
            if exited { " (exited)" } else { "" }
        )
    }

    fn wait_healthy(&mut self, index: usize, limit: Duration) -> Result<(), EtcdServerError> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.members[index].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(EtcdServerError::Spawn {
                        bin: self.bin_of(index).display().to_string(),
                        source: std::io::Error::other(format!(
                            "exited with {status}; see {}",
                            self.log_path_of(index).display()
                        )),
                    });
                }
            }
            if self
                .http_get(index, "/health")
                .is_some_and(|body| body.contains("\"health\":\"true\""))
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(EtcdServerError::NotReady(
            limit,
            self.log_path_of(index).display().to_string(),
        ))
    }

    #[cfg(feature = "test-support")]
    /// The value of a counter or gauge on the first member's `/metrics` page, summed over its
    /// label sets.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metric_of(0, name)
    }

    #[cfg(feature = "test-support")]
    fn metric_of(&self, index: usize, name: &str) -> Option<f64> {
        let page = self.http_get(index, "/metrics")?;
        let values: Vec<f64> = page
            .lines()
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    fn http_get(&self, index: usize, path: &str) -> Option<String> {
        let (host, port) = (self.members[index].host.as_str(), self.members[index].metrics_port);
        let address: std::net::SocketAddr = format!("{host}:{port}").parse().ok()?;
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        Some(response)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
