//! How each job's notes wait their turn: in the order they came, one worker per job, so a job's
//! runs are accounted for in order and no job waits behind another's.

use std::collections::{HashMap, VecDeque};

/// Each job's waiting items in the order they came, for one worker per job: a job's items
/// stay in order (an older run accounted for after a newer one would be ignored), and no job
/// waits behind another's. A job is known while its worker runs.
pub(super) struct JobQueues<T> {
    by_job: HashMap<String, VecDeque<T>>,
}

impl<T> Default for JobQueues<T> {
    fn default() -> Self {
        JobQueues { by_job: HashMap::new() }
    }
}

impl<T> JobQueues<T> {
    /// Queues `item` behind `job`'s others; `true` when the job has no worker: start one.
    pub(super) fn push(&mut self, job: &str, item: T) -> bool {
        if let Some(waiting) = self.by_job.get_mut(job) {
            waiting.push_back(item);
            return false;
        }
        self.by_job.insert(job.to_string(), VecDeque::from([item]));
        true
    }

    /// The job's next item for its worker; `None` ends the worker, and the job is forgotten
    /// in the same step, so the next [`JobQueues::push`] starts another.
    pub(super) fn next(&mut self, job: &str) -> Option<T> {
        let next = self.by_job.get_mut(job).and_then(VecDeque::pop_front);
        if next.is_none() {
            self.by_job.remove(job);
        }
        next
    }

    /// How many items wait, across jobs.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_job.values().map(VecDeque::len).sum()
    }

    /// Forgets every waiting item (their workers end at their next look); how many there were.
    pub(super) fn clear(&mut self) -> usize {
        self.by_job.values_mut().map(|waiting| waiting.drain(..).count()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_job_has_its_own_queue_and_keeps_its_order() {
        let mut queues = JobQueues::default();
        assert!(queues.push("stuck", 1), "a worker for stuck");
        assert!(!queues.push("stuck", 2), "behind stuck's first");
        assert!(queues.push("other", 10), "other waits for no one: a worker of its own");
        assert_eq!(queues.len(), 3);
        assert_eq!(queues.next("stuck"), Some(1));
        // stuck's worker is busy with 1 (etcd refusing its record): other's goes on.
        assert_eq!(queues.next("other"), Some(10));
        assert_eq!(queues.next("other"), None, "other's worker ends");
        assert!(queues.push("other", 11), "and the next of other starts another");
        assert!(!queues.push("stuck", 3));
        assert_eq!((queues.next("stuck"), queues.next("stuck")), (Some(2), Some(3)));
        assert_eq!(queues.next("stuck"), None);
        assert!(queues.push("stuck", 4));
        assert_eq!(queues.len(), 2);
    }
}
