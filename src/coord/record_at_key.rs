//! A JSON record at one etcd key, changed by read-modify-write: each write is guarded by the
//! revision it read (or by the key being absent), so two writers never overwrite each other,
//! and the one that came second reads again and decides again. A job's backfill and its
//! notification record are kept this way.

use std::marker::PhantomData;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::coord::etcd::{self, CoordError};

/// Why a record at a key could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    #[error(transparent)]
    Etcd(#[from] CoordError),
    /// What etcd holds is not JSON of the record's type.
    #[error("a {what} record etcd holds: {source}")]
    Unreadable {
        what: &'static str,
        source: serde_json::Error,
    },
    /// The record could not be put in JSON.
    #[error("{0}")]
    Unwritable(serde_json::Error),
}

/// Callers answer in [`CoordError`]: a record that cannot be read or written is etcd answering
/// with something unexpected, in the same words as before there was a typed error.
impl From<RecordError> for CoordError {
    fn from(err: RecordError) -> CoordError {
        match err {
            RecordError::Etcd(err) => err,
            other => CoordError::Protocol(other.to_string()),
        }
    }
}

/// What a read-modify-write does with the record it read.
pub(crate) enum Change<T, R> {
    /// Write this record in place of the one read.
    Write(T),
    /// Write nothing, and answer this.
    Leave(R),
}

/// How a read-modify-write ended.
pub(crate) enum Changed<T, R> {
    /// The record as written.
    Written(T),
    /// Nothing written: what the decision answered.
    Left(R),
}

impl<T, R> Changed<T, R> {
    /// The record as written, if one was.
    pub(crate) fn written(self) -> Option<T> {
        match self {
            Changed::Written(record) => Some(record),
            Changed::Left(_) => None,
        }
    }
}

/// The record of type `T` at one key; `what` names it in errors ("a backfill record etcd
/// holds: ...").
pub(crate) struct RecordAtKey<'a, T> {
    client: &'a Client,
    key: String,
    what: &'static str,
    record: PhantomData<fn() -> T>,
}

impl<'a, T: Serialize + DeserializeOwned> RecordAtKey<'a, T> {
    pub(crate) fn new(client: &'a Client, key: String, what: &'static str) -> Self {
        RecordAtKey {
            client,
            key,
            what,
            record: PhantomData,
        }
    }

    /// The record and its mod revision; `None` if the key holds none.
    pub(crate) async fn read(&self) -> Result<Option<(T, i64)>, RecordError> {
        let read = etcd::call(self.client.clone().get(self.key.as_str(), None)).await?;
        read.kvs()
            .first()
            .map(|kv| Ok((decode(self.what, kv.value())?, kv.mod_revision())))
            .transpose()
    }

    /// Reads the record and writes what `decide` makes of it (`Ok(None)` when the key holds
    /// none, an error when it holds something that is not a `T`), only if the key still holds
    /// what was read; if not, reads again and asks `decide` again.
    pub(crate) async fn change<R>(
        &self,
        mut decide: impl FnMut(Result<Option<T>, RecordError>) -> Result<Change<T, R>, RecordError>,
    ) -> Result<Changed<T, R>, RecordError> {
        let key = self.key.as_str();
        loop {
            let read = etcd::call(self.client.clone().get(key, None)).await?;
            let (current, guard) = match read.kvs().first() {
                Some(kv) => (
                    decode(self.what, kv.value()).map(Some),
                    Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision()),
                ),
                None => (Ok(None), Compare::version(key, CompareOp::Equal, 0)),
            };
            let record = match decide(current)? {
                Change::Write(record) => record,
                Change::Leave(answer) => return Ok(Changed::Left(answer)),
            };
            let txn = Txn::new()
                .when([guard])
                .and_then([TxnOp::put(key, encode(&record)?, None)]);
            if etcd::call(self.client.clone().txn(txn)).await?.succeeded() {
                return Ok(Changed::Written(record));
            }
        }
    }
}

/// `record` as JSON, as a key holds it.
pub(crate) fn encode<T: Serialize>(record: &T) -> Result<Vec<u8>, RecordError> {
    serde_json::to_vec(record).map_err(RecordError::Unwritable)
}

/// A `what` record a key holds, from its JSON.
pub(crate) fn decode<T: DeserializeOwned>(what: &'static str, value: &[u8]) -> Result<T, RecordError> {
    serde_json::from_slice(value).map_err(|source| RecordError::Unreadable { what, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Callers log and return these errors as `CoordError`s: their words are the ones the
    /// records' own codecs gave before.
    #[test]
    fn a_record_that_is_not_json_of_its_type_is_named_in_the_error() {
        let err = decode::<Vec<u32>>("backfill", b"{").expect_err("not JSON");
        assert!(matches!(err, RecordError::Unreadable { what: "backfill", .. }));
        let said = CoordError::from(err).to_string();
        assert!(
            said.starts_with("etcd answered with something unexpected: a backfill record etcd holds: "),
            "{said}"
        );
        let timeout = CoordError::Timeout(std::time::Duration::from_secs(2));
        let said = timeout.to_string();
        assert_eq!(CoordError::from(RecordError::from(timeout)).to_string(), said);
    }
}
