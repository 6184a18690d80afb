//! A throwaway single-member etcd on free loopback ports in a temp dir: what `shardcron dev`
//! runs against, and what every integration test starts for itself.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd process; stopped and its data removed on drop.
pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    bin: PathBuf,
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

/// A loopback port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts `bin` and waits until it answers `/health`.
    pub fn start(bin: &Path) -> Result<EtcdServer, EtcdServerError> {
        let mut server = EtcdServer {
            child: None,
            dir: tempfile::Builder::new().prefix("shardcron-etcd-").tempdir()?,
            client_port: free_port()?,
            peer_port: free_port()?,
            bin: bin.to_path_buf(),
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), EtcdServerError> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let child = Command::new(&self.bin)
            .arg("--name=shardcron-dev")
            .arg(format!("--data-dir={}", self.dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=shardcron-dev={peer}"))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            // Its own process group: a Ctrl-C in the terminal reaches the node, which then
            // needs etcd to resign its shards, not etcd itself.
            .process_group(0)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|source| EtcdServerError::Spawn {
                bin: self.bin.display().to_string(),
                source,
            })?;
        self.child = Some(child);
        self.wait_healthy(Duration::from_secs(20))
    }

    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills etcd and keeps its data, so [`EtcdServer::restart`] comes back with the same state.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub fn restart(&mut self) -> Result<(), EtcdServerError> {
        self.kill();
        self.spawn()
    }

    fn wait_healthy(&mut self, limit: Duration) -> Result<(), EtcdServerError> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(EtcdServerError::Spawn {
                        bin: self.bin.display().to_string(),
                        source: std::io::Error::other(format!(
                            "exited with {status}; see {}",
                            self.log_path().display()
                        )),
                    });
                }
            }
            if self.healthy() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(EtcdServerError::NotReady(limit, self.log_path().display().to_string()))
    }

    fn healthy(&self) -> bool {
        self.http_get("/health")
            .is_some_and(|body| body.contains("\"health\":\"true\""))
    }

    /// The value of a counter or gauge on etcd's `/metrics` page, summed over its label sets.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let page = self.http_get("/metrics")?;
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

    fn http_get(&self, path: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.client_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.client_port
        );
        stream.write_all(request.as_bytes()).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        Some(response)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
