//! Building a client from `[etcd]`: its credentials, its TLS files, and the member each call
//! goes to.

use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::calls::within;
use super::error::CoordError;
use crate::coord::members::Members;
use crate::coord::routing::Routed;
use crate::rules::config::Etcd;

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
