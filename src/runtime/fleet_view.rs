//! `veris tui --nats URL`: the fleet's live view. Wires the stream's
//! follower ([`veris_fleet::follow`]) to the TUI's fleet view, and gives
//! the drilled-in sandbox the receipt `veris receipt --nats URL --sandbox
//! ID [--key …]` builds, by the same function, so the two never disagree.
//!
//! The stream is storage (DESIGN §7a): the fleet view itself verifies
//! nothing and never says `verified`; its header says how to get a
//! verdict. Only a drilled-in sandbox's receipt, checked against the keys
//! the user pinned, can be `verified`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use veris_fleet::follow::{Followed, Pattern, Start};
use veris_fleet::stream_read::Reader;
use veris_tui::{FleetEvent, FleetOptions, Message};

use crate::runtime::receipt::{ReceiptArgs, WindowArgs};
use crate::runtime::stream_receipt::StreamArgs;

/// How long a drilled-in sandbox's receipt waits for each gateway's
/// checkpoint stored after the read began (a live gateway seals every
/// second): without one its chain is not known complete.
const RECEIPT_WAIT_SECS: f64 = 2.0;

/// What the fleet view reads.
pub struct FleetView {
    pub url: String,
    pub creds: Option<PathBuf>,
    pub stream: String,
    pub pattern: Option<String>,
    pub start: Start,
    /// `--key`, as `veris receipt` takes them.
    pub keys: Vec<String>,
    /// `--fleet-key`: operator keys that certify gateways' seal keys.
    pub fleet_keys: Vec<String>,
}

/// Parses `--since`: `all` (the whole stream) or a duration back from now.
pub fn parse_start(text: &str) -> Result<Start, String> {
    let text = text.trim();
    if text == "all" {
        return Ok(Start::All);
    }
    let (num, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad --since {text:?}; expected e.g. 30s, 15m, 2h or all"))?;
    let secs = match unit {
        "s" | "" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => {
            return Err(format!(
                "bad --since {text:?}; expected e.g. 30s, 15m, 2h or all"
            ))
        }
    };
    Ok(Start::Recent(Duration::from_secs(secs)))
}

impl FleetView {
    /// Connects (a wrong URL, credentials or stream fails here, before the
    /// terminal is taken) and returns the TUI's options and its feed.
    pub async fn open(
        self,
        rows: usize,
        receipt_every: Duration,
    ) -> Result<(
        FleetOptions,
        impl FnOnce(tokio::sync::mpsc::Sender<FleetEvent>) -> FeedFuture,
    )> {
        let pattern = Pattern::parse(self.pattern.as_deref())
            .map_err(anyhow::Error::msg)
            .context(
                "--sandbox with --nats. Next: name one sandbox id, or a pattern such as 'ci-*'",
            )?;
        // The keys are checked now, not at the first Enter.
        crate::runtime::stream_receipt::pins(&self.keys)?;
        let reader = Reader::connect(&self.url, self.creds.as_deref(), &self.stream)
            .await
            .map_err(anyhow::Error::msg)
            .context("following the fleet on NATS (--nats). Next: check the URL, --nats-creds and --nats-stream")?;
        let integrity = if self.keys.is_empty() && self.fleet_keys.is_empty() {
            format!(
                "integrity: unverified (no key pinned; veris receipt --nats {} --sandbox ID --key …)",
                self.url
            )
        } else {
            "integrity: not checked in this list (the stream is storage); Enter checks a sandbox's seals against the pinned keys".to_string()
        };
        let since = match self.start {
            Start::All => "whole stream".to_string(),
            Start::Recent(d) => format!("since {}s ago", d.as_secs()),
        };
        let via = format!("nats {} stream {} · {since}", self.url, self.stream);
        let stream = StreamArgs {
            nats: Some(self.url.clone()),
            nats_creds: self.creds.clone(),
            nats_stream: self.stream.clone(),
            nats_wait: RECEIPT_WAIT_SECS,
            fleet_key: self.fleet_keys.clone(),
        };
        let keys = self.keys.clone();
        let receipt: veris_tui::run::SandboxReceipt = Arc::new(move |sandbox: String| {
            let args = ReceiptArgs {
                window: WindowArgs {
                    sandbox: Some(sandbox),
                    key: keys.clone(),
                    ..Default::default()
                },
                json: false,
                junit: None,
                junit_suite: None,
                require: Default::default(),
                stream: stream.clone(),
            };
            Box::pin(async move {
                crate::runtime::stream_receipt::build(&args)
                    .await
                    .map(|report| report.receipt)
                    .map_err(|e| format!("{e:#}"))
            })
        });
        let options = FleetOptions {
            via,
            rows,
            sandboxes: veris_tui::fleet::DEFAULT_SANDBOXES,
            integrity,
            receipt,
            receipt_every,
        };
        let start = self.start;
        let feed = move |tx| -> FeedFuture { Box::pin(feed(reader, pattern, start, tx)) };
        Ok((options, feed))
    }
}

pub type FeedFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Follows the stream and turns what it reads into the view's events.
async fn feed(
    reader: Reader,
    pattern: Pattern,
    start: Start,
    tx: tokio::sync::mpsc::Sender<FleetEvent>,
) {
    let (ftx, mut frx) = tokio::sync::mpsc::channel(256);
    let via = format!("nats stream {}", reader.stream_name());
    let follower = tokio::spawn(veris_fleet::follow::follow(reader, pattern, start, ftx));
    let mut attempt = 0;
    while let Some(f) = frx.recv().await {
        let ev = match f {
            Followed::Message {
                sandbox,
                gateway,
                ledger_id,
                stored_ms,
                payload,
                ..
            } => FleetEvent::Message(Message {
                sandbox,
                gateway,
                ledger_id,
                stored_ms,
                payload: payload.to_vec(),
            }),
            Followed::Malformed { stream_seq } => {
                tracing::debug!(
                    stream_seq,
                    "skipped a message on a subject that names no sandbox"
                );
                FleetEvent::Malformed
            }
            Followed::Live => {
                attempt = 0;
                FleetEvent::Connection(veris_tui::Connection {
                    state: veris_tui::ConnState::Live,
                    via: via.clone(),
                })
            }
            Followed::Failed(error) => {
                attempt += 1;
                FleetEvent::Connection(veris_tui::Connection {
                    state: veris_tui::ConnState::Reconnecting { attempt, error },
                    via: via.clone(),
                })
            }
        };
        if tx.send(ev).await.is_err() {
            break;
        }
    }
    follower.abort();
    // The TUI takes the feed's end for a failure: end only when the
    // follower stopped by itself (a panic), never when the TUI left.
    if tx.is_closed() {
        std::future::pending::<()>().await;
    }
}
