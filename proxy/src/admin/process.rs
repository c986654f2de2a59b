//! The metrics every Prometheus client library exports about its process
//! (`process_*`, as the Go and Python clients name them) and
//! `veris_build_info`, read from `/proc/self` when a scrape asks: nothing
//! is counted between scrapes. A figure that cannot be read is left out of
//! that scrape, never reported as 0.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// The process's own figures and the build's version.
#[derive(Debug, Default)]
pub struct Process;

/// What `/proc/self/stat` says, in the units Prometheus wants.
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    start_time_seconds: f64,
    virtual_bytes: f64,
    resident_bytes: f64,
    threads: f64,
}

/// Parses `/proc/self/stat` (proc(5)): fields after the command name,
/// which sits in parentheses and may itself hold spaces or parentheses.
fn parse_stat(text: &str, ticks: f64, page: f64, boot_time: f64) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field N is f[N - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<f64>().ok();
    Some(Stat {
        cpu_seconds: (num(14)? + num(15)?) / ticks,
        start_time_seconds: boot_time + num(22)? / ticks,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)? * page,
        threads: num(20)?,
    })
}

/// `btime` of `/proc/stat`: when the machine booted, in Unix seconds.
fn boot_time() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let page = rustix::param::page_size() as f64;
    parse_stat(&text, ticks, page, boot_time()?)
}

fn open_fds() -> Option<f64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as f64)
}

fn max_fds() -> Option<f64> {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    limit.current.map(|n| n as f64)
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let info = [("version", env!("CARGO_PKG_VERSION"))];
        let mut metric = encoder.encode_descriptor(
            "veris_build_info",
            "The veris build serving these metrics (always 1).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(metric.encode_family(&info)?)?;

        if let Some(s) = stat() {
            ConstCounter::new(s.cpu_seconds).encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?)?;
            let gauges = [
                (
                    "process_start_time",
                    "Start time of the process since unix epoch in seconds.",
                    Some(Unit::Seconds),
                    s.start_time_seconds,
                ),
                (
                    "process_virtual_memory",
                    "Virtual memory size in bytes.",
                    Some(Unit::Bytes),
                    s.virtual_bytes,
                ),
                (
                    "process_resident_memory",
                    "Resident memory size in bytes.",
                    Some(Unit::Bytes),
                    s.resident_bytes,
                ),
                (
                    "process_threads",
                    "Number of OS threads in the process.",
                    None,
                    s.threads,
                ),
            ];
            for (name, help, unit, value) in gauges {
                ConstGauge::new(value).encode(encoder.encode_descriptor(
                    name,
                    help,
                    unit.as_ref(),
                    MetricType::Gauge,
                )?)?;
            }
        }
        for (name, help, value) in [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                open_fds(),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max_fds(),
            ),
        ] {
            if let Some(v) = value {
                ConstGauge::new(v).encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    MetricType::Gauge,
                )?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        // Fields 3.. of a real line, after a name that would break a split.
        let line = "4242 (we (ird) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 7 0 1000 104857600 2560 18446744073709551615";
        let s = parse_stat(line, 100.0, 4096.0, 1_700_000_000.0).unwrap();
        assert_eq!(
            s,
            Stat {
                cpu_seconds: 3.0,
                start_time_seconds: 1_700_000_010.0,
                virtual_bytes: 104_857_600.0,
                resident_bytes: 2560.0 * 4096.0,
                threads: 7.0,
            }
        );
        assert!(parse_stat("no parenthesis", 100.0, 4096.0, 0.0).is_none());
        assert!(parse_stat("1 (x) S 1", 100.0, 4096.0, 0.0).is_none());
    }

    #[test]
    fn this_process_reads_its_own_figures() {
        let s = stat().expect("/proc/self/stat");
        assert!(s.resident_bytes > 0.0 && s.threads >= 1.0, "{s:?}");
        assert!(open_fds().unwrap() >= 3.0);
    }
}
