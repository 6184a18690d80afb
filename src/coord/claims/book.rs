//! What a leader knows of its jobs' records: the revision a claim must find, and the record.
//! The rules for what it writes over them are in [`crate::rules::protocol`].

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::coord::job_gauges::JobGauges;
use crate::rules::config::Job;
use crate::rules::protocol::ReadRecord;
use crate::rules::record::Claim;

/// One job of a term and what its leader knows of the job's record.
pub(crate) struct Entry {
    pub(crate) job: Arc<Job>,
    /// The record's mod revision, which the next write must find unchanged; 0 for no record.
    pub(super) revision: i64,
    /// The record as etcd holds it, as far as this leader knows. Boxed: a job a leader has not
    /// read yet, or that never ran, costs the book a pointer, not a claim.
    pub(super) record: Option<Box<Claim>>,
    /// Whether this leadership has read the record yet: a new leader reads its jobs' records a
    /// transaction's worth at a time as it settles them, so its first claim waits for one read,
    /// not for all of them.
    pub(super) read: bool,
}

impl Entry {
    /// The last tick claimed by anyone, as far as this leader knows.
    pub(crate) fn last(&self) -> Option<DateTime<Utc>> {
        self.record.as_deref().map(|claim| claim.scheduled_at)
    }

    /// The job's record as this leader knows it.
    pub(crate) fn record(&self) -> Option<&Claim> {
        self.record.as_deref()
    }

    /// The record's tick is the job's last claimed one, from which its next-run gauge counts.
    fn publish_claimed(&self, gauges: &JobGauges) {
        if let Some(tick) = self.last() {
            gauges.claimed(&self.job.name, tick);
        }
    }

    /// The revision of the job's record as this leader knows it.
    pub(crate) fn revision(&self) -> i64 {
        self.revision
    }
}

/// The jobs of one shard, indexed as the term queues them, with what their leader knows of them.
pub(crate) struct Book {
    pub(super) entries: Vec<Entry>,
    pub(super) by_name: HashMap<String, usize>,
    /// Where the jobs' last claimed ticks go, for their next-run gauges.
    gauges: Arc<JobGauges>,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} jobs remembered", self.entries.len())
    }
}

impl Book {
    /// A book of no job yet, whose jobs' claims show in `gauges`.
    pub(crate) fn new(gauges: Arc<JobGauges>) -> Book {
        Book {
            entries: Vec::new(),
            by_name: HashMap::new(),
            gauges,
        }
    }

    /// What this book knows, leaving it empty (its gauges kept): for a term that ends and hands
    /// its knowledge to the next.
    pub(crate) fn take(&mut self) -> Book {
        let empty = Book::new(Arc::clone(&self.gauges));
        std::mem::replace(self, empty)
    }

    /// The book of `jobs`: what `known` (the previous term of this leadership) knew; the
    /// records of the jobs it did not know are read when they are first needed
    /// ([`Claimer::read`](super::Claimer::read)).
    pub(crate) fn open(jobs: Vec<Arc<Job>>, known: Book) -> Book {
        let known_gauges = known.gauges;
        let mut known: HashMap<String, Entry> = known
            .entries
            .into_iter()
            .map(|entry| (entry.job.name.clone(), entry))
            .collect();
        let entries: Vec<Entry> = jobs
            .iter()
            .map(|job| match known.remove(&job.name) {
                Some(entry) => Entry {
                    job: Arc::clone(job),
                    ..entry
                },
                None => Entry {
                    job: Arc::clone(job),
                    revision: 0,
                    record: None,
                    read: false,
                },
            })
            .collect();
        for entry in &entries {
            entry.publish_claimed(&known_gauges);
        }
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| (entry.job.name.clone(), index))
            .collect();
        Book {
            entries,
            by_name,
            gauges: known_gauges,
        }
    }

    /// This book with every record to be read again when next needed: another election's
    /// leaders may have written them meanwhile.
    pub(crate) fn forgotten(mut self) -> Book {
        for entry in &mut self.entries {
            entry.read = false;
        }
        self
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Where the job named `name` is in the book, if it is this shard's.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Those of `indices` whose records this leadership has not read yet.
    pub(super) fn unread(&self, indices: impl IntoIterator<Item = usize>) -> Vec<usize> {
        let mut unread: Vec<usize> = indices.into_iter().filter(|index| !self.entries[*index].read).collect();
        unread.sort_unstable();
        unread.dedup();
        unread
    }

    pub(crate) fn job(&self, index: usize) -> &Arc<Job> {
        &self.entries[index].job
    }

    pub(super) fn learn(&mut self, index: usize, seen: &ReadRecord) {
        self.holds(index, seen.mod_revision, seen.claim.clone());
    }

    /// etcd holds `record` at `revision` for the job at `index`.
    pub(super) fn holds(&mut self, index: usize, revision: i64, record: Option<Claim>) {
        let entry = &mut self.entries[index];
        entry.revision = revision;
        entry.record = record.map(Box::new);
        entry.read = true;
        entry.publish_claimed(&self.gauges);
    }
}
