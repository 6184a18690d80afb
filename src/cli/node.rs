//! `run` (and each node of `dev`): a node's start. The config is read so that it leaves nothing resident, the
//! HTTP listener is served before etcd answers, and signals and reloads are forwarded to the
//! node.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::args::endpoints;
use super::node_secrets::NodeSecrets;
use super::node_start::NodeStart;
use super::{block_on, ConfigArg, NodeArgs};
use crate::backoff::{sleep_or_cancel, Backoff};
use crate::coord::health::Limits;
use crate::coord::keys::Keys;
use crate::coord::members::Members;
use crate::coord::record_format;
use crate::node::{self, NodeOptions};
use crate::readiness::{Readiness, Stage};
use crate::rules::config::Config;
use crate::serving::http::Exposure;
use crate::{coord::etcd, memory, running::descriptors, secrets, serving::http, serving::systemd};

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// The config of a node about to start. A node holds secrets and runs jobs as its own user:
/// before it reads any secret, it makes itself not dumpable, so those jobs cannot read its
/// environment or memory through `/proc`.
pub fn load(config: &ConfigArg) -> Result<Config> {
    secrets::forbid_inspection()
        .context("cannot mark the node not dumpable (prctl PR_SET_DUMPABLE), which keeps its secrets from its jobs")?;
    load_for_node(&config.path()?)
}

/// `run`: the node, against the etcd of `--endpoints` or the config, until it is stopped.
pub fn run(config: Config, args: &NodeArgs) -> Result<()> {
    let endpoints = endpoints(&config, &args.endpoints);
    block_on(serve(config, args, endpoints))
}

/// A node's start: its flags and environment validated into a [`NodeStart`] first (any error
/// ends the start before anything is spawned), then the pieces started in order: the signal,
/// readiness and memory tasks, the HTTP listener, the reload on SIGHUP, the connection to etcd
/// and its members, the record format's check, and the node.
pub(super) async fn serve(config: Config, args: &NodeArgs, endpoints: Vec<String>) -> Result<()> {
    let NodeStart {
        config,
        endpoints,
        etcd_options: options,
        node_id,
        tags,
        shutdown_grace,
        http: plan,
        own_secrets,
        child_env,
    } = NodeStart::validate(config, args, endpoints)?;
    let shutdown = CancellationToken::new();
    let hurry = CancellationToken::new();
    let readiness = Readiness::default();
    let exposure = Exposure::default();
    tokio::spawn(forward_signals(shutdown.clone(), hurry.clone()));
    tokio::spawn(systemd::follow(readiness.clone()));
    tokio::spawn(memory::trim_until(shutdown.clone()));
    log_start(&config, &endpoints);
    // Served from the start, so an operator sees etcd errors while the node waits for etcd, and
    // until the node has ended, so `/readyz` says it is stopping while it drains.
    let listener_stop = CancellationToken::new();
    let _stop_listener = listener_stop.clone().drop_guard();
    if let Some(address) = plan.address {
        let served = |max_connections| http::Served {
            cluster: config.cluster.clone(),
            readiness: readiness.clone(),
            exposure: exposure.clone(),
            token: plan.token,
            read_token: plan.read_token,
            max_connections,
            allowed_hosts: plan.allowed_hosts,
        };
        serve_http(address, plan.max_connections, served, listener_stop.clone()).await?;
    }
    let probe_key = Keys::new(&config.cluster.name).nodes_prefix();
    // Before connecting, which may wait for etcd: SIGHUP's default action would end the node.
    let (reloads, reloaded) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(reload_on_hangup(
        config.path.clone(),
        own_secrets,
        Arc::clone(&child_env),
        reloads,
    ));
    let members = Members::new(Limits::for_ttl(config.cluster.lease_ttl));
    let Some(client) = connect(&endpoints, options.clone(), &members, &probe_key, &readiness, &shutdown).await? else {
        return Ok(());
    };
    let etcd_member = members.first();
    tokio::spawn(crate::coord::endpoints::follow(members, options, shutdown.clone()));
    if !can_read_records(&client, &Keys::new(&config.cluster.name), &readiness, &shutdown).await? {
        return Ok(());
    }
    let options = NodeOptions {
        node_id,
        tags,
        shutdown_grace,
        hurry,
        readiness,
        exposure,
        child_env,
        etcd_member,
    };
    node::run(config, options, client, shutdown, reloaded).await;
    Ok(())
}

/// What a start logs before it serves or connects: where it connects, the config's warnings,
/// and the descriptor limit it raised.
fn log_start(config: &Config, endpoints: &[String]) {
    tracing::info!(endpoints = ?endpoints, config = %config.path.display(), digest = %config.digest, "connecting to etcd");
    for warning in config.warnings() {
        tracing::warn!(config = %config.path.display(), "{warning}");
    }
    match descriptors::raise_limit() {
        Ok(raised) => {
            let shown = |limit: Option<u64>| limit.map_or_else(|| "unlimited".to_owned(), |limit| limit.to_string());
            tracing::info!(
                before = %shown(raised.before),
                now = %shown(raised.now),
                hard = %shown(raised.hard),
                "file descriptor limit (RLIMIT_NOFILE soft) raised to the hard limit"
            )
        }
        Err(err) => tracing::warn!(error = %err, "cannot raise the file descriptor limit to the hard limit"),
    }
}

/// Binds the HTTP listener and serves it until `stop`, with at most the `asked` connections and
/// half the descriptor limit (the cap `served` is given).
async fn serve_http(
    address: std::net::SocketAddr,
    asked: u32,
    served: impl FnOnce(usize) -> http::Served,
    stop: CancellationToken,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen for HTTP on {address}"))?;
    let served = served(http::connection_cap(asked as usize, descriptors::soft_limit()));
    let max_connections = served.max_connections;
    let writes = if served.token.is_some() {
        "on"
    } else {
        "off (no --api-token-env, --api-token-file or credential api-token)"
    };
    let reads = if served.read_token.is_some() {
        "need the read token"
    } else {
        "open"
    };
    if max_connections < asked as usize {
        tracing::warn!(asked, max_connections, "--http-max-connections lowered to half the descriptor limit, so clients cannot take the descriptors runs need");
    }
    tracing::info!(%address, writes, reads, max_connections, "serving HTTP: / (dashboard), /healthz, /readyz, /metrics, /api/v1");
    tokio::spawn(http::serve(listener, served, stop));
    Ok(())
}

/// SIGTERM or SIGINT starts a graceful stop. A second one kills the running commands' process
/// groups at once and lets the node end (so `dev` still removes its etcd); a node that has not
/// ended within [`HURRY_LIMIT`] exits anyway.
async fn forward_signals(shutdown: CancellationToken, hurry: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers; stop the node with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping gracefully"),
        _ = int.recv() => tracing::info!("SIGINT: stopping gracefully"),
    }
    shutdown.cancel();
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::warn!("second signal: killing running commands and exiting");
    hurry.cancel();
    tokio::time::sleep(HURRY_LIMIT).await;
    tracing::warn!(limit = ?HURRY_LIMIT, "the node did not end after a second signal: exiting now");
    std::process::exit(130);
}

/// After a second signal, how long the node may take to kill its commands and end.
const HURRY_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Connects to etcd, retrying with backoff while it is out of reach, until `shutdown`. A refused
/// credential (password, certificate) ends the start: no retry can fix it.
async fn connect(
    endpoints: &[String],
    options: etcd_client::ConnectOptions,
    members: &Members,
    probe_key: &str,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Result<Option<etcd_client::Client>> {
    let refused = |err: etcd::CoordError| {
        anyhow::Error::new(err).context(format!(
            "etcd at {endpoints:?} refused this node's credentials; check [etcd] username, password_env and tls"
        ))
    };
    let mut backoff = Backoff::coordination();
    loop {
        let attempt = match etcd::connect(endpoints, options.clone(), members).await {
            Ok(client) => match etcd::probe(&client, probe_key).await {
                Ok(()) => return Ok(Some(client)),
                Err(err) if err.is_refusal() => return Err(refused(err)),
                Err(err) => {
                    tracing::warn!(error = %err, "etcd does not answer yet; starting anyway, the node retries with backoff");
                    return Ok(Some(client));
                }
            },
            Err(err) if err.is_refusal() => return Err(refused(err)),
            Err(err) => err,
        };
        readiness.set(Stage::EtcdUnreachable(attempt.to_string()));
        let wait = backoff.next_delay();
        tracing::warn!(error = %attempt, retry_in = ?wait, "cannot connect to etcd; retrying");
        if !sleep_or_cancel(wait, shutdown).await {
            return Ok(None);
        }
    }
}

/// Whether this node can read the cluster's records (`coord::record_format`), asking etcd
/// until it answers; `false` if `shutdown` came first. A format from a newer release ends the
/// start with its error: misreading the records could run a tick twice or not at all.
async fn can_read_records(
    client: &etcd_client::Client,
    keys: &Keys,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Result<bool> {
    let mut backoff = Backoff::coordination();
    loop {
        match record_format::check(client, keys).await {
            Ok(_) => return Ok(true),
            Err(err) if err.is_retryable() => {
                readiness.set(Stage::EtcdUnreachable(err.to_string()));
                let wait = backoff.next_delay();
                tracing::warn!(error = %err, retry_in = ?wait, "cannot read the cluster's record format from etcd yet; retrying");
                if !sleep_or_cancel(wait, shutdown).await {
                    return Ok(false);
                }
            }
            Err(err) => return Err(anyhow::Error::new(err)),
        }
    }
}

/// SIGHUP re-reads the config file. A file that does not validate, or whose notifiers name the
/// node's own secrets, is rejected with its error and the old jobs kept; a valid one goes to
/// the node, which applies it without giving up its shards or refuses it if its `[cluster]` or
/// `[etcd]` changed.
///
/// The secret variables a valid file names are scrubbed from `child_env` before the node sees
/// it, so no run of its jobs (or of the old ones from then on) gets them; even a reload the node
/// then refuses scrubs them, which hides more, never less.
async fn reload_on_hangup(
    path: PathBuf,
    own_secrets: NodeSecrets,
    child_env: Arc<secrets::ChildEnv>,
    reloads: tokio::sync::mpsc::UnboundedSender<Config>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler; restart the node to reload jobs.toml");
        return;
    };
    while hangups.recv().await.is_some() {
        tracing::info!(config = %path.display(), "SIGHUP: reloading jobs.toml");
        systemd::send("RELOADING=1");
        let (reading, own_secrets) = (path.clone(), own_secrets.clone());
        let loaded = tokio::task::spawn_blocking(move || {
            let config = load_for_node(&reading)?;
            own_secrets.check(&config)?;
            Ok::<_, anyhow::Error>(config)
        })
        .await;
        // Rejected or not, the node goes on: systemd's reload job ends here either way.
        systemd::send("READY=1");
        match loaded {
            Ok(Ok(config)) => {
                let scrubbed = child_env.scrub(config.secret_variables());
                if !scrubbed.is_empty() {
                    tracing::info!(variables = ?scrubbed, "variables the reloaded config names as secrets are kept from every job from now on");
                }
                if reloads.send(config).is_err() {
                    return;
                }
            }
            Ok(Err(err)) => tracing::error!(error = %err, "reload rejected: the old jobs keep running"),
            Err(err) => tracing::error!(error = %err, "reload failed: the old jobs keep running"),
        }
    }
}

/// Loads the config for a long-running node, at start and on reload, so that the parse leaves
/// nothing resident behind.
///
/// Parsing a 100,000-job `jobs.toml` builds a TOML document many times the size of the jobs,
/// and the jobs end up scattered between its freed pieces: glibc cannot return a page that still
/// holds one live job, so the parse's peak would stay resident for the node's whole life
/// (measured: 226 MiB resident with 100,000 jobs; 47 MiB with this). Parsing on a thread of its
/// own keeps all of it in that thread's malloc arena; the copy made here is laid out densely,
/// and once the original is dropped the whole arena is free and handed back.
fn load_for_node(path: &Path) -> Result<Config> {
    let parsed = std::thread::scope(|scope| scope.spawn(|| crate::rules::config::load(path)).join())
        .map_err(|_| anyhow::anyhow!("the config parser panicked"))??;
    let config = parsed.clone();
    drop(parsed);
    memory::trim();
    Ok(config)
}
