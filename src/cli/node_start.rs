//! A node's start, validated: the flags of `run` (and of the node `dev` runs in its own process)
//! with what the environment adds to them (`SHARDCRON_METRICS_ADDR`, `$CREDENTIALS_DIRECTORY`,
//! the host name, the variables and files that hold the API's tokens, the etcd password),
//! checked once into a [`NodeStart`] before anything is spawned, as `rules::config` checks the
//! file into a `Config`.
//!
//! `node_args` is what clap parses, each flag on its own; this is what the start runs on. Nothing
//! after it reads a flag, loads a secret or asks the host its name.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::node_args::{parse_listen_address, parse_node_id, NodeArgs};
use super::node_secrets::{NodeSecrets, OwnSecretRefused};
use crate::coord::etcd::{self, SetupError};
use crate::rules::config::Config;
use crate::rules::pools::Tags;
use crate::secrets::{self, ChildEnv, Origin, Secret, SecretError, Sources};

/// The shortest API token a node accepts: a short one is guessed by trying.
pub const MIN_API_TOKEN: usize = 16;

/// Everything a node's start needs, validated. Holds the API's tokens: never logged, and no
/// `Debug`.
pub(super) struct NodeStart {
    pub config: Config,
    /// The etcd endpoints to connect to: the flag's, else the config's (`dev`: its own etcd's).
    pub endpoints: Vec<String>,
    /// The client's options from `[etcd]`, its password loaded.
    pub etcd_options: etcd_client::ConnectOptions,
    /// `--node-id`, else the host name.
    pub node_id: String,
    pub tags: Tags,
    pub shutdown_grace: Duration,
    pub http: HttpPlan,
    /// The node's own secret sources, refused in notifier headers again at each reload.
    pub own_secrets: NodeSecrets,
    /// The environment every command starts from: the node's own without its secrets or the
    /// config's.
    pub child_env: Arc<ChildEnv>,
}

/// The HTTP listener (served only with an address) and the API's tokens.
pub(super) struct HttpPlan {
    /// `--http-addr`, else `SHARDCRON_METRICS_ADDR`.
    pub address: Option<SocketAddr>,
    /// The bearer token API writes need; without one every write answers 403.
    pub token: Option<String>,
    /// The bearer token API reads need; without one reads are open.
    pub read_token: Option<String>,
    /// `--http-max-connections`, before half the descriptor limit caps it.
    pub max_connections: u32,
    /// `--http-allowed-hosts`.
    pub allowed_hosts: Vec<String>,
}

/// Why a node cannot start with its flags and environment. Each message names the flag,
/// variable or file and what to do; the start ends with it before anything is spawned.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// A notifier header of the config names one of the node's own secrets (file and field).
    #[error(transparent)]
    OwnSecret(#[from] OwnSecretRefused),
    /// `SHARDCRON_METRICS_ADDR`, the older spelling of `--http-addr`, is no address.
    #[error("SHARDCRON_METRICS_ADDR: {0}")]
    MetricsAddr(String),
    /// An API token the flags or the credentials name cannot be read (the message says which).
    #[error(transparent)]
    Token(#[from] SecretError),
    /// An API token short enough to be guessed.
    #[error("{what}: the token from the {origin} is {len} bytes long; it must be at least {MIN_API_TOKEN} (such as `openssl rand -hex 32`)")]
    ShortToken { what: String, origin: Origin, len: usize },
    /// No `--node-id`, and the host name cannot be read.
    #[error("cannot read the host name; pass --node-id")]
    Hostname(#[source] std::io::Error),
    /// No `--node-id`, and the host name is not one.
    #[error("the host name is no node id ({0}); pass --node-id")]
    HostnameNotNodeId(String),
    /// `[etcd]` gives no client: its password or a TLS file cannot be read (the config's path,
    /// then why).
    #[error("{}", path.display())]
    Etcd {
        path: PathBuf,
        #[source]
        source: SetupError,
    },
}

impl NodeStart {
    /// Checks `args` and the environment against `config`, in the order a start always has:
    /// the notifier headers against the node's secrets, the listen address, the API tokens
    /// (their origins logged), the node id, the etcd client's options. The first error ends the
    /// start.
    pub(super) fn validate(config: Config, args: &NodeArgs, endpoints: Vec<String>) -> Result<NodeStart, StartError> {
        // A notifier would send such a secret to its URL: refused before anything starts.
        let own_secrets = NodeSecrets::of(args, std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from));
        own_secrets.check(&config)?;
        let address = listen_address(args)?;
        let (token, read_token) = tokens(args)?;
        // Every command starts from the node's environment without the variables that hold its
        // secrets or the config's; a reload scrubs the ones its config adds.
        let secret_variables: Vec<&str> = secret_variables(args).chain(config.secret_variables()).collect();
        let child_env = Arc::new(ChildEnv::of_node(std::env::vars_os(), &secret_variables));
        let node_id = node_id(args)?;
        let etcd_options = etcd::connect_options(&config.etcd).map_err(|source| StartError::Etcd {
            path: config.path.clone(),
            source,
        })?;
        Ok(NodeStart {
            config,
            endpoints,
            etcd_options,
            node_id,
            tags: args.tags.clone(),
            shutdown_grace: args.shutdown_grace,
            http: HttpPlan {
                address,
                token,
                read_token,
                max_connections: args.http_max_connections,
                allowed_hosts: args.http_allowed_hosts.clone(),
            },
            own_secrets,
            child_env,
        })
    }
}

/// Where to serve HTTP: `--http-addr`, else the older `SHARDCRON_METRICS_ADDR`.
fn listen_address(args: &NodeArgs) -> Result<Option<SocketAddr>, StartError> {
    if args.http_addr.is_some() {
        return Ok(args.http_addr);
    }
    match std::env::var("SHARDCRON_METRICS_ADDR") {
        Ok(value) if !value.trim().is_empty() => {
            parse_listen_address(&value).map(Some).map_err(StartError::MetricsAddr)
        }
        _ => Ok(None),
    }
}

/// The API's tokens, their origins logged (never their values): each from the variable its
/// `-env` flag names, the file its `-file` flag names, or its systemd credential.
fn tokens(args: &NodeArgs) -> Result<(Option<String>, Option<String>), StartError> {
    let token = api_token(Sources {
        what: "the API token (--api-token-env, --api-token-file, credential api-token)",
        env: args.api_token_env.as_deref(),
        file: args.api_token_file.as_deref(),
        credential: secrets::API_TOKEN_CREDENTIAL,
    })?;
    let read_token = api_token(Sources {
        what: "the API read token (--api-read-token-env, --api-read-token-file, credential api-read-token)",
        env: args.api_read_token_env.as_deref(),
        file: args.api_read_token_file.as_deref(),
        credential: secrets::API_READ_TOKEN_CREDENTIAL,
    })?;
    for (name, secret) in [("API token", &token), ("API read token", &read_token)] {
        if let Some(secret) = secret {
            // Under the target these lines have always had, which filters (SHARDCRON_LOG) name.
            tracing::info!(target: "shardcron::cli::node", from = %secret.origin, "{name} loaded");
        }
    }
    Ok((token.map(|secret| secret.value), read_token.map(|secret| secret.value)))
}

/// A token, with the blanks around it dropped (a stray newline or space is never meant), and
/// refused if shorter than [`MIN_API_TOKEN`].
fn api_token(sources: Sources) -> Result<Option<Secret>, StartError> {
    let Some(mut token) = secrets::load(sources)? else {
        return Ok(None);
    };
    token.value = token.value.trim().to_string();
    if token.value.len() < MIN_API_TOKEN {
        return Err(StartError::ShortToken {
            what: sources.what.to_string(),
            origin: token.origin,
            len: token.value.len(),
        });
    }
    Ok(Some(token))
}

/// The variables that hold the node's secrets, which its jobs must not see.
fn secret_variables(args: &NodeArgs) -> impl Iterator<Item = &str> {
    [&args.api_token_env, &args.api_read_token_env]
        .into_iter()
        .filter_map(|var| var.as_deref())
}

/// `--node-id`, else the host name if it is a valid node id.
fn node_id(args: &NodeArgs) -> Result<String, StartError> {
    match &args.node_id {
        Some(id) => Ok(id.clone()),
        None => {
            let host = hostname::get().map_err(StartError::Hostname)?;
            parse_node_id(&host.to_string_lossy()).map_err(StartError::HostnameNotNodeId)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn an_api_token_is_trimmed_and_must_be_at_least_16_bytes() {
        let dir = tempfile::tempdir().expect("dir");
        let token = |text: &str| {
            let path = dir.path().join("token");
            std::fs::write(&path, text).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            api_token(Sources {
                what: "the test token",
                env: None,
                file: Some(&path),
                credential: "unused",
            })
        };
        let got = token(" 0123456789abcdef \n").expect("16 bytes").expect("a token");
        assert_eq!(got.value, "0123456789abcdef");
        let err = token("0123456789abcde\n").expect_err("15 bytes").to_string();
        assert!(err.contains("15 bytes") && err.contains("at least 16"), "{err}");
        assert!(!err.contains("0123456789abcde"), "the error shows the token: {err}");
    }
}
