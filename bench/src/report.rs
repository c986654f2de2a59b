//! The final tables: medians over rounds, per scenario and path, as aligned
//! text or as the Markdown tables of BENCHMARKS.md.
//!
//! Ratios are of requests per second (veris ÷ direct 0.25: veris serves a
//! quarter of the rate a client reaches going straight to the twin; veris ÷
//! mitmdump 15: fifteen times mitmdump's rate). A path that was skipped or
//! failed shows `—`.

use std::time::Duration;

use crate::load::Scenario;

/// The paths in column order.
pub const PATHS: [&str; 4] = ["direct", "veris", "hudsucker", "mitmdump"];
/// The paths that are proxies (CPU, RSS and idle memory are theirs).
pub const PROXIES: [&str; 3] = ["veris", "hudsucker", "mitmdump"];

/// One measured run.
#[derive(Clone, Debug)]
pub struct Sample {
    pub scenario: Scenario,
    pub path: &'static str,
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// The proxy's CPU time per answered request (None for direct).
    pub proxy_cpu_us: Option<f64>,
    /// The twin's CPU time per answered request.
    pub twin_cpu_us: Option<f64>,
}

/// What a proxy process held.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// VmHWM after the load rounds, before the idle connections (KiB).
    pub peak_kib: Option<u64>,
    /// RSS growth per idle TLS connection (KiB) and how many were held.
    pub idle_kib_per_conn: Option<f64>,
    pub idle_conns: usize,
}

pub struct Report<'a> {
    pub samples: &'a [Sample],
    pub scenarios: &'a [Scenario],
    /// (path, memory) for each proxy that ran.
    pub memory: &'a [(&'static str, Memory)],
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

impl Report<'_> {
    fn median_of(
        &self,
        scenario: Scenario,
        path: &str,
        f: impl Fn(&Sample) -> Option<f64>,
    ) -> Option<f64> {
        median(
            self.samples
                .iter()
                .filter(|s| s.scenario == scenario && s.path == path)
                .filter_map(f)
                .collect(),
        )
    }

    fn rate(&self, scenario: Scenario, path: &str) -> Option<f64> {
        self.median_of(scenario, path, |s| Some(s.per_second))
    }

    fn ratio(&self, scenario: Scenario, of: &str) -> Option<f64> {
        Some(self.rate(scenario, "veris")? / self.rate(scenario, of)?)
    }

    fn ms(&self, scenario: Scenario, path: &str, f: fn(&Sample) -> Duration) -> Option<f64> {
        self.median_of(scenario, path, |s| Some(f(s).as_secs_f64() * 1e3))
    }

    /// The tables as rows of cells; the first row of each is its header.
    fn tables(&self) -> Vec<(String, Vec<Vec<String>>)> {
        let dash = || "—".to_string();
        let cell = |v: Option<f64>, fmt: &dyn Fn(f64) -> String| v.map(fmt).unwrap_or_else(dash);
        let rate = |v: f64| format!("{v:.0}");
        let ratio = |v: f64| {
            if v >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        let us = |v: f64| format!("{v:.0}");
        let ms = |v: f64| format!("{v:.2}");

        let mut throughput = vec![vec!["scenario (req/s)".to_string()]];
        throughput[0].extend(PATHS.iter().map(|p| p.to_string()));
        throughput[0]
            .extend(["veris÷direct", "veris÷hudsucker", "veris÷mitmdump"].map(String::from));
        let mut latency = vec![vec!["scenario (p50 / p99 ms)".to_string()]];
        latency[0].extend(PATHS.iter().map(|p| p.to_string()));
        let mut cpu = vec![vec!["scenario (CPU µs per request)".to_string()]];
        cpu[0].extend(PROXIES.iter().map(|p| p.to_string()));
        cpu[0].extend(["twin (direct)", "twin (via veris)"].map(String::from));

        for &scenario in self.scenarios {
            let mut row = vec![scenario.title().to_string()];
            row.extend(PATHS.iter().map(|p| cell(self.rate(scenario, p), &rate)));
            row.extend(
                ["direct", "hudsucker", "mitmdump"].map(|p| cell(self.ratio(scenario, p), &ratio)),
            );
            throughput.push(row);

            let mut row = vec![scenario.title().to_string()];
            row.extend(PATHS.iter().map(|p| {
                match (
                    self.ms(scenario, p, |s| s.p50),
                    self.ms(scenario, p, |s| s.p99),
                ) {
                    (Some(a), Some(b)) => format!("{} / {}", ms(a), ms(b)),
                    _ => dash(),
                }
            }));
            latency.push(row);

            let mut row = vec![scenario.title().to_string()];
            row.extend(
                PROXIES
                    .iter()
                    .map(|p| cell(self.median_of(scenario, p, |s| s.proxy_cpu_us), &us)),
            );
            row.push(cell(
                self.median_of(scenario, "direct", |s| s.twin_cpu_us),
                &us,
            ));
            row.push(cell(
                self.median_of(scenario, "veris", |s| s.twin_cpu_us),
                &us,
            ));
            cpu.push(row);
        }

        let mut memory = vec![vec![
            "proxy".to_string(),
            "peak RSS after load (MB)".to_string(),
            "KB per idle TLS connection".to_string(),
        ]];
        for (path, m) in self.memory {
            memory.push(vec![
                path.to_string(),
                cell(m.peak_kib.map(|k| k as f64 / 1024.0), &|v| {
                    format!("{v:.1}")
                }),
                match m.idle_kib_per_conn {
                    Some(k) => format!("{k:.1} ({} conns)", m.idle_conns),
                    None => dash(),
                },
            ]);
        }

        vec![
            ("Throughput".into(), throughput),
            ("Latency".into(), latency),
            ("Proxy CPU".into(), cpu),
            ("Memory".into(), memory),
        ]
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        for (title, rows) in self.tables() {
            out.push_str(&format!("\n{title}\n"));
            let cols = rows[0].len();
            let widths: Vec<usize> = (0..cols)
                .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
                .collect();
            for row in &rows {
                let mut line = String::new();
                for (c, text) in row.iter().enumerate() {
                    let pad = widths[c] - text.chars().count();
                    if c == 0 {
                        line.push_str(text);
                        line.push_str(&" ".repeat(pad));
                    } else {
                        line.push_str("  ");
                        line.push_str(&" ".repeat(pad));
                        line.push_str(text);
                    }
                }
                out.push_str(line.trim_end());
                out.push('\n');
            }
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for (title, rows) in self.tables() {
            out.push_str(&format!("\n### {title}\n\n"));
            for (i, row) in rows.iter().enumerate() {
                out.push_str(&format!("| {} |\n", row.join(" | ")));
                if i == 0 {
                    let sep: Vec<&str> = row
                        .iter()
                        .enumerate()
                        .map(|(c, _)| if c == 0 { "---" } else { "---:" })
                        .collect();
                    out.push_str(&format!("|{}|\n", sep.join("|")));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(path: &'static str, per_second: f64) -> Sample {
        Sample {
            scenario: Scenario::KeepAlive,
            path,
            per_second,
            p50: Duration::from_micros(500),
            p99: Duration::from_millis(2),
            proxy_cpu_us: (path != "direct").then_some(40.0),
            twin_cpu_us: Some(10.0),
        }
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        let samples = [
            sample("direct", 40_000.0),
            sample("direct", 30_000.0),
            sample("direct", 50_000.0),
            sample("veris", 10_000.0),
        ];
        let report = Report {
            samples: &samples,
            scenarios: &[Scenario::KeepAlive],
            memory: &[("veris", Memory::default())],
        };
        assert_eq!(report.ratio(Scenario::KeepAlive, "direct"), Some(0.25));
        assert_eq!(report.ratio(Scenario::KeepAlive, "mitmdump"), None);
        let text = report.text();
        assert!(text.contains("40000"), "{text}");
        assert!(text.contains("0.25"), "{text}");
        let md = report.markdown();
        assert!(
            md.contains("| keep-alive HTTP/1.1, 16 conns | 40000 | 10000 | — | — | 0.25 | — | — |"),
            "{md}"
        );
    }
}
