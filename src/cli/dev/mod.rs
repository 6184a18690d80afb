//! `dev`: shardcron on one machine with nothing to set up. Its throwaway etcd goes where the
//! config's endpoint points when that port is free, so commands pasted into a second terminal
//! find it as the README shows them; otherwise `dev` prints the one line to paste first. One node
//! runs in this process, or `--nodes N` run as child processes ([`fleet`]), to watch a fleet
//! share its shards and take over a killed node's.

mod fleet;

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use super::args::endpoints;
use super::{block_on, ConfigArg, NodeArgs};
use crate::etcd_server::EtcdServer;
use crate::rules::config::Config;

/// The most nodes `dev` starts: enough to watch shards spread and move on a laptop.
const MAX_NODES: u8 = 9;

#[derive(Debug, Args)]
pub struct DevArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    #[command(flatten)]
    pub node: NodeArgs,
    /// The etcd binary to start.
    #[arg(long, env = "SHARDCRON_ETCD_BIN", default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// How many nodes to run (1 to 9). One runs in this process; more run as child processes
    /// `dev-1`, `dev-2`.. (`--node-id` names the prefix), each serving HTTP on its own port
    /// counted up from `--http-addr` (default 127.0.0.1:8080), their log lines prefixed by node.
    /// Type `stop dev-2`, `kill dev-2` or `start dev-2` to watch a failover.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=MAX_NODES as i64))]
    pub nodes: u8,
}

/// `dev`: the node, or `--nodes` of them, against a throwaway etcd, removed when they end.
pub fn dev(config: Config, args: &DevArgs) -> Result<()> {
    let wanted = endpoints(&config, &args.node.endpoints).into_iter().next();
    let server = start_etcd(&args.etcd_bin, wanted.as_deref(), &config.path)?;
    let (endpoint_shown, log) = (server.client_url(), server.log_path());
    if args.nodes == 1 {
        tracing::info!(endpoint = %endpoint_shown, log = %log.display(), "throwaway etcd started; Ctrl-C stops the node and removes it");
    } else {
        tracing::info!(endpoint = %endpoint_shown, log = %log.display(), "throwaway etcd started; Ctrl-C stops the nodes and removes it");
    }
    let endpoint = server.client_url();
    // Beside etcd's data, not in it: etcd's directory is removed with it, this one on return.
    let private = tempfile::Builder::new()
        .prefix("shardcron-dev-")
        .tempdir()
        .context("cannot make dev's temp dir")?;
    let mut node = args.node.clone();
    if let Some(token_file) = api_token(&node, private.path())? {
        node.api_token_file = Some(token_file);
    }
    let result = if args.nodes == 1 {
        block_on(super::node::serve(config, &node, vec![endpoint]))
    } else {
        block_on(fleet::run(fleet::Plan {
            config: config.path.clone(),
            node,
            endpoint,
            count: args.nodes,
        }))
    };
    drop(server);
    result
}

/// Starts etcd at the port of `wanted` (the first endpoint the flags or the config name) when it
/// is a plain loopback address whose port is free, else on a free port, and says where it is.
fn start_etcd(bin: &Path, wanted: Option<&str>, config: &Path) -> Result<EtcdServer> {
    let named = |endpoint: &str| format!("{endpoint}, the endpoint {} names,", config.display());
    let reason = match wanted.map(|endpoint| (endpoint, loopback_port(endpoint))) {
        None => format!("{} names no etcd endpoint, so", config.display()),
        Some((endpoint, None)) => format!("{} is not a plain http:// address on this machine, so", named(endpoint)),
        Some((endpoint, Some(port))) if !is_free(port) => format!("{} is taken, so", named(endpoint)),
        Some((endpoint, Some(port))) => match EtcdServer::start_at(bin, port) {
            Ok(server) => {
                eprintln!(
                    "shardcron dev: etcd serves {endpoint}, the endpoint {} names: commands run with that config find it, from any terminal.",
                    config.display()
                );
                return Ok(server);
            }
            // Taken between the look and etcd's start, most likely.
            Err(err) => {
                tracing::debug!(error = %err, port, "etcd did not start at the config's port");
                format!("{} could not be served ({err}), so", named(endpoint))
            }
        },
    };
    let server = EtcdServer::start(bin)?;
    eprintln!(
        "shardcron dev: {reason} etcd serves {} instead. In another terminal, paste this first:\nexport SHARDCRON_ENDPOINTS={}",
        server.client_url(),
        server.client_url()
    );
    Ok(server)
}

/// The port of an `http://127.0.0.1:PORT` or `http://localhost:PORT` endpoint.
fn loopback_port(endpoint: &str) -> Option<u16> {
    let uri: http::Uri = endpoint.trim().parse().ok()?;
    let loopback = matches!(uri.host(), Some("127.0.0.1" | "localhost"));
    (uri.scheme_str() == Some("http") && loopback)
        .then(|| uri.port_u16())
        .flatten()
}

fn is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A token for this run of `dev`, unless one was given: without one every API write (the
/// dashboard's buttons) answers 403. It is shown, once, to the person who started `dev`; the
/// nodes read it from a file only they and that person can read.
fn api_token(node: &NodeArgs, dir: &Path) -> Result<Option<PathBuf>> {
    if node.api_token_env.is_some() || node.api_token_file.is_some() {
        return Ok(None);
    }
    let token = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
    let path = dir.join("api-token");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(token.as_bytes()))
        .with_context(|| format!("cannot write dev's API token to {}", path.display()))?;
    eprintln!(
        "shardcron dev: API token of this run (the dashboard asks for it at its first Trigger, Pause or Resume; for curl: -H 'Authorization: Bearer {token}'): {token}"
    );
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_loopback_endpoint_gives_dev_its_port() {
        assert_eq!(loopback_port("http://127.0.0.1:2379"), Some(2379));
        assert_eq!(loopback_port("http://localhost:2380/"), Some(2380));
        assert_eq!(loopback_port(" http://127.0.0.1:2379 "), Some(2379));
        for elsewhere in [
            "https://127.0.0.1:2379",
            "http://10.0.0.1:2379",
            "http://etcd-1:2379",
            "http://127.0.0.1",
            "127.0.0.1:2379",
            "",
            "http://[::1]:2379",
        ] {
            assert_eq!(loopback_port(elsewhere), None, "{elsewhere}");
        }
    }
}
