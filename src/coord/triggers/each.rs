//! A run asked for by hand of a `fan_out = "all"` job: one request per node that has the job's
//! tags, each taken by that node's own election, as every tick of the job is.

use std::time::Duration;

use super::ask::{ask, Claimed};
use crate::coord::etcd::CoordError;
use crate::coord::keys::Keys;
use crate::rules::config::Job;
use crate::rules::pools::Tags;

/// Asks every live node with all of `run_on` for a run of its instance of `job`, at once, and
/// waits up to `timeout` for each to take it. By node id: `None` where no node took it in time
/// (the request was withdrawn). No node with the tags: an empty list.
pub async fn ask_each(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    run_on: &Tags,
    timeout: Duration,
) -> Result<Vec<(String, Option<Claimed>)>, CoordError> {
    let (members, _) = crate::coord::fleet::read_members(client, keys).await?;
    let mut asking = tokio::task::JoinSet::new();
    for (node, member) in &members.nodes {
        if !member.tags.has_all(run_on) {
            continue;
        }
        let (client, keys, node) = (client.clone(), keys.clone(), node.clone());
        let instance = Job::instance_name(job, &node);
        asking.spawn(async move {
            let asked = ask(&client, &keys, &instance, timeout).await;
            (node, asked)
        });
    }
    let mut answers = Vec::new();
    while let Some(joined) = asking.join_next().await {
        let (node, asked) = joined.map_err(|err| CoordError::Protocol(err.to_string()))?;
        answers.push((node, asked?));
    }
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(answers)
}
