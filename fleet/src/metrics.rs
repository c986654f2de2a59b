//! A publisher's state as Prometheus metrics, added to the admin API's
//! `/metrics` registry by the binary.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::publish::Watch;

/// Encodes one publisher's state when scraped.
#[derive(Clone)]
pub struct Collect(pub Watch);

impl fmt::Debug for Collect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collect").finish_non_exhaustive()
    }
}

impl Collector for Collect {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = self.0.state();
        let labels = [("subject", s.subject.as_str())];
        let gauges: [(&str, &str, u64); 4] = [
            ("veris_publish_published_seq", "Last ledger seq the NATS stream acknowledged.", s.published_seq),
            ("veris_publish_lag_lines", "Ledger lines written but not yet in the NATS stream.", s.lag),
            ("veris_publish_refused", "1 while the stream refuses this ledger's lines (a fork, a full stream, a line over its size limit): see /status publishing.refused.", u64::from(s.refused.is_some())),
            ("veris_publish_fork", "1 once a fork was found on the subject (another writer, or a line that differs from the file): publishing stopped.", u64::from(s.fork)),
        ];
        for (name, help, v) in gauges {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
                .encode(m.encode_family(&labels)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "veris_publish_messages",
            "Messages (batches of ledger lines) the NATS stream acknowledged.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.messages).encode(m.encode_family(&labels)?)?;
        Ok(())
    }
}
