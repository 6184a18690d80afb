//! The validated config: what the rest of the program reads, with schedules parsed and zones
//! resolved.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use serde::Deserialize;

use crate::rules::blackouts::Blackout;
use crate::rules::groups::Group;
use crate::rules::notify::{HeaderValue, Notifier, PingMethod};
pub use crate::rules::output::LogOutput;
#[cfg(test)]
use crate::rules::output::DEFAULT_OUTPUT_TAIL;
use crate::rules::own_secrets::OwnSecrets;
use crate::rules::pools::{Elections, FanOut, Tags};
use crate::rules::schedule::Schedule;

/// One node's instance of a `fan_out = "all"` job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The job's name as `jobs.toml` has it.
    pub job: String,
    pub node: String,
}

/// The most shards a cluster may have; each is an etcd election, so this bounds etcd load.
pub const MAX_SHARDS: u32 = 4096;
/// Job names become etcd key segments and log fields, so they are kept short and plain.
pub const MAX_JOB_NAME: usize = 128;

/// A validated `jobs.toml`.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub cluster: Cluster,
    pub etcd: Etcd,
    /// Sorted by name. Each job is made once and shared from then on (a node's elections hold
    /// these same jobs), so 100,000 jobs are never held twice.
    pub jobs: Vec<Arc<Job>>,
    /// seahash of the file's bytes, hex: nodes compare it to spot config drift.
    pub digest: String,
    /// Every election the jobs are in: the fleet's shards, each pool's, the node's own.
    pub elections: Arc<Elections>,
    /// `[groups.<name>]`, by name.
    pub groups: GroupsByName,
    /// `[blackouts.<name>]`, by name.
    pub blackouts: BTreeMap<String, Arc<Blackout>>,
    /// `[notify.<name>]`, by name.
    pub notifiers: BTreeMap<String, Arc<Notifier>>,
}

impl Config {
    /// What an operator should hear about this config without it being an error: `check`
    /// prints each, a node logs each as it loads the config.
    pub fn warnings(&self) -> Vec<String> {
        self.notifiers
            .values()
            .flat_map(|notifier| notifier.warnings())
            .collect()
    }

    /// Every environment variable the config names as holding a secret: `[etcd] password_env`
    /// and each notifier header's `{ env = "NAME" }`, whether a job uses that notifier or not.
    /// None of them may reach a job.
    pub fn secret_variables(&self) -> impl Iterator<Item = &str> {
        let headers = self.notifiers.values().flat_map(|notifier| {
            notifier.headers.iter().filter_map(|(_, value)| match value {
                HeaderValue::Env(var) => Some(var.as_str()),
                HeaderValue::Text(_) | HeaderValue::File(_) => None,
            })
        });
        self.etcd.password_env.as_deref().into_iter().chain(headers)
    }
}

/// The concurrency groups of a config, by name.
pub type GroupsByName = BTreeMap<String, Arc<Group>>;

#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub shards: u32,
    pub lease_ttl: Duration,
    pub timezone: Tz,
    /// How many of each job's last runs etcd keeps for `shardcron history`; 0 keeps none.
    pub history: u32,
    /// The shard count of every pool (jobs with one `run_on` set).
    pub pool_shards: u32,
}

/// Default for `[cluster] history`.
pub const DEFAULT_HISTORY: u32 = 50;
/// At most this many runs per job in `[cluster] history`: each is a key in etcd per job.
pub const MAX_HISTORY: i64 = 1000;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Etcd {
    pub endpoints: Vec<String>,
    pub username: Option<String>,
    /// The name of the environment variable holding the password, never the password itself.
    pub password_env: Option<String>,
    /// A file holding the password, private to the node's user.
    pub password_file: Option<PathBuf>,
    pub tls: Option<EtcdTls>,
    /// How old the history is that one node compacts etcd's history to; `None` (`"off"`) for
    /// an etcd that compacts itself.
    pub compaction: Option<Duration>,
    /// How long the records a node leaves (its instances of `fan_out = "all"` jobs) outlive its
    /// leaving the fleet: node ids change at every deploy in some fleets, and without a bound
    /// each would leave its records for good.
    pub gone_node_retention: Duration,
}

impl Etcd {
    /// The secrets this section names (the password's variable or file, the client key), with
    /// those every node keeps to itself: no notifier header may name them.
    pub fn own_secrets(&self) -> OwnSecrets {
        let mut own = OwnSecrets::default();
        if let Some(var) = &self.password_env {
            own.var(var, "[etcd] password_env");
        }
        if let Some(file) = &self.password_file {
            own.file(file, "[etcd] password_file");
        }
        if let Some(key) = self.tls.as_ref().and_then(|tls| tls.key.as_ref()) {
            own.file(key, "[etcd] tls.key");
        }
        own
    }
}

/// Default for `[etcd] compaction`: what Kubernetes' API server keeps of its etcd's history.
pub const DEFAULT_COMPACTION: Duration = Duration::from_secs(5 * 60);
/// The shortest `[etcd] compaction`: a watch of ours that restarts reads its prefix and then
/// watches from that read's revision, and that revision must outlive the few calls between.
pub const MIN_COMPACTION: Duration = Duration::from_secs(10);
/// Default for `[etcd] gone_node_retention`: a day, long enough to read a gone node's last runs.
pub const DEFAULT_GONE_NODE_RETENTION: Duration = Duration::from_secs(86_400);
/// The shortest `[etcd] gone_node_retention`: longer than a node takes to restart.
pub const MIN_GONE_NODE_RETENTION: Duration = Duration::from_secs(10);
/// The longest `[etcd] gone_node_retention`.
pub const MAX_GONE_NODE_RETENTION: Duration = Duration::from_secs(30 * 86_400);

#[derive(Debug, Clone, PartialEq)]
pub struct EtcdTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// One job, ready to schedule.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    /// The number of the job's election (see [`crate::rules::pools`]): its shard of the fleet's
    /// `shards` for a job without `run_on`.
    pub shard: u32,
    /// The shard within its pool (or within the fleet's `shards`): `CRON_SHARD`. 0 for a
    /// fanned-out job.
    pub pool_shard: u32,
    /// Only nodes with all of these tags run the job; none: any node.
    pub run_on: Tags,
    pub fan_out: FanOut,
    /// For an instance of a `fan_out = "all"` job, the node it runs on; its `name` is then
    /// `<job>@<node>`, which names its records.
    pub instance_of: Option<Box<Instance>>,
    /// Shared between jobs with the same (expression, zone): parsed once.
    pub schedule: Arc<Schedule>,
    pub command: String,
    pub timeout: Option<Duration>,
    /// After the timeout's (or a replacement's) SIGTERM, how long before SIGKILL.
    pub kill_grace: Duration,
    /// Further attempts after a failed run of the same tick, while this node leads the shard.
    pub retries: u32,
    /// The first retry's delay; each next one doubles, capped at [`MAX_RETRY_BACKOFF`], jittered.
    pub retry_backoff: Duration,
    pub catch_up: CatchUp,
    pub starting_deadline: Option<Duration>,
    pub overlap: Overlap,
    pub delivery: Delivery,
    pub working_dir: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    /// `KEY=VALUE` lines read at each run (the job's secrets): see `env_file` for the format.
    pub env_file: Option<PathBuf>,
    /// The concurrency group whose slots the job's attempts take, if any.
    pub group: Option<Arc<Group>>,
    /// How many of the last bytes of each output stream a run keeps with its history entry.
    pub output_tail: usize,
    pub log_output: LogOutput,
    /// The blackouts whose spans the job's ticks are skipped in: the cluster's, then its own.
    pub blackouts: Vec<Arc<Blackout>>,
    /// Who hears of the job's transitions: the cluster's notifiers, then its own.
    pub notify: Vec<Arc<Notifier>>,
    /// Pinged after each successful run.
    pub ping: Option<Box<Ping>>,
}

/// `ping_url` and `ping_method`: a dead man's switch told of each success.
#[derive(Clone, PartialEq, Eq)]
pub struct Ping {
    pub url: String,
    pub method: PingMethod,
}

impl std::fmt::Debug for Ping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A ping URL is a secret: whoever has it can say the job succeeded.
        f.debug_struct("Ping")
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

/// What a new leader does with a tick that was claimed and never started: its leader died,
/// stalled past its lease or stopped first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Run it, with a higher fence and `CRON_REDELIVERED=1`. A tick runs twice only if it had
    /// started and its start was not yet written when its node died.
    #[default]
    AtLeastOnce,
    /// Record it `lost`: a tick never runs twice.
    AtMostOnce,
}

/// What a new leader does with ticks that passed while the shard had no leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Run only the newest missed tick.
    #[default]
    Latest,
    /// Run every missed tick, oldest first.
    All,
    /// Run none of them.
    None,
}

/// What a tick does while the job's previous run on this node is still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Skip the new tick.
    #[default]
    Skip,
    /// Run both.
    Allow,
    /// Stop the running one (SIGTERM, SIGKILL after `kill_grace`), then run the new tick.
    Replace,
}

/// Default for `kill_grace`.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);
/// Default for `retry_backoff`.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// Retry delays grow up to this.
pub const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(300);
/// At most this many retries per tick: a job that needs more is failing, not flaky.
pub const MAX_RETRIES: i64 = 100;

impl Job {
    /// The job's name as `jobs.toml` has it: what `CRON_JOB`, pauses, metrics and the API say,
    /// also for one node's instance of a fanned-out job.
    pub fn job_name(&self) -> &str {
        self.instance_of.as_ref().map_or(&self.name, |instance| &instance.job)
    }

    /// The name of a node's instance of `job`: what its records in etcd are named.
    pub fn instance_name(job: &str, node: &str) -> String {
        format!("{job}@{node}")
    }

    /// This job as run by `node` alone, with records of its own.
    pub fn instance(&self, node: &str) -> Job {
        Job {
            name: Job::instance_name(&self.name, node),
            instance_of: Some(Box::new(Instance {
                job: self.name.clone(),
                node: node.to_string(),
            })),
            ..self.clone()
        }
    }
}

#[cfg(test)]
impl Job {
    /// A job named `name` on `expression` in UTC with every other field at its default, for
    /// unit tests to adjust.
    pub(crate) fn for_tests(name: &str, expression: &str) -> Job {
        Job {
            name: name.into(),
            shard: 0,
            pool_shard: 0,
            run_on: Tags::default(),
            fan_out: FanOut::One,
            instance_of: None,
            schedule: Arc::new(Schedule::parse(expression, chrono_tz::UTC).expect("a valid test schedule")),
            command: "true".into(),
            timeout: None,
            kill_grace: DEFAULT_KILL_GRACE,
            retries: 0,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            catch_up: CatchUp::default(),
            starting_deadline: None,
            overlap: Overlap::default(),
            delivery: Delivery::default(),
            working_dir: None,
            env: BTreeMap::new(),
            env_file: None,
            group: None,
            output_tail: DEFAULT_OUTPUT_TAIL,
            log_output: LogOutput::All,
            blackouts: Vec::new(),
            notify: Vec::new(),
            ping: None,
        }
    }
}
