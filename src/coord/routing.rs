//! The channel under a node's etcd client: each call goes to the member `members` puts first,
//! and moves off a member that stops answering.
//!
//! etcd-client leaves failover to its users: its channel is tonic's balance, which spreads
//! calls over every endpoint and keeps sending a share to a member that accepts connections but
//! answers nothing (stopped, stalled on a disk, its packets dropped); each such call then waits
//! out its deadline, a lease renewal what is left of the lease. Here, when a member a call waits
//! on is found stalled (or refuses the connection), the call is not left there:
//! - a read is sent again to the next member: asking twice changes nothing;
//! - a call that never reached the member (its connection failed) goes to the next one too;
//! - a write already sent fails at once with "unavailable", and its caller retries as after any
//!   failed etcd call: every write shardcron makes is guarded by what it expects in etcd or
//!   writes the same value again, so one that landed after all is found, never doubled;
//! - a stream (a watch, a lease's keep-alive) ends with an error, and its owner opens it again,
//!   on a member that answers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use tonic::body::Body;
use tower::{Service, ServiceExt};

use crate::coord::health::MemberReply;
use crate::coord::members::{endpoint_label, Members, Pick};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Builds etcd-client's channel over `members`.
pub(crate) struct Routed(pub(crate) Members);

impl etcd_client::BalancedChannelBuilder for Routed {
    type Error = etcd_client::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<
        (
            etcd_client::Channel,
            tokio::sync::mpsc::Sender<tonic::transport::channel::Change<Uri, tonic::transport::Endpoint>>,
        ),
        Self::Error,
    > {
        let (changes, listened) = tokio::sync::mpsc::channel(buffer_size.max(1));
        self.0.listen(listened);
        let router = Router { members: self.0 };
        Ok((
            etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(router)),
            changes,
        ))
    }
}

#[derive(Clone)]
struct Router {
    members: Members,
}

/// What may be done with a call whose member stops answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Changes nothing in etcd: sent again elsewhere.
    Read,
    /// May change etcd: failed, for its caller to retry under its guard.
    Write,
    /// Answers for as long as it is open: ended, for its owner to open again.
    Stream,
}

impl Kind {
    fn of(path: &str) -> Kind {
        match path {
            "/etcdserverpb.Watch/Watch"
            | "/etcdserverpb.Lease/LeaseKeepAlive"
            | "/v3electionpb.Election/Observe"
            | "/etcdserverpb.Maintenance/Snapshot" => Kind::Stream,
            "/etcdserverpb.KV/Range"
            | "/etcdserverpb.Lease/LeaseTimeToLive"
            | "/etcdserverpb.Lease/LeaseLeases"
            | "/etcdserverpb.Maintenance/Status"
            | "/etcdserverpb.Cluster/MemberList"
            | "/etcdserverpb.Auth/Authenticate"
            | "/v3electionpb.Election/Leader" => Kind::Read,
            _ => Kind::Write,
        }
    }
}

impl Service<Request<Body>> for Router {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each member's channel is made ready when a call is sent on it.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        Box::pin(route(self.members.clone(), request))
    }
}

/// What became of one attempt on one member.
enum Attempt {
    Answered(Response<Body>),
    /// It failed before the call reached the member: another may take it.
    NotSent(BoxError),
    /// It failed once sent, or the member's answer was an error.
    Failed(BoxError),
    /// The member was found stalled while the call waited on it.
    Cut,
}

async fn route(members: Members, request: Request<Body>) -> Result<Response<Body>, BoxError> {
    let kind = Kind::of(request.uri().path());
    if kind == Kind::Stream {
        // A stream's requests are sent as they come: it is sent once, to the first member.
        let pick = members
            .pick(&[])
            .ok_or_else(|| unavailable("no etcd member to send the call to"))?;
        let uri = pick.uri.clone();
        return match attempt(pick, request, kind).await {
            Attempt::Answered(response) => Ok(response),
            Attempt::NotSent(err) => {
                members.observe(&uri, MemberReply::Failed);
                Err(err)
            }
            Attempt::Failed(err) => Err(err),
            Attempt::Cut => Err(cut_off(&uri).into()),
        };
    }
    let (parts, body) = request.into_parts();
    // A unary request is one small message: kept, so the call can be sent again.
    let body = body.collect().await?.to_bytes();
    let mut tried: Vec<Uri> = Vec::new();
    let mut last_error: Option<BoxError> = None;
    loop {
        let Some(pick) = members.pick(&tried) else {
            return Err(last_error.unwrap_or_else(|| unavailable("no etcd member to send the call to").into()));
        };
        let uri = pick.uri.clone();
        tried.push(uri.clone());
        let request = Request::from_parts(parts.clone(), Body::new(http_body_util::Full::new(body.clone())));
        match attempt(pick, request, kind).await {
            Attempt::Answered(response) => return Ok(response),
            Attempt::NotSent(err) => {
                members.observe(&uri, MemberReply::Failed);
                last_error = Some(err);
            }
            Attempt::Failed(err) => return Err(err),
            Attempt::Cut if kind == Kind::Read => last_error = Some(cut_off(&uri).into()),
            Attempt::Cut => return Err(cut_off(&uri).into()),
        }
    }
}

fn cut_off(uri: &Uri) -> tonic::Status {
    unavailable(&format!(
        "etcd member {} stopped answering: the call was cut, to be retried on another member",
        endpoint_label(uri)
    ))
}

async fn attempt(pick: Pick, request: Request<Body>, kind: Kind) -> Attempt {
    let Pick { uri, channel, mut cut } = pick;
    let sent = async move {
        let mut channel = channel;
        let ready = match channel.ready().await {
            Ok(ready) => ready,
            Err(err) => return Attempt::NotSent(err.into()),
        };
        match ready.call(request).await {
            Ok(response) => Attempt::Answered(response),
            Err(err) if never_sent(&err) => Attempt::NotSent(err.into()),
            Err(err) => Attempt::Failed(err.into()),
        }
    };
    let answered = tokio::select! {
        attempt = sent => attempt,
        _ = cut.changed() => return Attempt::Cut,
    };
    match (answered, kind) {
        (Attempt::Answered(response), Kind::Stream) => Attempt::Answered(response.map(|body| {
            Body::new(CutBody {
                inner: body,
                cut: Box::pin(cut_of(cut, uri)),
            })
        })),
        (answered, _) => answered,
    }
}

/// Resolves once the member's calls are cut.
async fn cut_of(mut cut: tokio::sync::watch::Receiver<u64>, uri: Uri) -> tonic::Status {
    // A member removed drops its sender: the stream ends too.
    let _ = cut.changed().await;
    unavailable(&format!(
        "etcd member {} stopped answering: the stream is opened again on another member",
        endpoint_label(&uri)
    ))
}

/// Whether a failed call never reached the member: its connection could not be made.
fn never_sent(err: &tonic::transport::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::HostUnreachable
            ) {
                return true;
            }
        }
        source = err.source();
    }
    format!("{err:?}").contains("ConnectError")
}

fn unavailable(message: &str) -> tonic::Status {
    tonic::Status::unavailable(message.to_owned())
}

/// A stream's answer that ends with an error once its member's calls are cut.
struct CutBody {
    inner: Body,
    cut: Pin<Box<dyn Future<Output = tonic::Status> + Send>>,
}

impl http_body::Body for CutBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(status) = self.cut.as_mut().poll(cx) {
            return Poll::Ready(Some(Err(Box::new(status))));
        }
        Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_sent_again_writes_fail_and_streams_end() {
        assert_eq!(Kind::of("/etcdserverpb.KV/Range"), Kind::Read);
        assert_eq!(Kind::of("/etcdserverpb.Lease/LeaseTimeToLive"), Kind::Read);
        assert_eq!(Kind::of("/etcdserverpb.KV/Txn"), Kind::Write);
        assert_eq!(Kind::of("/etcdserverpb.KV/Put"), Kind::Write);
        assert_eq!(Kind::of("/etcdserverpb.Lease/LeaseGrant"), Kind::Write);
        assert_eq!(Kind::of("/etcdserverpb.Lease/LeaseRevoke"), Kind::Write);
        assert_eq!(Kind::of("/etcdserverpb.Watch/Watch"), Kind::Stream);
        assert_eq!(Kind::of("/etcdserverpb.Lease/LeaseKeepAlive"), Kind::Stream);
        assert_eq!(
            Kind::of("/some.Unknown/Call"),
            Kind::Write,
            "what is not known may write"
        );
    }
}
