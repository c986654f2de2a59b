//! `veris-bench gateway`: one `veris gateway` serving many sandboxes against
//! `veris serve` serving one, under the same load (the targets of issue G1).
//!
//! Processes: the upstream (`veris twin --tls`), `veris serve` in front of
//! it (as in `proxy`), and `veris gateway --twin` the same twin, with its
//! CA copied from the twin's state dir (so it trusts the twin's leaf, and
//! clients verify both proxies against the one CA). All on 127.0.0.1.
//!
//! - **Load**: `--sandboxes` (100) sandboxes added through the gateway's
//!   admin API (`POST /sandboxes`), `--conns` (4) keep-alive HTTP/1.1
//!   connections each, every one a SOCKS5 handshake with the sandbox's
//!   username and password ([`socks5_connect`]: RFC 1928 `CONNECT` by
//!   domain name, RFC 1929 login), then TLS to `api.stripe.com` verified
//!   against the gateway's CA; against as many keep-alive connections to
//!   serve over HTTP `CONNECT`. One request in flight per connection, the
//!   request of `proxy` (`GET /v1/customers`). Runs alternate between the
//!   two for `--rounds` rounds; each stops at `--requests` or `--seconds`.
//!   Figures: req/s, p50/p99, and each proxy process's CPU time per answered
//!   request (`procstat`, over the measured window).
//! - **Memory per idle sandbox**: a second, fresh gateway; its `VmRSS` and
//!   thread count with 0, 100 and `--idle` (1000) sandboxes registered and
//!   never used; per sandbox = the slope from 100 to `--idle`.
//! - **Add → first request**: on that gateway, `--adds` (50) times: `POST
//!   /sandboxes`, then a new SOCKS5 connection as the new sandbox, TLS, and
//!   one request, until its answer (the twin's list) is read.
//!
//! Targets (issue G1): throughput ≥ 0.9× serve's, proxy CPU per request
//! within 10% of serve's, ≤ 64 KB per idle sandbox, add → first request
//! ≤ 50 ms. Printed with the figures, never asserted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::load::{self, Endpoint, RunResult};
use crate::peers::{self, Child, Twin, Workdir};
use crate::procstat;

const USAGE: &str = "\
veris-bench gateway [--quick] [--rounds R] [--requests N] [--seconds S] [--sandboxes N]
                    [--conns N] [--sandbox-rps N] [--idle N] [--adds N] [--nats] [--rate R]
                    [--markdown]

  --quick         small counts, one round (a smoke run)
  --rounds R      rounds of serve and gateway runs, interleaved [3]
  --requests N    requests per run [40000]
  --seconds S     time limit of one run, whatever is answered by then counts [5]
  --sandboxes N   sandboxes under load [100]
  --conns N       keep-alive connections per sandbox (serve gets N × sandboxes) [4]
  --sandbox-rps N the loaded gateways' `--sandbox-rps` [the gateway's default, 1000;
                  0: no limit, for few sandboxes carrying the whole load]
  --idle N        idle sandboxes registered for the memory figure [1000; 0: skip]
  --adds N        add → first request measurements [50; 0: skip]
  --nats          a third path: a gateway publishing to NATS JetStream
                  (`--nats`, a nats-server started here): its added latency
                  and CPU against the same gateway without it, how far
                  publishing lags under the load, how long it takes to drain
  --rate R        then an open-loop pass per path at R requests a second in
                  all (latency counted from when each request was due): the
                  latency publishing adds below saturation [2000 with --nats,
                  else 0: skip]
  --markdown      print the summary as BENCHMARKS.md's table

Needs target/release/veris (cargo build --release) or $VERIS_BIN.";

struct Options {
    rounds: usize,
    requests: u64,
    seconds: u64,
    sandboxes: usize,
    conns: usize,
    idle: usize,
    adds: usize,
    nats: bool,
    /// `--sandbox-rps` for the gateways under load (None: their default).
    sandbox_rps: Option<u64>,
    /// Open-loop requests a second (`--rate`; None: the default).
    rate: Option<f64>,
    markdown: bool,
}

impl Options {
    /// The open-loop pass's rate; 0 skips it.
    fn open_rate(&self) -> f64 {
        self.rate
            .unwrap_or(if self.nats { DEFAULT_RATE } else { 0.0 })
    }
}

/// `--rate`'s default with `--nats`: about a tenth of what one gateway
/// answers at saturation on 2 cores — a busy CI fleet, not a flood.
const DEFAULT_RATE: f64 = 2000.0;

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        rounds: 3,
        requests: 40_000,
        seconds: 5,
        sandboxes: 100,
        conns: 4,
        idle: 1000,
        adds: 50,
        nats: false,
        sandbox_rps: None,
        rate: None,
        markdown: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<u64> {
            let text = it
                .next()
                .with_context(|| format!("{name} needs a value\n\n{USAGE}"))?;
            text.parse()
                .with_context(|| format!("{name} {text:?} is not a number\n\n{USAGE}"))
        };
        match arg.as_str() {
            "--quick" => {
                o.rounds = 1;
                o.requests = 5000;
                o.seconds = 2;
                o.idle = 200;
                o.adds = 10;
            }
            "--rounds" => o.rounds = value("--rounds")?.clamp(1, 50) as usize,
            "--requests" => o.requests = value("--requests")?.clamp(10, 10_000_000),
            "--seconds" => o.seconds = value("--seconds")?.clamp(1, 600),
            "--sandboxes" => o.sandboxes = value("--sandboxes")?.clamp(1, 1000) as usize,
            "--conns" => o.conns = value("--conns")?.clamp(1, 1000) as usize,
            "--idle" => o.idle = value("--idle")?.min(5000) as usize,
            "--adds" => o.adds = value("--adds")?.min(1000) as usize,
            "--nats" => o.nats = true,
            "--sandbox-rps" => o.sandbox_rps = Some(value("--sandbox-rps")?),
            "--rate" => o.rate = Some(value("--rate")?.min(1_000_000) as f64),
            "--markdown" => o.markdown = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(o)
}

/// Runs the gateway benchmark; false when it could not run (the error is printed).
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
                    signal = crate::proxy::interrupted() => Err(anyhow!("interrupted by {signal}")),
                }
            })
    });
    match result {
        Ok(()) => true,
        Err(e) => {
            eprintln!("veris-bench gateway: {e:#}");
            false
        }
    }
}

/// SOCKS5 (RFC 1928) with username/password (RFC 1929) to `host:port` by
/// name, on a fresh connection to the gateway: greeting, login, `CONNECT`,
/// each answer read before the next step (as curl does). Bounded by the
/// caller's dial timeout.
pub async fn socks5_connect(
    io: &mut TcpStream,
    username: &str,
    password: &str,
    host: &str,
    port: u16,
) -> Result<()> {
    let (user, pass, name) = (username.as_bytes(), password.as_bytes(), host.as_bytes());
    if user.is_empty() || user.len() > 255 || pass.len() > 255 || name.len() > 255 {
        bail!("a SOCKS5 username, password or host is 1 to 255 bytes");
    }
    // Version 5, one method: 0x02 username/password.
    io.write_all(&[5, 1, 2]).await?;
    let mut two = [0u8; 2];
    io.read_exact(&mut two).await.context("SOCKS5 greeting")?;
    if two != [5, 2] {
        bail!("the gateway chose SOCKS5 method {two:?}, not username/password");
    }
    let mut login = vec![1, user.len() as u8];
    login.extend_from_slice(user);
    login.push(pass.len() as u8);
    login.extend_from_slice(pass);
    io.write_all(&login).await?;
    io.read_exact(&mut two).await.context("SOCKS5 login")?;
    if two != [1, 0] {
        bail!("the gateway refused the sandbox's login ({two:?})");
    }
    // CONNECT, reserved, address type 0x03: a domain name.
    let mut connect = vec![5, 1, 0, 3, name.len() as u8];
    connect.extend_from_slice(name);
    connect.extend_from_slice(&port.to_be_bytes());
    io.write_all(&connect).await?;
    let mut head = [0u8; 4];
    io.read_exact(&mut head).await.context("SOCKS5 reply")?;
    if head[0] != 5 || head[1] != 0 {
        bail!(
            "the gateway answered CONNECT {host}:{port} with reply {}",
            head[1]
        );
    }
    // The bound address, then its port: read and ignored.
    let rest = match head[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut len = [0u8; 1];
            io.read_exact(&mut len).await?;
            usize::from(len[0]) + 2
        }
        other => bail!("the gateway's SOCKS5 reply has address type {other}"),
    };
    let mut bound = vec![0u8; rest];
    io.read_exact(&mut bound).await?;
    Ok(())
}

/// A running `veris gateway` and its admin API.
struct Gateway {
    child: Child,
    addr: SocketAddr,
    admin: String,
    token: String,
    state: PathBuf,
    /// The CA its leaves chain to.
    ca: PathBuf,
}

impl Gateway {
    /// `veris gateway --twin TWIN` on a state dir of its own under `dir`,
    /// whose CA is the twin's (copied from `twin_state`).
    fn start(
        bin: &Path,
        dir: &Path,
        name: &'static str,
        twin_state: &Path,
        twin: &Twin,
        per_sandbox: usize,
        extra: &[&str],
    ) -> Result<Gateway> {
        let state = dir.join(name);
        let ca = state.join("ca");
        std::fs::create_dir_all(&ca).with_context(|| format!("creating {}", ca.display()))?;
        for entry in std::fs::read_dir(twin_state.join("ca"))? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                std::fs::copy(entry.path(), ca.join(entry.file_name()))
                    .with_context(|| format!("copying {}", entry.path().display()))?;
            }
        }
        let ready = dir.join(format!("{name}-ready.json"));
        let mut cmd = Command::new(bin);
        cmd.arg("gateway")
            .arg("--state-dir")
            .arg(&state)
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(["--twin", &twin.url, "--mode", "strict"])
            // The default cap (256) unless one sandbox is to hold more.
            .arg("--sandbox-connections")
            .arg(per_sandbox.max(256).to_string())
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .env("VERIS_LOG", "warn");
        let mut child = Child::spawn(name, cmd, dir.join(format!("{name}.log")))?;
        child.drain_stdout();
        let json = child.ready_file(&ready)?;
        let field = |key: &str| {
            json[key]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{} has no {key:?}: {json}", ready.display()))
        };
        let addr = field("listen")?
            .parse()
            .with_context(|| format!("the `listen` of {}", ready.display()))?;
        let token = std::fs::read_to_string(state.join("admin.token"))
            .context("reading the gateway's admin.token")?
            .trim()
            .to_string();
        Ok(Gateway {
            child,
            addr,
            admin: field("admin")?,
            token,
            ca: PathBuf::from(field("ca")?),
            state,
        })
    }

    /// `POST /sandboxes` for `id` with the stripe service: its username and
    /// password.
    async fn add(&self, id: &str) -> Result<(String, String)> {
        let body = serde_json::json!({"id": id, "services": ["stripe"]}).to_string();
        let req = veris_admin_client::Request::new("POST", "/sandboxes", &self.admin)
            .bearer(&self.token)
            .body("application/json", body.as_bytes());
        let answer = veris_admin_client::within(&self.admin, Duration::from_secs(10), async {
            let tcp = veris_admin_client::connect(&self.admin).await?;
            veris_admin_client::exchange(tcp, &self.admin, &req, 64 << 10).await
        })
        .await?;
        let json: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        if answer.status != 201 {
            bail!("adding sandbox {id}: {} {json}", answer.status);
        }
        match (json["username"].as_str(), json["password"].as_str()) {
            (Some(u), Some(p)) => Ok((u.to_string(), p.to_string())),
            _ => bail!("adding sandbox {id}: no username or password in {json}"),
        }
    }

    /// Lines written to its sandboxes' ledgers and not yet in the NATS
    /// stream, summed over its publishers (`veris_publish_lag_lines` of
    /// its `/metrics`).
    async fn publish_lag(&self) -> Result<u64> {
        let req =
            veris_admin_client::Request::new("GET", "/metrics", &self.admin).bearer(&self.token);
        let answer = veris_admin_client::within(&self.admin, Duration::from_secs(10), async {
            let tcp = veris_admin_client::connect(&self.admin).await?;
            veris_admin_client::exchange(tcp, &self.admin, &req, 16 << 20).await
        })
        .await?;
        if answer.status != 200 {
            bail!("GET /metrics: {}", answer.status);
        }
        let text = String::from_utf8_lossy(&answer.body);
        Ok(text
            .lines()
            .filter(|l| l.starts_with("veris_publish_lag_lines{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum())
    }

    /// `request` lines over every sandbox's ledger.
    fn request_lines(&self) -> Result<u64> {
        let mut n = 0;
        for entry in std::fs::read_dir(self.state.join("sandboxes"))? {
            let ledger = entry?.path().join("ledger.jsonl");
            if ledger.is_file() {
                n += crate::proxy::count_request_lines(&ledger)?;
            }
        }
        Ok(n)
    }
}

/// One open-loop run: latency percentiles at a fixed rate.
struct Paced {
    path: &'static str,
    /// p50, p99, p99.9.
    ms: [f64; 3],
}

/// One measured run.
struct Sample {
    path: &'static str,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    proxy_cpu_us: Option<f64>,
}

/// What answered on a path, over the whole run.
#[derive(Default)]
struct Tally {
    answered: u64,
    not_ok: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn add(&mut self, r: &RunResult) {
        self.answered += r.answered;
        self.not_ok += r.not_ok;
        self.errors += r.errors;
        if self.first_error.is_none() {
            self.first_error = r.first_error.clone();
        }
    }
}

async fn run(o: Options) -> Result<()> {
    let bin = peers::veris_binary()?;
    let work = Workdir::new("gateway")?;
    let state = work.0.join("state");
    let twin = peers::start_twin(&bin, &state, &work.0)?;
    let serve = peers::start_veris(&bin, &state, &work.0, &twin)?;
    let rps = o.sandbox_rps.map(|n| n.to_string());
    let limits: Vec<&str> = match &rps {
        Some(n) => vec!["--sandbox-rps", n],
        None => Vec::new(),
    };
    let gateway = Gateway::start(&bin, &work.0, "gateway", &state, &twin, o.conns, &limits)?;
    let nats = match o.nats {
        true => {
            let (server, url) = peers::start_nats(&work.0)?;
            let extra = [limits.as_slice(), &["--nats", &url]].concat();
            let published = Gateway::start(
                &bin,
                &work.0,
                "gateway-nats",
                &state,
                &twin,
                o.conns,
                &extra,
            )?;
            Some((server, published))
        }
        false => None,
    };
    let total = o.sandboxes * o.conns;
    println!("veris-bench gateway: {}", crate::proxy::machine());
    println!(
        "binary {}; {} round(s); ≤{} requests or {} s per run; keep-alive HTTP/1.1: {} sandboxes × {} connections (SOCKS5) through the gateway, {total} connections (CONNECT) to serve",
        bin.display(),
        o.rounds,
        o.requests,
        o.seconds,
        o.sandboxes,
        o.conns,
    );
    println!(
        "twin {} (pid {}); serve pid {}; gateway pid {}",
        twin.url,
        twin.child.pid(),
        serve.child.pid(),
        gateway.child.pid()
    );

    let serve_endpoint = Endpoint::proxied(serve.addr, &serve.ca, false)?;
    let base = Endpoint::proxied(gateway.addr, &gateway.ca, false)?;
    let started = Instant::now();
    let mut sandboxes = Vec::with_capacity(o.sandboxes);
    for i in 0..o.sandboxes {
        let (user, password) = gateway.add(&format!("load-{i:04}")).await?;
        sandboxes.push(base.via_socks5(gateway.addr, &user, &password));
    }
    println!(
        "added {} sandboxes in {:.2} s",
        o.sandboxes,
        started.elapsed().as_secs_f64()
    );
    let mut published_sandboxes = Vec::new();
    if let Some((_, published)) = &nats {
        let base = Endpoint::proxied(published.addr, &published.ca, false)?;
        for i in 0..o.sandboxes {
            let (user, password) = published.add(&format!("load-{i:04}")).await?;
            published_sandboxes.push(base.via_socks5(published.addr, &user, &password));
        }
    }
    let (mut serve_tally, mut gateway_tally) = (Tally::default(), Tally::default());
    let mut nats_tally = Tally::default();
    serve_endpoint.warm_up().await.context("warming up serve")?;
    serve_tally.answered += 41;
    for (i, sandbox) in sandboxes.iter().enumerate() {
        sandbox
            .warm_up()
            .await
            .with_context(|| format!("warming up sandbox {i} of the gateway"))?;
        gateway_tally.answered += 41;
    }
    for (i, sandbox) in published_sandboxes.iter().enumerate() {
        sandbox
            .warm_up()
            .await
            .with_context(|| format!("warming up sandbox {i} of the publishing gateway"))?;
        nats_tally.answered += 41;
    }
    let serve_conns = vec![serve_endpoint.clone(); total];
    let gateway_conns: Vec<Endpoint> = sandboxes
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.clone(), o.conns))
        .collect();
    let published_conns: Vec<Endpoint> = published_sandboxes
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.clone(), o.conns))
        .collect();

    let limit = Duration::from_secs(o.seconds);
    let mut samples = Vec::new();
    let mut lags = Vec::new();
    for round in 1..=o.rounds {
        println!("\nround {round}/{}", o.rounds);
        // Who goes first rotates: none always runs on a warmer machine.
        let mut order = vec![
            ("serve", serve.child.pid()),
            ("gateway", gateway.child.pid()),
        ];
        if let Some((_, published)) = &nats {
            order.push((NATS_PATH, published.child.pid()));
        }
        let turn = (round - 1) % order.len();
        order.rotate_left(turn);
        for (path, pid) in order {
            let sample = match (path, &nats) {
                ("serve", _) => {
                    measure(
                        path,
                        &serve_conns,
                        pid,
                        &twin,
                        o.requests,
                        limit,
                        &mut serve_tally,
                    )
                    .await?
                }
                (NATS_PATH, Some((server, published))) => {
                    let (sample, lag) = measure_publishing(
                        published,
                        server.pid(),
                        &published_conns,
                        &twin,
                        o.requests,
                        limit,
                        &mut nats_tally,
                    )
                    .await?;
                    lags.push(lag);
                    sample
                }
                _ => {
                    measure(
                        path,
                        &gateway_conns,
                        pid,
                        &twin,
                        o.requests,
                        limit,
                        &mut gateway_tally,
                    )
                    .await?
                }
            };
            samples.push(sample);
        }
    }

    let paced = {
        let mut by_path: Vec<(&'static str, &[Endpoint], &mut Tally)> = vec![
            ("serve", &serve_conns, &mut serve_tally),
            ("gateway", &gateway_conns, &mut gateway_tally),
        ];
        if nats.is_some() {
            by_path.push((NATS_PATH, &published_conns, &mut nats_tally));
        }
        open_loop(&o, &mut by_path, limit).await?
    };

    println!("\nafter the load:");
    let mut pids = vec![
        ("serve", serve.child.pid()),
        ("gateway", gateway.child.pid()),
    ];
    if let Some((server, published)) = &nats {
        pids.push((NATS_PATH, published.child.pid()));
        pids.push(("nats-server", server.pid()));
    }
    for (name, pid) in pids {
        println!(
            "  {name:<8} peak RSS {:.1} MB, RSS {:.1} MB, {} threads",
            procstat::peak_rss_kib(pid).unwrap_or(0) as f64 / 1024.0,
            procstat::rss_kib(pid).unwrap_or(0) as f64 / 1024.0,
            procstat::threads(pid).unwrap_or(0)
        );
    }
    println!("\nsanity:");
    for (name, tally, lines) in [
        (
            "serve",
            &serve_tally,
            serve
                .ledger
                .as_deref()
                .map(crate::proxy::count_request_lines),
        ),
        ("gateway", &gateway_tally, Some(gateway.request_lines())),
    ]
    .into_iter()
    .chain(
        nats.as_ref()
            .map(|(_, published)| (NATS_PATH, &nats_tally, Some(published.request_lines()))),
    ) {
        let verdict = if tally.not_ok == 0 && tally.errors == 0 {
            "every answer 200".to_string()
        } else {
            format!(
                "{} answers not 200, {} errors (first: {})",
                tally.not_ok,
                tally.errors,
                tally.first_error.as_deref().unwrap_or("none")
            )
        };
        let ledger = match lines {
            Some(Ok(n)) => format!(
                "; ledger(s): {n} request lines{}",
                if n == tally.answered {
                    " (equal)"
                } else {
                    " (DIFFERENT)"
                }
            ),
            Some(Err(e)) => format!("; ledger: {e:#}"),
            None => String::new(),
        };
        println!(
            "  {name:<8} {} requests answered: {verdict}{ledger}",
            tally.answered
        );
    }
    // The load's processes go: the idle figures have the machine alone.
    drop(sandboxes);
    drop((serve_conns, gateway_conns));
    drop(gateway);
    drop(serve);
    drop((published_sandboxes, published_conns, nats));

    let idle = if o.idle > 0 || o.adds > 0 {
        let fresh = Gateway::start(&bin, &work.0, "gateway-idle", &state, &twin, 0, &[])?;
        let memory = if o.idle > 0 {
            Some(idle_memory(&fresh, o.idle).await?)
        } else {
            None
        };
        let adds = if o.adds > 0 {
            Some(add_to_first(&fresh, o.adds).await?)
        } else {
            None
        };
        (memory, adds)
    } else {
        (None, None)
    };

    println!("load average at the end: {}", crate::proxy::load_average());
    // A run with refusals (a sandbox over its rate limit answers 429 in
    // microseconds) or errors does not compare the proxies' work.
    let clean = [&serve_tally, &gateway_tally, &nats_tally]
        .iter()
        .all(|t| t.not_ok == 0 && t.errors == 0);
    let mut summary = summary(&o, clean, &samples, &lags, &idle.0, &idle.1);
    summary.extend(paced_rows(o.open_rate(), &paced));
    println!(
        "\nMedians of {} round(s); CPU is the proxy process's user+system time per answered request.",
        o.rounds
    );
    if o.markdown {
        print!("{}", markdown(&summary));
    } else {
        for (what, figure, target) in &summary {
            println!("  {what}: {figure} — {target}");
        }
    }
    drop(twin);
    Ok(())
}

/// The open-loop pass (`--rate`): `o.rounds` rounds over the paths, in
/// rotating order, each at the same fixed rate for `o.seconds`.
async fn open_loop(
    o: &Options,
    paths: &mut [(&'static str, &[Endpoint], &mut Tally)],
    limit: Duration,
) -> Result<Vec<Paced>> {
    let rate = o.open_rate();
    let mut out = Vec::new();
    if rate <= 0.0 || paths.is_empty() {
        return Ok(out);
    }
    println!("\nopen loop at {rate:.0} req/s in all (latency from when each request was due):");
    let requests = (rate * o.seconds as f64) as u64;
    for round in 0..o.rounds {
        let n = paths.len();
        for k in 0..n {
            let (path, conns, tally) = &mut paths[(round + k) % n];
            let r = load::keep_alive_at(conns, requests, limit, Some(rate), || {})
                .await
                .with_context(|| format!("open loop on {path}"))?;
            tally.add(&r);
            let at = |p: f64| r.percentile(p).unwrap_or_default().as_secs_f64() * 1e3;
            let ms = [at(50.0), at(99.0), at(99.9)];
            println!(
                "  {path:<8} {:>7} req in {:>5.2} s ({:.0} req/s): p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms{}",
                r.answered,
                r.elapsed.as_secs_f64(),
                r.per_second(),
                ms[0],
                ms[1],
                ms[2],
                match (r.not_ok, r.errors) {
                    (0, 0) => String::new(),
                    (n, e) => format!(" [{n} not 200, {e} errors]"),
                }
            );
            out.push(Paced { path, ms });
        }
    }
    Ok(out)
}

/// The open-loop rows: each path's median percentiles, and what
/// publishing adds against the spread of the plain gateway's own rounds
/// (the noise it must stay within).
fn paced_rows(rate: f64, paced: &[Paced]) -> Vec<(String, String, String)> {
    let of = |path: &str, i: usize| -> Vec<f64> {
        paced
            .iter()
            .filter(|p| p.path == path)
            .map(|p| p.ms[i])
            .collect()
    };
    let mut rows = Vec::new();
    let mut figures = Vec::new();
    for path in ["serve", "gateway", NATS_PATH] {
        let m: Vec<Option<f64>> = (0..3).map(|i| median(of(path, i))).collect();
        if m[0].is_some() {
            figures.push(format!(
                "{path} {} / {} / {} ms",
                fmt_ms(m[0]),
                fmt_ms(m[1]),
                fmt_ms(m[2])
            ));
        }
    }
    if figures.is_empty() {
        return rows;
    }
    rows.push((
        format!("open loop at {rate:.0} req/s: latency p50 / p99 / p99.9"),
        figures.join(", "),
        "no target".into(),
    ));
    let spread = |v: Vec<f64>| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        (hi - lo).max(0.0)
    };
    if let (Some(g50), Some(n50), Some(g99), Some(n99)) = (
        median(of("gateway", 0)),
        median(of(NATS_PATH, 0)),
        median(of("gateway", 1)),
        median(of(NATS_PATH, 1)),
    ) {
        let (noise50, noise99) = (spread(of("gateway", 0)), spread(of("gateway", 1)));
        let within = (n50 - g50) <= noise50.max(0.05) && (n99 - g99) <= noise99.max(0.1);
        let rounds = of("gateway", 0).len();
        rows.push((
            format!("added by --nats at {rate:.0} req/s"),
            format!(
                "p50 {:+.2} ms, p99 {:+.2} ms (the gateway's own rounds spread {noise50:.2} / {noise99:.2} ms)",
                n50 - g50,
                n99 - g99
            ),
            format!(
                "target none beyond noise: {}",
                match (rounds, within) {
                    (0 | 1, _) => "no verdict: one round has no spread",
                    (_, true) => "met",
                    (_, false) => "NOT met",
                }
            ),
        ));
    }
    rows
}

/// One keep-alive run over `conns`, with the CPU time of the proxy (`pid`),
/// the twin and this load generator over the measured window.
async fn measure(
    path: &'static str,
    conns: &[Endpoint],
    pid: u32,
    twin: &Twin,
    requests: u64,
    limit: Duration,
    tally: &mut Tally,
) -> Result<Sample> {
    let me = std::process::id();
    let twin_pid = twin.child.pid();
    let snapshot = || {
        [pid, twin_pid, me]
            .map(procstat::cpu_time)
            .map(|t| t.unwrap_or_default())
    };
    let mut before = [Duration::ZERO; 3];
    let mut counted = procstat::Activity::default();
    let result = load::keep_alive(conns, requests, limit, || {
        before = snapshot();
        counted = procstat::activity(pid);
    })
    .await
    .with_context(|| format!("keep-alive on {path}"))?;
    let after = snapshot();
    let counts = procstat::activity(pid).since(&counted);
    tally.add(&result);
    let per_request = |i: usize| {
        let spent = after[i].checked_sub(before[i])?;
        (result.answered > 0).then(|| spent.as_secs_f64() * 1e6 / result.answered as f64)
    };
    let sample = Sample {
        path,
        per_second: result.per_second(),
        p50: result.percentile(50.0).unwrap_or_default(),
        p99: result.percentile(99.0).unwrap_or_default(),
        proxy_cpu_us: per_request(0),
    };
    let us = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.0}"));
    println!(
        "  {path:<8} {:>7} req in {:>5.2} s: {:>7.0} req/s, p50 {:.2} ms, p99 {:.2} ms; CPU µs/req proxy {}, twin {}, client {}{}{}",
        result.answered,
        result.elapsed.as_secs_f64(),
        sample.per_second,
        sample.p50.as_secs_f64() * 1e3,
        sample.p99.as_secs_f64() * 1e3,
        us(sample.proxy_cpu_us),
        us(per_request(1)),
        us(per_request(2)),
        activity_per_request(&counts, result.answered),
        match (result.not_ok, result.errors) {
            (0, 0) => String::new(),
            (n, e) => format!(" [{n} not 200, {e} errors]"),
        }
    );
    Ok(sample)
}

/// The proxy's kernel share per request: system CPU µs, context switches
/// and read/write syscalls (counts, steadier than time on a busy machine).
fn activity_per_request(a: &procstat::Activity, answered: u64) -> String {
    if answered == 0 {
        return String::new();
    }
    let n = answered as f64;
    format!(
        "; proxy per req: sys {:.0} µs, {:.2} switches, {:.2} r/w syscalls",
        a.system.as_secs_f64() * 1e6 / n,
        a.switches as f64 / n,
        a.io_calls as f64 / n
    )
}

/// The path of the gateway that publishes to NATS (`--nats`).
const NATS_PATH: &str = "gw+nats";

/// Publishing under one run's load.
struct Lag {
    /// Lines not yet in the stream, summed over the sandboxes, sampled
    /// every [`LAG_EVERY`] while the load ran (sorted).
    samples: Vec<u64>,
    /// The run's answers a second, to turn lines into time.
    per_second: f64,
    /// From the load's end until every line was in the stream.
    drain: Option<Duration>,
    /// nats-server's CPU µs per answered request over the run.
    server_cpu_us: Option<f64>,
}

const LAG_EVERY: Duration = Duration::from_millis(100);

/// [`measure`] on the publishing gateway, sampling its publish lag while
/// the load runs, then timing the drain (bounded: 30 s).
async fn measure_publishing(
    gateway: &Gateway,
    server_pid: u32,
    conns: &[Endpoint],
    twin: &Twin,
    requests: u64,
    limit: Duration,
    tally: &mut Tally,
) -> Result<(Sample, Lag)> {
    let server_before = procstat::cpu_time(server_pid);
    let answered_before = tally.answered;
    let (sample, samples) = {
        let load = measure(
            NATS_PATH,
            conns,
            gateway.child.pid(),
            twin,
            requests,
            limit,
            tally,
        );
        tokio::pin!(load);
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(LAG_EVERY);
        loop {
            tokio::select! {
                sample = &mut load => break (sample?, samples),
                _ = tick.tick() => {
                    if let Ok(lag) = gateway.publish_lag().await {
                        samples.push(lag);
                    }
                }
            }
        }
    };
    let ended = Instant::now();
    let mut drain = None;
    while ended.elapsed() < Duration::from_secs(30) {
        if gateway.publish_lag().await? == 0 {
            drain = Some(ended.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answered = tally.answered - answered_before;
    let server_cpu_us = match (server_before, procstat::cpu_time(server_pid)) {
        (Some(a), Some(b)) if answered > 0 => {
            Some(b.saturating_sub(a).as_secs_f64() * 1e6 / answered as f64)
        }
        _ => None,
    };
    let mut samples = samples;
    samples.sort_unstable();
    println!(
        "  {NATS_PATH:<8} publish lag while loaded: median {} lines, max {} lines; drained {} after the load; nats-server CPU {} µs/req",
        samples.get(samples.len() / 2).copied().unwrap_or(0),
        samples.last().copied().unwrap_or(0),
        drain.map_or("NOT within 30 s".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3)),
        server_cpu_us.map_or("—".into(), |v| format!("{v:.0}")),
    );
    let lag = Lag {
        samples,
        per_second: sample.per_second,
        drain,
        server_cpu_us,
    };
    Ok((sample, lag))
}

/// RSS (KiB) and threads with 0, 100 and `n` idle sandboxes registered.
struct IdleMemory {
    points: Vec<(usize, u64, u64)>,
}

impl IdleMemory {
    /// KB per sandbox between two of the points.
    fn slope(&self, from: usize, to: usize) -> Option<f64> {
        let (a, b) = (self.points.get(from)?, self.points.get(to)?);
        (b.0 > a.0).then(|| (b.1 as f64 - a.1 as f64) / (b.0 - a.0) as f64)
    }
}

async fn idle_memory(gateway: &Gateway, n: usize) -> Result<IdleMemory> {
    let pid = gateway.child.pid();
    let mut points = Vec::new();
    let mut added = 0;
    println!("\nidle sandboxes (registered, never used), fresh gateway pid {pid}:");
    for target in [0, n.min(100), n] {
        if target < added || (target == added && !points.is_empty()) {
            continue;
        }
        let started = Instant::now();
        while added < target {
            gateway.add(&format!("idle-{added:05}")).await?;
            added += 1;
        }
        let took = started.elapsed();
        // Each new ledger's first interval seal comes within a second.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let rss = procstat::rss_kib(pid).context("reading the gateway's VmRSS")?;
        let threads = procstat::threads(pid).unwrap_or(0);
        println!(
            "  {target:>5} sandboxes: RSS {:.1} MB, {threads} threads, {} fds{}",
            rss as f64 / 1024.0,
            open_fds(pid),
            if target > 0 {
                format!(" (adds took {:.2} s)", took.as_secs_f64())
            } else {
                String::new()
            }
        );
        points.push((target, rss, threads));
    }
    Ok(IdleMemory { points })
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Add → first request served, and the add call alone, each sorted.
struct Adds {
    total: Vec<Duration>,
    add: Vec<Duration>,
}

async fn add_to_first(gateway: &Gateway, n: usize) -> Result<Adds> {
    let base = Endpoint::proxied(gateway.addr, &gateway.ca, false)?;
    let mut adds = Adds {
        total: Vec::with_capacity(n),
        add: Vec::with_capacity(n),
    };
    // One first, unmeasured: it mints the gateway's leaf for the vendor
    // host, which every later sandbox shares.
    for i in 0..=n {
        let started = Instant::now();
        let (user, password) = gateway.add(&format!("first-{i:04}")).await?;
        let add = started.elapsed();
        base.via_socks5(gateway.addr, &user, &password)
            .first_answer()
            .await
            .with_context(|| format!("the first request of sandbox first-{i:04}"))?;
        if i > 0 {
            adds.total.push(started.elapsed());
            adds.add.push(add);
        }
    }
    adds.total.sort_unstable();
    adds.add.sort_unstable();
    let ms = |v: &[Duration], p: f64| percentile(v, p).as_secs_f64() * 1e3;
    println!(
        "\nadd → first request served, {n} sandboxes (after one unmeasured): p50 {:.1} ms, p99 {:.1} ms; the add call alone p50 {:.1} ms, p99 {:.1} ms",
        ms(&adds.total, 50.0),
        ms(&adds.total, 99.0),
        ms(&adds.add, 50.0),
        ms(&adds.add, 99.0),
    );
    Ok(adds)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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

/// (what, figure, target and verdict) rows.
fn summary(
    o: &Options,
    clean: bool,
    samples: &[Sample],
    lags: &[Lag],
    memory: &Option<IdleMemory>,
    adds: &Option<Adds>,
) -> Vec<(String, String, String)> {
    let of = |path: &str, f: &dyn Fn(&Sample) -> Option<f64>| {
        median(
            samples
                .iter()
                .filter(|s| s.path == path)
                .filter_map(f)
                .collect(),
        )
    };
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    // The load's targets, only when every answer was a 200 (see sanity).
    let load_verdict = |met: bool| {
        if clean {
            verdict(met)
        } else {
            "no verdict: not every answer was 200 (see sanity)"
        }
    };
    let mut rows = Vec::new();
    let rate = |p: &str| of(p, &|s| Some(s.per_second));
    if let (Some(serve), Some(gateway)) = (rate("serve"), rate("gateway")) {
        let ratio = gateway / serve;
        rows.push((
            format!(
                "throughput, keep-alive ({} sandboxes × {} conns against {} conns)",
                o.sandboxes,
                o.conns,
                o.sandboxes * o.conns
            ),
            format!(
                "serve {serve:.0} req/s, gateway {gateway:.0} req/s: gateway ÷ serve {ratio:.2}"
            ),
            format!("target ≥ 0.9: {}", load_verdict(ratio >= 0.9)),
        ));
    }
    let ms = |p: &str, f: fn(&Sample) -> Duration| of(p, &|s| Some(f(s).as_secs_f64() * 1e3));
    if let (Some(a), Some(b), Some(c), Some(d)) = (
        ms("serve", |s| s.p50),
        ms("serve", |s| s.p99),
        ms("gateway", |s| s.p50),
        ms("gateway", |s| s.p99),
    ) {
        rows.push((
            "latency p50 / p99".into(),
            format!("serve {a:.2} / {b:.2} ms, gateway {c:.2} / {d:.2} ms"),
            "no target".into(),
        ));
    }
    let cpu = |p: &str| of(p, &|s| s.proxy_cpu_us);
    if let (Some(serve), Some(gateway)) = (cpu("serve"), cpu("gateway")) {
        let more = gateway / serve - 1.0;
        rows.push((
            "proxy CPU per request".into(),
            format!(
                "serve {serve:.0} µs, gateway {gateway:.0} µs: {:+.0}%",
                more * 100.0
            ),
            format!("target within 10%: {}", load_verdict(more <= 0.10)),
        ));
        // Each round's own ratio, in run order: how much the medians hide.
        let per_round: Vec<String> = samples
            .iter()
            .filter(|s| s.path == "serve")
            .zip(samples.iter().filter(|s| s.path == "gateway"))
            .filter_map(|(a, b)| Some(format!("{:.2}", b.proxy_cpu_us? / a.proxy_cpu_us?)))
            .collect();
        rows.push((
            "proxy CPU gateway ÷ serve, each round".into(),
            per_round.join(", "),
            "no target".into(),
        ));
    }
    if let (Some(plain), Some(published)) = (rate("gateway"), rate(NATS_PATH)) {
        let (p50, p99) = (ms(NATS_PATH, |s| s.p50), ms(NATS_PATH, |s| s.p99));
        let (g50, g99) = (ms("gateway", |s| s.p50), ms("gateway", |s| s.p99));
        rows.push((
            "with --nats: throughput, latency p50 / p99".into(),
            format!(
                "{published:.0} req/s ({:.2}× without), {} / {} ms (without: {} / {} ms)",
                published / plain,
                fmt_ms(p50),
                fmt_ms(p99),
                fmt_ms(g50),
                fmt_ms(g99)
            ),
            "no target (publishing is off the request path)".into(),
        ));
        if let (Some(a), Some(b)) = (cpu("gateway"), cpu(NATS_PATH)) {
            let server = median(lags.iter().filter_map(|l| l.server_cpu_us).collect());
            rows.push((
                "with --nats: gateway CPU per request".into(),
                format!(
                    "{b:.0} µs against {a:.0} µs without ({:+.0}%); nats-server {} µs",
                    (b / a - 1.0) * 100.0,
                    server.map_or("—".into(), |v| format!("{v:.0}"))
                ),
                "no target".into(),
            ));
        }
    }
    if !lags.is_empty() {
        let all: Vec<u64> = {
            let mut v: Vec<u64> = lags
                .iter()
                .flat_map(|l| l.samples.iter().copied())
                .collect();
            v.sort_unstable();
            v
        };
        let rate = median(lags.iter().map(|l| l.per_second).collect()).unwrap_or(0.0);
        let lines_ms = |n: u64| {
            if rate > 0.0 {
                n as f64 / rate * 1e3
            } else {
                0.0
            }
        };
        let (med, max) = (
            all.get(all.len() / 2).copied().unwrap_or(0),
            all.last().copied().unwrap_or(0),
        );
        let drains: Vec<String> = lags
            .iter()
            .map(|l| {
                l.drain.map_or("> 30 s".into(), |d| {
                    format!("{:.0} ms", d.as_secs_f64() * 1e3)
                })
            })
            .collect();
        rows.push((
            format!("publish lag under load ({} samples, every 100 ms)", all.len()),
            format!(
                "median {med} lines (≈ {:.0} ms of requests), max {max} lines (≈ {:.0} ms); drained after the load in {}",
                lines_ms(med),
                lines_ms(max),
                drains.join(", ")
            ),
            "no target".into(),
        ));
    }
    if let Some(m) = memory {
        let points: Vec<String> = m
            .points
            .iter()
            .map(|(n, rss, threads)| {
                format!("{n}: {:.1} MB, {threads} threads", *rss as f64 / 1024.0)
            })
            .collect();
        let last = m.points.len().saturating_sub(1);
        let slope = m.slope(1, last).or_else(|| m.slope(0, last));
        let first = m.slope(0, 1);
        rows.push((
            "memory per idle registered sandbox".into(),
            format!(
                "RSS with {}; {} KB per sandbox ({} → {}){}",
                points.join("; "),
                slope.map_or("—".into(), |k| format!("{k:.1}")),
                m.points
                    .get(if last > 1 { 1 } else { 0 })
                    .map_or(0, |p| p.0),
                m.points.get(last).map_or(0, |p| p.0),
                first.map_or(String::new(), |k| format!(
                    ", {k:.1} KB each for the first ones"
                ))
            ),
            match slope {
                Some(k) => format!("target ≤ 64 KB: {}", verdict(k <= 64.0)),
                None => "target ≤ 64 KB: not measured".into(),
            },
        ));
    }
    if let Some(a) = adds {
        let ms = |v: &[Duration], p: f64| percentile(v, p).as_secs_f64() * 1e3;
        let p99 = ms(&a.total, 99.0);
        rows.push((
            format!(
                "add-sandbox → first request served ({} adds)",
                a.total.len()
            ),
            format!(
                "p50 {:.1} ms, p99 {p99:.1} ms (the add call alone: p50 {:.1} ms, p99 {:.1} ms)",
                ms(&a.total, 50.0),
                ms(&a.add, 50.0),
                ms(&a.add, 99.0)
            ),
            format!("target ≤ 50 ms (p99): {}", verdict(p99 <= 50.0)),
        ));
    }
    rows
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}"))
}

fn markdown(rows: &[(String, String, String)]) -> String {
    let mut out = String::from("\n| figure | this run | target |\n|---|---|---|\n");
    for (what, figure, target) in rows {
        out.push_str(&format!("| {what} | {figure} | {target} |\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&args(&["--quick", "--sandboxes", "10", "--conns", "2"])).unwrap();
        assert_eq!((o.rounds, o.sandboxes, o.conns, o.idle), (1, 10, 2, 200));
        assert!(parse(&args(&["--conns"])).is_err());
        assert!(parse(&args(&["--idle", "x"])).is_err());
        assert!(parse(&args(&["--nope"])).is_err());
        // The open loop: off by default, on with --nats, or at --rate.
        assert_eq!(o.open_rate(), 0.0);
        assert_eq!(parse(&args(&["--nats"])).unwrap().open_rate(), DEFAULT_RATE);
        let o = parse(&args(&["--nats", "--rate", "300"])).unwrap();
        assert_eq!(o.open_rate(), 300.0);
    }

    /// The open-loop rows: medians per path, and the verdict only with a
    /// spread to judge against.
    #[test]
    fn open_loop_rows() {
        let p = |path, ms| Paced { path, ms };
        let one = [p("gateway", [1.0, 2.0, 3.0]), p(NATS_PATH, [1.5, 2.5, 3.5])];
        let rows = paced_rows(500.0, &one);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert!(
            rows[1].1.starts_with("p50 +0.50 ms, p99 +0.50 ms"),
            "{rows:?}"
        );
        assert!(rows[1].2.contains("no verdict"), "{rows:?}");
        let three = [
            p("gateway", [1.0, 2.0, 3.0]),
            p(NATS_PATH, [1.1, 2.1, 3.0]),
            p("gateway", [1.3, 2.4, 3.0]),
            p(NATS_PATH, [1.2, 2.2, 3.0]),
            p("gateway", [1.1, 2.2, 3.0]),
            p(NATS_PATH, [1.1, 2.3, 3.0]),
        ];
        let rows = paced_rows(500.0, &three);
        assert!(rows[1].2.ends_with(": met"), "{rows:?}");
        assert!(paced_rows(500.0, &[]).is_empty());
    }

    #[test]
    fn slope_and_percentiles() {
        let m = IdleMemory {
            points: vec![(0, 10_000, 5), (100, 14_000, 205), (1000, 50_000, 2005)],
        };
        assert_eq!(m.slope(1, 2), Some(40.0));
        assert_eq!(m.slope(0, 1), Some(40.0));
        assert_eq!(m.slope(2, 1), None);
        let v: Vec<Duration> = (1..=50).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(25));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(50));
        assert_eq!(percentile(&[], 99.0), Duration::ZERO);
    }

    /// The client's bytes, against a server that answers as RFC 1928/1929 say.
    #[tokio::test]
    async fn socks5_handshake_bytes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut greeting = [0u8; 3];
            s.read_exact(&mut greeting).await.unwrap();
            s.write_all(&[5, 2]).await.unwrap();
            let mut login = [0u8; 1 + 1 + 2 + 1 + 3];
            s.read_exact(&mut login).await.unwrap();
            s.write_all(&[1, 0]).await.unwrap();
            let mut connect = [0u8; 5 + 14 + 2];
            s.read_exact(&mut connect).await.unwrap();
            s.write_all(&[5, 0, 0, 1, 127, 0, 0, 1, 0, 80])
                .await
                .unwrap();
            (greeting, login, connect)
        });
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        socks5_connect(&mut tcp, "sb", "pw!", "api.stripe.com", 443)
            .await
            .unwrap();
        let (greeting, login, connect) = server.await.unwrap();
        assert_eq!(greeting, [5, 1, 2]);
        assert_eq!(&login, b"\x01\x02sb\x03pw!");
        assert_eq!(&connect[..5], &[5, 1, 0, 3, 14]);
        assert_eq!(&connect[5..19], b"api.stripe.com");
        assert_eq!(&connect[19..], &443u16.to_be_bytes());
    }
}
