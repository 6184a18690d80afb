//! How a throwaway etcd's members are started, and how the server knows one is healthy.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, EtcdServer, EtcdServerError, Member, MemberNet, ServerTls};

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

    pub(super) fn spawn(&mut self, index: usize) -> Result<(), EtcdServerError> {
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

    pub(super) fn log_path_of(&self, index: usize) -> PathBuf {
        self.dir.path().join(format!("{}.log", self.members[index].name))
    }

    pub(super) fn bin_of(&self, index: usize) -> &Path {
        self.members[index].bin.as_deref().unwrap_or(&self.bin)
    }

    pub(super) fn wait_healthy(&mut self, index: usize, limit: Duration) -> Result<(), EtcdServerError> {
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

    pub(super) fn http_get(&self, index: usize, path: &str) -> Option<String> {
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
