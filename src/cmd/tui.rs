//! `veris tui`: picks the source (admin API, state dir, ledger file, or the
//! fleet on NATS: [`crate::runtime::fleet_view`]), owns
//! the terminal (raw mode and alternate screen, restored on quit, on error
//! and on panic) and sends logs to a file while the screen is taken.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use veris_tui::admin::Target;
use veris_tui::{ReceiptHook, RunOptions, SourceSpec, DEFAULT_CAPACITY};

#[derive(Args, Debug)]
pub struct TuiArgs {
    /// Admin API of a live proxy, e.g. http://127.0.0.1:PORT (a forwarded port works).
    #[arg(long, value_name = "URL", conflicts_with = "state_dir")]
    pub admin: Option<String>,
    /// Admin API token (with --admin).
    #[arg(
        long,
        env = "VERIS_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Follow this ledger file, also one still being written.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["admin", "state_dir"])]
    pub ledger: Option<PathBuf>,
    /// State dir of the proxy to watch [default: $VERIS_STATE_DIR, else ~/.veris]:
    /// its `ledger.jsonl` (a `veris serve`'s), else its newest run's ledger.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Follow this run's ledger in the state dir (`veris runs` lists them).
    #[arg(long, value_name = "ID", conflicts_with_all = ["admin", "ledger"])]
    pub run: Option<String>,
    /// Follow a gateway's sandbox (--state-dir is the gateway's): its
    /// ledger file, and the receipt `veris receipt --sandbox` builds.
    /// With --nats: the sandboxes to list, an id or a pattern with `*`
    /// (`ci-*`) [default: all].
    #[arg(long, value_name = "ID|PATTERN", conflicts_with_all = ["admin", "ledger", "run"])]
    pub sandbox: Option<String>,
    /// The fleet's live view: every sandbox's ledger lines from NATS
    /// JetStream at this URL, one row per sandbox (Enter opens one).
    #[arg(long, value_name = "URL", conflicts_with_all = ["admin", "ledger", "run", "state_dir"])]
    pub nats: Option<String>,
    /// NATS credentials for --nats: a .creds file, or a file holding only a
    /// user nkey seed (a user and password go in the URL).
    #[arg(long = "nats-creds", value_name = "FILE", requires = "nats")]
    pub nats_creds: Option<PathBuf>,
    /// The stream the gateways publish to.
    #[arg(long = "nats-stream", value_name = "NAME", default_value = veris_fleet::DEFAULT_STREAM, requires = "nats")]
    pub nats_stream: String,
    /// With --nats: where the view starts, a time back from now (`30s`,
    /// `15m`, `2h`) or `all` (the whole stream).
    #[arg(
        long,
        value_name = "DURATION|all",
        default_value = "15m",
        requires = "nats"
    )]
    pub since: String,
    /// With --nats: pin the gateways' seal keys for the receipt of a sandbox
    /// opened with Enter, as `veris receipt --nats --key` (repeatable).
    /// Without one nothing is `verified`.
    #[arg(long, value_name = "FINGERPRINT|FILE", requires = "nats")]
    pub key: Vec<String>,
    /// With --nats: the operator key that certifies the fleet's gateways,
    /// as `veris receipt --nats --fleet-key` (repeatable).
    #[arg(long, value_name = "FP|FILE", requires = "nats")]
    pub fleet_key: Vec<String>,
    /// Rows kept in memory; older ones are counted, not shown [default:
    /// 50000; with --nats 100 per sandbox and gateway].
    #[arg(long, value_name = "N")]
    pub rows: Option<usize>,
    /// Seconds between receipt refreshes while traffic flows (r refreshes now).
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    pub receipt_every: u64,
    /// Log file while the TUI owns the terminal [default: $TMPDIR/veris-tui.log].
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

impl TuiArgs {
    fn log_path(&self) -> PathBuf {
        self.log_file
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("veris-tui.log"))
    }
}

/// Installs the tracing subscriber writing to the log file (never the
/// terminal, which the TUI owns). Without a writable file, logs are dropped.
pub fn init_logging(args: &TuiArgs) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = args.log_path();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path);
    let Ok(file) = file else { return };
    tracing_subscriber::fmt()
        .with_env_filter(crate::logging::filter("info"))
        .with_ansi(false)
        .fmt_fields(crate::logging::PlainFields)
        .with_writer(std::sync::Mutex::new(file))
        .init();
}

pub async fn tui(args: TuiArgs) -> Result<u8> {
    if let Some(url) = &args.nats {
        return fleet(&args, url).await;
    }
    let spec = if let Some(path) = &args.ledger {
        SourceSpec::Ledger(path.clone())
    } else if let Some(url) = &args.admin {
        let Some(token) = args.token.as_deref().filter(|t| !t.trim().is_empty()) else {
            bail!("--admin needs a token. Next: pass --token TOKEN or set VERIS_ADMIN_TOKEN (the proxy writes it to <state>/admin.token)");
        };
        SourceSpec::Admin(
            Target::new(url, token).with_context(|| format!("using admin URL {url}"))?,
        )
    } else if let Some(id) = &args.run {
        let state_dir = crate::util::state_dir(args.state_dir.clone());
        let source = crate::runtime::ledgers::resolve(&state_dir, None, Some(id), false)?;
        SourceSpec::Ledger(source.path().to_path_buf())
    } else {
        // A sandbox's dir reads as a serve's state dir. Rows come from the
        // file the receipt reads, never from the event stream at
        // `admin.addr`, which the workload may have planted.
        let window = crate::runtime::receipt::WindowArgs {
            state_dir: args.state_dir.clone(),
            sandbox: args.sandbox.clone(),
            ..Default::default()
        };
        SourceSpec::StateDir(window.state_dir()?, crate::runtime::ledgers::followed)
    };
    let receipt = matches!(spec, SourceSpec::StateDir(..))
        .then(|| state_dir_receipt(args.state_dir.clone(), args.sandbox.clone()));
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!("veris tui needs an interactive terminal. Next: run it in a terminal, or use `veris receipt` for a one-shot summary");
    }
    tracing::info!(source = %spec.describe(), "tui starting");
    // Raw mode and the alternate screen, plus a panic hook that restores them.
    let mut terminal = veris_tui::enter_terminal().context("setting up the terminal")?;
    let result = veris_tui::run(
        &mut terminal,
        RunOptions {
            spec,
            capacity: args.rows.unwrap_or(DEFAULT_CAPACITY).max(1),
            receipt_every: Duration::from_secs(args.receipt_every.max(1)),
            receipt,
        },
    )
    .await;
    veris_tui::leave_terminal();
    result.with_context(|| format!("the TUI stopped; see {}", args.log_path().display()))?;
    Ok(0)
}

/// `veris tui --nats URL`: the fleet view.
async fn fleet(args: &TuiArgs, url: &str) -> Result<u8> {
    use crate::runtime::fleet_view::{parse_start, FleetView};
    let start = parse_start(&args.since).map_err(anyhow::Error::msg)?;
    let view = FleetView {
        url: url.to_string(),
        creds: args.nats_creds.clone(),
        stream: args.nats_stream.clone(),
        pattern: args.sandbox.clone(),
        start,
        keys: args.key.clone(),
        fleet_keys: args.fleet_key.clone(),
    };
    let rows = args
        .rows
        .unwrap_or(veris_tui::fleet::DEFAULT_FLEET_ROWS)
        .max(1);
    let every = Duration::from_secs(args.receipt_every.max(1));
    // Bad flags, credentials or a wrong URL are told before the terminal is.
    let (options, feed) = view.open(rows, every).await?;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!("veris tui needs an interactive terminal. Next: run it in a terminal, or use `veris receipt --nats URL --sandbox ID` for one sandbox's receipt");
    }
    tracing::info!(url, "fleet tui starting");
    let mut terminal = veris_tui::enter_terminal().context("setting up the terminal")?;
    let result = veris_tui::run_fleet(&mut terminal, options, feed).await;
    veris_tui::leave_terminal();
    result.with_context(|| format!("the TUI stopped; see {}", args.log_path().display()))?;
    Ok(0)
}

/// A state dir's header receipt is the one `veris receipt --state-dir S
/// [--sandbox ID]` builds, by the same function (ledger file, seals, and
/// `live::discover` for the proxy), never what answers at `<S>/admin.addr`:
/// the workload may share S's uid and plant that file and `admin.token`
/// for a server of its own whose `GET /receipt` says `verified`. (A
/// gateway's own `GET /receipt` also cannot know the reader named S a
/// gateway's state dir.) Only `--admin URL`, typed by the user, is asked.
fn state_dir_receipt(state_dir: Option<PathBuf>, sandbox: Option<String>) -> ReceiptHook {
    ReceiptHook::new(move || {
        let args = crate::runtime::receipt::ReceiptArgs {
            window: crate::runtime::receipt::WindowArgs {
                state_dir: state_dir.clone(),
                sandbox: sandbox.clone(),
                ..Default::default()
            },
            json: false,
            junit: None,
            junit_suite: None,
            require: Default::default(),
            stream: Default::default(),
        };
        Box::pin(async move {
            crate::runtime::receipt::build(&args)
                .await
                .map(|report| report.receipt)
                .map_err(|e| format!("{e:#}"))
        })
    })
}
