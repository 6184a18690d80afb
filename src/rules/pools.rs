//! Where a job runs: node tags, pools, and the elections one config holds.
//!
//! A job with `run_on = [tags]` runs only on nodes that have every one of those tags. Jobs with
//! the same `run_on` set form a pool; a pool's jobs are hashed into its own `pool_shards`
//! elections, in which only the nodes that have the pool's tags campaign. A `fan_out = "all"`
//! job runs on every such node, as one instance per node: each node leads its instances in an
//! election of its own, where it is the only candidate.
//!
//! Every node of one config numbers the elections alike: the fleet's `shards` first (jobs
//! without `run_on`, with the keys and elections they had before pools existed), then each
//! pool's in the order of its id, then the node's own election if any job fans out. A job's
//! `shard` is its election's number; [`Elections::locate`] says which election that is.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// At most this many tags per node and per `run_on`.
pub const MAX_TAGS: usize = 32;
/// The longest tag.
pub const MAX_TAG_LEN: usize = 64;
/// Default for `[cluster] pool_shards`.
pub const DEFAULT_POOL_SHARDS: u32 = 16;

/// Whether `tag` may be a tag: it becomes part of etcd keys and metric labels.
pub fn valid_tag(tag: &str) -> bool {
    (1..=MAX_TAG_LEN).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A set of tags: a node's, or the ones a job runs on. Sorted, without repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tags(BTreeSet<String>);

impl Tags {
    /// Validates a list of tags; repeats count once.
    pub fn new<S: AsRef<str>>(list: &[S]) -> Result<Tags, String> {
        let mut tags = BTreeSet::new();
        for tag in list {
            let tag = tag.as_ref();
            if !valid_tag(tag) {
                return Err(format!(
                    "invalid tag {tag:?}: use 1 to {MAX_TAG_LEN} letters, digits, '.', '_' and '-'"
                ));
            }
            tags.insert(tag.to_string());
        }
        if tags.len() > MAX_TAGS {
            return Err(format!("at most {MAX_TAGS} tags, found {}", tags.len()));
        }
        Ok(Tags(tags))
    }

    /// `--tags db,eu-west`: a comma-separated list; blanks around a tag are dropped.
    pub fn parse(list: &str) -> Result<Tags, String> {
        let items: Vec<&str> = list.split(',').map(str::trim).filter(|tag| !tag.is_empty()).collect();
        Tags::new(&items)
    }

    /// Whether a node with these tags may run a job that runs on `wanted`.
    pub fn has_all(&self, wanted: &Tags) -> bool {
        wanted.0.is_subset(&self.0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// The pool's id: its tags joined with `+`, a character no tag has.
    pub fn id(&self) -> String {
        self.iter().collect::<Vec<_>>().join("+")
    }
}

/// How many nodes run each tick of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FanOut {
    /// One eligible node runs each tick.
    #[default]
    One,
    /// Every eligible node runs each tick once.
    All,
}

/// The jobs with one `run_on` set, and the elections they are hashed into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The tags joined with `+`: part of the pool's election keys.
    pub id: String,
    pub tags: Tags,
    /// The number of the pool's first election.
    pub first: u32,
}

/// Which election a number names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Election<'a> {
    /// Shard `shard` of the fleet's `shards`: jobs without `run_on`.
    Fleet { shard: u32, shards: u32 },
    /// Shard `shard` of a pool's `shards`.
    Pool { pool: &'a Pool, shard: u32, shards: u32 },
    /// The node's own election, led only by itself: its instances of `fan_out = "all"` jobs.
    Own,
}

impl Election<'_> {
    /// The pool's id, or `None` for the fleet's elections and the node's own.
    pub fn pool_id(&self) -> Option<&str> {
        match self {
            Election::Pool { pool, .. } => Some(&pool.id),
            _ => None,
        }
    }

    /// The shard within its pool (or the fleet's), as `CRON_SHARD` says it.
    pub fn shard(&self) -> u32 {
        match self {
            Election::Fleet { shard, .. } | Election::Pool { shard, .. } => *shard,
            Election::Own => 0,
        }
    }

    /// The shard count of its family of elections.
    pub fn shards(&self) -> u32 {
        match self {
            Election::Fleet { shards, .. } | Election::Pool { shards, .. } => *shards,
            Election::Own => 1,
        }
    }
}

/// Every election of one config, numbered as the module says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elections {
    pub shards: u32,
    pub pool_shards: u32,
    /// By id.
    pub pools: Vec<Arc<Pool>>,
    /// Whether any job fans out: the node's own election exists.
    pub own: bool,
}

impl Elections {
    /// The elections of a config whose jobs use these `run_on` sets (the empty set aside).
    pub fn new(shards: u32, pool_shards: u32, run_on: &BTreeSet<Tags>, own: bool) -> Elections {
        let pools = run_on
            .iter()
            .filter(|tags| !tags.is_empty())
            .enumerate()
            .map(|(index, tags)| {
                Arc::new(Pool {
                    id: tags.id(),
                    tags: tags.clone(),
                    first: shards + index as u32 * pool_shards,
                })
            })
            .collect();
        Elections {
            shards,
            pool_shards,
            pools,
            own,
        }
    }

    /// How many elections there are: each a number below this.
    pub fn total(&self) -> u32 {
        self.shards + self.pools.len() as u32 * self.pool_shards + u32::from(self.own)
    }

    /// How many elections a fleet holds at most: each pool's and the fleet's, and one per node
    /// for its fanned-out instances.
    pub fn shared(&self) -> u64 {
        u64::from(self.shards) + self.pools.len() as u64 * u64::from(self.pool_shards)
    }

    /// The number of the node's own election, if any job fans out.
    pub fn own_number(&self) -> Option<u32> {
        self.own.then(|| self.total() - 1)
    }

    pub fn pool(&self, tags: &Tags) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|pool| pool.tags == *tags)
    }

    pub fn pool_by_id(&self, id: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|pool| pool.id == id)
    }

    /// The election a job is in: its own node's for a fanned-out job, else its pool's (or the
    /// fleet's) shard by the hash of its name.
    pub fn number_of(&self, name: &str, run_on: &Tags, fan_out: FanOut) -> u32 {
        if fan_out == FanOut::All {
            if let Some(own) = self.own_number() {
                return own;
            }
        }
        match self.pool(run_on) {
            Some(pool) => pool.first + crate::rules::shard::shard_of(name, self.pool_shards),
            None => crate::rules::shard::shard_of(name, self.shards),
        }
    }

    /// Which election `number` names; `None` past the last.
    pub fn locate(&self, number: u32) -> Option<Election<'_>> {
        if number < self.shards {
            return Some(Election::Fleet {
                shard: number,
                shards: self.shards,
            });
        }
        if self.own_number() == Some(number) {
            return Some(Election::Own);
        }
        let index = (number - self.shards) / self.pool_shards.max(1);
        let pool = self.pools.get(index as usize)?;
        Some(Election::Pool {
            pool,
            shard: number - pool.first,
            shards: self.pool_shards,
        })
    }

    /// The number of an election given by its pool (`None`: the fleet's), shard and shard
    /// count; `None` when this config holds no such election.
    pub fn number(&self, pool: Option<&str>, shard: u32, shards: u32) -> Option<u32> {
        match pool {
            None => (shards == self.shards && shard < shards).then_some(shard),
            Some(id) => {
                let pool = self.pool_by_id(id)?;
                (shards == self.pool_shards && shard < shards).then_some(pool.first + shard)
            }
        }
    }

    /// The pools a node with `tags` campaigns in.
    pub fn pools_of<'a>(&'a self, tags: &'a Tags) -> impl Iterator<Item = &'a Arc<Pool>> + 'a {
        self.pools.iter().filter(move |pool| tags.has_all(&pool.tags))
    }

    /// Whether a node with `tags` campaigns in election `number`.
    pub fn eligible(&self, number: u32, tags: &Tags) -> bool {
        match self.locate(number) {
            Some(Election::Pool { pool, .. }) => tags.has_all(&pool.tags),
            Some(_) => true,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &[&str]) -> Tags {
        Tags::new(list).unwrap()
    }

    fn elections() -> Elections {
        let run_on: BTreeSet<Tags> = [tags(&[]), tags(&["web"]), tags(&["eu-west", "db"])].into();
        Elections::new(8, 4, &run_on, true)
    }

    #[test]
    fn tags_are_checked_sorted_and_joined() {
        assert_eq!(Tags::parse(" db, eu-west ,db,").unwrap().id(), "db+eu-west");
        assert!(Tags::parse("a/b").is_err());
        assert!(Tags::parse(&"x".repeat(65)).is_err());
        let many: Vec<String> = (0..33).map(|i| format!("t{i}")).collect();
        assert!(Tags::new(&many).is_err());
        assert!(Tags::new(&many[..32]).is_ok());
        assert!(tags(&["db", "eu-west", "ssd"]).has_all(&tags(&["eu-west", "db"])));
        assert!(!tags(&["db"]).has_all(&tags(&["eu-west", "db"])));
        assert!(tags(&[]).has_all(&tags(&[])));
    }

    #[test]
    fn elections_are_numbered_fleet_then_pools_by_id_then_own() {
        let elections = elections();
        assert_eq!(elections.total(), 8 + 2 * 4 + 1);
        assert_eq!(elections.shared(), 16);
        assert_eq!(elections.pools[0].id, "db+eu-west");
        assert_eq!(elections.pools[1].first, 12);
        assert_eq!(elections.locate(3), Some(Election::Fleet { shard: 3, shards: 8 }));
        let Some(Election::Pool {
            pool,
            shard: 1,
            shards: 4,
        }) = elections.locate(13)
        else {
            panic!("13 is web's second shard");
        };
        assert_eq!(pool.id, "web");
        assert_eq!(elections.locate(16), Some(Election::Own));
        assert_eq!(elections.locate(17), None);
        for number in 0..elections.total() {
            let election = elections.locate(number).unwrap();
            if election != Election::Own {
                assert_eq!(
                    elections.number(election.pool_id(), election.shard(), election.shards()),
                    Some(number)
                );
            }
        }
        assert_eq!(elections.number(Some("web"), 1, 5), None);
        assert_eq!(elections.number(Some("gpu"), 0, 4), None);
        assert_eq!(elections.number(None, 8, 8), None);
    }

    #[test]
    fn a_job_is_in_its_pool_or_the_fleet_or_its_node_when_it_fans_out() {
        let elections = elections();
        let plain = elections.number_of("backup", &tags(&[]), FanOut::One);
        assert_eq!(plain, crate::rules::shard::shard_of("backup", 8));
        let web = elections.number_of("warm", &tags(&["web"]), FanOut::One);
        assert!((12..16).contains(&web));
        assert_eq!(elections.number_of("rotate", &tags(&["web"]), FanOut::All), 16);
        assert!(elections.eligible(web, &tags(&["web", "ssd"])));
        assert!(!elections.eligible(web, &tags(&["db"])));
        assert!(elections.eligible(16, &tags(&[])));
        assert_eq!(elections.pools_of(&tags(&["db", "eu-west", "web"])).count(), 2);
    }
}
