//! `veris mcp`: `veris baseline`, `veris receipt` and `veris check` as tools
//! of a Model Context Protocol server on stdio, so an agent session can ask
//! for its own receipt. The protocol is rmcp's (the official Rust SDK); this
//! module only maps each tool onto the function its command runs, so a tool
//! and its command cannot disagree: same live-proxy discovery (the state
//! dir's `admin.addr` and `admin.token`), same checks, same verdict.
//!
//! The agent may be the workload the receipt must hold against (DESIGN
//! §7a), so the tools only report: nothing a tool is given reaches the
//! ledger (a baseline appends nothing; a receipt gets the live proxy to
//! append its own seal on demand, as `veris receipt` does), no option
//! weakens a check, and no argument picks a ledger file or pins a key (a
//! workload could pass a ledger it forged and the key it forged it with).
//! Which proxy is read is fixed when the server starts (`--state-dir`), by
//! whoever configures the agent's MCP client. Within that state dir a tool
//! may name a run by its id (`veris_runs` lists them; `crate::runtime::ledgers`
//! refuses anything but an id), never a path; a finished run read so is
//! `unverified` unless the server's own `--key` pins its key, and the
//! answer says why.
//!
//! `veris_run` is the way to `verified`: it starts `veris run` (this same
//! binary) on the server's state dir, which seals with a key that never
//! leaves that process, and takes the judged run back over a pipe the
//! command never holds (`--report-fd`), not from a file the agent could
//! rewrite nor from output the command shares. One run at a time, bounded
//! by its time limit; whatever it leaves running is ended.
//!
//! stdout carries protocol messages only; logs go to stderr. What the
//! client sends that rmcp would not answer as JSON-RPC says (a line that is
//! not JSON, a request before `initialize`) is answered by the stdio front
//! ([`stdio`]); no line ends the session.
//!
//! Every tool declares the shape of its structured result (`outputSchema`,
//! [`schema`]) and what it does to its environment
//! (`annotations`). Every failure has one shape, `{verdict: "error",
//! exit_code, error}`, a wrong argument name or type included.

mod schema;
mod stdio;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use veris_receipt::receipt::IntegrityStatus;

use crate::cmd::check::EXIT_CHECK_FAILED;
use crate::runtime::ledgers::Source;
use crate::runtime::live::{self, Discovery};
use crate::runtime::receipt::{ReceiptArgs, RequireArgs, WindowArgs};
use crate::runtime::stream_receipt::StreamArgs;
use crate::util::EXIT_USAGE;

#[derive(Args, Debug)]
pub struct McpArgs {
    /// State dir of the proxy the tools report on [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Pin the proxy's seal key (its fingerprint, the `key_id` of its ready file, or a file
    /// holding it) for every receipt: a proxy found through the state dir that seals with
    /// another key fails. Set by whoever configures the server, never by a tool argument.
    /// Repeatable (with --nats: every gateway process's key).
    #[arg(long, value_name = "FINGERPRINT|FILE")]
    pub key: Vec<String>,
    /// Read a sandbox's receipt (veris_receipt with `sandbox`) from NATS
    /// JetStream at this URL, as `veris receipt --nats` does: every
    /// gateway's chain, verified only with --key or --fleet-key.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// NATS credentials for --nats (a .creds file or a user nkey seed).
    #[arg(long, value_name = "FILE", requires = "nats")]
    pub nats_creds: Option<PathBuf>,
    /// The stream the gateways publish to.
    #[arg(long, value_name = "NAME", default_value = veris_fleet::DEFAULT_STREAM, requires = "nats")]
    pub nats_stream: String,
    /// With --nats: the operator key that certifies the fleet's gateways
    /// (its fingerprint or `operator.pub`); repeatable.
    #[arg(long, value_name = "FP|FILE", requires = "nats")]
    pub fleet_key: Vec<String>,
}

/// `veris mcp`: serves until the client closes stdin.
pub async fn mcp(args: McpArgs) -> Result<u8> {
    for k in &args.key {
        crate::runtime::receipt::parse_pin(k)?;
    }
    crate::runtime::stream_receipt::operator_pins(&args.fleet_key)?;
    let stream = args.nats.map(|nats| StreamArgs {
        nats: Some(nats),
        nats_creds: args.nats_creds,
        nats_stream: args.nats_stream,
        nats_wait: 0.0,
        fleet_key: args.fleet_key,
    });
    let server = Veris {
        state_dir: crate::util::state_dir(args.state_dir),
        key: args.key,
        stream,
        running: Default::default(),
        tool_router: Veris::tool_router(),
    };
    // `veris_run` hands its runs a pipe for their report: no process of the
    // agent's uid may reach it through /proc/<pid>/fd, nor this server's
    // memory (its pin).
    if let Err(e) = crate::os::prctl::set_non_dumpable() {
        tracing::warn!(error = %e, "veris mcp: cannot make the process non-dumpable");
    }
    tracing::info!(state_dir = %server.state_dir.display(), "veris mcp: serving on stdio");
    let running = server
        .serve(stdio::front(tokio::io::stdin(), tokio::io::stdout()))
        .await
        .context("starting the MCP session on stdio (the client must send `initialize` first)")?;
    let reason = running.waiting().await.context("the MCP session")?;
    tracing::info!(?reason, "veris mcp: session ended");
    Ok(0)
}

/// The MCP server: which state dir it reports on, and its tools.
#[derive(Clone)]
pub struct Veris {
    state_dir: PathBuf,
    /// `--key`: the seal key every receipt is pinned to.
    key: Vec<String>,
    /// `--nats`: where a sandbox's receipt is read from (set by whoever
    /// configures the server, never by a tool argument).
    stream: Option<StreamArgs>,
    /// One `veris_run` at a time: a timed-out run's leftovers are ended by
    /// looking for this server's descendants.
    running: std::sync::Arc<tokio::sync::Mutex<()>>,
    tool_router: ToolRouter<Self>,
}

/// Arguments of `veris_receipt`, named as `veris receipt`'s flags.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub struct ReceiptParams {
    /// Only what happened after this baseline: the token `veris_baseline` returned (or a ledger seq). Without it (and without `all`), the latest proxy session.
    #[serde(default)]
    pub since: Option<String>,
    /// The whole ledger, every session (not with `since`).
    #[serde(default)]
    pub all: bool,
    /// Only this service.
    #[serde(default)]
    pub service: Option<String>,
    /// A gateway's sandbox (its id): that sandbox's receipt, read through the live gateway of the state dir, or from the fleet's NATS stream when the server was started with --nats.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// Require at least N requests of a service answered 2xx: "SERVICE" (N = 1) or "SERVICE:N", e.g. "stripe:1"; a last word "status=CODE", "status=Nxx" or "status=any" counts other answers, e.g. "stripe:1 status=4xx".
    #[serde(default)]
    pub require: Vec<String>,
    /// Require at least N requests to a host answered 2xx (requests that reached the twin): "HOST" or "HOST:N", e.g. "api.stripe.com:2"; a last word "status=…" as for `require`.
    #[serde(default)]
    pub require_host: Vec<String>,
    /// Require one request answered 2xx: "SERVICE METHOD /path", e.g. "stripe POST /v1/charges" (one trailing slash does not matter); a last word "status=…" as for `require`, e.g. "stripe POST /v1/charges status=402".
    #[serde(default)]
    pub require_request: Vec<String>,
    /// Require at least N of veris's webhook deliveries (the twin calling the app back) to PATH answered 2xx by the app: "PATH" or "PATH:N", e.g. "/webhook:2"; a last word "status=…" as for `require`. Only deliveries of events the twin made for requests it served count.
    #[serde(default)]
    pub require_callback: Vec<String>,
    /// Do not fail when no request reached the twin.
    #[serde(default)]
    pub allow_empty: bool,
    /// Fail unless integrity is `verified` (recommended: anything less cannot rule out a forged ledger).
    #[serde(default)]
    pub require_verified: bool,
    /// Read this run of the server's state dir (its id, as `veris_runs` lists it) instead of what the state dir means by default (its live `veris serve`, else its newest run).
    #[serde(default)]
    pub run: Option<String>,
}

/// Arguments of `veris_run`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// The command and its arguments, e.g. ["python3", "charge.py"] (no shell: use ["sh", "-c", "…"] for one).
    pub command: Vec<String>,
    /// As for veris_receipt: "SERVICE[:N] [status=…]".
    #[serde(default)]
    pub require: Vec<String>,
    /// As for veris_receipt: "HOST[:N] [status=…]".
    #[serde(default)]
    pub require_host: Vec<String>,
    /// As for veris_receipt: "SERVICE METHOD /path [status=…]".
    #[serde(default)]
    pub require_request: Vec<String>,
    /// As for veris_receipt: "PATH[:N] [status=…]".
    #[serde(default)]
    pub require_callback: Vec<String>,
    /// Deliver the built-in twin's webhook events for SERVICE to the command's app: "SERVICE=URL", e.g. "stripe=http://127.0.0.1:4242/webhook"; the command gets the signing secret in its environment (STRIPE_WEBHOOK_SECRET).
    #[serde(default)]
    pub webhook: Vec<String>,
    /// Do not fail when no request reached the twin.
    #[serde(default)]
    pub allow_empty: bool,
    /// Fail unless integrity is `verified`.
    #[serde(default)]
    pub require_verified: bool,
    /// Seconds the run may take (default 300, at most 3600); then it is stopped (SIGTERM, then SIGKILL) and its receipt, if it could still be written, is returned.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// The arguments of `veris_baseline` and `veris_check`: none. An argument
/// the caller believes changes something is refused, not ignored.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

#[tool_router(router = tool_router)]
impl Veris {
    #[tool(
        name = "veris_baseline",
        output_schema = schema::baseline(),
        annotations(read_only_hint = true, idempotent_hint = true, open_world_hint = false),
        description = "Mark now, before the work whose calls you want to prove. Returns a baseline token; pass it as `since` to veris_receipt to cover exactly what happened after it. Writes nothing to the ledger."
    )]
    async fn veris_baseline(&self, Parameters(_): Parameters<NoParams>) -> CallToolResult {
        match crate::runtime::baseline::take(&self.state_dir, None, None).await {
            Ok(b) => {
                let token = b.token();
                let text = format!(
                    "baseline: {token}\nPass it as `since` to veris_receipt to see only what happens from now on."
                );
                let structured = json!({
                    "verdict": "pass",
                    "exit_code": 0,
                    "baseline": token,
                    "ledger_id": b.ledger,
                    "seq": b.seq,
                    "twin": b.twin,
                });
                result(text, structured, false)
            }
            Err(e) => failure("veris_baseline", EXIT_USAGE, &e),
        }
    }

    #[tool(
        name = "veris_receipt",
        output_schema = schema::receipt(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
        description = "What really reached the vendor twin (each request the proxy forwarded), with integrity and leaks, judged against requirements as `veris receipt` judges them. A failed requirement, an empty window or failed integrity is an error result (isError) with exit_code 3; use require_verified to also fail on anything short of `integrity: verified`."
    )]
    async fn veris_receipt(&self, Parameters(p): Parameters<ReceiptParams>) -> CallToolResult {
        if p.all && p.since.is_some() {
            let e = anyhow::anyhow!(
                "`since` and `all` exclude each other. Next: pass `since` (a baseline token) for one test run, or `all` for every session"
            );
            return failure("veris_receipt", EXIT_USAGE, &e);
        }
        let stream = match (&self.stream, &p.sandbox) {
            (Some(stream), Some(_)) => {
                if p.since.is_some() || p.run.is_some() {
                    let e = anyhow::anyhow!(
                        "`since` and `run` name a local ledger; this server reads sandboxes from the NATS stream. Next: drop them (the stream's window is the sandbox's latest session, or `all`)"
                    );
                    return failure("veris_receipt", EXIT_USAGE, &e);
                }
                stream.clone()
            }
            _ => StreamArgs::default(),
        };
        let from_stream = stream.nats.is_some();
        let args = ReceiptArgs {
            window: WindowArgs {
                state_dir: (!from_stream).then(|| self.state_dir.clone()),
                run: p.run,
                ledger: None,
                since: p.since,
                all: p.all,
                key: self.key.clone(),
                service: p.service,
                sandbox: p.sandbox,
            },
            json: true,
            junit: None,
            junit_suite: None,
            require: RequireArgs {
                require: p.require,
                require_host: p.require_host,
                require_request: p.require_request,
                require_callback: p.require_callback,
                allow_empty: p.allow_empty,
                require_verified: p.require_verified,
            },
            stream,
        };
        let report = match crate::runtime::receipt::build(&args).await {
            Ok(report) => report,
            Err(e) => return failure("veris_receipt", EXIT_USAGE, &e),
        };
        let receipt = match serde_json::to_value(&report.receipt) {
            Ok(v) => v,
            Err(e) => return failure("veris_receipt", EXIT_USAGE, &e.into()),
        };
        // From the verdict, not the text: the empty sentence is the receipt's
        // own count line there, never a `FAIL:` line.
        let failures = &report.verdict.lines;
        let passed = report.exit_code == 0;
        let verdict = if passed { "pass" } else { "fail" };
        let mut text = report.text.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let run = match &report.source {
            Some(Source::Run { id, .. }) => Some(id.clone()),
            _ => None,
        };
        let note = run
            .as_ref()
            .filter(|_| report.receipt.integrity.status != IntegrityStatus::Verified)
            .map(|id| finished_run_note(id, !self.key.is_empty()));
        if let Some(id) = &run {
            text.push_str(&format!("ledger: run {id} of the state dir\n"));
        }
        if let Some(note) = &note {
            text.push_str(&format!("note: {note}\n"));
        }
        text.push_str(&format!(
            "verdict: {verdict} (exit code {}, as `veris receipt` would exit)",
            report.exit_code
        ));
        let structured = json!({
            "verdict": verdict,
            "exit_code": report.exit_code,
            "failures": failures,
            "run": run,
            "note": note,
            "receipt": receipt,
        });
        result(text, structured, !passed)
    }

    #[tool(
        name = "veris_runs",
        output_schema = schema::runs(),
        annotations(read_only_hint = true, idempotent_hint = true, open_world_hint = false),
        description = "The `veris run` runs of this state dir, newest first: id, start, command and the verdict of each run's own ledger. Read this way a finished run is `unverified` (its seal key lived only in the run's memory); pass a run's id as `run` to veris_receipt to read it, or use veris_run to get a `verified` receipt."
    )]
    async fn veris_runs(&self, Parameters(_): Parameters<NoParams>) -> CallToolResult {
        let runs = crate::cmd::runs::list(&self.state_dir, RUNS_LISTED).await;
        let mut text = String::new();
        for r in runs.as_array().into_iter().flatten() {
            text.push_str(&format!(
                "run {} started {} integrity {} requests {} command {}\n",
                r["id"].as_str().unwrap_or_default(),
                r["started"]
                    .as_str()
                    .map_or("-".into(), |s| veris_receipt::quote::token(s).into_owned()),
                r["verdict"]["integrity"].as_str().unwrap_or("-"),
                r["verdict"]["requests"]
                    .as_u64()
                    .map_or("-".into(), |n| n.to_string()),
                r["command_text"].as_str().unwrap_or("-"),
            ));
        }
        if text.is_empty() {
            text = crate::runtime::ledgers::what_is_there(&self.state_dir);
        } else {
            text.push_str("Each verdict is read without a pin: a finished run is `unverified`, because its seal key lived only in the run's memory. The command is what the run wrote at its start (not sealed).");
        }
        result(
            text,
            json!({ "verdict": "pass", "exit_code": 0, "runs": runs }),
            false,
        )
    }

    #[tool(
        name = "veris_run",
        output_schema = schema::run(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false),
        description = "Run a command under `veris run` (its own proxy and twin, sealed by a key held only in memory) and return its receipt, judged against the requirements: the way to a `verified` receipt. A failed requirement, an empty receipt or failed integrity is an error result with exit_code 3; otherwise exit_code is the command's. The command runs with no stdin; the tails of its stdout and stderr are returned as its output (its words, not veris's)."
    )]
    async fn veris_run(&self, Parameters(p): Parameters<RunParams>) -> CallToolResult {
        if p.command.is_empty() || p.command[0].is_empty() {
            let e = anyhow::anyhow!("`command` is empty. Next: pass the program and its arguments, e.g. [\"python3\", \"charge.py\"]");
            return failure("veris_run", EXIT_USAGE, &e);
        }
        let _one = self.running.lock().await;
        match run_command(&self.state_dir, &p).await {
            Ok((text, structured, failed)) => result(text, structured, failed),
            Err(e) => failure("veris_run", EXIT_USAGE, &e),
        }
    }

    #[tool(
        name = "veris_check",
        output_schema = schema::check(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
        description = "Is the veris proxy of this state dir live and on the interception path? Asks it for its canary the way intercepted traffic travels (as `veris check`); a failure is an error result with exit_code 2."
    )]
    async fn veris_check(&self, Parameters(_): Parameters<NoParams>) -> CallToolResult {
        match check(&self.state_dir).await {
            Ok((outcome, structured)) => {
                let failed = outcome.exit_code != 0;
                result(outcome.message, structured, failed)
            }
            Err(e) => failure("veris_check", EXIT_CHECK_FAILED, &e),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Veris {
    /// rmcp's call, with one change: a wrong argument name or type (which
    /// rmcp answers as an error result with text only) gets the structured
    /// shape of every other failure, so an agent reads it the same way.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let tool = request.name.to_string();
        let ctx = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        let response = self.tool_router.call(ctx).await?;
        Ok(match response {
            rmcp::model::CallToolResponse::Complete(r)
                if r.is_error == Some(true) && r.structured_content.is_none() =>
            {
                let said: Vec<&str> = r
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                    .collect();
                let e = anyhow::anyhow!(
                    "{}. Next: call it with the arguments its inputSchema names (tools/list)",
                    said.join(" ")
                );
                failure(&tool, EXIT_USAGE, &e).into()
            }
            other => other,
        })
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("veris", env!("CARGO_PKG_VERSION"))
                    .with_title("veris receipts"),
            )
            .with_instructions(
                "Proves which vendor API calls really reached the twin. Call veris_baseline before the work, then veris_receipt with since=<the baseline> and require=[\"SERVICE:N\"]; trust only a result that is not an error. veris_check tells whether the proxy is live. veris_run runs a command under its own proxy and returns its receipt (verified when all checks pass); veris_runs lists earlier runs.",
            )
    }
}

/// `veris check` for the live proxy of `state_dir`: the probe along the
/// proxy's interception path must be answered with its canary (and with
/// `$VERIS_CANARY` when set: this environment's run, as `veris receipt`).
async fn check(state_dir: &Path) -> Result<(crate::cmd::check::Outcome, Value)> {
    let live = match live::discover(state_dir).await {
        Discovery::Live(l) => l,
        Discovery::Unusable(why) => anyhow::bail!("{why}"),
        Discovery::NotLive => anyhow::bail!(
            "no live veris proxy for state dir {} (no {} there, or nothing answers at it). Next: start the proxy with this state dir (`veris serve --state-dir {}`), or start `veris mcp --state-dir DIR` with the proxy's state dir",
            state_dir.display(),
            live::ADDR_FILE,
            state_dir.display()
        ),
    };
    let status = live
        .status()
        .await
        .context("asking the live proxy for its status")?;
    let path = crate::runtime::checks::probe_path(status.tier, &status.proxy_url);
    let expected = std::env::var("VERIS_CANARY")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| status.canary.clone());
    let answer = veris_proxy::canary::probe(&path, CHECK_TIMEOUT).await;
    let outcome = crate::cmd::check::judge(&path, Some(&expected), answer);
    let structured = json!({
        "verdict": if outcome.exit_code == 0 { "pass" } else { "fail" },
        "exit_code": outcome.exit_code,
        "live": true,
        "probe": path.describe(),
        "run_id": outcome.answer.as_ref().map(|a| a.run_id.clone()),
        "sandbox_id": outcome.answer.as_ref().map(|a| a.sandbox_id.clone()),
        "listener": outcome.answer.as_ref().map(|a| json!(a.tier)),
        "mode": outcome.answer.as_ref().map(|a| json!(a.mode)),
    });
    Ok((outcome, structured))
}

/// Runs listed by `veris_runs`, newest first.
const RUNS_LISTED: usize = 20;

/// What a receipt of a finished run read from the state dir can and cannot say.
fn finished_run_note(id: &str, pinned: bool) -> String {
    let why = if pinned {
        "the key this server pins (--key) is not the one that sealed it"
    } else {
        "nothing pins its seal key, which lived only in the run's memory and ended with it, so nothing the workload could not have written anchors the file"
    };
    format!("run {id} is finished and read from its ledger file: its integrity is `unverified` at best, because {why}. For a `verified` receipt, run the command through veris_run, or start this server with --key set to the fingerprint the run printed.")
}

/// The `veris_run` time limit when none is given, and the most it may be.
const RUN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
const RUN_TIMEOUT_MAX: u64 = 3600;
/// After the limit: how long the run gets to end its command and write its
/// receipt after SIGTERM, and after a second one (which ends an isolated
/// command's namespace), before SIGKILL.
const RUN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
/// Bytes of the report, and of each tail of the command's output, kept.
const REPORT_CAP: u64 = 64 * 1024 * 1024;
const OUTPUT_TAIL: usize = 16 * 1024;

/// `veris run` of `p.command` on `state_dir`, as a child of this server:
/// the run's report comes back on a pipe of its own (`--report-fd 3`),
/// closed on exec inside the run, so nothing the command prints can pose
/// as it. Returns the text, the structured result and whether it failed.
async fn run_command(state_dir: &Path, p: &RunParams) -> Result<(String, Value, bool)> {
    use std::os::fd::AsRawFd;
    let limit = p
        .timeout_secs
        .map(|s| std::time::Duration::from_secs(s.clamp(1, RUN_TIMEOUT_MAX)))
        .unwrap_or(RUN_TIMEOUT);
    let exe = std::env::current_exe().context("finding the veris binary")?;
    let (reader, writer) = std::io::pipe().context("making the report pipe")?;
    // dup2 onto the same number would keep close-on-exec.
    let writer = if writer.as_raw_fd() == REPORT_FD {
        writer.try_clone().context("moving the report pipe")?
    } else {
        writer
    };
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("run")
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--report-fd")
        .arg(REPORT_FD.to_string());
    for (flag, values) in [
        ("--require", &p.require),
        ("--require-host", &p.require_host),
        ("--require-request", &p.require_request),
        ("--require-callback", &p.require_callback),
        ("--webhook", &p.webhook),
    ] {
        for v in values {
            cmd.arg(flag).arg(v);
        }
    }
    if p.allow_empty {
        cmd.arg("--allow-empty");
    }
    if p.require_verified {
        cmd.arg("--require-verified");
    }
    cmd.arg("--")
        .args(&p.command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    crate::os::fd::pass_fd(&mut cmd, writer.as_raw_fd(), REPORT_FD);
    // A run killed at the limit leaves its command's processes to us.
    if let Err(e) = crate::os::procs::become_subreaper() {
        tracing::warn!(error = %e, "veris mcp: cannot become the subreaper of veris_run's processes");
    }
    let mut child = cmd.spawn().context("starting `veris run`")?;
    drop(writer);
    let pid = child.id();
    let report = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut bytes = Vec::new();
        reader
            .take(REPORT_CAP)
            .read_to_end(&mut bytes)
            .map(|_| bytes)
    });
    let stdout = tail(child.stdout.take());
    let stderr = tail(child.stderr.take());
    let mut timed_out = false;
    let status = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status?,
        Err(_) => {
            timed_out = true;
            tracing::warn!(
                limit_secs = limit.as_secs(),
                "veris mcp: veris_run hit its time limit; stopping it"
            );
            stop(&mut child, pid).await?
        }
    };
    let ended = tokio::task::spawn_blocking(|| {
        crate::os::procs::end_descendants(
            std::time::Duration::from_millis(500),
            std::time::Duration::from_secs(5),
        )
    })
    .await
    .unwrap_or_default();
    let bytes = report.await.context("reading the run's report")??;
    let (stdout, stderr) = (
        stdout.await.unwrap_or_default(),
        stderr.await.unwrap_or_default(),
    );
    let output = json!({
        "stdout_tail": String::from_utf8_lossy(&stdout),
        "stderr_tail": String::from_utf8_lossy(&stderr),
    });
    let limit_note = timed_out.then(|| {
        format!(
            "the run hit its time limit of {} s and was stopped",
            limit.as_secs()
        )
    });
    let leftovers = (!ended.left.is_empty()).then(|| {
        format!(
            "{} process(es) of the run could not be ended",
            ended.left.len()
        )
    });
    let report: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => {
            let why = match (&limit_note, status.code()) {
                (Some(n), _) => format!("{n} before it could write its receipt"),
                (None, code) => {
                    format!("`veris run` ended (exit {code:?}) without a readable report")
                }
            };
            anyhow::bail!(
                "{why}. Next: give it a longer timeout_secs, or look at its output: {}",
                veris_receipt::quote::quoted(&String::from_utf8_lossy(&stderr))
            );
        }
    };
    if let Some(error) = report["error"].as_str() {
        let exit = report["exit_code"]
            .as_u64()
            .unwrap_or(u64::from(EXIT_USAGE));
        let text = format!("veris_run: {error}");
        return Ok((
            text.clone(),
            json!({"verdict": "error", "exit_code": exit, "error": text, "output": output}),
            true,
        ));
    }
    let exit = report["exit_code"]
        .as_u64()
        .unwrap_or(u64::from(EXIT_USAGE));
    let verdict_exit = report["verdict_exit"].as_u64().unwrap_or(3);
    let passed = verdict_exit == 0 && !timed_out;
    let mut text = report["text"].as_str().unwrap_or_default().to_string();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "ledger: {} (seal key {})\n",
        report["ledger"].as_str().unwrap_or_default(),
        report["key_id"].as_str().unwrap_or_default()
    ));
    for n in limit_note.iter().chain(leftovers.iter()) {
        text.push_str(&format!("note: {n}\n"));
    }
    text.push_str(&format!(
        "verdict: {} (exit code {exit}, as `veris run` would exit; the command exited {})",
        if passed { "pass" } else { "fail" },
        report["command_exit"]
    ));
    let structured = json!({
        "verdict": if passed { "pass" } else { "fail" },
        "exit_code": exit,
        "command_exit": report["command_exit"],
        "failures": report["failures"],
        "timed_out": timed_out,
        "ledger": report["ledger"],
        "seal_key": report["key_id"],
        "receipt": report["receipt"],
        "output": output,
    });
    Ok((text, structured, !passed))
}

/// The descriptor a `veris run` started by `veris_run` writes its report to.
const REPORT_FD: i32 = 3;

/// Stops a run past its limit: SIGTERM (the run passes it to its command,
/// then seals and reports), a second SIGTERM after [`RUN_GRACE`] (which
/// ends an isolated command's namespace), then SIGKILL to the run's group.
async fn stop(
    child: &mut tokio::process::Child,
    pid: Option<u32>,
) -> Result<std::process::ExitStatus> {
    for _ in 0..2 {
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).context("the run's pid")?,
                rustix::process::Signal::TERM,
            );
        }
        if let Ok(status) = tokio::time::timeout(RUN_GRACE, child.wait()).await {
            return Ok(status?);
        }
    }
    if let Some(pid) = pid {
        let _ = crate::os::procs::kill_group(pid, rustix::process::Signal::KILL);
    }
    Ok(child.wait().await?)
}

/// The last [`OUTPUT_TAIL`] bytes of a child's output, read to its end.
fn tail(out: Option<impl AsyncRead + Unpin + Send + 'static>) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut kept = Vec::new();
        let Some(mut out) = out else { return kept };
        let mut buf = vec![0u8; 8192];
        while let Ok(n) = out.read(&mut buf).await {
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buf[..n]);
            if kept.len() > 2 * OUTPUT_TAIL {
                kept.drain(..kept.len() - OUTPUT_TAIL);
            }
        }
        if kept.len() > OUTPUT_TAIL {
            kept.drain(..kept.len() - OUTPUT_TAIL);
        }
        kept
    })
}

/// How long the check's probe may take (`veris check`'s default).
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A tool result: the text for a person or model, the same facts as JSON
/// (structured content, and as a second text block for clients that show
/// only text).
fn result(text: String, structured: Value, is_error: bool) -> CallToolResult {
    let json_text = serde_json::to_string_pretty(&structured).unwrap_or_default();
    let mut r = if is_error {
        CallToolResult::structured_error(structured)
    } else {
        CallToolResult::structured(structured)
    };
    r.content = vec![ContentBlock::text(text), ContentBlock::text(json_text)];
    r
}

/// A tool that could not run: an error result naming the exit code the
/// command would have returned and what to do next.
fn failure(tool: &str, exit_code: u8, e: &anyhow::Error) -> CallToolResult {
    let message = format!("{tool}: {e:#}");
    tracing::warn!(error = %message, "veris mcp: tool failed");
    let structured = json!({
        "verdict": "error",
        "exit_code": exit_code,
        "error": message,
    });
    result(message, structured, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_arguments_name_no_ledger_or_key_and_refuse_unknown_ones() {
        let schema = serde_json::to_value(schemars::schema_for!(ReceiptParams)).unwrap();
        let props = schema["properties"].as_object().unwrap();
        for p in [
            "since",
            "all",
            "service",
            "require",
            "require_verified",
            "run",
        ] {
            assert!(props.contains_key(p), "{p}: {schema}");
        }
        for p in ["ledger", "key", "state_dir"] {
            assert!(!props.contains_key(p), "{p}: {schema}");
        }
        assert_eq!(schema["additionalProperties"], false, "{schema}");
        assert!(serde_json::from_value::<ReceiptParams>(json!({"skip_integrity": true})).is_err());
        let p: ReceiptParams = serde_json::from_value(json!({"require": ["stripe:1"]})).unwrap();
        assert_eq!(p.require, ["stripe:1"]);
        assert!(!p.require_verified && !p.all && p.since.is_none());
    }

    #[test]
    fn a_failed_tool_is_an_error_result_with_the_exit_code() {
        let r = failure(
            "veris_check",
            2,
            &anyhow::anyhow!("no proxy. Next: start one"),
        );
        assert_eq!(r.is_error, Some(true));
        let s = r.structured_content.unwrap();
        assert_eq!(s["exit_code"], 2);
        assert_eq!(s["verdict"], "error");
        assert!(r.content[0]
            .as_text()
            .is_some_and(|t| t.text.contains("Next: start one")));
    }
}
