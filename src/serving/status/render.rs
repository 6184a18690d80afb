//! `status` as text: nodes, shard leaders and jobs as aligned tables.

use super::{JobStatus, NoEligibleNode, Status};
use crate::rules::pools::FanOut;
use crate::rules::record::{Claim, RunRecord};
use crate::text_table;

/// The human-readable form: nodes, shard leaders and jobs as aligned tables.
pub fn render(status: &Status) -> String {
    format!(
        "cluster {} ({} shards, config digest {})\n\n{}\n{}\n{}{}{}",
        status.cluster,
        status.shard_count,
        status.digest,
        nodes_table(status),
        shards_table(status),
        groups_table(status),
        backfills_table(status),
        jobs_table(status)
    )
}

/// The jobs' backfills, when there are any: nothing otherwise.
fn backfills_table(status: &Status) -> String {
    if status.backfills.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = status
        .backfills
        .iter()
        .map(|entry| {
            let backfill = &entry.backfill;
            let state = match (entry.over, backfill.cancelled) {
                (true, true) => "cancelled",
                (true, false) => "done",
                (false, true) => "cancelling",
                (false, false) => "going",
            };
            let running: Vec<String> = backfill
                .in_flight
                .iter()
                .map(|flight| {
                    format!(
                        "{}@{}",
                        flight.tick.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        flight.node
                    )
                })
                .collect();
            vec![
                entry.job.clone(),
                format!("{}/{}", backfill.done, backfill.total),
                state.to_string(),
                backfill.from.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                backfill.to.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                if running.is_empty() { dash() } else { running.join(",") },
            ]
        })
        .collect();
    format!(
        "{}\n",
        text_table::table(&["BACKFILL", "DONE", "STATE", "FROM", "TO", "RUNNING"], &rows)
    )
}

/// The concurrency groups, when the config has any: nothing otherwise, so the output reads as
/// it did before groups.
fn groups_table(status: &Status) -> String {
    if status.groups.is_empty() {
        return String::new();
    }
    let groups: Vec<Vec<String>> = status
        .groups
        .iter()
        .map(|group| {
            let holders: Vec<String> = group
                .holders
                .iter()
                .map(|holder| format!("{}@{}", holder.job, holder.node))
                .collect();
            vec![
                group.name.clone(),
                group.limit.to_string(),
                group.running.to_string(),
                group.waiting.to_string(),
                group.wait.clone().unwrap_or_else(|| "next tick".to_string()),
                if holders.is_empty() { dash() } else { holders.join(",") },
            ]
        })
        .collect();
    format!(
        "{}\n",
        text_table::table(&["GROUP", "LIMIT", "RUNNING", "WAITING", "WAIT", "HOLDERS"], &groups)
    )
}

fn dash() -> String {
    "-".to_string()
}

fn nodes_table(status: &Status) -> String {
    let nodes: Vec<Vec<String>> = status
        .nodes
        .iter()
        .map(|node| {
            vec![
                node.id.clone(),
                node.leads.to_string(),
                node.shards.to_string(),
                format!("{}{}", node.digest, if node.drift { " (differs)" } else { "" }),
                node.version.clone(),
                node.started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                if node.tags.is_empty() {
                    dash()
                } else {
                    node.tags.join(",")
                },
                node.etcd.clone().unwrap_or_else(dash),
            ]
        })
        .collect();
    text_table::table(
        &[
            "NODE", "LEADS", "SHARDS", "DIGEST", "VERSION", "STARTED", "TAGS", "ETCD",
        ],
        &nodes,
    )
}

fn shards_table(status: &Status) -> String {
    let shards: Vec<Vec<String>> = status
        .shards
        .iter()
        .map(|shard| {
            vec![
                shard.shard.to_string(),
                shard.leader.clone().unwrap_or_else(dash),
                shard.term.map_or_else(dash, |term| term.to_string()),
                shard.standby.to_string(),
                shard.pool.clone().unwrap_or_else(dash),
                shard.no_eligible_node.as_ref().map_or_else(String::new, unserved_note),
            ]
        })
        .collect();
    // TERM: the leader's term (headed FENCE before #45, which was not the runs' fence).
    text_table::table(&["SHARD", "LEADER", "TERM", "STANDBY", "POOL", "NOTE"], &shards)
}

fn unserved_note(unserved: &NoEligibleNode) -> String {
    match unserved.since {
        Some(since) => format!(
            "no eligible node since {}",
            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        None => "no eligible node".to_string(),
    }
}

fn jobs_table(status: &Status) -> String {
    let mut jobs: Vec<Vec<String>> = Vec::with_capacity(status.jobs.len());
    for job in &status.jobs {
        if job.fan_out == FanOut::All {
            // A row per node that ran its instance, live or gone.
            for instance in &job.instances {
                jobs.push(job_row(
                    job,
                    instance.last_claim.as_ref(),
                    instance.last_run.as_ref(),
                    Some(&instance.node),
                ));
            }
            if job.instances.is_empty() {
                jobs.push(job_row(job, None, None, None));
            }
        } else {
            jobs.push(job_row(job, job.last_claim.as_ref(), job.last_run.as_ref(), None));
        }
    }
    text_table::table(
        &[
            "JOB",
            "SHARD",
            "LAST TICK",
            "NODE",
            "FENCE",
            "OUTCOME",
            "EXIT",
            "NEXT",
            "PAUSED",
            "POOL",
            "NOTE",
        ],
        &jobs,
    )
}

fn job_row(job: &JobStatus, claim: Option<&Claim>, run: Option<&RunRecord>, node: Option<&String>) -> Vec<String> {
    let placement = match (&job.no_eligible_node, job.fan_out) {
        (Some(unserved), _) => unserved_note(unserved),
        (None, FanOut::All) => "fan_out=all".to_string(),
        (None, FanOut::One) => String::new(),
    };
    let mut notes: Vec<String> = [placement].into_iter().filter(|note| !note.is_empty()).collect();
    // A tick claimed ahead is not run yet: the row's tick, node and fence are its last run's.
    if claim.is_some_and(|claim| claim.scheduled_at > crate::clock::now()) {
        notes.push("next tick claimed".to_string());
    }
    notes.extend(job.group.as_ref().map(|group| format!("group={group}")));
    notes.extend(job.blackouts_now.iter().map(|blackout| format!("blackout={blackout}")));
    if job.notification.as_ref().is_some_and(|told| told.failing) {
        notes.push("failing".to_string());
    }
    let note = notes.join(", ");
    vec![
        job.name.clone(),
        job.shard.to_string(),
        // The last run's: its tick, node, `CRON_FENCE` and outcome, as `history` shows them.
        run.map_or_else(dash, |run| {
            run.scheduled_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        }),
        node.cloned()
            .or_else(|| run.map(|run| run.node.clone()))
            .unwrap_or_else(dash),
        run.map_or_else(dash, |run| run.fence.to_string()),
        run.map_or_else(dash, RunRecord::outcome_shown),
        run.and_then(|run| run.exit_code)
            .map_or_else(dash, |code| code.to_string()),
        job.next.map_or_else(
            || "never".to_string(),
            |next| next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        ),
        job.paused.as_ref().map_or_else(dash, |pause| match pause.until {
            Some(until) => format!("until {}", until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            None => "yes".to_string(),
        }),
        job.pool.clone().unwrap_or_else(dash),
        note,
    ]
}
