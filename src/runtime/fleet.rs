//! Publishing ledgers to NATS JetStream (`--nats`, DESIGN §14): the flags
//! `serve` and `gateway` share, starting a publisher for a ledger, and
//! recording in the ledger that the stream refused its lines (a fork, or a
//! full stream) and that a refusal passed, which the receipt then reports.
//! The publishing itself is `veris_fleet`'s.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use veris_fleet::publish::{Publisher, Watch};
use veris_fleet::{Fleet, Limits, Settings};
use veris_receipt::ledger::Ledger;
use veris_receipt::{CheckLine, Entry};

/// Seconds a stopping veris waits for its ledgers' last lines to reach the
/// stream (what is left is in the file; the next start publishes it).
pub const FLUSH_GRACE: Duration = Duration::from_secs(5);

#[derive(Args, Clone, Debug, Default)]
pub struct NatsArgs {
    /// Publish every committed ledger line (seals included) to NATS
    /// JetStream at this URL (nats://HOST:PORT, or tls://), off the request
    /// path; the ledger file stays the source of truth.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// NATS credentials for --nats: a .creds file (user JWT and nkey seed),
    /// or a file holding only a user nkey seed (SU…), as
    /// deploy/nats/nats-server.conf names the gateway's user. A user and
    /// password go in the URL (nats://USER:PASS@HOST:PORT).
    #[arg(long, value_name = "FILE", requires = "nats")]
    pub nats_creds: Option<PathBuf>,
    /// JetStream stream for --nats, created when missing (subjects
    /// veris.ledger.> and veris.checkpoint.>, file storage, discard new).
    #[arg(long, value_name = "NAME", default_value = veris_fleet::DEFAULT_STREAM, requires = "nats")]
    pub nats_stream: String,
    /// This veris's name in the subjects it publishes on
    /// (veris.ledger.SANDBOX.NAME) [default: the host name].
    #[arg(long, value_name = "NAME", requires = "nats")]
    pub nats_name: Option<String>,
    /// Bytes the stream may hold when veris creates it; a full stream
    /// refuses lines (reported in /status and the metrics), never drops old ones.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30, requires = "nats")]
    pub nats_max_bytes: i64,
    /// Seconds a message is kept when veris creates the stream (0: forever).
    #[arg(long, value_name = "SECS", default_value_t = 0, requires = "nats")]
    pub nats_max_age: u64,
}

impl NatsArgs {
    /// Connects (in the background: an unreachable server delays nothing)
    /// when `--nats` was given.
    pub async fn connect(&self) -> Result<Option<Fleet>> {
        let Some(url) = &self.nats else {
            return Ok(None);
        };
        let gateway = match &self.nats_name {
            Some(name) => name.clone(),
            None => host_name(),
        };
        let settings = Settings {
            url: url.clone(),
            creds: self.nats_creds.clone(),
            stream: self.nats_stream.clone(),
            gateway,
            limits: Limits {
                max_bytes: self.nats_max_bytes,
                max_age: Duration::from_secs(self.nats_max_age),
                ..Limits::default()
            },
        };
        let fleet = Fleet::connect(settings)
            .await
            .context("starting to publish to NATS (--nats). Next: check the URL, --nats-creds and --nats-name")?;
        Ok(Some(fleet))
    }
}

/// Starts publishing `ledger` as `sandbox`'s.
fn publish(fleet: &Fleet, ledger: &Arc<Ledger>, sandbox: &str) -> Result<Publisher> {
    Publisher::start(fleet, ledger.clone(), sandbox)
        .with_context(|| format!("publishing the ledger of sandbox {sandbox} to NATS"))
}

/// A ledger's publisher (a gateway's sandbox's, or a serve's): its state
/// for `/status` and the metrics, its refusals recorded in the ledger, and
/// its final drain.
pub struct Publishing {
    publisher: Mutex<Option<Publisher>>,
    watch: Watch,
    /// The ledger's newest `publish` line says `refused`.
    recorded: AtomicBool,
}

impl Publishing {
    pub fn start(fleet: &Fleet, ledger: &Arc<Ledger>, sandbox: &str) -> Result<Publishing> {
        let publisher = publish(fleet, ledger, sandbox)?;
        Ok(Publishing {
            watch: publisher.watch(),
            publisher: Mutex::new(Some(publisher)),
            recorded: AtomicBool::new(false),
        })
    }

    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// Records in the ledger, as a `publish` check line, each change of
    /// the stream's answer: `refused` when it refuses the ledger's lines (a
    /// fork, for good: veris stops publishing; a full stream or a line over
    /// its message size: veris retries every 30 s), `resumed` when a
    /// refusal that could pass did (the lines the file held meanwhile were
    /// sent, in order). The receipt's `publishing` is the newest refusal
    /// not resumed, read live or from the file after the proxy is gone.
    /// Called on the seal timer and before the final seal: at most one
    /// line per change, and the stream's answer changes at most every 30 s.
    pub fn record_refusal(&self, ledger: &Ledger, since: u64) {
        let s = self.watch.state();
        let recorded = self.recorded.load(Ordering::SeqCst);
        let (status, detail) = match (&s.refused, recorded) {
            (Some(why), false) => {
                let next = if s.fork {
                    "veris stopped publishing it"
                } else {
                    "veris retries every 30 s; the lines wait in the ledger file"
                };
                (
                    "refused",
                    format!(
                        "the NATS stream refused this ledger's lines on {} after seq {}, and {next}: {why}",
                        s.subject, s.published_seq
                    ),
                )
            }
            (None, true) if !s.fork => (
                "resumed",
                format!(
                    "the NATS stream accepts this ledger's lines on {} again: published through seq {}",
                    s.subject, s.published_seq
                ),
            ),
            _ => return,
        };
        if self.recorded.swap(status == "refused", Ordering::SeqCst) != recorded {
            return;
        }
        let line = Entry::Check(CheckLine {
            name: veris_receipt::receipt::PUBLISH_CHECK.into(),
            status: status.into(),
            detail,
            since_seq: since,
            until_seq: ledger.head().0,
        });
        if let Err(e) = ledger.append(line) {
            tracing::warn!(subject = %s.subject, error = %e, "cannot record the stream's answer in the ledger");
        }
    }

    /// Waits up to [`FLUSH_GRACE`] for the ledger's last lines (its final
    /// seal) to reach the stream, then stops publishing. False when some
    /// did not (they are in the file).
    pub async fn finish(&self) -> bool {
        let publisher = self
            .publisher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match publisher {
            Some(p) => p.finish(FLUSH_GRACE).await,
            None => true,
        }
    }
}

/// What `/status` shows of a publisher.
pub fn status_of(watch: Watch) -> Arc<dyn Fn() -> serde_json::Value + Send + Sync> {
    Arc::new(move || serde_json::to_value(watch.state()).unwrap_or_default())
}

/// The host name as a subject token: what is not a letter, digit, `-` or
/// `_` becomes `-`.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let token: String = name
        .trim()
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if token.is_empty() {
        "veris".into()
    } else {
        token
    }
}
