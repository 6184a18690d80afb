//! Throwaway etcd on free loopback ports in a temp dir: one member for `shardcron dev` and most
//! tests, three for the tests that kill etcd's own leader. Killed and removed on drop. The
//! packet-drop tests put a member on other addresses, or in a network namespace ([`MemberNet`]).
//!
//! - `start`: how members are started and known to be healthy.
//! - `faults`: what tests do to running members (kill, stall, restart, upgrade) and read back.

#[cfg(feature = "test-support")]
mod faults;
mod start;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

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
