//! `veris receipt`, and the requirement flags `run` shares with it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use veris_receipt::ledger::{self, LedgerRead};
use veris_receipt::receipt::{self, Options, Receipt, Requirement};

#[derive(Args, Clone, Debug, Default)]
pub struct RequireArgs {
    /// Require at least N requests of SERVICE (repeatable): SERVICE[:N].
    #[arg(long = "require", value_name = "SERVICE[:N]")]
    pub require: Vec<String>,
    /// Require at least N requests to HOST (repeatable): HOST[:N].
    #[arg(long = "require-host", value_name = "HOST[:N]")]
    pub require_host: Vec<String>,
    /// Require one request (repeatable): 'SERVICE METHOD /path'.
    #[arg(long = "require-request", value_name = "'SERVICE METHOD /path'")]
    pub require_request: Vec<String>,
    /// Do not fail when no request reached the twin.
    #[arg(long)]
    pub allow_empty: bool,
}

impl RequireArgs {
    pub fn parse(&self) -> Result<Vec<Requirement>> {
        let mut out = Vec::new();
        for s in &self.require {
            out.push(Requirement::parse_service(s).context("--require")?);
        }
        for s in &self.require_host {
            out.push(Requirement::parse_host(s).context("--require-host")?);
        }
        for s in &self.require_request {
            out.push(Requirement::parse_request(s).context("--require-request")?);
        }
        Ok(out)
    }
}

#[derive(Args, Debug)]
pub struct ReceiptArgs {
    /// State dir whose ledger to read [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR", conflicts_with = "ledger")]
    pub state_dir: Option<PathBuf>,
    /// Ledger file to read.
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Only lines after this seq.
    #[arg(long, value_name = "SEQ")]
    pub since: Option<u64>,
    /// Only this service.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// Print the receipt as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub require: RequireArgs,
}

/// A built receipt and the verdict on it.
pub struct Report {
    pub receipt: Receipt,
    pub text: String,
    pub exit_code: u8,
}

/// Builds, renders and judges a receipt. The verdict lines follow the text.
pub fn report(
    read: &LedgerRead,
    options: &Options,
    reqs: &[Requirement],
    allow_empty: bool,
) -> Report {
    let receipt = receipt::build(read, options);
    let mut text = receipt::render_text(&receipt);
    let verdict = receipt::evaluate(&receipt, reqs, allow_empty);
    if !verdict.lines.is_empty() {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        for line in &verdict.lines {
            // The empty sentence is already the receipt's own count line.
            if line != receipt::EMPTY_SENTENCE || !text.contains(receipt::EMPTY_SENTENCE) {
                text.push_str(&format!("FAIL: {line}\n"));
            }
        }
    }
    Report {
        receipt,
        text,
        exit_code: u8::try_from(verdict.exit_code).unwrap_or(3),
    }
}

pub async fn receipt(args: ReceiptArgs) -> Result<u8> {
    let reqs = args.require.parse()?;
    let path = match &args.ledger {
        Some(p) => p.clone(),
        None => crate::state_dir(args.state_dir.clone()).join("ledger.jsonl"),
    };
    if !path.exists() {
        bail!(
            "no ledger at {}. Next: run the proxy (`veris serve` or `veris run -- CMD`) with this state dir, or pass --ledger FILE",
            path.display()
        );
    }
    let read = ledger::read(&path).with_context(|| format!("reading ledger {}", path.display()))?;
    let options = Options {
        since: args.since,
        service: args.service.clone(),
        proxy_live: false,
    };
    let report = report(&read, &options, &reqs, args.require.allow_empty);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.receipt)?);
        // Verdict lines still reach a person, on stderr.
        for line in report.text.lines().filter(|l| l.starts_with("FAIL: ")) {
            eprintln!("{line}");
        }
    } else {
        print!("{}", report.text);
    }
    Ok(report.exit_code)
}
