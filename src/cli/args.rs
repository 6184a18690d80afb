//! The arguments most commands share: where the config is, which etcd to reach, and instants
//! as the flags spell them.

use std::path::PathBuf;

use anyhow::{Context, Result};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;

use crate::coord::etcd;
use crate::coord::health::Limits;
use crate::coord::keys::Keys;
use crate::coord::members::Members;
use crate::rules::config::{self, Config};

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Path of jobs.toml. Default: ./config/jobs.toml if it exists, else
    /// /etc/shardcron/jobs.toml.
    #[arg(long, env = "SHARDCRON_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
}

/// Where a config is looked for when neither `--config` nor `SHARDCRON_CONFIG` names one, in
/// order: a checkout's or working directory's own, then the installed one.
pub const DEFAULT_CONFIG_PATHS: [&str; 2] = ["config/jobs.toml", "/etc/shardcron/jobs.toml"];

impl ConfigArg {
    /// The config file: `--config`, then `SHARDCRON_CONFIG`, then the first of
    /// [`DEFAULT_CONFIG_PATHS`] that exists. The error names every place looked at.
    pub fn path(&self) -> Result<PathBuf> {
        if let Some(path) = &self.config {
            return Ok(path.clone());
        }
        DEFAULT_CONFIG_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|path| path.exists())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no config file: --config not given, SHARDCRON_CONFIG not set, and neither {} (in {}) nor {} exists",
                    DEFAULT_CONFIG_PATHS[0],
                    std::env::current_dir().map_or_else(|_| "the working directory".to_string(), |dir| dir.display().to_string()),
                    DEFAULT_CONFIG_PATHS[1]
                )
            })
    }

    pub fn load(&self) -> Result<Config> {
        Ok(config::load(&self.path()?)?)
    }
}

/// The config and the etcd endpoints of a command that talks to the cluster.
#[derive(Debug, Args)]
pub struct ClusterArg {
    #[command(flatten)]
    pub config: ConfigArg,
    /// etcd endpoints, comma-separated; overrides [etcd] endpoints.
    #[arg(long, env = "SHARDCRON_ENDPOINTS", value_delimiter = ',')]
    pub endpoints: Vec<String>,
}

/// A connection to the cluster a command talks to, with the keys of its config's cluster.
pub(super) struct Cluster {
    pub client: etcd_client::Client,
    /// As connected to, for the errors of the command's calls.
    pub endpoints: Vec<String>,
    pub keys: Keys,
}

impl ClusterArg {
    /// Connects to the `--endpoints` given, else to the config's.
    pub(super) async fn connect(&self, config: &Config) -> Result<Cluster> {
        let endpoints = endpoints(config, &self.endpoints);
        let client = etcd::connect(
            &endpoints,
            etcd::connect_options(&config.etcd).with_context(|| config.path.display().to_string())?,
            &Members::new(Limits::for_ttl(config.cluster.lease_ttl)),
        )
        .await
        .with_context(|| format!("cannot connect to etcd at {endpoints:?}"))?;
        Ok(Cluster {
            client,
            endpoints,
            keys: Keys::new(&config.cluster.name),
        })
    }
}

/// The endpoints a flag names, blanks dropped (an unset variable in `--endpoints "$E"`), else
/// the config's.
pub(super) fn endpoints(config: &Config, flag: &[String]) -> Vec<String> {
    let flag: Vec<String> = flag
        .iter()
        .filter(|endpoint| !endpoint.trim().is_empty())
        .cloned()
        .collect();
    if flag.is_empty() {
        config.etcd.endpoints.clone()
    } else {
        flag
    }
}

pub fn parse_instant(flag: &str, value: Option<&str>) -> Result<Option<DateTime<Utc>>> {
    value
        .map(|value| {
            DateTime::parse_from_rfc3339(value)
                .map(|instant| instant.with_timezone(&Utc))
                .with_context(|| {
                    format!("{flag} {value:?} is not an RFC 3339 instant such as 2027-03-14T01:00:00-05:00")
                })
        })
        .transpose()
}

/// RFC 3339 with the zone's own offset, as operators read it (`2027-03-14T03:00:00-04:00`).
pub fn format_instant(instant: DateTime<Utc>, zone: chrono_tz::Tz) -> String {
    instant.with_timezone(&zone).to_rfc3339_opts(SecondsFormat::Secs, false)
}
