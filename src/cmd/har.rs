//! `veris har`: the receipt's window as a HAR 1.2 document, for HAR viewers
//! and devtools. The receipt is built exactly as `veris receipt` builds it
//! (`runtime::receipt::build_with`: same window rules, same live checks, same
//! integrity verdict), and the HAR (`veris_receipt::har`) is folded over the
//! same lines in the same pass, so it shows exactly what the verdict was
//! reached on. The exit code is the receipt's with no requirement and an
//! empty window allowed: 0, or 3 when integrity failed or a vendor host
//! refused the veris certificate (the HAR is still written, its
//! `log.comment` says why); 1 when no HAR could be made. With `--nats` the
//! window is a sandbox's from the NATS stream, as `veris receipt --nats`
//! reads it: each gateway's chain folded into its receipt and its HAR in
//! one pass, the HARs merged in time order (`_veris.gateway` on each entry).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use veris_receipt::har::HarBuilder;
use veris_receipt::receipt::CheckStatus;

use crate::runtime::receipt::{ReceiptArgs, RequireArgs, WindowArgs};
use crate::runtime::stream_receipt::StreamArgs;

#[derive(Args, Debug)]
pub struct HarArgs {
    #[command(flatten)]
    pub window: WindowArgs,
    /// Write the HAR to FILE (replaced atomically) instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Add the bodies captured with `--capture-bodies DIR` (redacted): each
    /// only when its file is the one the sealed ledger names by SHA-256;
    /// otherwise the entry says why not (`body_altered`, `body_missing`,
    /// `not_captured: …`). Bodies are never evidence for the verdict.
    #[arg(long, value_name = "DIR", conflicts_with = "nats")]
    pub bodies: Option<PathBuf>,
    #[command(flatten)]
    pub stream: StreamArgs,
}

pub async fn har(args: HarArgs) -> Result<u8> {
    let receipt_args = ReceiptArgs {
        window: args.window.clone(),
        json: true,
        junit: None,
        junit_suite: None,
        require: RequireArgs {
            allow_empty: true,
            ..RequireArgs::default()
        },
        stream: args.stream.clone(),
    };
    // One pass over the file for both: the HAR holds exactly the lines the
    // receipt's verdict was reached on, whatever happens to the file after.
    let (report, mut har) = if args.stream.nats.is_some() {
        let (report, har) =
            crate::runtime::stream_receipt::build_with_har(&receipt_args, true).await?;
        (report, har.context("the stream read made no HAR")?)
    } else {
        let mut har = HarBuilder::new(args.window.service.as_deref());
        let report = crate::runtime::receipt::build_with(&receipt_args, |line, fold| {
            har.line(line, fold.window_so_far())
        })
        .await?;
        let har = har.finish(&report.receipt);
        (report, har)
    };
    if let Some(note) = report.note() {
        eprintln!("{note}");
    }
    if let Some(dir) = &args.bodies {
        har.attach_bodies(dir);
    }
    let mut json = serde_json::to_string_pretty(&har).context("encoding the HAR")?;
    json.push('\n');
    match &args.output {
        // 0600, as the JSON receipt: it may hold captured (redacted) bodies.
        Some(out) => veris_ca::fsutil::write_file(out, json.as_bytes(), 0o600).with_context(|| {
            format!(
                "writing the HAR to {}. Next: pass -o a file path in a directory that exists and is writable",
                out.display()
            )
        })?,
        None => crate::out!("{json}"),
    }
    // A torn last line is not in the HAR: say so where a person sees it.
    for c in &report.receipt.integrity.checks {
        if c.name == "tail" && c.status != CheckStatus::Ok {
            eprintln!(
                "veris: {}: the ledger ends in a line a crash cut short, left out of the HAR. Next: start the proxy on this state dir once (it moves the torn line aside), or read it with `veris receipt`",
                c.detail
            );
        }
    }
    for line in report.text.lines().filter(|l| l.starts_with("FAIL: ")) {
        eprintln!("{line}");
    }
    if report.exit_code != 0 {
        eprintln!("Next: read the whole verdict with `veris receipt` and the same window flags");
    }
    if let Some(out) = &args.output {
        eprintln!(
            "veris: wrote {} HAR entr{} to {}",
            har.log.entries.len(),
            if har.log.entries.len() == 1 {
                "y"
            } else {
                "ies"
            },
            out.display()
        );
    }
    Ok(report.exit_code)
}
