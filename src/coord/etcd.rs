//! Connecting to etcd, and the errors a coordination call can end in.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue, TlsOptions, Txn, TxnOp,
};

use crate::coord::keys::Keys;
use crate::coord::members::Members;
use crate::coord::routing::Routed;
use crate::rules::config::Etcd;

/// A failed etcd call. Callers retry with backoff: the state they guard lives in etcd, so a
/// retry after a failure can never double a write that a guard would reject.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    // Not marked as the source: the message already carries it, and error chains would print
    // it twice.
    #[error("{}", describe(.0))]
    Etcd(etcd_client::Error),
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    #[error("etcd answered with something unexpected: {0}")]
    Protocol(String),
}

/// An etcd-client error in plain words: what etcd said, that no member answered and why, or
/// why the connection failed (a TLS handshake's certificate error, say). The transport's own
/// dump (tonic's types, the source chain) stays in the error's `Debug` form.
fn describe(err: &etcd_client::Error) -> String {
    if let Some(why) = unreachable_because(err) {
        return format!("no etcd member answers ({why}): is etcd running, and are these its client URLs?");
    }
    if let Some(innermost) = innermost_transport_cause(err) {
        return format!("the connection to etcd failed: {innermost}");
    }
    match err {
        etcd_client::Error::GRpcStatus(status) if !status.message().is_empty() => format!("etcd: {}", status.message()),
        etcd_client::Error::GRpcStatus(status) => format!("etcd: {:?}", status.code()),
        other => format!("etcd: {other}"),
    }
}

/// The causes inside an etcd-client error, outermost first: etcd-client's error names no
/// source, so the chain starts inside it.
fn causes(err: &etcd_client::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    let first: Option<&(dyn std::error::Error + 'static)> = match err {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        etcd_client::Error::TransportError(transport) => Some(transport),
        _ => None,
    };
    std::iter::successors(first, |cause| cause.source())
}

/// Why no connection to a member could be made at all, if that is what failed: refused, timed
/// out, no route. A connection made and then refused (a TLS handshake) is not this.
fn unreachable_because(err: &etcd_client::Error) -> Option<&'static str> {
    use std::io::ErrorKind;
    let io_kind = causes(err).find_map(|cause| cause.downcast_ref::<std::io::Error>().map(std::io::Error::kind));
    match io_kind {
        Some(ErrorKind::ConnectionRefused) => Some("connection refused"),
        Some(ErrorKind::TimedOut) => Some("connection timed out"),
        Some(ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable) => Some("no route to it"),
        Some(ErrorKind::AddrNotAvailable) => Some("address not available"),
        _ => None,
    }
}

/// The innermost cause of a failed connection (a certificate the TLS handshake refused, a
/// reset), in its own words; `None` when etcd answered.
fn innermost_transport_cause(err: &etcd_client::Error) -> Option<String> {
    let transport = match err {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => std::error::Error::source(status).is_some(),
        _ => false,
    };
    transport.then(|| causes(err).last().map(ToString::to_string)).flatten()
}

impl From<etcd_client::Error> for CoordError {
    fn from(err: etcd_client::Error) -> Self {
        CoordError::Etcd(err)
    }
}

impl CoordError {
    /// Whether the answer was larger than etcd-client takes (4 MiB): a smaller read may pass.
    pub(crate) fn is_too_large(&self) -> bool {
        matches!(self, CoordError::Etcd(etcd_client::Error::GRpcStatus(status))
            if status.code() == tonic::Code::OutOfRange || status.message().contains("message length too large"))
    }

    /// Whether etcd refused a transaction for its number of operations (its `--max-txn-ops`).
    pub(crate) fn is_too_many_ops(&self) -> bool {
        matches!(self, CoordError::Etcd(etcd_client::Error::GRpcStatus(status))
            if status.message().contains("too many operations in txn request"))
    }

    /// Whether etcd pushed back: it answered "too many requests", or did not answer in time.
    /// Every request of the node should slow down, not just the one that failed.
    pub fn is_pushback(&self) -> bool {
        match self {
            CoordError::Timeout(_) => true,
            // NOSPACE shares the code, but no pause makes room: it lasts until an operator acts.
            CoordError::Etcd(etcd_client::Error::GRpcStatus(status)) if !self.is_nospace() => {
                status.code() == tonic::Code::ResourceExhausted || status.message().contains("too many requests")
            }
            _ => false,
        }
    }

    /// Whether no member could be reached at all: a connection refused, timed out, unroutable.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, CoordError::Etcd(err) if unreachable_because(err).is_some())
    }

    /// Whether etcd dropped the call because its raft leader changed while it waited: a new
    /// leader is in place, so the call may be sent again at once.
    pub(crate) fn is_leader_change(&self) -> bool {
        matches!(self, CoordError::Etcd(etcd_client::Error::GRpcStatus(status)) if status.message().contains("leader changed"))
    }

    /// Whether etcd refused a write because its NOSPACE alarm is raised. `etcd_space` warns of
    /// the alarm once per node; the writes it refuses meanwhile are logged at debug level only,
    /// or every claim and result of every shard would warn of it again.
    pub fn is_nospace(&self) -> bool {
        matches!(self, CoordError::Etcd(etcd_client::Error::GRpcStatus(status)) if status.message().contains("database space exceeded"))
    }

    /// Whether etcd, or the TLS handshake with it, refused this client's credentials: a wrong
    /// password, an unknown user, a certificate from another authority. Retrying cannot help
    /// until the operator fixes the config, unlike an etcd that is down or out of reach.
    pub fn is_refusal(&self) -> bool {
        let CoordError::Etcd(err) = self else {
            return false;
        };
        if let etcd_client::Error::GRpcStatus(status) = err {
            use tonic::Code;
            match status.code() {
                Code::PermissionDenied => return true,
                // Not every InvalidArgument or Unauthenticated is about credentials: an old
                // auth revision or an expired token pass with a retry.
                Code::InvalidArgument | Code::Unauthenticated if status.message().contains("authentication failed") => {
                    return true
                }
                _ => {}
            }
        }
        // A certificate rejected on either side reaches us as a transport error whose source
        // chain names the certificate; a connection merely closed mid-handshake does not.
        format!("{err:?}").to_ascii_lowercase().contains("certificate")
    }
}

/// A read of `key` that needs a working, authorised connection: what a node tries once at
/// start, so a refused credential ends the start with a clear error instead of endless retries.
pub async fn probe(client: &Client, key: &str) -> Result<(), CoordError> {
    let options = etcd_client::GetOptions::new().with_keys_only().with_limit(1);
    call(client.clone().get(key, Some(options))).await.map(|_| ())
}

/// How long one unary etcd call may take. A connection cut by a dropping firewall hangs rather
/// than fails, and nothing that guards a tick may wait on it for longer than this.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs an etcd call with [`CALL_TIMEOUT`].
pub(crate) async fn call<T, F>(future: F) -> Result<T, CoordError>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    within(CALL_TIMEOUT, future).await
}

/// Runs an etcd call with a timeout of its own.
/// Whether etcd no longer holds `lease`. Its answer counts whole seconds left, rounded toward
/// zero: 0 is a lease with less than a second left, or one past its expiry that etcd has not
/// revoked yet, so only a negative answer (not found) says it is gone.
pub(crate) async fn lease_gone(client: &Client, lease: i64) -> Result<bool, CoordError> {
    let answer = call(client.clone().lease_time_to_live(lease, None)).await?;
    Ok(answer.ttl() < 0)
}

pub(crate) async fn within<T, F>(limit: Duration, future: F) -> Result<T, CoordError>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    let result = match tokio::time::timeout(limit, future).await {
        Ok(result) => result.map_err(CoordError::from),
        Err(_) => Err(CoordError::Timeout(limit)),
    };
    if result.is_err() {
        crate::metrics::get().etcd_errors.inc();
    }
    result
}

/// Whether etcd cancelled a watch because its start revision was compacted: then the revision
/// to read and watch again from (the first etcd still holds). Any other cancellation is an
/// error: the watch will never deliver again.
pub(crate) fn compacted(response: &etcd_client::WatchResponse, what: &str) -> Result<Option<i64>, CoordError> {
    if !response.canceled() {
        return Ok(None);
    }
    if response.compact_revision() > 0 {
        tracing::info!(
            compacted = response.compact_revision(),
            "the watch of {what} started before etcd's compacted history: reading it again"
        );
        return Ok(Some(response.compact_revision()));
    }
    Err(CoordError::Protocol(format!(
        "etcd cancelled the watch of {what}: {}",
        response.cancel_reason()
    )))
}

/// Why a client could not be built from the config: not retryable, the operator must act.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Password(#[from] crate::secrets::SecretError),
    /// Checked here and not when the config is validated: the systemd credential is a source
    /// only where the node runs.
    #[error("field \"etcd.username\": username {0:?} has no password: set password_env or password_file, or give the node the systemd credential {cred} (LoadCredential={cred} or {cred}:PATH)", cred = crate::secrets::ETCD_PASSWORD_CREDENTIAL)]
    NoPassword(String),
    #[error("cannot read {what} file {path}: {source}")]
    TlsFile {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
}

/// Connection options from `[etcd]`.
pub fn connect_options(etcd: &Etcd) -> Result<ConnectOptions, SetupError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let Some(username) = &etcd.username {
        let password = crate::secrets::load(crate::secrets::Sources {
            what: "the etcd password",
            env: etcd.password_env.as_deref(),
            file: etcd.password_file.as_deref(),
            credential: crate::secrets::ETCD_PASSWORD_CREDENTIAL,
        })?
        .ok_or_else(|| SetupError::NoPassword(username.clone()))?;
        // etcd expires an idle auth token (300 s by default for simple tokens); without a
        // refresh every call after that fails with "invalid auth token", forever.
        options = options
            .with_user(username.clone(), password.value)
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &etcd.tls {
        let read = |what: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|source| SetupError::TlsFile {
                what,
                path: path.display().to_string(),
                source,
            })
        };
        let mut tls_options = TlsOptions::new();
        if let Some(ca) = &tls.ca {
            tls_options = tls_options.ca_certificate(Certificate::from_pem(read("CA certificate", ca)?));
        }
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            tls_options = tls_options.identity(Identity::from_pem(read("certificate", cert)?, read("key", key)?));
        }
        options = options.with_tls(tls_options);
    }
    Ok(options)
}

/// Connects to `endpoints`, each call going to the member `members` puts first
/// (`routing`). etcd-client connects lazily enough that this mostly validates the URLs; an
/// unreachable etcd shows up as failed calls, which callers retry.
pub(crate) async fn connect(
    endpoints: &[String],
    options: ConnectOptions,
    members: &Members,
) -> Result<Client, CoordError> {
    let routed = Client::connect_with_balanced_channel(endpoints, Some(options), Routed(members.clone()));
    within(Duration::from_secs(5), routed).await
}

/// Keys per page of a prefix read: far below etcd-client's 4 MiB answer limit.
pub(crate) const PAGE: i64 = 2000;

/// Every key under `prefix` at one revision, read in pages, and that revision.
/// Every key under `prefix` whose value is JSON of a `T`, by the rest of its key; a value that
/// does not parse is left out.
pub(crate) async fn read_named<T: serde::de::DeserializeOwned>(
    client: &etcd_client::Client,
    prefix: &str,
) -> Result<Vec<(String, T)>, CoordError> {
    let (read, _) = read_prefix(client, prefix).await?;
    Ok(read
        .iter()
        .filter_map(|kv| {
            let name = std::str::from_utf8(kv.key()).ok()?.strip_prefix(prefix)?;
            Some((name.to_string(), serde_json::from_slice(kv.value()).ok()?))
        })
        .collect())
}

pub(crate) async fn read_prefix(
    client: &etcd_client::Client,
    prefix: &str,
) -> Result<(Vec<KeyValue>, i64), CoordError> {
    let mut read = Vec::new();
    let revision = scan_prefix(client, prefix, PAGE, |page| read.extend(page)).await?;
    Ok((read, revision))
}

/// Hands every key under `prefix` at one revision to `each`, a page of at most `page` keys at
/// a time, and returns that revision. A page is dropped once `each` returns, so a reader that
/// keeps only what it parsed never holds the whole range as etcd sent it. The next page is
/// asked for before `each` reads this one: etcd serves it while this one is parsed.
pub(crate) async fn scan_prefix(
    client: &etcd_client::Client,
    prefix: &str,
    mut page: i64,
    mut each: impl FnMut(Vec<KeyValue>),
) -> Result<i64, CoordError> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let mut from = prefix.as_bytes().to_vec();
    let mut revision = 0;
    let mut asked = ask_page(client, &from, &end, page, revision);
    loop {
        let answer = match asked.await {
            Ok(answer) => answer,
            Err(err) => return Err(CoordError::Protocol(format!("a page read ended: {err}"))),
        };
        let mut response = match answer {
            Ok(response) => response,
            // Past etcd-client's answer limit: the same keys again, in smaller pages.
            Err(err) if err.is_too_large() && page > 1 => {
                page /= 2;
                asked = ask_page(client, &from, &end, page, revision);
                continue;
            }
            Err(err) => return Err(err),
        };
        if revision == 0 {
            revision = response.header().map_or(0, |header| header.revision());
        }
        let more = response.more();
        let kvs = response.take_kvs();
        let Some(last) = kvs.last() else { break };
        from = last.key().to_vec();
        from.push(0);
        if !more {
            each(kvs);
            break;
        }
        asked = ask_page(client, &from, &end, page, revision);
        each(kvs);
    }
    Ok(revision)
}

/// One page of `[from, end)`, at `revision` unless it is 0, read on a task of its own.
fn ask_page(
    client: &etcd_client::Client,
    from: &[u8],
    end: &[u8],
    page: i64,
    revision: i64,
) -> tokio::task::JoinHandle<Result<etcd_client::GetResponse, CoordError>> {
    let mut options = GetOptions::new().with_range(end.to_vec()).with_limit(page);
    if revision > 0 {
        options = options.with_revision(revision);
    }
    let (mut client, from) = (client.clone(), from.to_vec());
    tokio::spawn(async move { call(client.get(from, Some(options))).await })
}

/// etcd refuses transactions of more than 128 operations by default; a guard takes one.
pub const MAX_OPS_PER_TXN: usize = 100;

/// The fewest operations per transaction shardcron works with.
const MIN_OPS_PER_TXN: usize = 8;

/// How many records one transaction writes: [`MAX_OPS_PER_TXN`], or fewer when etcd's
/// `--max-txn-ops` is lower ([`learn_txn_limit`]).
static OPS_PER_TXN: AtomicUsize = AtomicUsize::new(MAX_OPS_PER_TXN);

/// How many records one transaction writes, a guard or two beside them.
pub fn ops_per_txn() -> usize {
    OPS_PER_TXN.load(Ordering::Relaxed)
}

/// Learns how many operations etcd takes in one transaction, with read-only transactions of
/// `n + 1` compares and `n + 1` reads of one key: an etcd started with a `--max-txn-ops` below
/// ours would otherwise refuse every full claim for ever. Called at each session's start.
pub async fn learn_txn_limit(client: &etcd_client::Client, keys: &Keys) -> Result<usize, CoordError> {
    let probe = keys.txn_probe();
    let accepts = |ops: usize| {
        let mut kv = client.kv_client();
        let txn = Txn::new()
            .when(vec![Compare::version(probe.as_str(), CompareOp::Equal, 0); ops + 1])
            .and_then(vec![TxnOp::get(probe.as_str(), None); ops + 1]);
        async move {
            match call(kv.txn(txn)).await {
                Ok(_) => Ok(true),
                Err(err) if err.is_too_many_ops() => Ok(false),
                Err(err) => Err(err),
            }
        }
    };
    let limit = if accepts(MAX_OPS_PER_TXN).await? {
        MAX_OPS_PER_TXN
    } else {
        // The largest count etcd takes, between the least we work with and ours.
        let (mut taken, mut refused) = (MIN_OPS_PER_TXN - 1, MAX_OPS_PER_TXN);
        while refused - taken > 1 {
            let middle = (taken + refused) / 2;
            if accepts(middle).await? {
                taken = middle;
            } else {
                refused = middle;
            }
        }
        if taken < MIN_OPS_PER_TXN {
            return Err(CoordError::Protocol(format!(
                "etcd takes fewer than {} operations in a transaction (its --max-txn-ops): shardcron needs at least that many",
                MIN_OPS_PER_TXN + 1
            )));
        }
        tracing::warn!(records = taken, ours = MAX_OPS_PER_TXN, "etcd takes fewer operations in a transaction than shardcron writes (its --max-txn-ops is low): claims write fewer records each");
        taken
    };
    OPS_PER_TXN.store(limit, Ordering::Relaxed);
    Ok(limit)
}

#[cfg(test)]
mod tests {

    use etcd_client::{Txn, TxnOp};

    #[test]
    fn an_etcd_error_reads_as_what_etcd_said_or_why_nothing_answered() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let status = tonic::Status::from_error(Box::new(refused));
        let said = super::CoordError::Etcd(etcd_client::Error::GRpcStatus(status)).to_string();
        assert!(
            said.starts_with("no etcd member answers (connection refused)"),
            "{said}"
        );
        let handshake = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let said = super::CoordError::Etcd(etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(
            handshake,
        ))));
        assert_eq!(
            said.to_string(),
            "the connection to etcd failed: invalid peer certificate: UnknownIssuer"
        );
        assert!(!said.is_unreachable(), "a refused certificate is no unreachable etcd");
        let status = tonic::Status::new(tonic::Code::Unavailable, "etcdserver: no leader");
        assert_eq!(
            super::CoordError::Etcd(etcd_client::Error::GRpcStatus(status)).to_string(),
            "etcd: etcdserver: no leader"
        );
    }

    #[test]
    fn only_a_leader_change_sends_a_call_again_at_once() {
        let status = |code, message: &str| {
            super::CoordError::Etcd(etcd_client::Error::GRpcStatus(tonic::Status::new(code, message)))
        };
        assert!(status(tonic::Code::Unavailable, "etcdserver: leader changed").is_leader_change());
        assert!(
            !status(tonic::Code::Unavailable, "etcdserver: no leader").is_leader_change(),
            "with no leader yet, a call sent again fails again"
        );
        assert!(!super::CoordError::Timeout(std::time::Duration::from_secs(2)).is_leader_change());
    }

    use super::*;
    use crate::etcd_server::EtcdServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_is_gone_once_etcd_no_longer_holds_it_not_in_its_last_second() {
        let etcd = EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        // etcd's shortest lease is 2 s (its election timeout, rounded up); in its last second
        // etcd answers 0 seconds left.
        let lease = client.clone().lease_grant(2, None).await.expect("grant").id();
        let seconds_left = || async {
            client
                .clone()
                .lease_time_to_live(lease, None)
                .await
                .expect("read")
                .ttl()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while seconds_left().await > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the lease never reached its last second"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let gone = lease_gone(&client, lease).await.expect("read");
        // Unless it expired between the two reads (a stalled machine), etcd still held it.
        assert!(!gone || seconds_left().await < 0, "a lease in its last second is held");
        client.clone().lease_revoke(lease).await.expect("revoke");
        assert!(
            lease_gone(&client, lease).await.expect("read"),
            "a revoked lease is gone"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paged_read_of_a_prefix_equals_one_read_of_it() {
        let etcd = EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = 2 * PAGE as usize + 500;
        for chunk in (0..keys).collect::<Vec<_>>().chunks(100) {
            let puts: Vec<TxnOp> = chunk
                .iter()
                .map(|index| TxnOp::put(format!("/p/{index:05}"), format!("node{index}"), None))
                .collect();
            client.clone().txn(Txn::new().and_then(puts)).await.expect("put");
        }
        // Keys just outside the prefix on either side stay out.
        client.clone().put("/o", "out", None).await.expect("put");
        client.clone().put("/q", "out", None).await.expect("put");
        let (paged, revision) = read_prefix(&client, "/p/").await.expect("paged read");
        let whole = client
            .clone()
            .get("/p/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("one read");
        let pairs = |kvs: &[KeyValue]| -> Vec<(Vec<u8>, Vec<u8>, i64)> {
            kvs.iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision()))
                .collect()
        };
        assert_eq!(paged.len(), keys);
        assert_eq!(pairs(&paged), pairs(whole.kvs()));
        assert_eq!(revision, whole.header().map_or(0, |header| header.revision()));
    }
}
