//! Which etcd endpoints a node's calls go to. etcd-client balances every call over all the
//! endpoints it was given, and keeps handing a share of them to one whose member is down: a
//! refused connection fails the call rather than taking the endpoint out. With one member of
//! three killed, a third of all calls then fail, and a session, which needs several calls in a
//! row to open, rarely does (the fleet stopped firing for as long as the member stayed down).
//! So each node asks every endpoint for its status on a connection of its own, and keeps in the
//! balance only those that answer; when none answers the balance stays as it is, since the fault
//! is then more likely this node's own network than every member at once.

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio_util::sync::CancellationToken;

use crate::backoff::sleep_or_cancel;

/// How often each endpoint is asked: a member's death takes calls with it for about this long.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long an endpoint's answer may take before it counts as none.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The endpoints to add to and remove from the balance (indices into the endpoint list), given
/// those in it and those that answered.
fn changes(in_balance: &BTreeSet<usize>, answered: &BTreeSet<usize>) -> (Vec<usize>, Vec<usize>) {
    if answered.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let add = answered.difference(in_balance).copied().collect();
    let remove = in_balance.difference(answered).copied().collect();
    (add, remove)
}

/// The URI etcd-client keys an endpoint by: the URL as given, with the scheme it adds to one
/// written without.
fn balanced_uri(endpoint: &str, tls: bool) -> String {
    let endpoint = endpoint.trim();
    match (endpoint.contains("://"), tls) {
        (true, _) => endpoint.to_owned(),
        (false, true) => format!("https://{endpoint}"),
        (false, false) => format!("http://{endpoint}"),
    }
}

/// Keeps `client`'s balance to the endpoints that answer, until `shutdown`. Does nothing for a
/// single endpoint: there is nothing to balance to.
pub(crate) async fn follow(
    client: Client,
    endpoints: Vec<String>,
    options: ConnectOptions,
    tls: bool,
    shutdown: CancellationToken,
) {
    if endpoints.len() < 2 {
        return;
    }
    let uris: Vec<String> = endpoints.iter().map(|endpoint| balanced_uri(endpoint, tls)).collect();
    let mut probes: Vec<Option<Client>> = vec![None; endpoints.len()];
    let mut in_balance: BTreeSet<usize> = (0..endpoints.len()).collect();
    loop {
        let mut answered = BTreeSet::new();
        for (index, probe) in probes.iter_mut().enumerate() {
            if answers(probe, &uris[index], &options).await {
                answered.insert(index);
            }
        }
        let (add, remove) = changes(&in_balance, &answered);
        for index in remove {
            match client.remove_endpoint(&uris[index]).await {
                Ok(()) => {
                    tracing::warn!(endpoint = %uris[index], "etcd endpoint does not answer: sending no calls to it until it does");
                    in_balance.remove(&index);
                }
                Err(err) => {
                    tracing::debug!(endpoint = %uris[index], error = %err, "cannot take the endpoint out of the balance")
                }
            }
        }
        for index in add {
            match client.add_endpoint(&uris[index]).await {
                Ok(()) => {
                    tracing::info!(endpoint = %uris[index], "etcd endpoint answers again: sending calls to it");
                    in_balance.insert(index);
                }
                Err(err) => {
                    tracing::debug!(endpoint = %uris[index], error = %err, "cannot put the endpoint back in the balance")
                }
            }
        }
        if !sleep_or_cancel(PROBE_EVERY, &shutdown).await {
            return;
        }
    }
}

/// Whether the member at `uri` answers a status call in time, on a connection of its own made
/// on first use. A member that lost its raft leader fails the call too (the options require one).
async fn answers(probe: &mut Option<Client>, uri: &str, options: &ConnectOptions) -> bool {
    let asked = async {
        if probe.is_none() {
            *probe = Some(Client::connect([uri], Some(options.clone())).await?);
        }
        match probe.as_mut() {
            Some(client) => client.status().await.map(|_| ()),
            None => Ok(()),
        }
    };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, asked).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answering_endpoints_stay_in_the_balance_and_never_none() {
        let set = |indices: &[usize]| indices.iter().copied().collect::<BTreeSet<usize>>();
        let cases = [
            (
                set(&[0, 1, 2]),
                set(&[0, 2]),
                (vec![], vec![1]),
                "a member down is taken out",
            ),
            (
                set(&[0, 2]),
                set(&[0, 1, 2]),
                (vec![1], vec![]),
                "and put back when it answers",
            ),
            (
                set(&[0, 2]),
                set(&[]),
                (vec![], vec![]),
                "none answering: nothing changes",
            ),
            (
                set(&[0]),
                set(&[1]),
                (vec![1], vec![0]),
                "the balance moves to the one that answers",
            ),
            (
                set(&[0, 1]),
                set(&[0, 1]),
                (vec![], vec![]),
                "all well: nothing changes",
            ),
        ];
        for (in_balance, answered, expected, why) in cases {
            assert_eq!(changes(&in_balance, &answered), expected, "{why}");
        }
    }

    #[test]
    fn an_endpoint_is_named_as_etcd_client_keys_it() {
        assert_eq!(balanced_uri("http://10.0.0.1:2379", false), "http://10.0.0.1:2379");
        assert_eq!(balanced_uri("10.0.0.1:2379", false), "http://10.0.0.1:2379");
        assert_eq!(balanced_uri(" 10.0.0.1:2379", true), "https://10.0.0.1:2379");
    }
}
