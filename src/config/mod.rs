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

mod error;
mod model;
mod raw;
mod validate;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use chrono_tz::Tz;

pub use error::ConfigError;
use error::Source;
pub use model::*;
use raw::RawFile;
use validate::{validate_cluster, validate_etcd, validate_job};

use crate::schedule::Schedule;

/// Reads and validates the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|err| ConfigError {
        file: path.to_path_buf(),
        location: None,
        job: None,
        field: None,
        message: format!("cannot read config file: {err}"),
    })?;
    parse(path, &text)
}

/// Validates `text` as the contents of the config file `path`.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let source = Source { path, text };
    let raw: RawFile = toml::from_str(text).map_err(|err| source.toml_error(&err))?;
    let cluster = validate_cluster(&source, raw.cluster)?;
    let etcd = validate_etcd(&source, raw.etcd)?;

    let mut schedules: HashMap<(String, Tz), Arc<Schedule>> = HashMap::new();
    let mut jobs = Vec::with_capacity(raw.jobs.len());
    for (name, job) in raw.jobs {
        jobs.push(validate_job(&source, &cluster, name, job, &mut schedules)?);
    }
    Ok(Config {
        path: path.to_path_buf(),
        cluster,
        etcd,
        jobs,
        digest: format!("{:016x}", seahash::hash(text.as_bytes())),
    })
}

#[cfg(test)]
mod tests;
