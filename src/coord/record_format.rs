//! The format of the records a cluster keeps in etcd, and the check that a node can read them.
//!
//! Releases that read and write records the same way share a format number. A release that
//! changes a record so that an older one would misread it raises the number; the first node of
//! that release in a cluster writes it, and from then on a node of an older release refuses to
//! start, saying so, instead of misreading what it finds (a rollback past that release is then
//! the operator's choice to make, with the cluster's records cleared). A cluster whose key is
//! missing was written by releases from before the key, which are format 1.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;

/// The format this release writes, and the newest it reads.
pub(crate) const FORMAT: u32 = 1;

/// What the format key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Stored {
    format: u32,
}

/// Why a node cannot work on a cluster's records.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FormatError {
    #[error(
        "the records of this cluster in etcd are format {found} ({key}), written by a newer shardcron; this one ({version}) reads formats up to {FORMAT}: run the newer release on this node"
    )]
    Newer {
        found: u32,
        key: String,
        version: &'static str,
    },
    #[error("the format key {key} in etcd holds something this shardcron cannot read ({value:?}): not starting rather than misread the cluster's records")]
    Unreadable { key: String, value: String },
    #[error(transparent)]
    Etcd(#[from] CoordError),
}

impl FormatError {
    /// Whether trying again later may pass: etcd did not answer.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, FormatError::Etcd(_))
    }
}

/// What a node may do with a cluster whose format key holds `stored` (`None`: missing).
fn judge(stored: Option<&[u8]>, key: &str) -> Result<Option<u32>, FormatError> {
    let Some(value) = stored else {
        return Ok(None);
    };
    let unreadable = || FormatError::Unreadable {
        key: key.to_owned(),
        value: String::from_utf8_lossy(&value[..value.len().min(200)]).into_owned(),
    };
    let found = serde_json::from_slice::<Stored>(value)
        .map_err(|_| unreadable())?
        .format;
    match found {
        0 => Err(unreadable()),
        found if found > FORMAT => Err(FormatError::Newer {
            found,
            key: key.to_owned(),
            version: env!("CARGO_PKG_VERSION"),
        }),
        found => Ok(Some(found)),
    }
}

/// Checks that this node can read the cluster's records, writing this release's format if
/// the cluster has none yet. Returns the cluster's format.
pub(crate) async fn check(client: &Client, keys: &Keys) -> Result<u32, FormatError> {
    let key = keys.record_format();
    let read = etcd::call(client.clone().get(key.as_str(), None)).await?;
    if let Some(format) = judge(read.kvs().first().map(|kv| kv.value()), &key)? {
        return Ok(format);
    }
    let value = serde_json::to_string(&Stored { format: FORMAT }).unwrap_or_default();
    let written = Txn::new()
        .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.as_str(), value, None)])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let answer = match etcd::within(Duration::from_secs(5), client.clone().txn(written)).await {
        Ok(answer) => answer,
        // A cluster without the key holds records of releases before it: format 1, which this
        // one reads. Under etcd's NOSPACE alarm nothing can be written, the key neither; the
        // node goes on to say so (`/readyz`) and the next start writes it.
        Err(err) if err.is_nospace() => {
            tracing::info!(
                key,
                "etcd is out of space: the record format is written at a later start"
            );
            return Ok(1);
        }
        Err(err) => return Err(err.into()),
    };
    if answer.succeeded() {
        tracing::info!(
            format = FORMAT,
            key,
            "first node of this release in the cluster: its record format written"
        );
        return Ok(FORMAT);
    }
    // Another node wrote it first: what it wrote decides.
    let stored = answer.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    });
    Ok(judge(stored.as_deref(), &key)?.unwrap_or(FORMAT))
}

/// Every record of a cluster written by the previous release (0.1.0 at 4f05eb0, the config
/// beside it), read from a running etcd as that release left it, by the key's path under the
/// cluster: what this release must read as format 1.
#[cfg(test)]
pub(crate) fn previous_release_records() -> Vec<(String, String)> {
    let text = include_str!("../../tests/fixtures/records-0.1.0-4f05eb0.json");
    let records: std::collections::BTreeMap<String, String> = serde_json::from_str(text).expect("the fixture parses");
    records
        .into_iter()
        .map(|(key, value)| {
            let path = key
                .strip_prefix("/shardcron/prev/")
                .expect("the fixture's cluster")
                .to_owned();
            (path, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{activity::Activity, backfill::Backfill, groups::Holder, record};

    const KEY: &str = "/shardcron/test/format";

    #[test]
    fn every_record_the_previous_release_wrote_is_read() {
        fn reads<T: serde::de::DeserializeOwned>(path: &str, value: &str) {
            if let Err(err) = serde_json::from_str::<T>(value) {
                panic!("{path}: {err}: {value}");
            }
        }
        let mut read = std::collections::BTreeMap::<&str, usize>::new();
        let records = previous_release_records();
        for (path, value) in &records {
            let parts: Vec<&str> = path.split('/').collect();
            let kind = match parts.as_slice() {
                ["jobs", _, "last"] => {
                    reads::<record::Claim>(path, value);
                    "claim"
                }
                ["jobs", _, "result" | "success"] | ["runs", _, _] | ["runs", _, "+backfill", _] => {
                    reads::<record::RunRecord>(path, value);
                    "run"
                }
                ["runs", _, .., "output"] => {
                    reads::<record::RunOutput>(path, value);
                    "output"
                }
                ["nodes", _] => {
                    reads::<record::Member>(path, value);
                    "member"
                }
                ["pauses", _] => {
                    reads::<crate::coord::pauses::Pause>(path, value);
                    "pause"
                }
                ["backfills", _] => {
                    reads::<Backfill>(path, value);
                    "backfill"
                }
                ["groups", _, "slots", _] => {
                    reads::<Holder>(path, value);
                    "slot"
                }
                ["activity", _] => {
                    reads::<Activity>(path, value);
                    "activity"
                }
                // Read by the modules that own them (their own tests): `triggers`, `etcd_space`.
                ["jobs", _, "manual"] => "manual",
                ["compaction"] => "compaction",
                // An election candidate: the node's id as plain text.
                ["shards", ..] => {
                    assert!(!value.is_empty() && !value.starts_with('{'), "{path}: {value}");
                    "candidate"
                }
                _ => panic!("a record of the previous release this test does not know: {path}"),
            };
            *read.entry(kind).or_default() += 1;
        }
        for kind in [
            "claim",
            "run",
            "output",
            "member",
            "pause",
            "backfill",
            "slot",
            "activity",
            "candidate",
        ] {
            assert!(read.contains_key(kind), "the fixture has no {kind} record: {read:?}");
        }
    }

    #[test]
    fn a_node_reads_its_own_format_and_older_ones_and_refuses_a_newer_one() {
        assert_eq!(judge(None, KEY).unwrap(), None, "missing: written by this node");
        assert_eq!(judge(Some(br#"{"format":1}"#), KEY).unwrap(), Some(1));
        let newer = judge(Some(br#"{"format":2}"#), KEY).unwrap_err();
        assert!(matches!(newer, FormatError::Newer { found: 2, .. }), "{newer}");
        assert!(newer.to_string().contains("reads formats up to 1"), "{newer}");
        assert!(!newer.is_retryable());
    }

    #[test]
    fn a_format_key_that_does_not_parse_stops_the_start() {
        for value in [&b"1"[..], b"{\"format\":0}", b"{}", b"\xff"] {
            let err = judge(Some(value), KEY).unwrap_err();
            assert!(matches!(err, FormatError::Unreadable { .. }), "{err}");
        }
    }

    #[tokio::test]
    async fn the_first_node_writes_the_format_and_later_ones_read_it() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = Client::connect([etcd.client_url()], None).await.expect("client");
        let keys = Keys::new("test");
        assert_eq!(check(&client, &keys).await.unwrap(), FORMAT);
        let stored = client.clone().get(keys.record_format(), None).await.expect("read");
        assert_eq!(stored.kvs()[0].value(), br#"{"format":1}"#);
        assert_eq!(check(&client, &keys).await.unwrap(), FORMAT, "read again");
        client
            .clone()
            .put(keys.record_format(), r#"{"format":7}"#, None)
            .await
            .expect("write a newer format");
        let refused = check(&client, &keys).await.unwrap_err();
        assert!(matches!(refused, FormatError::Newer { found: 7, .. }), "{refused}");
    }
}
