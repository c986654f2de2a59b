//! The flags every command that starts a proxy shares.

use std::path::PathBuf;

use clap::Args;
use veris_ca::env::EnvFormat;
use veris_receipt::Mode;

/// Sandbox id used with the built-in twin when none is given.
pub const DEFAULT_SANDBOX: &str = "sbx_local";

/// The proxy's flags, shared by every command that starts one (`serve`,
/// `run`, `demo`): routing, where state lives, client and twin timeouts.
#[derive(Args, Clone, Debug)]
pub struct ProxyArgs {
    /// JSON config file (format: docs/config.md). Flags given with it override the
    /// file's field of the same meaning (--listen, --sandbox, --mode,
    /// --allow-passthrough, --ca-dir); --twin, --services and --route are
    /// errors with it (the routes live in the file).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Proxy listen address [serve: 127.0.0.1:8080, run/demo: 127.0.0.1:0].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Twin base URL; without it the built-in twin runs in-process on loopback.
    #[arg(long, value_name = "URL")]
    pub twin: Option<String>,
    /// Twin sandbox id.
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
    /// Catalog services to route (comma-separated); default: the whole catalog.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub services: Vec<String>,
    /// Route, repeatable: SERVICE=HOST[/PREFIX], added to the catalog
    /// services (all of them, or --services). A route for a host (and
    /// prefix) the catalog claims takes that claim over; the catalog's other
    /// hosts and prefixes stay.
    #[arg(long = "route", value_name = "SERVICE=HOST[/PREFIX]")]
    pub routes: Vec<String>,
    /// What happens to hosts no service claims.
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Host pattern tunneled even in strict mode (repeatable; `@build` = package registries).
    #[arg(long = "allow-passthrough", value_name = "HOST")]
    pub allow_passthrough: Vec<String>,
    /// State dir [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// CA dir [default: <state>/ca].
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Seconds in-flight requests get after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub grace: u64,
    /// Seconds a client may take for a TLS handshake.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub handshake_timeout: u64,
    /// Seconds a client may take to send a request head; an idle HTTP/1
    /// keep-alive connection is closed after as long (HTTP/2: the ping
    /// interval and deadline).
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub client_timeout: u64,
    /// Client connections open at once (all listeners); more are closed on
    /// accept. Default: half the open-file limit, at most 16384.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Seconds to wait for the twin's response head before answering 504.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub upstream_timeout: u64,
    /// HTTP proxy that passthrough traffic (hosts not routed to a twin) is
    /// chained through with CONNECT, e.g. a corporate proxy:
    /// http://[user:password@]host:port. Twin traffic and loopback never
    /// go through it.
    #[arg(long, value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// Store the redacted request and response bodies of twin traffic in
    /// DIR (created if missing) for `veris har --bodies DIR`; each stored
    /// body's SHA-256 goes into the sealed ledger. Off by default.
    #[arg(long, value_name = "DIR")]
    pub capture_bodies: Option<PathBuf>,
    /// Deliver the built-in twin's webhook events for SERVICE (stripe) to
    /// URL, signed the vendor's way (repeatable): 'SERVICE=http://HOST:PORT/PATH'
    /// (or https://, the app's certificate verified against the system's
    /// roots and --webhook-ca).
    /// The signing secret is made per start and given to the command as
    /// STRIPE_WEBHOOK_SECRET (`serve` prints it and writes it to its env file);
    /// every attempt is a `callback` line in the ledger. An isolated
    /// `run` delivers into the command's namespace: loopback URLs only.
    #[arg(long = "webhook", value_name = "SERVICE=URL")]
    pub webhooks: Vec<String>,
    /// With --webhook: deliver wrong on purpose, to check that the app copes:
    /// 'duplicate' (each event twice), 'reorder' (held up to 3 s, sent newest
    /// first), 'delay=DURATION' (each first attempt waits, at most 10m),
    /// 'stale-signature' (`t=` 600 s old, past Stripe's 300 s tolerance),
    /// 'bad-signature' (signed with a wrong key). Comma-separated or
    /// repeated; each delivery's line records its fault, and a fault-injected
    /// delivery never counts toward --require-callback.
    #[arg(long = "webhook-faults", value_name = "LIST")]
    pub webhook_faults: Vec<String>,
    /// With --webhook https://…: also trust the CA certificates in FILE
    /// (PEM) for the app's certificate, e.g. a private CA. A certificate
    /// that does not verify is a failed delivery on record, never sent.
    #[arg(long = "webhook-ca", value_name = "FILE")]
    pub webhook_ca: Option<PathBuf>,
    /// With --capture-bodies: bytes kept of each body (the rest is cut, and
    /// the cut is recorded).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024, requires = "capture_bodies")]
    pub capture_max_body: usize,
    /// With --capture-bodies: bytes stored in all; then nothing more is
    /// stored (and each later body is recorded as `total_cap`).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024, requires = "capture_bodies")]
    pub capture_max_total: u64,
}

/// `veris serve`: the proxy's flags plus what only a long-running service
/// has (its announcements, the transparent tier, the admin API). `run`
/// takes [`ProxyArgs`] alone, so its `--help` lists only what it uses.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// Written last, atomically, once the proxy accepts connections (JSON:
    /// proxy_url, pid, sandbox_id, twin, state_dir, ledger, ca, admin,
    /// key_id, https_listen, http_listen; see docs/cli.md).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// Write the client env file (proxy and trust variables) here.
    #[arg(long, value_name = "FILE")]
    pub write_env: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "posix")]
    pub env_format: EnvFormatArg,
    /// Leave every routing variable out of the env file (trust only).
    #[arg(long)]
    pub env_trust_only: bool,
    #[command(flatten)]
    pub transparent: crate::tier::transparent::TransparentArgs,
    /// Admin API listen address (address written to <state>/admin.addr and the ready file).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub admin: String,
    /// Serve the admin API's GET /metrics (Prometheus) without the bearer
    /// token, for a scraper that cannot be given it; every other endpoint
    /// still needs the token.
    #[arg(long)]
    pub metrics_open: bool,
    /// Also serve GET /metrics on a listener of its own, a fixed address for
    /// a scraper (the admin port is random unless --admin is set): ADDR, or
    /// 127.0.0.1:9479 when given without one. It serves /metrics and
    /// /healthz only, with the admin token unless --metrics-open.
    #[arg(long, value_name = "ADDR", num_args = 0..=1,
          default_missing_value = veris_proxy::admin::metrics::DEFAULT_LISTEN)]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub nats: crate::runtime::fleet::NatsArgs,
}

impl ServeArgs {
    /// `proxy` with every serve-only flag at its default (`run` has none of
    /// them). The defaults come from clap itself, so they cannot drift.
    pub fn with_defaults(proxy: ProxyArgs) -> anyhow::Result<ServeArgs> {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            serve: ServeArgs,
        }
        use clap::Parser;
        // No flag of ServeArgs is required and none reads the environment,
        // so parsing no arguments should not fail; if a new flag breaks
        // that, `veris run` says so rather than panicking.
        let mut serve = Defaults::try_parse_from(["veris"])
            .map_err(|e| anyhow::anyhow!("the serve flags' defaults do not parse: {e}"))?
            .serve;
        serve.proxy = proxy;
        Ok(serve)
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ModeArg {
    Passthrough,
    Strict,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Strict => Mode::Strict,
            ModeArg::Passthrough => Mode::Passthrough,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum EnvFormatArg {
    Posix,
    Docker,
}

impl From<EnvFormatArg> for EnvFormat {
    fn from(f: EnvFormatArg) -> Self {
        match f {
            EnvFormatArg::Posix => EnvFormat::Posix,
            EnvFormatArg::Docker => EnvFormat::Docker,
        }
    }
}
