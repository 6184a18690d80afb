//! `jobs.toml`, read once and turned into a validated [`Config`].
//!
//! The raw file is deserialized with spans kept on every value, then checked field by field; the
//! rest of the program only ever sees [`Config`] and [`Job`], whose schedules are parsed and whose
//! zones are resolved. Every error names the file, line, column, job and field.
//!
//! - `model`: the validated types.
//! - `raw`: the file's serde shapes, spans kept.
//! - `validate`: the checks from one to the other.
//! - `error`: [`ConfigError`] and the source text that locates it.
//! - `pieces`: a large file read a thousand jobs at a time.

mod error;
mod loaded;
mod model;
mod pieces;
mod raw;
mod validate;
mod validate_job;
mod validate_named;

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use chrono_tz::Tz;

pub use error::ConfigError;
use error::Source;
pub(crate) use loaded::Loaded;
pub use loaded::NodeSpec;
pub use model::*;
use raw::{RawFile, RawJobs};
pub(crate) use validate::valid_name;
use validate::{validate_cluster, validate_etcd};
use validate_job::validate_job;
use validate_named::{cluster_lists, Shared, SharedTables};

use crate::rules::pools::{Elections, FanOut, Tags};
use crate::rules::schedule::Schedule;

/// Reads and validates the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|err| ConfigError {
        file: path.to_path_buf(),
        location: None,
        job: None,
        field: None,
        message: format!("cannot read config file: {err} (name another with --config or SHARDCRON_CONFIG)"),
    })?;
    parse(path, &text)
}

/// Validates `text` as the contents of the config file `path`.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let source = Source { path, text };
    let Parts {
        cluster,
        etcd,
        shared,
        mut jobs,
    } = match parse_in_pieces(&source, pieces::JOBS_PER_PIECE) {
        Some(parts) => parts,
        None => parse_whole(&source)?,
    };
    let elections = Arc::new(elections_of(&source, &cluster, &mut jobs)?);
    Ok(Config {
        path: path.to_path_buf(),
        cluster,
        etcd,
        jobs,
        digest: format!("{:016x}", seahash::hash(text.as_bytes())),
        elections,
        groups: shared.groups,
        blackouts: shared.blackouts,
        notifiers: shared.notifiers,
    })
}

/// Every election the jobs need, bounded as one fleet of [`MAX_SHARDS`] shards is, and each job
/// numbered with its own.
fn elections_of(source: &Source, cluster: &Cluster, jobs: &mut [Arc<Job>]) -> Result<Elections, ConfigError> {
    let run_on: BTreeSet<Tags> = jobs
        .iter()
        .filter(|job| job.fan_out == FanOut::One)
        .map(|job| job.run_on.clone())
        .collect();
    let own = jobs.iter().any(|job| job.fan_out == FanOut::All);
    let elections = Elections::new(cluster.shards, cluster.pool_shards, &run_on, own);
    if elections.shared() > u64::from(MAX_SHARDS) {
        return Err(source.error(
            None,
            None,
            Some("cluster.pool_shards"),
            format!(
                "{} shards and {} pools of {} shards make {} elections; at most {MAX_SHARDS} (each is an etcd election): lower shards or pool_shards, or use fewer run_on sets",
                cluster.shards,
                elections.pools.len(),
                cluster.pool_shards,
                elections.shared()
            ),
        ));
    }
    for job in jobs {
        // Not shared yet: numbered in place, never copied.
        let job = Arc::make_mut(job);
        job.shard = elections.number_of(&job.name, &job.run_on, job.fan_out);
        job.pool_shard = elections.locate(job.shard).map_or(0, |election| election.shard());
    }
    Ok(elections)
}

/// What the file says, validated.
struct Parts {
    cluster: Cluster,
    etcd: Etcd,
    shared: Shared,
    jobs: Vec<Arc<Job>>,
}

fn parse_whole(source: &Source) -> Result<Parts, ConfigError> {
    let mut raw: RawFile = toml::from_str(source.text).map_err(|err| source.toml_error(&err))?;
    let lists = cluster_lists(&mut raw.cluster);
    let cluster = validate_cluster(source, raw.cluster)?;
    let etcd = validate_etcd(source, raw.etcd)?;
    let tables = SharedTables {
        groups: raw.groups,
        blackouts: raw.blackouts,
        notify: raw.notify,
    };
    let shared = Shared::validate(source, &cluster, &etcd, tables, lists)?;

    let mut schedules: HashMap<(String, Tz), Arc<Schedule>> = HashMap::new();
    let mut jobs = Vec::with_capacity(raw.jobs.len());
    for (name, job) in raw.jobs {
        jobs.push(Arc::new(validate_job(
            source,
            &cluster,
            name,
            job,
            &shared,
            &mut schedules,
        )?));
    }
    Ok(Parts {
        cluster,
        etcd,
        shared,
        jobs,
    })
}

/// What [`parse_whole`] makes, read in pieces, so that no tree of the whole document is ever
/// held; `None` for a file that must be read whole, or one with any error, whose message the
/// whole-document reader then gives.
fn parse_in_pieces(source: &Source, jobs_per_piece: usize) -> Option<Parts> {
    let pieces = pieces::split(source.text, jobs_per_piece)?;
    let mut rest: RawFile = toml::from_str(&pieces.rest).ok()?;
    if !rest.jobs.is_empty() {
        return None;
    }
    let lists = cluster_lists(&mut rest.cluster);
    let cluster = validate_cluster(source, rest.cluster).ok()?;
    let etcd = validate_etcd(source, rest.etcd).ok()?;
    let tables = SharedTables {
        groups: rest.groups,
        blackouts: rest.blackouts,
        notify: rest.notify,
    };
    let shared = Shared::validate(source, &cluster, &etcd, tables, lists).ok()?;
    drop(pieces.rest);

    // The pieces are independent: each core reads a run of them.
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    let per_core = pieces.jobs.len().div_ceil(cores).max(1);
    let read: Vec<Option<Vec<Arc<Job>>>> = std::thread::scope(|scope| {
        let readers: Vec<_> = pieces
            .jobs
            .chunks(per_core)
            .map(|run| scope.spawn(|| read_pieces(source, &cluster, &shared, run)))
            .collect();
        readers.into_iter().map(|reader| reader.join().ok().flatten()).collect()
    });
    let mut jobs = Vec::with_capacity(pieces.job_count);
    for run in read {
        jobs.extend(run?);
    }
    // In name order, as the whole-document reader's map gives them.
    jobs.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Some(Parts {
        cluster,
        etcd,
        shared,
        jobs,
    })
}

/// The jobs of a run of pieces, validated; `None` on any error.
fn read_pieces(source: &Source, cluster: &Cluster, shared: &Shared, run: &[Range<usize>]) -> Option<Vec<Arc<Job>>> {
    let mut schedules: HashMap<(String, Tz), Arc<Schedule>> = HashMap::new();
    let mut jobs = Vec::new();
    for piece in run {
        let raw: RawJobs = toml::from_str(&source.text[piece.clone()]).ok()?;
        for (name, job) in raw.jobs {
            jobs.push(Arc::new(
                validate_job(source, cluster, name, job, shared, &mut schedules).ok()?,
            ));
        }
    }
    Some(jobs)
}

#[cfg(test)]
mod tests;
