//! Probing each etcd member a node talks to, for the health view in `members`.
//!
//! Every member is asked for its status on a connection of its own, every [`PROBE_EVERY`] and
//! all at once: a member refusing connections, one that accepts them and answers nothing
//! (stopped, stalled on a disk, its packets dropped) and one without a raft leader are each
//! seen within a probe interval and a stall (`health::Limits`), well inside the lease a
//! renewal has left, and `members` moves calls off it. A call that finds a member's
//! connection refused reports it too (`routing`).

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use http::Uri;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::sleep_or_cancel;
use crate::coord::health::MemberReply;
use crate::coord::members::Members;

/// How often each member is asked.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Probes every member of `members` until `shutdown`. Does nothing for a single member: there
/// is nowhere else for calls to go.
pub(crate) async fn follow(members: Members, options: ConnectOptions, shutdown: CancellationToken) {
    let uris = members.uris();
    if uris.len() < 2 {
        return;
    }
    let mut probes = tokio::task::JoinSet::new();
    for uri in uris {
        probes.spawn(probe_member(members.clone(), uri, options.clone(), shutdown.clone()));
    }
    while probes.join_next().await.is_some() {}
}

async fn probe_member(members: Members, uri: Uri, options: ConnectOptions, shutdown: CancellationToken) {
    let stall = members.limits().stall;
    let mut probe: Option<Client> = None;
    loop {
        let started = Instant::now();
        let seen = {
            let asked = ask(&mut probe, &uri, &options);
            tokio::pin!(asked);
            let mut waited = stall;
            loop {
                tokio::select! {
                    answer = &mut asked => break Some(answer.seen(started.elapsed())),
                    _ = tokio::time::sleep_until(started + waited) => {
                        members.observe(&uri, MemberReply::Waiting { waited });
                        if waited >= stall * 2 {
                            break None;
                        }
                        waited += stall;
                    }
                    _ = shutdown.cancelled() => return,
                }
            }
        };
        if let Some(seen) = seen {
            members.observe(&uri, seen);
        }
        if !sleep_or_cancel(PROBE_EVERY, &shutdown).await {
            return;
        }
    }
}

/// A member's answer to a status call.
enum Answer {
    /// Its raft leader (0 for none).
    Status { leader: u64 },
    /// It answered that it has no raft leader.
    NoLeader,
    /// No answer: the connection failed, or it answered with another error.
    Failed,
}

impl Answer {
    fn seen(self, took: Duration) -> MemberReply {
        match self {
            Answer::Status { leader } => MemberReply::Answered { took, leader },
            Answer::NoLeader => MemberReply::Answered { took, leader: 0 },
            Answer::Failed => MemberReply::Failed,
        }
    }
}

/// Asks the member at `uri` for its status, on a connection of its own made on first use.
async fn ask(probe: &mut Option<Client>, uri: &Uri, options: &ConnectOptions) -> Answer {
    if probe.is_none() {
        match Client::connect([uri.to_string()], Some(options.clone())).await {
            Ok(client) => *probe = Some(client),
            Err(_) => return Answer::Failed,
        }
    }
    let Some(client) = probe.as_mut() else {
        return Answer::Failed;
    };
    match client.status().await {
        Ok(status) => Answer::Status {
            leader: status.leader(),
        },
        // The options require a leader: a member without one says so.
        Err(etcd_client::Error::GRpcStatus(status)) if status.message().contains("no leader") => Answer::NoLeader,
        Err(_) => Answer::Failed,
    }
}
