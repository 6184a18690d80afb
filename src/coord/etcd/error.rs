//! The errors a coordination call can end in, in plain words, and what each allows next.

use std::time::Duration;

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
