//! The gauges of each concurrency group the node's config has: its limit, and how many of its
//! attempts run and wait fleet-wide as the node's mirror shows them. Every node exports the
//! same values: alert on their `max` across nodes.

use std::sync::{Arc, Once};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use tokio::sync::watch;

use crate::coord::groups::Groups;
use crate::rules::config::Loaded;

/// One group's values at a scrape.
struct Count<'a> {
    group: &'a str,
    limit: f64,
    running: f64,
    waiting: f64,
}

/// A gauge's name, its help, and its value for one group.
type Gauge = (&'static str, &'static str, fn(&Count) -> f64);

struct Collector {
    groups: Arc<Groups>,
    jobs: watch::Receiver<Arc<Loaded>>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("group gauges")
    }
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let configured = self.jobs.borrow().groups.clone();
        let views = self.groups.views();
        let counts: Vec<Count> = configured
            .values()
            .map(|group| {
                let view = views.get(&group.name);
                Count {
                    group: &group.name,
                    limit: f64::from(group.limit),
                    running: view.map_or(0, |view| view.slots.len()) as f64,
                    waiting: view.map_or(0, |view| view.waiting.len()) as f64,
                }
            })
            .collect();
        let gauges: [Gauge; 3] = [
            (
                "group_limit",
                "How many runs of the group's jobs may go at once, fleet-wide",
                |count| count.limit,
            ),
            (
                "group_running",
                "Runs of the group's jobs going now, fleet-wide (slots held)",
                |count| count.running,
            ),
            (
                "group_waiting",
                "Ticks of the group's jobs waiting for a slot, fleet-wide",
                |count| count.waiting,
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for count in &counts {
                ConstGauge::new(value(count)).encode(family.encode_family(&[("group", count.group)].as_slice())?)?;
            }
        }
        Ok(())
    }
}

/// Adds the group gauges to the node's metrics page, once per process.
pub(crate) fn export(groups: Arc<Groups>, jobs: watch::Receiver<Arc<Loaded>>) {
    static EXPORTED: Once = Once::new();
    EXPORTED.call_once(|| crate::metrics::get().register_collector(Box::new(Collector { groups, jobs })));
}
