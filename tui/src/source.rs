//! Where rows come from, as tasks that turn a source into [`Event`]s:
//!
//! - [`SourceSpec::Ledger`]: follow a ledger file ([`crate::follow`]); the
//!   header's receipt is [`veris_receipt::receipt::build`] over a fresh read
//!   of the file.
//! - [`SourceSpec::Admin`]: the admin API's event stream and `GET /receipt`.
//! - [`SourceSpec::StateDir`]: the ledger the binary's rule picks in the
//!   state dir (a live `serve`'s `ledger.jsonl`, else the newest `veris
//!   run`'s), followed as a file and re-picked every second. Never the
//!   event stream of whatever `<state>/admin.addr` names: the workload may
//!   share the state dir's uid and plant that file for a server of its own,
//!   whose rows the ledger does not hold. For the same reason the binary
//!   passes a [`ReceiptHook`] that builds the header's receipt as `veris
//!   receipt --state-dir` does, and without one the file is read.
//!
//! Every source remembers the last seq it delivered and resumes after it
//! (`Last-Event-ID` for the event stream), and the app drops any seq it has
//! already seen, so reconnecting neither loses nor repeats rows. Sources
//! stop when the event channel closes.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, warn};
use veris_receipt::ledger;
use veris_receipt::receipt::{build, Options};

use crate::admin::{AdminError, Target};
use crate::app::{ConnState, Connection, Event};
use crate::follow::{Follower, Polled};

/// How often a ledger file is checked for growth while it is idle.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How often a state dir's ledger is picked again.
const REPICK_INTERVAL: Duration = Duration::from_secs(1);

/// Reconnect delays grow to this.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub enum SourceSpec {
    /// Follow this ledger file.
    Ledger(PathBuf),
    /// The admin API at this target.
    Admin(Target),
    /// Follow the ledger the function picks in this state dir (the
    /// binary's one rule for "which ledger"), re-picked every second.
    StateDir(PathBuf, LedgerPick),
}

/// Which ledger file of a state dir to follow.
pub type LedgerPick = fn(&Path) -> PathBuf;

/// A receipt the binary builds its own way, in place of the source's: the
/// header of `veris tui --sandbox` is the receipt `veris receipt --sandbox`
/// builds (the reader named the state dir a gateway's, which neither the
/// gateway's `GET /receipt` nor a bare file read can know), so the two
/// never disagree.
#[derive(Clone)]
pub struct ReceiptHook(Arc<dyn Fn() -> ReceiptFuture + Send + Sync>);

/// What a [`ReceiptHook`] returns: the receipt, or why there is none.
pub type ReceiptFuture =
    Pin<Box<dyn Future<Output = Result<veris_receipt::Receipt, String>> + Send>>;

impl ReceiptHook {
    pub fn new(build: impl Fn() -> ReceiptFuture + Send + Sync + 'static) -> ReceiptHook {
        ReceiptHook(Arc::new(build))
    }
}

impl std::fmt::Debug for ReceiptHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReceiptHook")
    }
}

impl SourceSpec {
    /// Words for the header before the first connection.
    /// Whether the proxy behind this source runs on this host, on our
    /// clock: a ledger file or state dir, or an admin API on loopback.
    pub fn same_host(&self) -> bool {
        match self {
            SourceSpec::Ledger(_) | SourceSpec::StateDir(..) => true,
            SourceSpec::Admin(t) => {
                let authority = t.authority();
                let host = authority
                    .rsplit_once(':')
                    .map_or(authority.as_str(), |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                host == "localhost"
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            SourceSpec::Ledger(p) => format!("file {}", p.display()),
            SourceSpec::Admin(t) => format!("admin {}", t.authority()),
            SourceSpec::StateDir(d, _) => format!("state {}", d.display()),
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    let ms = 250u64.saturating_mul(1 << attempt.min(5));
    Duration::from_millis(ms).min(MAX_BACKOFF)
}

/// Runs the line feed of `spec` until `tx` closes.
pub async fn feed(spec: SourceSpec, tx: mpsc::Sender<Event>) {
    let mut feed = Feed {
        tx,
        last_seq: 0,
        attempt: 0,
        shown: None,
    };
    match spec {
        SourceSpec::Ledger(path) => {
            let mut follower = Follower::new(path);
            while !feed.tx.is_closed() {
                if !feed.follow_step(&mut follower).await {
                    return;
                }
            }
        }
        SourceSpec::Admin(target) => {
            while !feed.tx.is_closed() {
                let err = feed.stream(&target).await;
                if !feed.retry(&target, err).await {
                    return;
                }
            }
        }
        SourceSpec::StateDir(dir, pick) => {
            let mut follower = Follower::new(pick(&dir));
            while !feed.tx.is_closed() {
                // A `veris run` that started since, or a `serve` that began
                // its ledger, changes the pick.
                let newest = pick(&dir);
                if newest != follower.path() {
                    let why = format!("following {}", newest.display());
                    follower = Follower::new(newest);
                    feed.last_seq = 0;
                    if !feed.send(Event::Reset(why)).await {
                        return;
                    }
                }
                let until = tokio::time::Instant::now() + REPICK_INTERVAL;
                while tokio::time::Instant::now() < until {
                    if !feed.follow_step(&mut follower).await {
                        return;
                    }
                }
            }
        }
    }
}

struct Feed {
    tx: mpsc::Sender<Event>,
    last_seq: u64,
    attempt: u32,
    /// The connection last reported, so repeats are not sent.
    shown: Option<Connection>,
}

impl Feed {
    async fn send(&self, ev: Event) -> bool {
        self.tx.send(ev).await.is_ok()
    }

    async fn set(&mut self, state: ConnState, via: String) -> bool {
        let c = Connection { state, via };
        if self.shown.as_ref() == Some(&c) {
            return true;
        }
        self.shown = Some(c.clone());
        self.send(Event::Connection(c)).await
    }

    /// Sends lines past `last_seq`; false when the app is gone.
    async fn deliver(&mut self, lines: Vec<veris_receipt::Line>) -> bool {
        let lines: Vec<_> = lines
            .into_iter()
            .filter(|l| l.seq > self.last_seq)
            .collect();
        if let Some(last) = lines.last() {
            self.last_seq = last.seq;
            return self.send(Event::Lines(lines)).await;
        }
        true
    }

    /// One poll of the file, then a pause if there was nothing more to read.
    async fn follow_step(&mut self, follower: &mut Follower) -> bool {
        let via = format!("file {}", follower.path().display());
        let polled = follower.poll();
        let idle = match polled {
            Ok(Polled::Missing) => {
                if !self
                    .set(
                        ConnState::Reconnecting {
                            attempt: 0,
                            error: "waiting for the ledger file".into(),
                        },
                        via,
                    )
                    .await
                {
                    return false;
                }
                true
            }
            Ok(Polled::Reset(why)) => {
                warn!(%why, "ledger file started over");
                self.last_seq = 0;
                if !self.send(Event::Reset(why)).await {
                    return false;
                }
                false
            }
            Ok(Polled::Lines { lines, bad, more }) => {
                if bad > 0 {
                    warn!(bad, "skipped ledger lines that do not parse");
                }
                if !self.set(ConnState::Live, via).await || !self.deliver(lines).await {
                    return false;
                }
                !more
            }
            Err(e) => {
                if !self
                    .set(
                        ConnState::Reconnecting {
                            attempt: 0,
                            error: format!("reading the ledger: {e}"),
                        },
                        via,
                    )
                    .await
                {
                    return false;
                }
                true
            }
        };
        if idle {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        true
    }

    /// Streams events until the stream fails; returns why.
    async fn stream(&mut self, target: &Target) -> AdminError {
        let via = format!("admin {}", target.authority());
        let mut events = match target.events(self.last_seq).await {
            Ok(e) => e,
            Err(e) => return e,
        };
        self.attempt = 0;
        if !self.set(ConnState::Live, via).await {
            return AdminError::Ended;
        }
        loop {
            match events.next_batch().await {
                Ok((lines, bad)) => {
                    if bad > 0 {
                        debug!(bad, "skipped events that are not ledger lines");
                    }
                    if !self.deliver(lines).await {
                        return AdminError::Ended;
                    }
                }
                Err(e) => return e,
            }
        }
    }

    /// Reports a failed stream and waits before the next attempt; false
    /// when the app is gone.
    async fn retry(&mut self, target: &Target, err: AdminError) -> bool {
        if self.tx.is_closed() {
            return false;
        }
        self.attempt = self.attempt.saturating_add(1);
        debug!(error = %err, attempt = self.attempt, "admin event stream failed");
        let state = ConnState::Reconnecting {
            attempt: self.attempt,
            error: err.short(),
        };
        if !self
            .set(state, format!("admin {}", target.authority()))
            .await
        {
            return false;
        }
        tokio::time::sleep(backoff(self.attempt)).await;
        true
    }
}

/// Answers receipt requests (one per `()` received) until either channel
/// closes: the `hook`'s receipt when there is one, else `GET /receipt` from
/// an admin API the user named, else a fresh read of the ledger file built
/// into a receipt.
pub async fn receipts(
    spec: SourceSpec,
    hook: Option<ReceiptHook>,
    mut requests: mpsc::Receiver<()>,
    tx: mpsc::Sender<Event>,
) {
    while requests.recv().await.is_some() {
        let result = match (&hook, &spec) {
            (Some(hook), _) => (hook.0)().await,
            (None, spec) => spec_receipt(spec).await,
        };
        let ev = match result {
            Ok(r) => Event::Receipt(Box::new(r)),
            Err(e) => Event::ReceiptError(e),
        };
        if tx.send(ev).await.is_err() {
            return;
        }
    }
}

/// The receipt a source gives by itself.
async fn spec_receipt(spec: &SourceSpec) -> Result<veris_receipt::Receipt, String> {
    match spec {
        SourceSpec::Admin(t) => t
            .receipt()
            .await
            .map_err(|e| format!("{e}. Next: check the admin URL and token, then press r")),
        SourceSpec::Ledger(p) => file_receipt(p.clone()).await,
        SourceSpec::StateDir(d, pick) => file_receipt(pick(d)).await,
    }
}

/// The receipt of a ledger file as `veris receipt --ledger` would build it:
/// seals are checked with the `ledger.pub` beside the file when there is one
/// (a hint: offline, with no pinned key, the verdict stays `unverified`).
async fn file_receipt(path: PathBuf) -> Result<veris_receipt::Receipt, String> {
    tokio::task::spawn_blocking(move || {
        let read = ledger::read(&path).map_err(|e| format!("reading the ledger: {e}"))?;
        let pub_path = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(veris_receipt::seal::PUB_FILE);
        let seal_keys = if pub_path.exists() {
            Some(
                veris_receipt::seal::PublicKeys::load(&pub_path)
                    .map_err(|e| format!("reading {}: {e}", pub_path.display()))?,
            )
        } else {
            None
        };
        let options = Options {
            hint_keys: seal_keys,
            ..Options::default()
        };
        Ok(build(&read, &options))
    })
    .await
    .map_err(|e| format!("reading the ledger: {e}"))?
}
