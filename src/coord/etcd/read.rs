//! Reading every key under a prefix at one revision, in pages etcd-client takes.

use etcd_client::{GetOptions, KeyValue};

use super::calls::call;
use super::error::CoordError;

/// Keys per page of a prefix read: far below etcd-client's 4 MiB answer limit.
pub(crate) const PAGE: i64 = 2000;

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

/// Every key under `prefix` at one revision, read in pages, and that revision.
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
