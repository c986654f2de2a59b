//! `veris runs`: the runs of a state dir, newest first, each with its
//! start, its command and the verdict its own ledger gives.
//!
//! Everything listed is what the state dir holds, and the workload can
//! write there: the start is the `ts` of the run's session line, the
//! command is what the run wrote in `run.json` at its start (not sealed,
//! shown quoted), and the verdict is built from the run's ledger exactly as
//! `veris receipt --run ID` builds it, with no pin: a finished run reads
//! `unverified`, since its seal key lived only in its process's memory.
//! Work per run is bounded: a ledger over [`VERDICT_CAP`] bytes is listed
//! without a verdict, and only the newest `--limit` runs are judged.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde_json::{json, Value};
use veris_receipt::quote;

use crate::runtime::ledgers::RunInfo;
use crate::runtime::receipt::{ReceiptArgs, RequireArgs, WindowArgs};

/// Ledgers larger than this are listed without a verdict.
pub const VERDICT_CAP: u64 = 16 * 1024 * 1024;

#[derive(Args, Debug)]
pub struct RunsArgs {
    /// State dir whose runs to list [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the list as JSON.
    #[arg(long)]
    pub json: bool,
    /// List the newest N runs (0: all of them).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub limit: usize,
}

pub async fn runs(args: RunsArgs) -> Result<u8> {
    let state_dir = crate::util::state_dir(args.state_dir);
    let listed = list(&state_dir, args.limit).await;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&listed)?);
        return Ok(0);
    }
    if listed.as_array().is_some_and(|a| a.is_empty()) {
        crate::outln!("{}", crate::runtime::ledgers::what_is_there(&state_dir));
        return Ok(0);
    }
    crate::outln!("RUN               STARTED                   VERDICT     REQUESTS  COMMAND");
    for r in listed.as_array().into_iter().flatten() {
        let verdict = r["verdict"]["integrity"]
            .as_str()
            .or(r["unreadable"].as_str().map(|_| "unreadable"))
            .unwrap_or("-");
        let requests = r["verdict"]["requests"]
            .as_u64()
            .map_or("-".to_string(), |n| n.to_string());
        crate::outln!(
            "{:<16}  {:<24}  {:<10}  {:<8}  {}",
            r["id"].as_str().unwrap_or_default(),
            r["started"]
                .as_str()
                .map_or("-".into(), |s| quote::token(s).into_owned()),
            verdict,
            requests,
            r["command_text"].as_str().unwrap_or("-"),
        );
        for key in ["unreadable", "not_computed"] {
            if let Some(why) = r[key].as_str() {
                crate::outln!("    {}: {}", key.replace('_', " "), quote::escaped(why));
            }
        }
    }
    crate::outln!(
        "Verdicts are read from each run's ledger without a pin: a finished run is `unverified` (its seal key lived only in its process's memory). For `verified`, pin the key the run printed: `veris receipt --run ID --key FINGERPRINT`. The command is what the run wrote at its start (run.json, not sealed)."
    );
    Ok(0)
}

/// The runs of `state_dir`, newest first, at most `limit` (0: all), as
/// JSON objects: `id`, `started`, `command` (argv), `command_text` (quoted),
/// `ledger`, and `verdict` {`integrity`, `reason`, `requests`, `exit_code`},
/// or `unreadable` / `not_computed` saying why there is none.
pub async fn list(state_dir: &std::path::Path, limit: usize) -> Value {
    let mut runs = crate::runtime::ledgers::list_runs(state_dir);
    if limit > 0 {
        runs.truncate(limit);
    }
    let mut out = Vec::new();
    for r in &runs {
        out.push(entry(state_dir, r).await);
    }
    Value::Array(out)
}

async fn entry(state_dir: &std::path::Path, r: &RunInfo) -> Value {
    let mut v = json!({
        "id": r.id,
        "started": r.started,
        "command": r.command,
        "command_text": r.command_text(),
        "ledger": r.ledger,
        "verdict": null,
    });
    if let Some(why) = &r.unusable {
        v["unreadable"] = json!(why);
        return v;
    }
    let size = std::fs::symlink_metadata(&r.ledger).map_or(0, |m| m.len());
    if size > VERDICT_CAP {
        v["not_computed"] = json!(format!(
            "the ledger holds {size} bytes, over the listing's {VERDICT_CAP}: read it with `veris receipt --run {}`",
            r.id
        ));
        return v;
    }
    let args = ReceiptArgs {
        window: WindowArgs {
            state_dir: Some(state_dir.to_path_buf()),
            run: Some(r.id.clone()),
            ..WindowArgs::default()
        },
        json: true,
        junit: None,
        junit_suite: None,
        require: RequireArgs::default(),
        stream: Default::default(),
    };
    match crate::runtime::receipt::build(&args).await {
        Ok(report) => {
            let requests: u64 = report.receipt.services.values().map(|s| s.requests).sum();
            v["verdict"] = json!({
                "integrity": report.receipt.integrity.status,
                "reason": report.receipt.integrity.reason,
                "requests": requests,
                "exit_code": report.exit_code,
            });
        }
        Err(e) => v["unreadable"] = json!(format!("{e:#}")),
    }
    v
}
