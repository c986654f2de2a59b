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
//! whoever configures the agent's MCP client.
//!
//! stdout carries protocol messages only; logs go to stderr. A line on stdin
//! that is not JSON is dropped with a warning on stderr and the session
//! goes on (JSON-RPC has no id to answer it with; rmcp and the other official
//! SDKs ignore such lines too, and the warning makes it visible).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::check::EXIT_CHECK_FAILED;
use crate::live::{self, Discovery};
use crate::receipt_cmd::{ReceiptArgs, RequireArgs, WindowArgs};
use crate::EXIT_USAGE;

#[derive(Args, Debug)]
pub struct McpArgs {
    /// State dir of the proxy the tools report on [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Pin the proxy's seal key (its fingerprint, the `key_id` of its ready file, or a file
    /// holding it) for every receipt: a proxy found through the state dir that seals with
    /// another key fails. Set by whoever configures the server, never by a tool argument.
    #[arg(long, value_name = "FINGERPRINT|FILE")]
    pub key: Option<String>,
}

/// `veris mcp`: serves until the client closes stdin.
pub async fn mcp(args: McpArgs) -> Result<u8> {
    if let Some(k) = &args.key {
        crate::receipt_cmd::parse_pin(k)?;
    }
    let server = Veris {
        state_dir: crate::state_dir(args.state_dir),
        key: args.key,
        tool_router: Veris::tool_router(),
    };
    tracing::info!(state_dir = %server.state_dir.display(), "veris mcp: serving on stdio");
    let running = server
        .serve((json_lines(tokio::io::stdin()), tokio::io::stdout()))
        .await
        .context("starting the MCP session on stdio (the client must send `initialize` first)")?;
    let reason = running.waiting().await.context("the MCP session")?;
    tracing::info!(?reason, "veris mcp: session ended");
    Ok(0)
}

/// Bound on one message line, as rmcp's own.
const MAX_LINE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// `input` with every line that is not JSON (or is longer than [`MAX_LINE`])
/// left out, each with a warning on stderr; the rest is passed on unchanged.
fn json_lines(input: impl AsyncRead + Send + Unpin + 'static) -> impl AsyncRead {
    let (reader, mut writer) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut input = tokio::io::BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            let limit = (MAX_LINE + 1) as u64;
            let n = match (&mut input).take(limit).read_until(b'\n', &mut line).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(error = %e, "veris mcp: reading stdin");
                    break;
                }
            };
            if n > MAX_LINE && !line.ends_with(b"\n") {
                tracing::warn!(
                    max = MAX_LINE,
                    "veris mcp: ignored a line on stdin longer than the limit"
                );
                if skip_line(&mut input).await.is_err() {
                    break;
                }
                continue;
            }
            let body = line.trim_ascii();
            if body.is_empty() {
                continue;
            }
            if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                tracing::warn!(
                    bytes = body.len(),
                    error = %e,
                    "veris mcp: ignored a line on stdin that is not JSON; the session goes on"
                );
                continue;
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            if writer.write_all(&line).await.is_err() {
                break;
            }
        }
        // Dropping the writer is the end of input for the session.
    });
    reader
}

/// Reads up to and including the next newline, keeping nothing.
async fn skip_line(input: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> std::io::Result<()> {
    loop {
        let buf = input.fill_buf().await?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// The MCP server: which state dir it reports on, and its tools.
#[derive(Clone)]
pub struct Veris {
    state_dir: PathBuf,
    /// `--key`: the seal key every receipt is pinned to.
    key: Option<String>,
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
    /// Require at least N requests of a service answered 2xx: "SERVICE" (N = 1) or "SERVICE:N", e.g. "stripe:1"; a last word "status=CODE", "status=Nxx" or "status=any" counts other answers, e.g. "stripe:1 status=4xx".
    #[serde(default)]
    pub require: Vec<String>,
    /// Require at least N requests to a host answered 2xx (requests that reached the twin): "HOST" or "HOST:N", e.g. "api.stripe.com:2"; a last word "status=…" as for `require`.
    #[serde(default)]
    pub require_host: Vec<String>,
    /// Require one request answered 2xx: "SERVICE METHOD /path", e.g. "stripe POST /v1/charges" (one trailing slash does not matter); a last word "status=…" as for `require`, e.g. "stripe POST /v1/charges status=402".
    #[serde(default)]
    pub require_request: Vec<String>,
    /// Do not fail when no request reached the twin.
    #[serde(default)]
    pub allow_empty: bool,
    /// Fail unless integrity is `verified` (recommended: anything less cannot rule out a forged ledger).
    #[serde(default)]
    pub require_verified: bool,
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
        description = "Mark now, before the work whose calls you want to prove. Returns a baseline token; pass it as `since` to veris_receipt to cover exactly what happened after it. Writes nothing to the ledger."
    )]
    async fn veris_baseline(&self, Parameters(_): Parameters<NoParams>) -> CallToolResult {
        match crate::baseline::take(&self.state_dir, None).await {
            Ok(b) => {
                let token = b.token();
                let text = format!(
                    "baseline: {token}\nPass it as `since` to veris_receipt to see only what happens from now on."
                );
                let structured = json!({
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
        description = "What really reached the vendor twin (each request the proxy forwarded), with integrity and leaks, judged against requirements as `veris receipt` judges them. A failed requirement, an empty window or failed integrity is an error result (isError) with exit_code 3; use require_verified to also fail on anything short of `integrity: verified`."
    )]
    async fn veris_receipt(&self, Parameters(p): Parameters<ReceiptParams>) -> CallToolResult {
        if p.all && p.since.is_some() {
            let e = anyhow::anyhow!(
                "`since` and `all` exclude each other. Next: pass `since` (a baseline token) for one test run, or `all` for every session"
            );
            return failure("veris_receipt", EXIT_USAGE, &e);
        }
        let args = ReceiptArgs {
            window: WindowArgs {
                state_dir: Some(self.state_dir.clone()),
                ledger: None,
                since: p.since,
                all: p.all,
                key: self.key.clone(),
                service: p.service,
            },
            json: true,
            junit: None,
            require: RequireArgs {
                require: p.require,
                require_host: p.require_host,
                require_request: p.require_request,
                allow_empty: p.allow_empty,
                require_verified: p.require_verified,
            },
        };
        let report = match crate::receipt_cmd::build(&args).await {
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
        text.push_str(&format!(
            "verdict: {verdict} (exit code {}, as `veris receipt` would exit)",
            report.exit_code
        ));
        let structured = json!({
            "verdict": verdict,
            "exit_code": report.exit_code,
            "failures": failures,
            "receipt": receipt,
        });
        result(text, structured, !passed)
    }

    #[tool(
        name = "veris_check",
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
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("veris", env!("CARGO_PKG_VERSION"))
                    .with_title("veris receipts"),
            )
            .with_instructions(
                "Proves which vendor API calls really reached the twin. Call veris_baseline before the work, then veris_receipt with since=<the baseline> and require=[\"SERVICE:N\"]; trust only a result that is not an error. veris_check tells whether the proxy is live.",
            )
    }
}

/// `veris check` for the live proxy of `state_dir`: the probe along the
/// proxy's interception path must be answered with its canary (and with
/// `$VERIS_CANARY` when set: this environment's run, as `veris receipt`).
async fn check(state_dir: &Path) -> Result<(crate::check::Outcome, Value)> {
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
    let path = live::probe_path(status.tier, &status.proxy_url);
    let expected = std::env::var("VERIS_CANARY")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| status.canary.clone());
    let answer = crate::check::probe(&path, CHECK_TIMEOUT).await;
    let outcome = crate::check::judge(&path, Some(&expected), answer);
    let structured = json!({
        "verdict": if outcome.exit_code == 0 { "pass" } else { "fail" },
        "exit_code": outcome.exit_code,
        "live": true,
        "probe": path.describe(),
        "run_id": outcome.answer.as_ref().map(|a| a.run_id.clone()),
        "sandbox_id": outcome.answer.as_ref().map(|a| a.sandbox_id.clone()),
        "tier": outcome.answer.as_ref().map(|a| json!(a.tier)),
        "mode": outcome.answer.as_ref().map(|a| json!(a.mode)),
    });
    Ok((outcome, structured))
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

    #[tokio::test]
    async fn lines_that_are_not_json_are_dropped_and_the_rest_pass_unchanged() {
        let input: &'static [u8] = b"not json\n{\"a\":1}\r\n\n  \n{\"b\":\n[1, 2]\n{\"c\":2}";
        let mut out = String::new();
        json_lines(input).read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "{\"a\":1}\r\n[1, 2]\n{\"c\":2}\n");
    }

    #[tokio::test]
    async fn an_overlong_line_is_dropped_whole() {
        let mut input = vec![b'"'; MAX_LINE + 10];
        input.extend_from_slice(b"\n{\"ok\":true}\n");
        let mut out = String::new();
        json_lines(std::io::Cursor::new(input))
            .read_to_string(&mut out)
            .await
            .unwrap();
        assert_eq!(out, "{\"ok\":true}\n");
    }

    #[test]
    fn receipt_arguments_name_no_ledger_or_key_and_refuse_unknown_ones() {
        let schema = serde_json::to_value(schemars::schema_for!(ReceiptParams)).unwrap();
        let props = schema["properties"].as_object().unwrap();
        for p in ["since", "all", "service", "require", "require_verified"] {
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
