//! `veris gateway`: one veris outside many sandboxes (DESIGN §13), and the
//! subcommands that register, remove and list its sandboxes through its
//! admin API (found through `<state>/admin.addr` and `admin.token`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use veris_admin_client::{connect, exchange, within, HttpUrl, Limits, Request};

use crate::runtime::gateway::{GatewayConfig, Registered, SandboxLimits};
use crate::runtime::live::discovery::{ADDR_FILE, TOKEN_FILE};
use crate::runtime::stack::ModeArg;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct GatewayCmd {
    #[command(subcommand)]
    pub action: Option<Action>,
    #[command(flatten)]
    pub serve: GatewayArgs,
}

#[derive(Subcommand, Debug)]
pub enum Action {
    /// Register a sandbox with the live gateway; prints its proxy URL
    /// (`socks5h://USER:PASS@HOST:PORT`) as the last line.
    AddSandbox(AddArgs),
    /// Remove a sandbox: its ledger gets its final seal, its credential is refused.
    RemoveSandbox(IdArgs),
    /// List the live gateway's sandboxes.
    ListSandboxes(StateArgs),
    /// Print the path of the gateway's CA certificate, the one file a
    /// sandbox needs; or the certificate, or the env and Java trust files
    /// that make a sandbox's clients trust it.
    Ca(CaArgs),
}

#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// State dir [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The SOCKS5 and HTTP proxy listener sandboxes' platforms connect to.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:1080")]
    pub listen: String,
    /// The admin API (add and remove sandboxes, read receipts).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub admin: String,
    /// Also serve GET /metrics on a listener of its own, a fixed address for
    /// a scraper: ADDR, or 127.0.0.1:9479 when given without one. It serves
    /// /metrics and /healthz only, with the admin token unless --metrics-open.
    #[arg(long, value_name = "ADDR", num_args = 0..=1,
          default_missing_value = veris_proxy::admin::metrics::DEFAULT_LISTEN)]
    pub metrics_listen: Option<String>,
    /// Serve GET /metrics without the admin token (on the admin API and
    /// --metrics-listen), for a scraper that cannot be given it.
    #[arg(long)]
    pub metrics_open: bool,
    /// Write JSON with `listen`, `admin` and `ca` here once serving.
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// Twin base URL [default: the built-in twin, serving every sandbox].
    #[arg(long, value_name = "URL")]
    pub twin: Option<String>,
    /// What unmapped hosts get, unless a sandbox says otherwise.
    #[arg(long, value_enum, default_value = "passthrough")]
    pub mode: ModeArg,
    /// Let sandboxes' passthrough dials reach this address block although
    /// the dial policy refuses it (loopback, private, link-local, CGNAT,
    /// the gateway's own). Repeat for more.
    #[arg(long, value_name = "CIDR")]
    pub allow_dial: Vec<String>,
    /// Connections open at once over all sandboxes, both listeners together.
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub max_connections: usize,
    /// Connections one sandbox may have open at once.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub sandbox_connections: usize,
    /// Requests (and tunnel opens) one sandbox may make a second, a
    /// second's worth at once; more are answered 429 (0: no limit). The
    /// default is a tenth of what the gateway serves on one core: one busy
    /// sandbox cannot starve the others, a test suite is never near it.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub sandbox_rps: u32,
    /// Bytes one sandbox may move a second, both directions of all its
    /// connections together; more wait, nothing is dropped. Default 0 (no
    /// limit): the right figure is a share of the gateway's link, which
    /// veris cannot know.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub sandbox_bytes_per_sec: u64,
    /// The interception CA, from a dir holding `veris-ca.pem` and
    /// `veris-ca-key.pem` (0600): every gateway of a fleet names the same CA
    /// (a mounted secret), so a sandbox trusts one file whichever gateway it
    /// reaches. Read only, never created or replaced: a gateway refuses to
    /// start when it is missing or unusable [default: STATE/ca, created on
    /// the first start].
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Every sandbox's ledger to NATS JetStream, as `serve --nats`.
    #[command(flatten)]
    pub nats: crate::runtime::fleet::NatsArgs,
    /// With --nats: the JetStream key-value bucket that holds the fleet's
    /// sandboxes (created when missing). Every gateway that names the same
    /// bucket serves every sandbox in it; one added or removed through any
    /// of them is added or removed on all.
    #[arg(long, value_name = "NAME", default_value = veris_fleet::registry::DEFAULT_BUCKET, requires = "nats")]
    pub nats_registry: String,
    /// With --nats: the directory `veris fleet-key certify --out` wrote
    /// (identity.key, identity.cert). At each start the gateway certifies
    /// its new seal key with it in the bucket VERIS_KEYS, so readers who
    /// pin the operator key (veris receipt --fleet-key) verify its chains.
    /// The certificate must name this gateway (--nats-name).
    #[arg(long, value_name = "DIR", requires = "nats")]
    pub fleet_identity: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct TlsArgs {
    /// Also serve SOCKS5 and HTTP CONNECT inside TLS, on this address and
    /// only TLS there: for platforms that reach the gateway over the
    /// internet (plaintext clients are closed before their credential is read).
    #[arg(long, value_name = "ADDR")]
    pub tls_listen: Option<String>,
    /// The TLS listener's certificate chain, PEM, leaf first (e.g. a public
    /// one for the gateway's DNS name) [default: a leaf of the gateway's CA].
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_listen"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A name (DNS name or IP) the TLS listener's minted leaf carries; repeat
    /// for more [default: the --tls-listen address, or every interface
    /// address for 0.0.0.0 or ::, and localhost].
    #[arg(
        long,
        value_name = "NAME",
        requires = "tls_listen",
        conflicts_with = "tls_cert"
    )]
    pub tls_name: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StateArgs {
    /// The gateway's state dir.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CaArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Print the CA certificate itself (PEM), to copy into a sandbox.
    #[arg(long, conflicts_with_all = ["env", "java"])]
    pub pem: bool,
    /// Print the env file that makes clients trust the gateway's CA, as
    /// `veris ca env --trust-only` does (SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
    /// NODE_EXTRA_CA_CERTS, JAVA_TOOL_OPTIONS, …), naming the files in
    /// <state>/trust. No proxy variables: the platform sends the
    /// sandbox's traffic to the gateway.
    #[arg(long, conflicts_with = "java")]
    pub env: bool,
    /// Print the path of the Java trust store (JKS) that holds the CA.
    #[arg(long)]
    pub java: bool,
    /// With --env: the sandbox's id, as VERIS_SANDBOX_ID.
    #[arg(long, value_name = "ID", requires = "env")]
    pub sandbox: Option<String>,
    /// With --env: the sandbox's canary (`add-sandbox --json`), as
    /// VERIS_CANARY, which `veris check --gateway` compares.
    #[arg(long, value_name = "TOKEN", requires = "env")]
    pub canary: Option<String>,
    /// With --env: the env file's format.
    #[arg(long, value_enum, default_value = "posix")]
    pub format: crate::runtime::stack::EnvFormatArg,
}

#[derive(Args, Debug)]
pub struct IdArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// The sandbox id.
    pub id: String,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// The sandbox id: 1 to 64 of a-z, 0-9, _ and -.
    pub id: String,
    /// Services routed to the twin (comma-separated) [default: all the catalog's].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub services: Vec<String>,
    /// Its mode [default: the gateway's].
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Its twin base URL [default: the gateway's].
    #[arg(long, value_name = "URL")]
    pub twin: Option<String>,
    /// How long it is served, e.g. 3600, 90m, 2h [default: until removed].
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,
    /// Connections it may have open at once [default: the gateway's
    /// --sandbox-connections].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Requests it may make a second, 0 for no limit [default: the
    /// gateway's --sandbox-rps].
    #[arg(long, value_name = "N")]
    pub max_rps: Option<u32>,
    /// Bytes it may move a second, 0 for no limit [default: the gateway's
    /// --sandbox-bytes-per-sec].
    #[arg(long, value_name = "N")]
    pub max_bytes_per_sec: Option<u64>,
    /// Deliver the built-in twin's webhook events for this sandbox's
    /// SERVICE (stripe) to URL, as `run --webhook` (repeatable):
    /// 'SERVICE=http://HOST:PORT/PATH', the address the platform exposes
    /// the app's port at, dialed from the gateway under its dial policy
    /// (--allow-dial). Its own signing secret per service is printed once
    /// (STRIPE_WEBHOOK_SECRET=…); every attempt is a `callback` line in
    /// this sandbox's ledger.
    #[arg(long = "webhook", value_name = "SERVICE=URL")]
    pub webhooks: Vec<String>,
    /// With --webhook: this sandbox's deliveries wrong on purpose, as
    /// `run --webhook-faults` (duplicate, reorder, delay=DURATION,
    /// stale-signature, bad-signature).
    #[arg(long = "webhook-faults", value_name = "LIST")]
    pub webhook_faults: Vec<String>,
    /// Print every field (address, username, password, read token, CA,
    /// canary) as JSON instead.
    #[arg(long)]
    pub json: bool,
}

pub async fn gateway(cmd: GatewayCmd) -> Result<u8> {
    match cmd.action {
        None => serve(cmd.serve).await,
        Some(Action::AddSandbox(a)) => add(a).await,
        Some(Action::RemoveSandbox(a)) => {
            let answer = admin(&a.state, "DELETE", &format!("/sandboxes/{}", a.id), None).await?;
            crate::outln!("{}", answer["removed"].as_str().unwrap_or(&a.id));
            Ok(0)
        }
        Some(Action::ListSandboxes(a)) => {
            let answer = admin(&a, "GET", "/sandboxes", None).await?;
            // id, mode, services, then its limits (0: no limit).
            for s in answer["sandboxes"].as_array().into_iter().flatten() {
                crate::outln!(
                    "{}\t{}\t{}\tconnections={} rps={} bytes_per_sec={}",
                    s["id"].as_str().unwrap_or_default(),
                    s["mode"].as_str().unwrap_or_default(),
                    s["services"]
                        .as_array()
                        .map(|v| v
                            .iter()
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join(","))
                        .unwrap_or_default(),
                    s["max_connections"],
                    s["max_rps"],
                    s["max_bytes_per_sec"],
                );
            }
            Ok(0)
        }
        Some(Action::Ca(a)) => ca(a),
    }
}

/// `veris gateway ca`: the trust files the gateway published when it
/// started (it alone writes them; this reads).
fn ca(a: CaArgs) -> Result<u8> {
    let dir = crate::util::state_dir(a.state.state_dir);
    let trust = veris_ca::trust::TrustFiles::at(&dir.join("trust"));
    let wanted = if a.java {
        &trust.truststore
    } else {
        &trust.ca_pem
    };
    if !wanted.is_file() {
        bail!(
            "no gateway trust files in {} ({} is missing). Next: start `veris gateway --state-dir {}` once",
            trust.dir.display(),
            wanted.display(),
            dir.display()
        );
    }
    if a.pem {
        let pem = crate::util::read_bounded(&trust.ca_pem, 64 << 10, false)
            .with_context(|| format!("reading {}", trust.ca_pem.display()))?;
        crate::out!("{pem}");
    } else if a.env {
        let text = crate::cmd::ca::env_file(
            &trust,
            None,
            a.sandbox.as_deref().unwrap_or_default(),
            a.canary.as_deref().unwrap_or_default(),
            a.format,
        );
        crate::out!("{text}");
    } else if a.java {
        eprintln!(
            "veris: Java trust store ({}, password {:?}); JAVA_TOOL_OPTIONS in `veris gateway ca --env` names it",
            trust.truststore_type, trust.truststore_password
        );
        crate::outln!("{}", trust.truststore.display());
    } else {
        crate::outln!("{}", trust.ca_pem.display());
    }
    Ok(0)
}

async fn serve(args: GatewayArgs) -> Result<u8> {
    let allow_dial = args
        .allow_dial
        .iter()
        .map(|c| {
            c.parse()
                .map_err(|e| anyhow::anyhow!("--allow-dial {c:?}: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let config = GatewayConfig {
        state_dir: crate::util::state_dir(args.state_dir),
        listen: args.listen,
        admin: args.admin,
        metrics_listen: args.metrics_listen,
        metrics_open: args.metrics_open,
        ready_file: args.ready_file,
        ca_dir: args.ca_dir,
        twin: args.twin,
        mode: args.mode.into(),
        allow_dial,
        max_connections: args.max_connections,
        sandbox_limits: SandboxLimits {
            max_connections: args.sandbox_connections.max(1),
            max_rps: args.sandbox_rps,
            max_bytes_per_sec: args.sandbox_bytes_per_sec,
        },
        tls: args
            .tls
            .tls_listen
            .map(|listen| crate::runtime::gateway_tls::TlsSettings {
                listen,
                cert: args.tls.tls_cert.zip(args.tls.tls_key),
                names: args.tls.tls_name,
            }),
        nats: args.nats,
        registry_bucket: args.nats_registry,
        fleet_identity: args.fleet_identity,
    };
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    crate::runtime::gateway::run(config, stop).await?;
    Ok(0)
}

async fn add(a: AddArgs) -> Result<u8> {
    let ttl_secs = a.ttl.as_deref().map(parse_duration).transpose()?;
    let body = serde_json::json!({
        "id": a.id,
        "services": a.services,
        "mode": a.mode.map(veris_receipt::Mode::from),
        "twin": a.twin,
        "ttl_secs": ttl_secs,
        "max_connections": a.max_connections,
        "max_rps": a.max_rps,
        "max_bytes_per_sec": a.max_bytes_per_sec,
        "webhooks": a.webhooks,
        "webhook_faults": a.webhook_faults,
    });
    let answer = admin(&a.state, "POST", "/sandboxes", Some(body.to_string())).await?;
    let registered: Registered =
        serde_json::from_value(answer).context("reading the gateway's answer")?;
    if a.json {
        crate::outln!("{}", serde_json::to_string_pretty(&registered)?);
    } else {
        eprintln!(
            "veris: sandbox {} registered (services {}; read token in <state>/sandboxes/{}/admin.token); its proxy URL:",
            registered.id,
            registered.services.join(","),
            registered.id
        );
        if let Some(url) = &registered.https_proxy_url {
            eprintln!(
                "veris: over TLS (SOCKS5 or CONNECT at {}): {url}",
                registered.tls_address.as_deref().unwrap_or_default()
            );
        }
        if let (Some(url), Some(token)) = (&registered.ingress_url, &registered.ingress_token) {
            eprintln!("veris: webhook ingress for the sandbox's twin: POST {url} with Authorization: Bearer {token}");
        }
        // The app's secrets, once; the proxy URL stays the last line.
        for (service, secret) in &registered.webhook_secrets {
            crate::outln!(
                "{}={secret}",
                crate::runtime::stack::webhooks::env_name(service)
            );
        }
        crate::outln!("{}", registered.proxy_url);
    }
    Ok(0)
}

/// `3600`, `90s`, `90m`, `2h`, `1d` in seconds.
fn parse_duration(text: &str) -> Result<u64> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits.parse().with_context(|| {
        format!("--ttl {text:?}: not a duration. Next: give seconds, or 90m, 2h, 1d")
    })?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => bail!("--ttl {text:?}: unknown unit {unit:?}. Next: s, m, h or d"),
    };
    Ok(n.saturating_mul(scale))
}

/// A call to the live gateway's admin API with its token; its JSON answer.
async fn admin(
    state: &StateArgs,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Result<serde_json::Value> {
    let dir = crate::util::state_dir(state.state_dir.clone());
    let read = |name: &str| crate::util::read_bounded(&dir.join(name), 4096, false);
    let addr = read(ADDR_FILE).with_context(|| {
        format!(
            "no live gateway announced in {}. Next: start `veris gateway --state-dir {}`",
            dir.display(),
            dir.display()
        )
    })?;
    let token = read(TOKEN_FILE).with_context(|| {
        format!(
            "cannot read {} (run as the gateway's uid or root)",
            dir.join(TOKEN_FILE).display()
        )
    })?;
    let url = HttpUrl::parse(&format!("http://{}{path}", addr.trim()))?;
    let target = url.target();
    let mut req = Request::new(method, &target, &url.authority).bearer(token.trim());
    if let Some(body) = &body {
        req = req.body("application/json", body.as_bytes());
    }
    let limits = Limits {
        body: 1 << 20,
        time: std::time::Duration::from_secs(15),
    };
    let answer = within(&url.authority, limits.time, async {
        let tcp = connect(&url.authority).await?;
        exchange(tcp, &url.authority, &req, limits.body).await
    })
    .await?;
    let json: serde_json::Value = serde_json::from_slice(&answer.body).with_context(|| {
        format!(
            "the gateway answered {method} {path} with {} and no JSON",
            answer.status
        )
    })?;
    if !(200..300).contains(&answer.status) {
        bail!(
            "the gateway refused {method} {path} ({}): {}",
            answer.status,
            json["message"].as_str().unwrap_or("no reason given")
        );
    }
    Ok(json)
}
