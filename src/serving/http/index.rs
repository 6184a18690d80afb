//! The node's jobs sorted by name, built once per config load: a handler finds a job in
//! O(log n) and lists them in order without sorting 100,000 jobs per request.
//!
//! Before, every `GET /api/v1/jobs/{name}` (and a backfill's lookup) collected and sorted every
//! job on a runtime thread before any permit: at 100,000 jobs about 1.7 M string compares per
//! request, enough for pipelined requests to starve the threads that fire ticks.

use std::sync::{Arc, Weak};

use crate::rules::config::{Job, Loaded};

/// The jobs of one config load, by name.
pub(super) struct ByName {
    sorted: Vec<Arc<Job>>,
}

impl ByName {
    pub(super) fn new(loaded: &Loaded) -> ByName {
        let mut sorted: Vec<Arc<Job>> = loaded.jobs().cloned().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        ByName { sorted }
    }

    /// The job named `name`, in O(log n).
    pub(super) fn get(&self, name: &str) -> Option<&Arc<Job>> {
        self.sorted
            .binary_search_by(|job| job.name.as_str().cmp(name))
            .ok()
            .map(|index| &self.sorted[index])
    }

    /// Every job, by name.
    pub(super) fn all(&self) -> &[Arc<Job>] {
        &self.sorted
    }
}

/// The [`ByName`] of the latest config load seen, rebuilt when a reload replaces it.
#[derive(Default)]
pub(super) struct JobIndex {
    /// The load it was built from (not kept alive by it), and the index.
    built: tokio::sync::Mutex<Option<(Weak<Loaded>, Arc<ByName>)>>,
}

impl JobIndex {
    /// The index of `loaded`: the one built before if it is of this load, else a new one,
    /// sorted off the runtime threads (once per load: callers meanwhile wait for it).
    pub(super) async fn of(&self, loaded: Arc<Loaded>) -> Arc<ByName> {
        let mut built = self.built.lock().await;
        if let Some((from, index)) = built.as_ref() {
            if std::ptr::eq(from.as_ptr(), Arc::as_ptr(&loaded)) && from.strong_count() > 0 {
                return Arc::clone(index);
            }
        }
        let from = Arc::downgrade(&loaded);
        let source = Arc::clone(&loaded);
        let index = match tokio::task::spawn_blocking(move || ByName::new(&source)).await {
            Ok(index) => Arc::new(index),
            // Only when the runtime is shutting down: built here instead.
            Err(_) => Arc::new(ByName::new(&loaded)),
        };
        *built = Some((from, Arc::clone(&index)));
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_name(names: &[&str]) -> ByName {
        let mut sorted: Vec<Arc<Job>> = names
            .iter()
            .map(|name| Arc::new(Job::for_tests(name, "* * * * * *")))
            .collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        ByName { sorted }
    }

    #[test]
    fn a_job_is_found_by_name_and_an_unknown_one_is_not() {
        let index = by_name(&["b", "a", "c-1", "c"]);
        let names: Vec<&str> = index.all().iter().map(|job| job.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "c-1"]);
        for name in ["a", "b", "c", "c-1"] {
            assert_eq!(index.get(name).map(|job| job.name.as_str()), Some(name));
        }
        for name in ["", "c-", "d", "*"] {
            assert!(index.get(name).is_none(), "{name}");
        }
    }

    /// The cost it removes, printed: sorting 100,000 jobs per request against a lookup.
    #[test]
    fn a_lookup_among_100000_jobs_costs_no_sort() {
        let names: Vec<String> = (0..100_000)
            .map(|index| format!("job-{:06}", (index * 7919) % 100_000))
            .collect();
        let jobs: Vec<Arc<Job>> = names
            .iter()
            .map(|name| Arc::new(Job::for_tests(name, "0 3 * * *")))
            .collect();
        let started = std::time::Instant::now();
        let mut per_request: Vec<Arc<Job>> = jobs.to_vec();
        per_request.sort_by(|a, b| a.name.cmp(&b.name));
        let sorted = started.elapsed();
        let index = ByName { sorted: per_request };
        let started = std::time::Instant::now();
        for name in names.iter().take(1000) {
            assert!(index.get(name).is_some());
        }
        let looked_up = started.elapsed() / 1000;
        eprintln!("100,000 jobs: clone and sort {sorted:?} (per request before), a lookup {looked_up:?}");
        assert!(index.get("job-100000").is_none());
    }
}
