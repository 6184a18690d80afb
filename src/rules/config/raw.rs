//! `jobs.toml` as written: serde shapes with the span of every value kept, for error locations.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::model::{CatchUp, Delivery, Overlap};
use crate::rules::pools::FanOut;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) cluster: Option<Spanned<RawCluster>>,
    pub(super) etcd: Option<Spanned<RawEtcd>>,
    #[serde(default)]
    pub(super) groups: BTreeMap<Spanned<String>, Spanned<RawGroup>>,
    #[serde(default)]
    pub(super) jobs: BTreeMap<Spanned<String>, Spanned<RawJob>>,
    #[serde(default)]
    pub(super) blackouts: BTreeMap<Spanned<String>, Spanned<RawBlackout>>,
    #[serde(default)]
    pub(super) notify: BTreeMap<Spanned<String>, Spanned<RawNotify>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBlackout {
    pub(super) windows: Option<Spanned<Vec<Spanned<RawWindow>>>>,
    pub(super) dates: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) timezone: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    pub(super) start: Option<Spanned<String>>,
    pub(super) duration: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotify {
    pub(super) url: Option<Spanned<String>>,
    pub(super) headers: Option<Spanned<BTreeMap<String, Spanned<RawHeader>>>>,
    pub(super) on: Option<Spanned<Vec<Spanned<String>>>>,
}

/// A header's value: written out, or read from the node's environment or a file at each send.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawHeader {
    Text(String),
    From(RawHeaderFrom),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaderFrom {
    pub(super) env: Option<String>,
    pub(super) file: Option<PathBuf>,
}

/// Names of `[blackouts.<name>]` or `[notify.<name>]` tables, as a job or the cluster lists them.
pub(super) type RawNames = Spanned<Vec<Spanned<String>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    pub(super) limit: Option<Spanned<i64>>,
    pub(super) wait: Option<Spanned<String>>,
}

/// A piece of the file holding only jobs' tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJobs {
    pub(super) jobs: BTreeMap<Spanned<String>, Spanned<RawJob>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub(super) name: Option<Spanned<String>>,
    pub(super) shards: Option<Spanned<i64>>,
    pub(super) lease_ttl: Option<Spanned<String>>,
    pub(super) timezone: Option<Spanned<String>>,
    pub(super) history: Option<Spanned<i64>>,
    pub(super) pool_shards: Option<Spanned<i64>>,
    pub(super) blackouts: Option<RawNames>,
    pub(super) notify: Option<RawNames>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEtcd {
    pub(super) endpoints: Option<Spanned<Vec<String>>>,
    pub(super) username: Option<Spanned<String>>,
    pub(super) password_env: Option<Spanned<String>>,
    pub(super) password_file: Option<Spanned<PathBuf>>,
    pub(super) tls: Option<RawTls>,
    pub(super) compaction: Option<Spanned<String>>,
    pub(super) gone_node_retention: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) ca: Option<PathBuf>,
    pub(super) cert: Option<Spanned<PathBuf>>,
    pub(super) key: Option<Spanned<PathBuf>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJob {
    pub(super) schedule: Option<Spanned<RawSchedule>>,
    pub(super) command: Option<Spanned<String>>,
    pub(super) timezone: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<String>>,
    pub(super) kill_grace: Option<Spanned<String>>,
    pub(super) retries: Option<Spanned<i64>>,
    pub(super) retry_backoff: Option<Spanned<String>>,
    pub(super) catch_up: Option<Spanned<CatchUp>>,
    pub(super) starting_deadline: Option<Spanned<String>>,
    pub(super) overlap: Option<Spanned<Overlap>>,
    pub(super) delivery: Option<Spanned<Delivery>>,
    pub(super) working_dir: Option<Spanned<PathBuf>>,
    pub(super) env: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) env_file: Option<Spanned<PathBuf>>,
    pub(super) run_on: Option<Spanned<Vec<String>>>,
    pub(super) fan_out: Option<Spanned<FanOut>>,
    pub(super) group: Option<Spanned<String>>,
    pub(super) output_tail: Option<Spanned<RawSize>>,
    pub(super) log_output: Option<Spanned<crate::rules::output::LogOutput>>,
    pub(super) blackouts: Option<RawNames>,
    pub(super) notify: Option<RawNames>,
    pub(super) ping_url: Option<Spanned<String>>,
    pub(super) ping_method: Option<Spanned<crate::rules::notify::PingMethod>>,
}

/// A size: a whole number of bytes, or a string with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawSize {
    Bytes(i64),
    Text(String),
}

/// `schedule`: one expression, or an array of them that the job fires on together.
pub(super) struct RawSchedule(pub(super) Vec<String>);

impl<'de> Deserialize<'de> for RawSchedule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expressions;
        impl<'de> serde::de::Visitor<'de> for Expressions {
            type Value = RawSchedule;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a crontab expression or an array of them")
            }

            fn visit_str<E: serde::de::Error>(self, expression: &str) -> Result<RawSchedule, E> {
                Ok(RawSchedule(vec![expression.to_string()]))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<RawSchedule, A::Error> {
                let mut expressions = Vec::new();
                while let Some(expression) = items.next_element::<String>()? {
                    expressions.push(expression);
                }
                Ok(RawSchedule(expressions))
            }
        }
        deserializer.deserialize_any(Expressions)
    }
}
