//! The fleet's shared storage on NATS JetStream (DESIGN §14): every
//! committed ledger line of every sandbox, seals included, published to a
//! stream off the request path (the local file stays the source of truth
//! and the spool), read back for receipts, and the sandbox registry the
//! gateways share.
//!
//! - [`Fleet`]: one connection per veris process (a `serve` or a gateway);
//!   it creates the stream when it is missing ([`Limits`]).
//! - [`publish::Publisher`]: one task per ledger, publishing it in order on
//!   `veris.ledger.<sandbox>.<gateway>` and its seal lines on
//!   `veris.checkpoint.<sandbox>.<gateway>`; its [`publish::State`] is what
//!   `/status` and the metrics show.
//! - [`stream_read`]: one sandbox's chains, per gateway, and their latest
//!   checkpoints, read with an ordered consumer (the stream receipt's input).
//! - [`follow`]: the fleet's ledger messages live, from a start time on
//!   (`veris tui --nats`).
//! - [`read`]: a subject's messages one by one, as the stream holds them
//!   (tests compare them with the ledger file).
//! - [`registry::Registry`]: the fleet's sandbox registry, a key-value
//!   bucket every gateway writes and follows.
//!
//! Message shape: the payload is one or more ledger lines, each with its
//! `\n`, byte for byte as in the file; headers name the chain
//! ([`HEADER_LEDGER`], the first 16 hex digits of its first line's hash, so
//! a new chain after a ledger was moved aside never collides with the old)
//! and the seqs ([`HEADER_FIRST`], [`HEADER_LAST`]); `Nats-Msg-Id` is
//! `<ledger id>.<first seq>-<last seq>`.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, stream};

pub mod follow;
pub mod metrics;
pub mod publish;
pub mod read;
pub mod registry;
pub mod stream_read;

/// The stream's default name.
pub const DEFAULT_STREAM: &str = "VERIS_LEDGERS";
/// Header: the ledger id (16 hex digits) of the lines in the message.
pub const HEADER_LEDGER: &str = "Veris-Ledger";
/// Header: seq of the message's first line.
pub const HEADER_FIRST: &str = "Veris-First-Seq";
/// Header: seq of the message's last line.
pub const HEADER_LAST: &str = "Veris-Last-Seq";

/// Subject of a sandbox's ledger lines as published by one gateway.
pub fn ledger_subject(sandbox: &str, gateway: &str) -> String {
    format!("veris.ledger.{sandbox}.{gateway}")
}

/// Subject of the chain heads (seal lines) of a sandbox's ledger as
/// published by one gateway.
pub fn checkpoint_subject(sandbox: &str, gateway: &str) -> String {
    format!("veris.checkpoint.{sandbox}.{gateway}")
}

/// A name usable as one subject token: letters, digits, `-` and `_`, 1 to
/// 64 of them (no `.`, `*`, `>` or spaces, which NATS gives a meaning).
pub fn check_token(what: &str, name: &str) -> Result<(), FleetError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(FleetError::Token {
            what: what.to_string(),
            name: name.to_string(),
        })
    }
}

/// The stream's limits when veris creates it (an existing stream is used
/// as it is). Discard policy `new`: a full stream refuses publishes, which
/// veris reports, rather than deleting old lines no reader was told about.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes the stream may hold (`--nats-max-bytes`, default 1 GiB).
    pub max_bytes: i64,
    /// Age after which messages are removed (`--nats-max-age`, 0 = never).
    pub max_age: Duration,
    /// The server's duplicate window for `Nats-Msg-Id` (2 minutes).
    pub duplicate_window: Duration,
    /// Largest message (1 MiB, the server's default `max_payload`).
    pub max_message_size: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 1 << 30,
            max_age: Duration::ZERO,
            duplicate_window: Duration::from_secs(120),
            max_message_size: 1 << 20,
        }
    }
}

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `nats://host:port` (or `tls://`), comma-separated for a cluster.
    pub url: String,
    /// A `.creds` file (user JWT and nkey seed), or a file holding only a
    /// user nkey seed.
    pub creds: Option<PathBuf>,
    pub stream: String,
    /// This veris's name in subjects (a subject token).
    pub gateway: String,
    pub limits: Limits,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(
        "{what} {name:?} cannot name a NATS subject token: use 1 to 64 letters, digits, '-' or '_'"
    )]
    Token { what: String, name: String },
    #[error("reading the NATS credentials file {path}")]
    Creds {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to NATS at {url}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
}

/// A user and password in the URL (`nats://USER:PASS@HOST:PORT`, the
/// first of a comma-separated list that has one): the client crate reads
/// them only from its options, and would connect without them.
pub(crate) fn with_url_user(
    options: async_nats::ConnectOptions,
    urls: &str,
) -> async_nats::ConnectOptions {
    let user = urls
        .split(',')
        .filter_map(|u| u.trim().parse::<async_nats::ServerAddr>().ok())
        .find_map(|a| Some((a.username()?.to_string(), a.password()?.to_string())));
    match user {
        Some((user, pass)) => options.user_and_password(user, pass),
        None => options,
    }
}

/// The user nkey seed a `--nats-creds` file holds when it holds nothing
/// else (one `SU…` line, comments aside); `None` for a `.creds` file.
fn nkey_seed(text: &str) -> Option<String> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("//"));
    let seed = lines.next()?;
    (seed.starts_with("SU") && lines.next().is_none()).then(|| seed.to_string())
}

/// A connection to NATS and the JetStream context publishers share.
#[derive(Clone)]
pub struct Fleet {
    js: jetstream::Context,
    settings: std::sync::Arc<Settings>,
}

impl Fleet {
    /// Starts connecting. Returns at once even when the server is down: the
    /// client keeps trying in the background (the ledger file is the spool
    /// meanwhile), and publishers report the outage in their state.
    pub async fn connect(settings: Settings) -> Result<Fleet, FleetError> {
        check_token("the stream name", &settings.stream)?;
        check_token("the gateway name", &settings.gateway)?;
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("veris {}", settings.gateway))
            .retry_on_initial_connect()
            .max_reconnects(None)
            // Bounded by operations, not bytes: one publish per ledger is in
            // flight at a time, so this bounds nothing veris relies on.
            .client_capacity(1024)
            .reconnect_delay_callback(|attempt| {
                Duration::from_millis((100u64 << attempt.min(5)).min(2000))
            });
        if let Some(path) = &settings.creds {
            let creds = |source| FleetError::Creds {
                path: path.clone(),
                source,
            };
            let text = std::fs::read_to_string(path).map_err(creds)?;
            options = match nkey_seed(&text) {
                // A user nkey's seed alone: the server's config names the
                // user by its public key (deploy/nats/nats-server.conf).
                Some(seed) => options.nkey(seed),
                // A `.creds` file: the user's JWT and its seed (operator mode).
                None => options.credentials_file(path).await.map_err(creds)?,
            };
        }
        let client = with_url_user(options, &settings.url)
            .connect(settings.url.as_str())
            .await
            .map_err(|source| FleetError::Connect {
                url: settings.url.clone(),
                source,
            })?;
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .build(client);
        Ok(Fleet {
            js,
            settings: std::sync::Arc::new(settings),
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub(crate) fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The stream, created with [`Limits`] when missing.
    pub(crate) async fn stream(&self) -> Result<stream::Stream, String> {
        let s = &self.settings;
        let config = stream::Config {
            name: s.stream.clone(),
            description: Some("veris ledger lines and chain heads".into()),
            subjects: vec!["veris.ledger.>".into(), "veris.checkpoint.>".into()],
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::New,
            max_bytes: s.limits.max_bytes,
            max_age: s.limits.max_age,
            duplicate_window: s.limits.duplicate_window,
            max_message_size: s.limits.max_message_size,
            allow_direct: true,
            ..Default::default()
        };
        self.js
            .get_or_create_stream(config)
            .await
            .map_err(|e| format!("stream {}: {e}", s.stream))
    }
}
