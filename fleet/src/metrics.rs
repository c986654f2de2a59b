//! Publishers' states as Prometheus metrics, added to an admin API's
//! `/metrics` registry by the binary: one publisher's (`serve`), or every
//! sandbox's of a gateway, one series per subject.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::publish::{State, Watch};

/// Encodes the publishers' states when scraped.
#[derive(Clone)]
pub struct Collect(Arc<dyn Fn() -> Vec<Watch> + Send + Sync>);

impl Collect {
    /// One publisher.
    pub fn one(watch: Watch) -> Collect {
        Collect(Arc::new(move || vec![watch.clone()]))
    }

    /// The publishers `each` names when scraped (a gateway's sandboxes
    /// come and go).
    pub fn each(each: impl Fn() -> Vec<Watch> + Send + Sync + 'static) -> Collect {
        Collect(Arc::new(each))
    }
}

impl fmt::Debug for Collect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collect").finish_non_exhaustive()
    }
}

type Gauge = (&'static str, &'static str, fn(&State) -> u64);

const GAUGES: [Gauge; 4] = [
    ("veris_publish_published_seq", "Last ledger seq the NATS stream acknowledged.", |s| s.published_seq),
    ("veris_publish_lag_lines", "Ledger lines written but not yet in the NATS stream.", |s| s.lag),
    ("veris_publish_refused", "1 while the stream refuses this ledger's lines (a fork, a full stream, a line over its size limit): see /status publishing.refused.", |s| u64::from(s.refused.is_some())),
    ("veris_publish_fork", "1 once a fork was found on the subject (another writer, or a line that differs from the file): publishing stopped.", |s| u64::from(s.fork)),
];

impl Collector for Collect {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let states: Vec<State> = (self.0)().iter().map(Watch::state).collect();
        if states.is_empty() {
            return Ok(());
        }
        for (name, help, value) in GAUGES {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &states {
                let labels = [("subject", s.subject.as_str())];
                ConstGauge::new(i64::try_from(value(s)).unwrap_or(i64::MAX))
                    .encode(m.encode_family(&labels)?)?;
            }
        }
        let mut m = encoder.encode_descriptor(
            "veris_publish_messages",
            "Messages (batches of ledger lines) the NATS stream acknowledged.",
            None,
            MetricType::Counter,
        )?;
        for s in &states {
            let labels = [("subject", s.subject.as_str())];
            ConstCounter::new(s.messages).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
