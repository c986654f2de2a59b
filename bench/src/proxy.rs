//! `veris-bench proxy`: veris against going straight to the twin and against
//! peer proxies, under four load shapes, in interleaved rounds.
//!
//! It starts the upstream (`veris twin --tls`), `veris serve` in front of it,
//! and the peers that are available (the hudsucker crate in
//! `bench/peers/hudsucker`, built on demand; `mitmdump` from PATH), each in
//! its own process. Then, for each round, for each scenario, for each path,
//! it runs the in-process load generator (`load`) and reads the proxy's and
//! the twin's CPU time around the measured window (`procstat`). Rounds are
//! interleaved so that a noisy minute on the shared machine hits every path
//! alike; the tables show medians over rounds. After the rounds: each proxy's
//! peak RSS, then its RSS growth while holding idle TLS connections, then the
//! sanity checks (every answer 200; veris's ledger has a request line for
//! every request sent through it). Nothing is asserted.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::load::{Endpoint, Scenario};
use crate::peers::{self, Proxy, Twin, Workdir};
use crate::procstat;
use crate::report::{Memory, Report, Sample};

const USAGE: &str = "\
veris-bench proxy [--quick] [--rounds R] [--requests N] [--seconds S] [--only SCENARIO]...
                  [--no-peers] [--no-build] [--idle N] [--resume] [--markdown]

  --quick         small counts, one round, 200 idle connections (a smoke run)
  --rounds R      rounds of every scenario on every path, interleaved [3]
  --requests N    requests per run for keep-alive and HTTP/2; new-connection runs
                  N/5 and c=1 runs N/4 [20000]
  --seconds S     time limit of one run, whatever is answered by then counts [5]
  --only S        keep-alive, new-conn, h2 or c1 (repeatable, or comma-separated)
  --no-peers      direct and veris only
  --no-build      use the hudsucker peer only if already built
  --idle N        idle TLS connections held per proxy for the memory figure [1000; 0: skip]
  --resume        new connections resume TLS sessions (default: a full handshake each)
  --markdown      print the tables in BENCHMARKS.md's format

Needs target/release/veris (cargo build --release) or $VERIS_BIN.";

struct Options {
    rounds: usize,
    requests: u64,
    seconds: u64,
    scenarios: Vec<Scenario>,
    peers: bool,
    build: bool,
    idle: usize,
    resume: bool,
    markdown: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        rounds: 3,
        requests: 20_000,
        seconds: 5,
        scenarios: Vec::new(),
        peers: true,
        build: true,
        idle: 1000,
        resume: false,
        markdown: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value\n\n{USAGE}"))
        };
        match arg.as_str() {
            "--quick" => {
                o.rounds = 1;
                o.requests = 2000;
                o.seconds = 2;
                o.idle = 200;
            }
            "--rounds" => o.rounds = number(&value("--rounds")?)?.clamp(1, 50) as usize,
            "--requests" => o.requests = number(&value("--requests")?)?.clamp(10, 10_000_000),
            "--seconds" => o.seconds = number(&value("--seconds")?)?.clamp(1, 600),
            "--idle" => o.idle = number(&value("--idle")?)?.min(10_000) as usize,
            "--only" => {
                for key in value("--only")?.split(',') {
                    match Scenario::from_key(key.trim()) {
                        Some(s) if !o.scenarios.contains(&s) => o.scenarios.push(s),
                        Some(_) => {}
                        None => bail!("--only {key:?}: not a scenario\n\n{USAGE}"),
                    }
                }
            }
            "--peers" => o.peers = true,
            "--no-peers" => o.peers = false,
            "--no-build" => o.build = false,
            "--resume" => o.resume = true,
            "--markdown" => o.markdown = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            // `all` hands the ledger's positional LINES to both groups.
            other if other.parse::<u64>().is_ok() => {}
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    if o.scenarios.is_empty() {
        o.scenarios = Scenario::ALL.to_vec();
    } else {
        // Keep the table's order whatever the flags' order.
        o.scenarios = Scenario::ALL
            .into_iter()
            .filter(|s| o.scenarios.contains(s))
            .collect();
    }
    Ok(o)
}

fn number(text: &str) -> Result<u64> {
    text.parse()
        .with_context(|| format!("{text:?} is not a number\n\n{USAGE}"))
}

/// Runs the proxy benchmarks; false when they could not run (the error is printed).
pub fn main(args: &[String]) -> bool {
    let result = parse(args).and_then(|o| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")?
            .block_on(async {
                // On SIGINT/SIGTERM the run is dropped: its children are
                // killed and its temp dir removed on the way out.
                tokio::select! {
                    result = run(o) => result,
                    signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
                }
            })
    });
    match result {
        Ok(()) => true,
        Err(e) => {
            eprintln!("veris-bench proxy: {e:#}");
            false
        }
    }
}

pub(crate) async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        // Without handlers the default action stops the process anyway.
        _ => std::future::pending().await,
    }
}

/// One way to reach the twin, and the proxy process on it (None: direct).
struct PathUnderTest {
    name: &'static str,
    endpoint: Endpoint,
    proxy: Option<Proxy>,
    /// Requests answered on this path, warm-up and idle checks included.
    answered: u64,
    not_ok: u64,
    errors: u64,
    first_error: Option<String>,
}

impl PathUnderTest {
    fn new(name: &'static str, endpoint: Endpoint, proxy: Option<Proxy>) -> PathUnderTest {
        PathUnderTest {
            name,
            endpoint,
            proxy,
            answered: 0,
            not_ok: 0,
            errors: 0,
            first_error: None,
        }
    }
}

async fn run(o: Options) -> Result<()> {
    let bin = peers::veris_binary()?;
    let work = Workdir::new("proxy")?;
    let state = work.0.join("state");
    let twin = peers::start_twin(&bin, &state, &work.0)?;
    let veris = peers::start_veris(&bin, &state, &work.0, &twin)?;

    println!("veris-bench proxy: {}", machine());
    println!(
        "binary {} ({}); {} round(s) of {}; ≤{} requests (new-conn {}, c=1 {}) or {} s per run; {}",
        bin.display(),
        built(&bin),
        o.rounds,
        o.scenarios
            .iter()
            .map(|s| s.key())
            .collect::<Vec<_>>()
            .join(", "),
        o.requests,
        o.requests / 5,
        o.requests / 4,
        o.seconds,
        if o.resume {
            "new connections resume TLS sessions"
        } else {
            "a full TLS handshake per new connection"
        }
    );
    println!(
        "request: GET https://api.stripe.com/v1/customers (twin: GET {}/s/sbx_local/stripe/v1/customers, pid {}); veris pid {}",
        twin.url,
        twin.child.pid(),
        veris.child.pid()
    );

    let mut paths = vec![
        PathUnderTest::new(
            "direct",
            Endpoint::direct(twin.addr, &twin.ca, o.resume)?,
            None,
        ),
        PathUnderTest::new(
            "veris",
            Endpoint::proxied(veris.addr, &veris.ca, o.resume)?,
            Some(veris),
        ),
    ];
    let mut skipped = Vec::new();
    if o.peers {
        for started in [
            peers::start_hudsucker(&work.0, &twin, o.build).map(|p| ("hudsucker", p)),
            peers::start_mitmdump(&work.0, &twin).map(|p| ("mitmdump", p)),
        ] {
            match started.and_then(|(name, p)| {
                let endpoint = Endpoint::proxied(p.addr, &p.ca, o.resume)
                    .map_err(|e| format!("{name}: {e:#}"))?;
                println!("{name} pid {}", p.child.pid());
                Ok(PathUnderTest::new(name, endpoint, Some(p)))
            }) {
                Ok(path) => paths.push(path),
                Err(skip) => skipped.push(skip),
            }
        }
    } else {
        skipped.push("peers: --no-peers".to_string());
    }
    for skip in &skipped {
        println!("{skip}");
    }

    // Warm up: a path that cannot answer is dropped (veris and direct must).
    let mut ready = Vec::new();
    for mut path in paths {
        match path.endpoint.warm_up().await {
            Ok(()) => {
                path.answered += 41;
                ready.push(path);
            }
            Err(e) if matches!(path.name, "direct" | "veris") => {
                return Err(e.context(format!("warming up {}", path.name)));
            }
            Err(e) => {
                let skip = format!("{}: warm-up failed — skipped: {e:#}", path.name);
                println!("{skip}");
                skipped.push(skip);
            }
        }
    }
    let mut paths = ready;

    let limit = Duration::from_secs(o.seconds);
    let mut samples = Vec::new();
    for round in 1..=o.rounds {
        println!("\nround {round}/{}", o.rounds);
        for &scenario in &o.scenarios {
            let requests = match scenario {
                Scenario::KeepAlive | Scenario::Http2 => o.requests,
                Scenario::NewConnection => (o.requests / 5).max(10),
                Scenario::Latency => (o.requests / 4).max(10),
            };
            for path in paths.iter_mut() {
                let sample = measure(path, &twin, scenario, requests, limit).await?;
                samples.push(sample);
            }
        }
    }

    // Peak RSS of the load, before idle connections raise it.
    let mut memory: Vec<(&'static str, Memory)> = paths
        .iter()
        .filter_map(|p| {
            let proxy = p.proxy.as_ref()?;
            Some((
                p.name,
                Memory {
                    peak_kib: procstat::peak_rss_kib(proxy.child.pid()),
                    ..Memory::default()
                },
            ))
        })
        .collect();

    if o.idle > 0 {
        println!(
            "\nidle TLS connections (CONNECT + handshake, then nothing), {} per proxy:",
            o.idle
        );
        for path in paths.iter_mut() {
            let Some(proxy) = &path.proxy else { continue };
            let Some((_, mem)) = memory.iter_mut().find(|(n, _)| *n == path.name) else {
                continue;
            };
            match idle(&path.endpoint, proxy.child.pid(), o.idle).await {
                Ok((before, after)) => {
                    let per = (after as f64 - before as f64) / o.idle as f64;
                    println!(
                        "  {:<10} RSS {:.1} MB → {:.1} MB: {per:.1} KB per connection",
                        path.name,
                        before as f64 / 1024.0,
                        after as f64 / 1024.0
                    );
                    mem.idle_kib_per_conn = Some(per);
                    mem.idle_conns = o.idle;
                }
                Err(e) => println!("  {:<10} failed: {e:#}", path.name),
            }
        }
    }

    sanity(&paths);
    println!("load average at the end: {}", load_average());

    let report = Report {
        samples: &samples,
        scenarios: &o.scenarios,
        memory: &memory,
    };
    println!(
        "\nMedians of {} round(s); ratios are of req/s; CPU is the proxy process's user+system time per answered request.",
        o.rounds
    );
    if o.markdown {
        print!("{}", report.markdown());
    } else {
        print!("{}", report.text());
    }
    for skip in &skipped {
        println!("{skip}");
    }
    // Children are killed (and the work dir removed) as they drop here.
    drop(paths);
    drop(twin);
    Ok(())
}

/// One run of `scenario` on `path`, with the CPU time of the proxy and the
/// twin over the measured window.
async fn measure(
    path: &mut PathUnderTest,
    twin: &Twin,
    scenario: Scenario,
    requests: u64,
    limit: Duration,
) -> Result<Sample> {
    let proxy_pid = path.proxy.as_ref().map(|p| p.child.pid());
    let twin_pid = twin.child.pid();
    let me = std::process::id();
    let snapshot = || {
        (
            proxy_pid.and_then(procstat::cpu_time),
            procstat::cpu_time(twin_pid),
            procstat::cpu_time(me),
        )
    };
    let mut before = (None, None, None);
    let result = path
        .endpoint
        .run(scenario, requests, limit, || before = snapshot())
        .await
        .with_context(|| format!("{} on {}", scenario.key(), path.name))?;
    let after = snapshot();
    let per_request = |b: Option<Duration>, a: Option<Duration>| {
        let spent = a?.checked_sub(b?)?;
        (result.answered > 0).then(|| spent.as_secs_f64() * 1e6 / result.answered as f64)
    };
    let sample = Sample {
        scenario,
        path: path.name,
        per_second: result.per_second(),
        p50: result.percentile(50.0).unwrap_or_default(),
        p99: result.percentile(99.0).unwrap_or_default(),
        proxy_cpu_us: per_request(before.0, after.0),
        twin_cpu_us: per_request(before.1, after.1),
    };
    path.answered += result.answered;
    path.not_ok += result.not_ok;
    path.errors += result.errors;
    if path.first_error.is_none() {
        path.first_error = result.first_error.clone();
    }
    // CPU per request of each process: the proxy's, the twin's and this
    // load generator's (which shares the machine's two cores with them).
    let mut cpu = String::new();
    for (who, us) in [
        ("proxy", sample.proxy_cpu_us),
        ("twin", sample.twin_cpu_us),
        ("client", per_request(before.2, after.2)),
    ] {
        if let Some(us) = us {
            cpu.push_str(&format!(", {who} {us:.0}"));
        }
    }
    if !cpu.is_empty() {
        cpu = format!("; CPU µs/req{}", &cpu[1..]);
    }
    println!(
        "  {:<10} {:<9} {:>7} req in {:>5.2} s: {:>7.0} req/s, p50 {:.2} ms, p99 {:.2} ms{cpu}{}",
        scenario.key(),
        path.name,
        result.answered,
        result.elapsed.as_secs_f64(),
        sample.per_second,
        sample.p50.as_secs_f64() * 1e3,
        sample.p99.as_secs_f64() * 1e3,
        match (result.not_ok, result.errors) {
            (0, 0) => String::new(),
            (n, e) => format!(" [{n} not 200, {e} errors]"),
        }
    );
    Ok(sample)
}

/// The proxy's RSS (KiB) before and while `n` idle TLS connections are held.
async fn idle(endpoint: &Endpoint, pid: u32, n: usize) -> Result<(u64, u64)> {
    let rss = || procstat::rss_kib(pid).context("reading the proxy's VmRSS");
    // Let buffers freed by the last run go back first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss()?;
    let held = endpoint.hold_idle(n).await?;
    // The last handshakes' tasks settle; well inside --client-timeout (30 s).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = rss()?;
    drop(held);
    Ok((before, after))
}

/// Every answer 200; veris's ledger holds a request line per request sent.
fn sanity(paths: &[PathUnderTest]) {
    println!("\nsanity:");
    for p in paths {
        let verdict = if p.not_ok == 0 && p.errors == 0 {
            "every answer 200".to_string()
        } else {
            format!(
                "{} answers not 200, {} errors (first: {})",
                p.not_ok,
                p.errors,
                p.first_error.as_deref().unwrap_or("none")
            )
        };
        println!(
            "  {:<10} {} requests answered: {verdict}",
            p.name, p.answered
        );
        if let Some(ledger) = p.proxy.as_ref().and_then(|x| x.ledger.as_deref()) {
            match count_request_lines(ledger) {
                Ok(n) => println!(
                    "  {:<10} ledger {}: {n} request lines for {} requests answered{}",
                    "",
                    ledger.display(),
                    p.answered,
                    if n == p.answered {
                        " (equal)"
                    } else {
                        " (DIFFERENT)"
                    }
                ),
                Err(e) => println!("  {:<10} ledger: {e:#}", ""),
            }
        }
    }
}

pub(crate) fn count_request_lines(ledger: &Path) -> Result<u64> {
    use std::io::BufRead;
    let file =
        std::fs::File::open(ledger).with_context(|| format!("opening {}", ledger.display()))?;
    let mut n = 0;
    for line in std::io::BufReader::new(file).lines() {
        if line?.contains("\"kind\":\"request\"") {
            n += 1;
        }
    }
    Ok(n)
}

/// Cores, CPU model and kernel, for the header of the output.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("unknown CPU");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores, {model}, Linux {}; load average {}",
        kernel.trim(),
        load_average()
    )
}

/// When `bin` was built (its mtime, UTC), so a table can be matched to a commit.
fn built(bin: &Path) -> String {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute] UTC");
    std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| time::OffsetDateTime::from(t).format(&format).ok())
        .map(|t| format!("built {t}"))
        .unwrap_or_else(|| "build time unknown".into())
}

/// The 1, 5 and 15 minute load averages: how busy the shared machine was.
pub(crate) fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&args(&["--quick", "--only", "c1,keep-alive", "--resume"])).unwrap();
        assert_eq!(o.rounds, 1);
        assert_eq!(o.scenarios, vec![Scenario::KeepAlive, Scenario::Latency]);
        assert!(o.resume && o.peers);
        assert!(parse(&args(&["--only", "nope"])).is_err());
        assert!(parse(&args(&["--rounds"])).is_err());
        // `all 200000` hands the ledger's LINES to this group too.
        assert!(parse(&args(&["200000"])).is_ok());
    }
}
