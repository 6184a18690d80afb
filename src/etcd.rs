//! Connecting to etcd, and the errors a coordination call can end in.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::config::Etcd;

/// A failed etcd call. Callers retry with backoff: the state they guard lives in etcd, so a
/// retry after a failure can never double a write that a guard would reject.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    // Not marked as the source: the message already carries it, and error chains would print
    // it twice.
    #[error("etcd: {0}")]
    Etcd(etcd_client::Error),
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    #[error("etcd answered with something unexpected: {0}")]
    Protocol(String),
}

impl From<etcd_client::Error> for CoordError {
    fn from(err: etcd_client::Error) -> Self {
        CoordError::Etcd(err)
    }
}

impl CoordError {
    /// Whether etcd pushed back: it answered "too many requests", or did not answer in time.
    /// Every request of the node should slow down, not just the one that failed.
    pub fn is_pushback(&self) -> bool {
        match self {
            CoordError::Timeout(_) => true,
            CoordError::Etcd(etcd_client::Error::GRpcStatus(status)) => {
                status.code() == tonic::Code::ResourceExhausted || status.message().contains("too many requests")
            }
            _ => false,
        }
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

/// Why a client could not be built from the config: not retryable, the operator must act.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("etcd.password_env names {0:?}, which is not set in the environment")]
    MissingPassword(String),
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
        let password = match &etcd.password_env {
            Some(var) => std::env::var(var).map_err(|_| SetupError::MissingPassword(var.clone()))?,
            None => String::new(),
        };
        // etcd expires an idle auth token (300 s by default for simple tokens); without a
        // refresh every call after that fails with "invalid auth token", forever.
        options = options
            .with_user(username.clone(), password)
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

/// Connects to `endpoints`. etcd-client connects lazily enough that this mostly validates the
/// URLs; an unreachable etcd shows up as failed calls, which callers retry.
pub async fn connect(endpoints: &[String], options: ConnectOptions) -> Result<Client, CoordError> {
    within(Duration::from_secs(5), Client::connect(endpoints, Some(options))).await
}
