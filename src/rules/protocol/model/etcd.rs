//! An abstract etcd: one linearizable store with a revision that grows at every write, leases
//! that expire, transactions that compare create and mod revisions, and elections won by the
//! lowest create revision among the candidate keys still on a live lease.

use std::collections::{BTreeMap, BTreeSet};

use crate::rules::protocol::{Guard, ReadRecord};
use crate::rules::record::Claim;

/// A lease: whose it is, the shard count its node runs (its fleet membership rides on it), and
/// the model second from which it is gone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Lease {
    pub(crate) node: usize,
    /// The election families its node runs (a shard count, and the pool's if it is in it).
    pub(crate) families: Vec<(Option<String>, u32)>,
    pub(crate) expires: u8,
}

/// A candidate key of an election.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Candidate {
    pub(crate) create_revision: i64,
    pub(crate) lease: u8,
    pub(crate) node: usize,
}

/// An election: a shard of a shard count.
pub(crate) type Election = (u32, u32);

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Etcd {
    pub(crate) revision: i64,
    /// Per job (by index), its `/last` record with its mod revision.
    pub(crate) records: BTreeMap<usize, (i64, Claim)>,
    pub(crate) leases: BTreeMap<u8, Lease>,
    next_lease: u8,
    pub(crate) candidates: BTreeMap<Election, Vec<Candidate>>,
}

impl Etcd {
    pub(crate) fn grant(&mut self, node: usize, families: Vec<(Option<String>, u32)>, expires: u8) -> u8 {
        let id = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(
            id,
            Lease {
                node,
                families,
                expires,
            },
        );
        id
    }

    /// Puts a candidate key on `lease`: its create revision is the term it leads with.
    pub(crate) fn campaign(&mut self, election: Election, lease: u8, node: usize) {
        self.revision += 1;
        let create_revision = self.revision;
        self.candidates.entry(election).or_default().push(Candidate {
            create_revision,
            lease,
            node,
        });
    }

    pub(crate) fn candidate(&self, election: Election, lease: u8) -> Option<&Candidate> {
        self.candidates.get(&election)?.iter().find(|key| key.lease == lease)
    }

    /// The candidate with the lowest create revision.
    pub(crate) fn leader(&self, election: Election) -> Option<&Candidate> {
        self.candidates
            .get(&election)?
            .iter()
            .min_by_key(|key| key.create_revision)
    }

    /// Deletes the candidate key on `lease`: a resignation.
    pub(crate) fn resign(&mut self, election: Election, lease: u8) {
        if let Some(keys) = self.candidates.get_mut(&election) {
            keys.retain(|key| key.lease != lease);
        }
        self.revision += 1;
    }

    /// Removes `lease` with every key on it: a revocation, or its expiry.
    pub(crate) fn revoke(&mut self, lease: u8) {
        if self.leases.remove(&lease).is_some() {
            for keys in self.candidates.values_mut() {
                keys.retain(|key| key.lease != lease);
            }
            self.revision += 1;
        }
    }

    /// Expires every lease gone by `now`.
    pub(crate) fn expire(&mut self, now: u8) {
        let gone: Vec<u8> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for lease in gone {
            self.revoke(lease);
        }
    }

    /// The election families the fleet's live members run.
    pub(crate) fn live_families(&self) -> BTreeSet<(Option<String>, u32)> {
        self.leases
            .values()
            .flat_map(|lease| lease.families.iter().cloned())
            .collect()
    }

    pub(crate) fn seen(&self, job: usize) -> ReadRecord {
        match self.records.get(&job) {
            Some((mod_revision, claim)) => ReadRecord {
                claim: Some(claim.clone()),
                mod_revision: *mod_revision,
            },
            None => ReadRecord::default(),
        }
    }

    /// Whether every guard of a transaction by a candidate of `election` holds; `leader_guard`
    /// false leaves out the leadership's (a rule broken on purpose).
    pub(crate) fn holds(&self, election: Election, guards: &[Guard], jobs: &[String], leader_guard: bool) -> bool {
        guards.iter().all(|guard| match guard {
            Guard::Leads { term } => {
                !leader_guard
                    || self
                        .candidates
                        .get(&election)
                        .is_some_and(|keys| keys.iter().any(|key| key.create_revision == *term))
            }
            Guard::RecordAt { job, revision } => {
                let index = jobs.iter().position(|name| name == job);
                index.is_some_and(|index| self.seen(index).mod_revision == *revision)
            }
        })
    }

    /// Writes `records` in one transaction: they share its revision.
    pub(crate) fn commit(&mut self, records: Vec<(usize, Claim)>) -> i64 {
        self.revision += 1;
        for (job, claim) in records {
            self.records.insert(job, (self.revision, claim));
        }
        self.revision
    }
}
