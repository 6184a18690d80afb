//! The options of a running node, shared by `run` and `dev`, as clap parses them: each flag's
//! own syntax is checked here (a node id, tags, a listen address, a grace); what needs several
//! flags, the environment or a file (the API tokens, the host name) is checked once by
//! [`super::node_start`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::rules::pools::Tags;

/// Options of a running node, shared by `run` and `dev`.
#[derive(Debug, Args, Clone)]
pub struct NodeArgs {
    /// This node's id in etcd and in CRON_NODE: 1 to 253 letters, digits, '.', '_' and '-'.
    /// Default: the host name.
    #[arg(long, env = "SHARDCRON_NODE_ID", value_parser = parse_node_id)]
    pub node_id: Option<String>,
    /// This node's tags, comma-separated (at most 32, each 1 to 64 letters, digits, '.', '_'
    /// and '-'): it runs the jobs whose `run_on` tags it has all of, and every job without
    /// `run_on`. Change them with a restart.
    #[arg(long, env = "SHARDCRON_TAGS", value_name = "TAG,...", default_value = "", value_parser = parse_tags)]
    pub tags: Tags,
    /// etcd endpoints, comma-separated; overrides [etcd] endpoints.
    #[arg(long, env = "SHARDCRON_ENDPOINTS", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// On SIGTERM/SIGINT, how long running commands may go on before they are killed (at most
    /// 1 day).
    #[arg(long, env = "SHARDCRON_SHUTDOWN_GRACE", default_value = "30s", value_parser = crate::rules::bounds::wait)]
    pub shutdown_grace: Duration,
    /// Serve HTTP at HOST:PORT (a bare PORT: on loopback only): /healthz, /readyz, /metrics,
    /// the JSON API under /api/v1 and the dashboard at /. Also spelled --metrics-addr (and
    /// SHARDCRON_METRICS_ADDR), its name before it served more than metrics.
    #[arg(long, env = "SHARDCRON_HTTP_ADDR", value_name = "HOST:PORT", alias = "metrics-addr", value_parser = parse_listen_address)]
    pub http_addr: Option<std::net::SocketAddr>,
    /// The most HTTP connections open at once; more wait until one closes. At most half the
    /// node's descriptor limit is used, so clients never take the descriptors runs need.
    #[arg(long, env = "SHARDCRON_HTTP_MAX_CONNECTIONS", value_name = "N", default_value_t = shardcron_http_default_connections(), value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub http_max_connections: u32,
    /// Host names HTTP requests may name besides the listen address and loopback (a name, or
    /// NAME:PORT), comma-separated; requests for any other `Host` get 421.
    #[arg(
        long,
        env = "SHARDCRON_HTTP_ALLOWED_HOSTS",
        value_name = "HOSTS",
        value_delimiter = ','
    )]
    pub http_allowed_hosts: Vec<String>,
    /// The environment variable that holds the bearer token API writes (trigger, pause,
    /// resume) need (at least 16 bytes). Without a token (this, --api-token-file or the systemd
    /// credential api-token) every write answers 403. Jobs never see the variable.
    #[arg(
        long,
        env = "SHARDCRON_API_TOKEN_ENV",
        value_name = "VAR",
        conflicts_with = "api_token_file"
    )]
    pub api_token_env: Option<String>,
    /// A file holding the API's write token, readable by the node's user only (mode 0600 or
    /// 0400). Without this or --api-token-env, the systemd credential api-token is used if given.
    #[arg(long, env = "SHARDCRON_API_TOKEN_FILE", value_name = "PATH")]
    pub api_token_file: Option<PathBuf>,
    /// The environment variable that holds the bearer token API reads need (at least 16
    /// bytes); probes and /metrics need none. Without a read token (this, --api-read-token-file
    /// or the systemd credential api-read-token) reads are open.
    #[arg(
        long,
        env = "SHARDCRON_API_READ_TOKEN_ENV",
        value_name = "VAR",
        conflicts_with = "api_read_token_file"
    )]
    pub api_read_token_env: Option<String>,
    /// A file holding the API's read token, readable by the node's user only.
    #[arg(long, env = "SHARDCRON_API_READ_TOKEN_FILE", value_name = "PATH")]
    pub api_read_token_file: Option<PathBuf>,
    /// Log lines as human-readable text or as one JSON object per line.
    #[arg(long, env = "SHARDCRON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn shardcron_http_default_connections() -> u32 {
    crate::serving::http::DEFAULT_MAX_CONNECTIONS as u32
}

/// A node id: part of etcd keys (its registration, its own election, its instances' records).
pub(crate) fn parse_node_id(value: &str) -> Result<String, String> {
    let valid = (1..=253).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(value.to_string())
    } else {
        Err(format!(
            "invalid node id {value:?}: use 1 to 253 letters, digits, '.', '_' and '-'"
        ))
    }
}

fn parse_tags(value: &str) -> Result<Tags, String> {
    Tags::parse(value)
}

/// `HOST:PORT`, or a bare `PORT` on loopback: the listener is never public unless asked.
pub(super) fn parse_listen_address(value: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = value.trim().parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not HOST:PORT (such as 127.0.0.1:9464) or a port"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
