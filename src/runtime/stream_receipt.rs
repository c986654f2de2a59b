//! `veris receipt --nats URL --sandbox ID`: a sandbox's receipt from the
//! NATS stream (G2, DESIGN §14) instead of a state dir. Every gateway's
//! chain of the sandbox (`veris.ledger.ID.*`) is folded by the receipt
//! crate's own [`receipt::Builder`] as a ledger file would be (chain, seals
//! against the pinned keys, the window), then the per-gateway receipts are
//! merged: counts added, the listed requests interleaved by time.
//!
//! The stream is storage, never an anchor (DESIGN §7a): a gateway's part
//! can be `verified` only with its seal key pinned (`--key`, repeatable, or
//! certified for that gateway in the key bucket under the operator key
//! `--fleet-key` pins: [`veris_receipt::fleet_cert`]), and only when its
//! chain is complete: it ends in the gateway's final
//! seal, or the gateway's latest checkpoint was stored after this read
//! began (a stream sequence greater than the stream's last one at the
//! start: no clock involved) and is the line at its seq in the chain; that
//! checkpoint then anchors the part as a live proxy's fresh seal does, and
//! the window ends at it. Anything else is `unverified` with the reason.
//! Each check of a part is named `GATEWAY: check` in the merged integrity;
//! one failure anywhere fails the receipt.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use veris_fleet::stream_read::{Checkpoint, Chunk, GatewayChain, Reader, SandboxRead};
use veris_receipt::entry::{Entry, Line};
use veris_receipt::har::{Har, HarBuilder};
use veris_receipt::ledger::{line_hash, SealInfo};
use veris_receipt::receipt::{
    self, Anchor, Check, CheckStatus, Integrity, IntegrityStatus, LiveChannel, Options, Receipt,
    WindowSpec, JSON_ENTRY_CAP,
};
use veris_receipt::seal::{self, Pin, PublicKeys};

use crate::runtime::receipt::{judge, offered_keys, parse_pin, ReceiptArgs, Report};

/// Where to read a sandbox's ledgers from instead of a state dir.
#[derive(Args, Debug, Clone, Default)]
pub struct StreamArgs {
    /// Read the sandbox's (--sandbox) ledgers from NATS JetStream at this
    /// URL instead of a state dir: every gateway's chain, each verified
    /// with the pinned keys (--key, once per gateway process, or
    /// --fleet-key), merged by time.
    #[arg(long = "nats", value_name = "URL", requires = "sandbox", conflicts_with_all = ["state_dir", "ledger", "run", "since"])]
    pub nats: Option<String>,
    /// NATS credentials for --nats: a .creds file, or a file holding only a
    /// user nkey seed (a user and password go in the URL).
    #[arg(long = "nats-creds", value_name = "FILE", requires = "nats")]
    pub nats_creds: Option<PathBuf>,
    /// The stream the gateways publish to.
    #[arg(long = "nats-stream", value_name = "NAME", default_value = veris_fleet::DEFAULT_STREAM)]
    pub nats_stream: String,
    /// Wait up to SECS for every gateway to store a checkpoint after this
    /// read began: a live gateway's chain is complete only then (it
    /// checkpoints every second while it writes).
    #[arg(
        long = "nats-wait",
        value_name = "SECS",
        default_value_t = 0.0,
        requires = "nats"
    )]
    pub nats_wait: f64,
    /// With --nats: the fleet's operator key (the fingerprint `veris
    /// fleet-key new` printed, or its operator.pub; repeat during a
    /// rotation). A gateway's seal key counts as pinned for that gateway's
    /// chain when the bucket VERIS_KEYS holds its certificate chain to this
    /// key: one pin for the whole fleet, restarts included.
    #[arg(long = "fleet-key", value_name = "FP|FILE", requires = "nats")]
    pub fleet_key: Vec<String>,
}

/// What `--fleet-key` made of one gateway's chain: the seal keys certified
/// for it (its pin, with `--key`'s), and per seal key its chain offered,
/// certified or why not.
#[derive(Clone, Default)]
struct FleetPin {
    pin: Option<Pin>,
    /// Fingerprint → why it is not certified (`None`: it is).
    keys: BTreeMap<String, Option<String>>,
    /// A seal key certified for the gateway and written to the bucket after
    /// every certified key its chain offers: the gateway started since its
    /// chain's last session ([`started_since`]).
    started_since: Option<String>,
}

/// One gateway's chain as folded.
struct Part {
    gateway: String,
    receipt: Receipt,
    /// `ts` of each request line, by seq (sorted).
    times: Vec<(u64, [u8; 24])>,
    /// Hash of the chain's first line.
    first_hash: Option<String>,
    /// Seqs of the first and last line read.
    seqs: Option<(u64, u64)>,
    /// The `complete` check.
    complete: Check,
    /// Fingerprints of the seal keys its session lines name.
    key_ids: Vec<String>,
    /// Other checks of the stream's (another sandbox's chain, a copy).
    stream_checks: Vec<Check>,
    /// Older chains on the subject (a ledger moved aside): not in the receipt.
    older_chains: usize,
    /// Counts in the merge (not another sandbox's chain, not a copy).
    counts: bool,
    /// The stream sequence of the chain's first message.
    first_stream_seq: u64,
    /// The chain's window as a HAR (`veris har --nats`), folded with it.
    har: Option<Har>,
}

fn check(name: &str, status: CheckStatus, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
    }
}

/// The pins of every `--key`, as one.
pub fn pins(keys: &[String]) -> Result<Option<Pin>> {
    let mut out: Option<Pin> = None;
    for k in keys {
        let p = parse_pin(k)?;
        match &mut out {
            None => out = Some(p),
            Some(o) => {
                o.fingerprints.extend(p.fingerprints);
                o.keys.keys.extend(p.keys.keys);
                if o.key_file.is_none() {
                    o.key_file = p.key_file;
                }
            }
        }
    }
    Ok(out)
}

/// Seal keys of one chain looked up in the key bucket, at most.
const MAX_LOOKUPS: usize = 256;

/// The operator keys' fingerprints `--fleet-key` pins.
pub fn operator_pins(args: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for a in args {
        let p = parse_pin(a).context("--fleet-key")?;
        if p.key_file.is_some() {
            bail!("--fleet-key {a} is a private key file: the operator key stays offline, and a reader pins its fingerprint. Next: pass the fingerprint `veris fleet-key new` printed, or its operator.pub");
        }
        out.extend(p.fingerprints);
    }
    Ok(out)
}

/// Looks up, for each gateway's newest chain in `read`, the seal keys its
/// session lines offer in the key bucket, and keeps those certified for
/// that gateway under `operators` (added to `pin`, `--key`'s).
async fn fleet_pins(
    reader: &Reader,
    read: &SandboxRead,
    operators: &[String],
    pin: Option<&Pin>,
) -> BTreeMap<String, FleetPin> {
    use veris_receipt::fleet_cert::{entry_key, KeyEntry};
    let bucket = veris_fleet::registry::KEYS_BUCKET;
    let now = crate::runtime::fleet_identity::now_ms();
    let mut out = BTreeMap::new();
    for (gw, chain) in &read.gateways {
        // One lookup per session key, at most MAX_LOOKUPS a chain (whoever
        // can write the stream can make a chain name any number): the rest
        // read "not looked up".
        let offered: Vec<_> = offered(&newest_chain(chain).0)
            .iter()
            .filter_map(|k| PublicKeys::from_hex(k))
            .take(MAX_LOOKUPS)
            .collect();
        let names: Vec<String> = offered.iter().map(|k| entry_key(gw, &k.key_id)).collect();
        let found = reader.bucket_entries(bucket, &names).await;
        let mut f = FleetPin {
            pin: pin.cloned(),
            ..FleetPin::default()
        };
        let mut newest = None;
        for (i, k) in offered.iter().enumerate() {
            let verdict = match &found {
                Err(e) => Err(format!("the key bucket could not be read ({e})")),
                Ok(values) => match &values[i] {
                    Err(e) => Err(e.clone()),
                    Ok(None) => Err(format!("the bucket {bucket} holds no entry {}", names[i])),
                    Ok(Some((v, revision))) => {
                        let c = KeyEntry::certifies(v, operators, gw, &k.key_id, now);
                        if c.is_ok() {
                            newest = newest.max(Some(*revision));
                        }
                        c
                    }
                },
            };
            if let Ok(seal) = &verdict {
                let p = f.pin.get_or_insert_with(Pin::default);
                p.fingerprints.push(seal.key_id.clone());
                p.keys.keys.push(seal.clone());
            }
            f.keys.insert(k.key_id.clone(), verdict.err());
        }
        if let Some(newest) = newest {
            f.started_since = started_since(reader, gw, operators, newest, &f.keys).await;
        }
        out.insert(gw.clone(), f);
    }
    out
}

/// A seal key certified for `gateway` under `operators` whose bucket entry
/// is newer than `revision` (its chain's newest certified key), if any: the
/// gateway started since, and at each start it writes a session line to
/// every sandbox it holds, so a chain ending in a `shutdown` seal before
/// that start was cut (or its sandbox had left the gateway, which then
/// ends its chain with a `removed` seal). The bucket can only make a chain
/// say less here, so a key counts when certified at its own start.
async fn started_since(
    reader: &Reader,
    gateway: &str,
    operators: &[String],
    revision: u64,
    offered: &BTreeMap<String, Option<String>>,
) -> Option<String> {
    use veris_receipt::fleet_cert::{entry_key, KeyEntry};
    let bucket = veris_fleet::registry::KEYS_BUCKET;
    let prefix = entry_key(gateway, "");
    let keys = reader
        .bucket_keys(bucket, &prefix, MAX_LOOKUPS)
        .await
        .ok()?;
    let newer: Vec<String> = keys
        .into_iter()
        .filter(|k| !offered.contains_key(&k[prefix.len()..]))
        .collect();
    let found = reader.bucket_entries(bucket, &newer).await.ok()?;
    for (key, entry) in newer.iter().zip(found).rev() {
        let Ok(Some((value, rev))) = entry else {
            continue;
        };
        let Ok(e) = serde_json::from_slice::<KeyEntry>(&value) else {
            continue;
        };
        let fp = &key[prefix.len()..];
        if rev > revision
            && KeyEntry::certifies(&value, operators, gateway, fp, e.seal.started_ms).is_ok()
        {
            return Some(fp.to_string());
        }
    }
    None
}

/// The `fleet_key` check of a chain: the seal keys of the sessions in the
/// receipt's window, each certified or not.
fn fleet_check(
    gateway: &str,
    f: &FleetPin,
    sessions: &[(u64, String)],
    since: u64,
) -> Option<Check> {
    let at = sessions
        .iter()
        .rposition(|(seq, _)| *seq <= since.saturating_add(1))
        .unwrap_or(0);
    let inside: Vec<&String> = sessions.get(at..)?.iter().map(|(_, k)| k).collect();
    if inside.is_empty() {
        return None;
    }
    let mut not = Vec::new();
    for k in &inside {
        match f.keys.get(*k) {
            Some(None) => {}
            Some(Some(why)) => not.push(format!("seal key {k}: {why}")),
            None => not.push(format!(
                "seal key {k}: not looked up (over {MAX_LOOKUPS} session keys in one chain)"
            )),
        }
    }
    Some(if not.is_empty() {
        check(
            "fleet_key",
            CheckStatus::Ok,
            format!(
                "{} seal key(s) certified for {gateway} by the pinned operator key",
                inside.len()
            ),
        )
    } else {
        check(
            "fleet_key",
            CheckStatus::Unverified,
            format!(
                "not certified for {gateway} by the pinned operator key: {}. Next: start the gateway with --fleet-identity (an identity `veris fleet-key certify --gateway {gateway}` made), or pin its seal key (--key)",
                not.join("; ")
            ),
        )
    })
}

/// Builds and judges the stream receipt `args` ask for (`args.stream.nats`
/// set), printing nothing.
pub async fn build(args: &ReceiptArgs) -> Result<Report> {
    Ok(build_with_har(args, false).await?.0)
}

/// [`build`], and with `har` the window as one HAR: each gateway's chain
/// folded into its HAR in the same pass as its receipt, then merged.
pub async fn build_with_har(args: &ReceiptArgs, har: bool) -> Result<(Report, Option<Har>)> {
    let s = &args.stream;
    let Some(url) = &s.nats else {
        bail!("--nats is needed to read a receipt from the stream");
    };
    let Some(sandbox) = &args.window.sandbox else {
        bail!("--nats reads one sandbox's receipt: name it with --sandbox ID");
    };
    crate::tier::gateway::valid_id(sandbox)?;
    let sandbox = sandbox.as_str();
    let reqs = args.require.parse()?;
    let pin = pins(&args.window.key)?;
    let operators = operator_pins(&s.fleet_key)?;
    let mut reader = Reader::connect(url, s.nats_creds.as_deref(), &s.nats_stream)
        .await
        .map_err(anyhow::Error::msg)
        .context("reading the receipt from NATS (--nats). Next: check the URL, --nats-creds and --nats-stream")?;
    let wait = Duration::from_secs_f64(s.nats_wait.clamp(0.0, 600.0));
    let options = Options {
        scope: if args.window.all {
            WindowSpec::All
        } else {
            WindowSpec::LatestSession
        },
        service: args.window.service.clone(),
        pinned_key_file: pin.as_ref().and_then(|p| p.key_file.clone()),
        ..Options::default()
    };
    let stream = reader.stream_name().to_string();
    let report = |parts: Vec<Part>, read: &SandboxRead| {
        finish(
            parts,
            &stream,
            sandbox,
            pin.as_ref(),
            read,
            &reqs,
            args,
            har,
        )
    };
    let failed =
        |e: String| anyhow::anyhow!(e).context("reading the sandbox's ledgers from the stream");
    // With --fleet-key, each gateway's keys are known only from its
    // chain's session lines and the bucket: read into memory first.
    if !operators.is_empty() {
        let read = reader.sandbox(sandbox, wait).await.map_err(failed)?;
        let fleet = fleet_pins(&reader, &read, &operators, pin.as_ref()).await;
        let cx = Arc::new(Ctx {
            start_seq: read.start_seq,
            sandbox: sandbox.to_string(),
            pin: pin.clone(),
            options,
            gateways: BTreeMap::new(),
            fleet: Some(fleet),
            har,
        });
        let parts = {
            let read = read.clone();
            tokio::task::spawn_blocking(move || fold_all(&read, &cx))
                .await
                .context("folding the stream's chains")?
        };
        return Ok(report(parts, &read));
    }
    // Folded as the lines arrive, one thread per gateway.
    let mut read = reader.prepare(sandbox, wait).await.map_err(failed)?;
    let cx = Arc::new(Ctx {
        start_seq: read.start_seq,
        sandbox: sandbox.to_string(),
        pin: pin.clone(),
        options: options.clone(),
        gateways: read.gateways.clone(),
        fleet: None,
        har,
    });
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let folding = {
        let cx = cx.clone();
        tokio::task::spawn_blocking(move || dispatch(rx, &cx))
    };
    let lines = reader.read_lines(sandbox, read.end_seq, tx).await;
    let streamed = folding.await.context("folding the stream's chains")?;
    (read.messages, read.bytes) = lines.map_err(failed)?;
    let parts = match streamed {
        Some(parts) => parts,
        // A later session offered a pinned key the fold did not know at
        // its start (a gateway restarted): read again, all in memory.
        None => {
            read = reader.sandbox(sandbox, wait).await.map_err(failed)?;
            let cx = Arc::new(Ctx {
                start_seq: read.start_seq,
                gateways: BTreeMap::new(),
                ..Arc::unwrap_or_clone(cx)
            });
            let read = read.clone();
            tokio::task::spawn_blocking(move || fold_all(&read, &cx))
                .await
                .context("folding the stream's chains")?
        }
    };
    Ok(report(parts, &read))
}

/// The parts merged, judged and reported; with `har`, their HARs merged.
#[allow(clippy::too_many_arguments)]
fn finish(
    mut parts: Vec<Part>,
    stream: &str,
    sandbox: &str,
    pin: Option<&Pin>,
    read: &SandboxRead,
    reqs: &[veris_receipt::Requirement],
    args: &ReceiptArgs,
    har: bool,
) -> (Report, Option<Har>) {
    dedupe(&mut parts);
    let (text, json) = section(stream, sandbox, read, &parts);
    let hars: Vec<(String, Har)> = parts
        .iter_mut()
        .filter(|p| p.counts)
        .filter_map(|p| Some((p.gateway.clone(), p.har.take()?)))
        .collect();
    let merged = merge(parts, sandbox, pin);
    let mut report = judge(merged, reqs, args.require.allow_empty);
    let har = har.then(|| {
        let source = format!("NATS stream {stream}, sandbox {sandbox}");
        veris_receipt::har::merged(hars, &report.receipt, &source)
    });
    report.text = match report.text.find("\nFAIL: ") {
        Some(at) => format!("{}\n{text}{}", &report.text[..at], &report.text[at + 1..]),
        None => format!("{}{text}", report.text),
    };
    report.stream = Some(json);
    (report, har)
}

/// What every gateway's fold shares.
#[derive(Clone)]
struct Ctx {
    start_seq: u64,
    sandbox: String,
    pin: Option<Pin>,
    options: Options,
    /// The gateways and checkpoints the read's first part found.
    gateways: BTreeMap<String, GatewayChain>,
    /// With `--fleet-key`: per gateway, its pin.
    fleet: Option<BTreeMap<String, FleetPin>>,
    /// Fold each chain's HAR too.
    har: bool,
}

/// Folds each gateway's lines as they arrive from `rx`, one thread per
/// gateway; `None` when one must be folded again knowing all its keys.
fn dispatch(mut rx: tokio::sync::mpsc::Receiver<(String, Chunk)>, cx: &Ctx) -> Option<Vec<Part>> {
    let results: Vec<(Part, bool)> = std::thread::scope(|s| {
        let mut feeds = BTreeMap::new();
        while let Some((gw, chunk)) = rx.blocking_recv() {
            let (tx, _) = feeds.entry(gw.clone()).or_insert_with(|| {
                let (tx, rx) = sync_channel::<Chunk>(16);
                let checkpoint = cx.gateways.get(&gw).and_then(|g| g.checkpoint.clone());
                let handle = s.spawn(move || fold_feed(&gw, checkpoint.as_ref(), rx, cx));
                (tx, handle)
            });
            // A fold that ended early dropped its receiver: nothing to do.
            let _ = tx.send(chunk);
        }
        let mut out: Vec<(Part, bool)> = feeds
            .into_values()
            .map(|(tx, handle)| {
                drop(tx);
                handle
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e))
            })
            .collect();
        // Gateways with a checkpoint and no line in the stream.
        for (gw, chain) in &cx.gateways {
            if !out.iter().any(|(p, _)| &p.gateway == gw) {
                let empty = Chunks {
                    rest: Vec::new().into_iter(),
                    cur: Bytes::new(),
                };
                let (part, _) = fold(gw, chain.checkpoint.as_ref(), u64::MAX, 0, empty, &[], cx);
                out.push((part, false));
            }
        }
        out
    });
    if results.iter().any(|(_, again)| *again) {
        return None;
    }
    let mut parts: Vec<Part> = results.into_iter().map(|(p, _)| p).collect();
    parts.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    Some(parts)
}

/// A [`Read`] over one chain's messages as they arrive; a message of
/// another chain (another `Veris-Ledger`) ends it and waits in `next`.
struct Feed {
    rx: Receiver<Chunk>,
    id: String,
    cur: Bytes,
    next: Option<Chunk>,
}

impl Read for Feed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.recv() {
                Ok(c) if c.ledger_id == self.id => self.cur = c.payload,
                Ok(c) => {
                    self.next = Some(c);
                    return Ok(0);
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

/// Folds the newest chain a gateway's messages hold, as they arrive. The
/// keys a pin selects come from the chain's first message (its session
/// line); `true` when a later session line offered another pinned key.
fn fold_feed(
    gw: &str,
    checkpoint: Option<&Checkpoint>,
    rx: Receiver<Chunk>,
    cx: &Ctx,
) -> (Part, bool) {
    let Ok(mut first) = rx.recv() else {
        let empty = Chunks {
            rest: Vec::new().into_iter(),
            cur: Bytes::new(),
        };
        return (fold(gw, checkpoint, u64::MAX, 0, empty, &[], cx).0, false);
    };
    let first_stream_seq = first.stream_seq;
    let mut feed = Feed {
        rx,
        id: String::new(),
        cur: Bytes::new(),
        next: None,
    };
    let mut older = 0;
    loop {
        let offered = offered(std::slice::from_ref(&first.payload));
        feed.id = first.ledger_id.clone();
        feed.cur = first.payload.clone();
        let (part, seen) = fold(
            gw,
            checkpoint,
            first_stream_seq,
            older,
            &mut feed,
            &offered,
            cx,
        );
        if let Some(next) = feed.next.take() {
            older += 1;
            first = next;
            continue;
        }
        let again = cx.pin.as_ref().is_some_and(|pin| {
            let all: Vec<String> = offered.iter().chain(seen.iter()).cloned().collect();
            offered_keys(pin, &all, None).keys.len() > offered_keys(pin, &offered, None).keys.len()
        });
        return (part, again);
    }
}

/// Folds every gateway's chain read into memory, one thread each.
fn fold_all(read: &SandboxRead, cx: &Ctx) -> Vec<Part> {
    std::thread::scope(|s| {
        let handles: Vec<_> = read
            .gateways
            .values()
            .map(|chain| {
                s.spawn(move || {
                    let (payloads, older) = newest_chain(chain);
                    let offered = offered(&payloads);
                    let reader = Chunks {
                        rest: payloads.into_iter(),
                        cur: Bytes::new(),
                    };
                    let first = chain.chunks.first().map_or(u64::MAX, |c| c.stream_seq);
                    fold(
                        &chain.gateway,
                        chain.checkpoint.as_ref(),
                        first,
                        older,
                        reader,
                        &offered,
                        cx,
                    )
                    .0
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// One chain under two gateway names counts once: where the stream stored
/// it first (a copy is published later).
fn dedupe(parts: &mut [Part]) {
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| parts[i].first_stream_seq);
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for i in order {
        let p = &mut parts[i];
        let Some(h) = p.first_hash.clone() else {
            continue;
        };
        if let Some(other) = seen.get(&h) {
            p.counts = false;
            p.stream_checks.push(check(
                "copy",
                CheckStatus::Failed,
                format!("the stream holds this chain under gateway {other} too: a copy, not a gateway's own ledger"),
            ));
        } else {
            seen.insert(h, p.gateway.clone());
        }
    }
}

/// The payloads of the subject's newest chain (by `Veris-Ledger`, a hint:
/// the lines are verified) and how many other chains the subject holds.
fn newest_chain(chain: &GatewayChain) -> (Vec<Bytes>, usize) {
    let Some(id) = chain.chunks.last().map(|c| c.ledger_id.clone()) else {
        return (Vec::new(), 0);
    };
    let mut others: Vec<&str> = chain
        .chunks
        .iter()
        .filter(|c| c.ledger_id != id)
        .map(|c| c.ledger_id.as_str())
        .collect();
    others.sort_unstable();
    others.dedup();
    let payloads = chain
        .chunks
        .iter()
        .filter(|c| c.ledger_id == id)
        .map(|c| c.payload.clone())
        .collect();
    (payloads, others.len())
}

/// A [`Read`] over the payloads, one after the other.
struct Chunks {
    rest: std::vec::IntoIter<Bytes>,
    cur: Bytes,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rest.next() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

/// The raw public keys the chain's session lines offer (a pin selects
/// among them by fingerprint).
fn offered(payloads: &[Bytes]) -> Vec<String> {
    let session = veris_receipt::ledger::mentions(b"session");
    let mut out = Vec::new();
    for p in payloads {
        for l in p.split(|b| *b == b'\n').filter(|l| session(l)) {
            if let Ok(Line {
                entry: Entry::Session(s),
                ..
            }) = serde_json::from_slice::<Line>(l)
            {
                out.extend(s.public_key);
            }
        }
    }
    out
}

/// The checkpoint as the seal a live gateway would have handed a reader.
fn checkpoint_seal(line: &[u8]) -> Option<SealInfo> {
    let l: Line = serde_json::from_slice(line).ok()?;
    let Entry::Seal {
        sealed_seq,
        signature,
        key_id,
        reason,
    } = l.entry
    else {
        return None;
    };
    Some(SealInfo {
        seq: l.seq,
        sealed_seq,
        head: l.prev,
        signature,
        key_id,
        reason,
        line_hash: line_hash(line),
        tampered: None,
    })
}

/// Folds one chain from `reader` with the receipt crate's [`receipt::Builder`]:
/// the part and the public keys its session lines offered.
#[allow(clippy::too_many_arguments)]
fn fold(
    gateway: &str,
    checkpoint: Option<&Checkpoint>,
    first_stream_seq: u64,
    older_chains: usize,
    reader: impl Read + Send,
    offered: &[String],
    cx: &Ctx,
) -> (Part, Vec<String>) {
    let (start_seq, sandbox) = (cx.start_seq, cx.sandbox.as_str());
    let mut options = cx.options.clone();
    // The checkpoint anchors the part when it was stored after this read
    // began and a pinned key made it.
    let fresh = checkpoint
        .filter(|c| c.stream_seq > start_seq)
        .and_then(|c| checkpoint_seal(&c.line));
    let mut anchored_by_checkpoint = false;
    let fleet = cx
        .fleet
        .as_ref()
        .map(|m| m.get(gateway).cloned().unwrap_or_default());
    let pin = match &fleet {
        Some(f) => f.pin.as_ref(),
        None => cx.pin.as_ref(),
    };
    // Under --fleet-key a chain none of whose keys is certified (or
    // pinned) is unverified, not refused: a missing certificate says
    // nothing about the chain.
    let pin = pin.filter(|p| fleet.is_none() || !offered_keys(p, offered, None).is_empty());
    if let Some(pin) = pin {
        let keys = offered_keys(pin, offered, None);
        let live = fresh
            .as_ref()
            .and_then(|seal| Some((seal, keys.find(&seal.key_id)?)));
        options.anchor = match live {
            Some((seal, key)) => {
                anchored_by_checkpoint = true;
                options.until = Some(seal.seq);
                // The gateway records its twin cross-check before its
                // final seal; nothing the stream holds can stand in for it.
                options.external_checks.push(check(
                    "twin_cross_check",
                    CheckStatus::Unverified,
                    "the sandbox is live: its gateway records the twin cross-check before its final seal, and a reader of the stream cannot run it. Next: read again once the gateway closed the sandbox",
                ));
                Anchor::Live {
                    seal: seal.clone(),
                    public_key: veris_receipt::hash::hex(&key.raw),
                    channel: LiveChannel::Gateway,
                }
            }
            None => Anchor::Pinned(keys),
        };
    }
    let mut seen_keys = Vec::new();
    let mut sessions = Vec::new();
    let mut b = receipt::Builder::new(&options);
    let mut har = cx.har.then(|| HarBuilder::new(options.service.as_deref()));
    let mut times = Vec::new();
    let mut first_hash = None;
    let mut seqs: Option<(u64, u64)> = None;
    let mut last_line: Option<Line> = None;
    // The line at the checkpoint's seq and its hash.
    let cp = checkpoint.and_then(|c| Some((checkpoint_seal(&c.line)?.seq, line_hash(&c.line))));
    let mut at_checkpoint: Option<bool> = None;
    let read = veris_receipt::ledger::scan(
        reader,
        veris_receipt::ledger::PROBLEM_CAP,
        |line, hash, _| {
            b.line(line, hash);
            if let Some(h) = har.as_mut() {
                h.line(line, b.window_so_far());
            }
            if first_hash.is_none() {
                first_hash = Some(hash.to_string());
            }
            seqs = Some((seqs.map_or(line.seq, |s| s.0), line.seq));
            if let Entry::Session(s) = &line.entry {
                seen_keys.extend(s.public_key.clone());
                if let Some(k) = s.public_key.as_deref().and_then(PublicKeys::from_hex) {
                    sessions.push((line.seq, k.key_id));
                }
            }
            if let Entry::Request(_) = &line.entry {
                let mut ts = [0u8; 24];
                let n = line.ts.len().min(24);
                ts[..n].copy_from_slice(&line.ts.as_bytes()[..n]);
                times.push((line.seq, ts));
            }
            if let Some((seq, h)) = &cp {
                if line.seq == *seq {
                    at_checkpoint = Some(hash == h);
                }
            }
            last_line = Some(line.clone());
        },
    )
    .unwrap_or_default();
    let receipt = b.finish(&read);
    let har = har.map(|h| h.finish(&receipt));
    times.sort_unstable_by_key(|t| t.0);
    let last_seq = seqs.map_or(0, |s| s.1);
    let complete = complete_check(
        gateway,
        fleet.as_ref().and_then(|f| f.started_since.as_deref()),
        checkpoint,
        start_seq,
        last_line.as_ref(),
        last_seq,
        cp.as_ref().map(|c| c.0),
        at_checkpoint,
        anchored_by_checkpoint,
    );
    let mut stream_checks = Vec::new();
    if let Some(f) = &fleet {
        stream_checks.extend(fleet_check(gateway, f, &sessions, receipt.window.since_seq));
    }
    let mut counts = true;
    match &receipt.twin {
        Some(id) if id == sandbox => {}
        Some(id) => {
            counts = false;
            stream_checks.push(check(
                "sandbox",
                CheckStatus::Failed,
                format!("the chain on {} is sandbox {id}'s (its session line says so), not {sandbox}'s: it does not count for this one", veris_fleet::ledger_subject(sandbox, gateway)),
            ));
        }
        None if seqs.is_some() => {
            stream_checks.push(check(
                "sandbox",
                CheckStatus::Unverified,
                "no session line in the window names the sandbox",
            ));
        }
        None => {}
    }
    let part = Part {
        gateway: gateway.to_string(),
        receipt,
        times,
        first_hash,
        seqs,
        complete,
        key_ids: sessions.into_iter().map(|(_, k)| k).collect(),
        stream_checks,
        older_chains,
        counts,
        first_stream_seq,
        har,
    };
    (part, seen_keys)
}

/// Is the gateway's chain in the stream complete? `started_since`: a seal
/// key the gateway started with after the chain's last session
/// ([`started_since`]).
#[allow(clippy::too_many_arguments)]
fn complete_check(
    gateway: &str,
    started_since: Option<&str>,
    checkpoint_msg: Option<&Checkpoint>,
    start_seq: u64,
    last: Option<&Line>,
    last_seq: u64,
    checkpoint: Option<u64>,
    at_checkpoint: Option<bool>,
    anchored: bool,
) -> Check {
    let name = "complete";
    let Some(last) = last else {
        return check(
            name,
            CheckStatus::Unverified,
            match checkpoint {
                Some(s) => format!("the stream holds no line of this gateway's chain, yet its checkpoint names seq {s}: the lines were removed, or never stored"),
                None => "the stream holds no line of this gateway's chain".into(),
            },
        );
    };
    if let (Some(s), Some(false)) = (checkpoint, at_checkpoint) {
        return check(
            name,
            CheckStatus::Failed,
            format!("the stream's line at seq {s} is not the gateway's checkpoint: the stream's chain was altered, or forked"),
        );
    }
    if let Some(s) = checkpoint {
        if at_checkpoint.is_none() && s > last_seq {
            return check(
                name,
                CheckStatus::Unverified,
                format!("the gateway checkpointed seq {s}, but the stream's chain ends at seq {last_seq}: lines were removed from the stream, or are not stored yet"),
            );
        }
    }
    if let Entry::Seal { reason, .. } = &last.entry {
        if let (seal::SHUTDOWN, Some(key)) = (reason.as_str(), started_since) {
            return check(
                name,
                CheckStatus::Unverified,
                format!("the chain ends in a final seal at seq {last_seq}, but {gateway} started again since (seal key {key}, certified in the key bucket after every key of this chain), and at each start a gateway writes a session line to every sandbox it holds: lines of this chain were removed from the stream, or are not stored yet. Next: read again with --nats-wait SECS"),
            );
        }
        if seal::is_final(reason) {
            return check(
                name,
                CheckStatus::Ok,
                format!("the chain ends in the gateway's final seal ({reason}) at seq {last_seq}"),
            );
        }
    }
    match (checkpoint_msg, checkpoint) {
        (Some(c), Some(s)) if c.stream_seq > start_seq && anchored => check(
            name,
            CheckStatus::Ok,
            format!("the gateway's checkpoint at seq {s} was stored after this read began (stream seq {} > {start_seq}) and is the chain's line at that seq: the window ends there", c.stream_seq),
        ),
        (Some(c), Some(s)) if c.stream_seq > start_seq => check(
            name,
            CheckStatus::Unverified,
            format!("the gateway's checkpoint at seq {s} was stored after this read began, but no pinned key made it. Next: pin the key the gateway logged at its start (--key)"),
        ),
        (Some(c), Some(s)) => check(
            name,
            CheckStatus::Unverified,
            format!("no final seal, and the gateway's latest checkpoint (seq {s}, stream seq {}) is not newer than this read (stream seq {start_seq}): the stream may lack lines the gateway wrote since, or its tail was cut. Next: read again with --nats-wait SECS while the gateway writes, or after it closed the sandbox", c.stream_seq),
        ),
        _ => check(
            name,
            CheckStatus::Unverified,
            "no final seal and no checkpoint of this gateway in the stream: its tail may be missing",
        ),
    }
}

/// The `pins` check: each key pinned with `--key` names a session of a
/// chain read. A gateway writes a session line to every sandbox it holds at
/// each start, so a pinned key no chain names is a start whose lines the
/// stream lacks (cut back to an earlier final seal), or a key of no
/// gateway of this sandbox: either way the pins cannot vouch for the whole.
fn unused_pins(parts: &[Part], pin: Option<&Pin>) -> Option<Check> {
    let pin = pin?;
    let named: std::collections::BTreeSet<&str> = parts
        .iter()
        .filter(|p| p.counts)
        .flat_map(|p| p.key_ids.iter().map(String::as_str))
        .collect();
    let unused: Vec<&str> = pin
        .fingerprints
        .iter()
        .map(String::as_str)
        .filter(|k| !named.contains(k))
        .collect();
    Some(if unused.is_empty() {
        check(
            "pins",
            CheckStatus::Ok,
            "every pinned seal key names a session of the sandbox's chains",
        )
    } else {
        check(
            "pins",
            CheckStatus::Unverified,
            format!("no chain of the sandbox in the stream has a session of the pinned seal key(s) {}: a gateway writes one to every sandbox it holds at each start, so lines were removed from the stream (a chain cut back to an earlier final seal), or the key is no gateway's of this sandbox. Next: pin only the keys of the gateways that served it (or --fleet-key)", unused.join(", ")),
        )
    })
}

/// The parts merged into one receipt.
fn merge(parts: Vec<Part>, sandbox: &str, pin: Option<&Pin>) -> Receipt {
    let mut checks = Vec::new();
    if parts.is_empty() {
        checks.push(check(
            "stream",
            CheckStatus::Unverified,
            format!("the stream holds no ledger of sandbox {sandbox}"),
        ));
    }
    checks.extend(unused_pins(&parts, pin));
    for p in &parts {
        let named = |c: &Check| Check {
            name: format!("{}: {}", p.gateway, c.name),
            status: c.status,
            detail: c.detail.clone(),
        };
        checks.extend(p.receipt.integrity.checks.iter().map(named));
        checks.push(named(&p.complete));
        checks.extend(p.stream_checks.iter().map(named));
    }
    let integrity = verdict(checks);
    let counted: Vec<&Part> = parts.iter().filter(|p| p.counts).collect();
    let first = counted.first().map(|p| &p.receipt);
    let mut out = Receipt {
        version: first.map_or(receipt::RECEIPT_VERSION, |r| r.version),
        twin: Some(sandbox.to_string()),
        window: receipt::Window {
            since_seq: 0,
            until_seq: counted
                .iter()
                .map(|p| p.receipt.window.until_seq)
                .max()
                .unwrap_or(0),
            scope: first.map_or(receipt::Scope::Session, |r| r.window.scope),
        },
        mode: first.and_then(|r| r.mode),
        interception: first.and_then(|r| r.interception),
        isolation: first.and_then(|r| r.isolation.clone()),
        bundles: first.map(|r| r.bundles.clone()).unwrap_or_default(),
        integrity,
        leaks: Vec::new(),
        services: BTreeMap::new(),
        trust_failures: Vec::new(),
        tls_abandoned: Vec::new(),
        passthrough: Default::default(),
        blocked: Default::default(),
        upstream_errors: Vec::new(),
        seal_key: None,
        reserved_paths: BTreeMap::new(),
        set_aside: Vec::new(),
        dns_refused: Vec::new(),
        // Gateways deliver no webhooks.
        callbacks: Default::default(),
        publishing: None,
        requirements: Vec::new(),
    };
    let keys: Vec<&String> = counted
        .iter()
        .filter_map(|p| p.receipt.seal_key.as_ref())
        .collect();
    if keys.windows(2).all(|w| w[0] == w[1]) {
        out.seal_key = keys.first().map(|k| (*k).clone());
    }
    // Listed requests by time, then gateway, then seq.
    let mut listed: BTreeMap<String, Vec<([u8; 24], usize, receipt::RequestEntry)>> =
        BTreeMap::new();
    for (i, p) in counted.iter().enumerate() {
        let r = &p.receipt;
        for l in &r.leaks {
            if !out.leaks.contains(l) {
                out.leaks.push(l.clone());
            }
        }
        for (name, s) in &r.services {
            let m = out.services.entry(name.clone()).or_default();
            m.requests += s.requests;
            m.incomplete += s.incomplete;
            add_counts(&mut m.hosts, &s.hosts);
            add_counts(&mut m.calls, &s.calls);
            for (k, v) in &s.host_statuses {
                add_counts(m.host_statuses.entry(k.clone()).or_default(), v);
            }
            for (k, v) in &s.call_statuses {
                add_counts(m.call_statuses.entry(k.clone()).or_default(), v);
            }
            let list = listed.entry(name.clone()).or_default();
            for e in &s.entries {
                let ts = p
                    .times
                    .binary_search_by_key(&e.seq, |t| t.0)
                    .map_or([0u8; 24], |at| p.times[at].1);
                list.push((ts, i, e.clone()));
            }
        }
        out.trust_failures.extend(r.trust_failures.iter().cloned());
        out.tls_abandoned.extend(r.tls_abandoned.iter().cloned());
        merge_hosts(&mut out.passthrough, &r.passthrough);
        merge_hosts(&mut out.blocked, &r.blocked);
        out.upstream_errors
            .extend(r.upstream_errors.iter().cloned());
        add_counts(&mut out.reserved_paths, &r.reserved_paths);
        out.set_aside.extend(r.set_aside.iter().cloned());
        for d in &r.dns_refused {
            if !out.dns_refused.contains(d) {
                out.dns_refused.push(d.clone());
            }
        }
        if out.publishing.is_none() {
            out.publishing = r.publishing.clone();
        }
    }
    for (name, mut list) in listed {
        list.sort_by_key(|a| (a.0, a.1, a.2.seq));
        let s = out.services.entry(name).or_default();
        s.entries = list
            .into_iter()
            .take(JSON_ENTRY_CAP)
            .map(|(_, _, e)| e)
            .collect();
        s.capped = s.requests > s.entries.len() as u64;
    }
    out
}

fn add_counts<K: Ord + Clone>(into: &mut BTreeMap<K, u64>, from: &BTreeMap<K, u64>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

fn merge_hosts(into: &mut receipt::HostCounts, from: &receipt::HostCounts) {
    add_counts(&mut into.hosts, &from.hosts);
    for d in &from.destinations {
        match into
            .destinations
            .iter_mut()
            .find(|x| x.host == d.host && x.dst == d.dst)
        {
            Some(x) => x.count += d.count,
            None => into.destinations.push(d.clone()),
        }
    }
    into.destinations
        .sort_by(|a, b| (&a.host, &a.dst).cmp(&(&b.host, &b.dst)));
    into.unreached.extend(from.unreached.iter().cloned());
}

/// The merged verdict: a failure anywhere fails it; any doubt leaves it
/// unverified with every reason once, naming the gateways it holds for.
fn verdict(checks: Vec<Check>) -> Integrity {
    if let Some(f) = checks.iter().find(|c| c.status == CheckStatus::Failed) {
        return Integrity {
            status: IntegrityStatus::Failed,
            reason: Some(format!("{}: {}", f.name, f.detail)),
            checks,
        };
    }
    // (gateways, check name, detail), in check order.
    let mut reasons: Vec<(Vec<&str>, &str, &str)> = Vec::new();
    for c in checks.iter().filter(|c| c.status != CheckStatus::Ok) {
        let (gw, name) = c.name.split_once(": ").unwrap_or(("", &c.name));
        match reasons.iter_mut().find(|r| r.1 == name && r.2 == c.detail) {
            Some(r) => r.0.push(gw),
            None => reasons.push((vec![gw], name, &c.detail)),
        }
    }
    let reason = reasons
        .iter()
        .map(|(gws, name, detail)| format!("{}: {name}: {detail}", gws.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    Integrity {
        status: if reasons.is_empty() {
            IntegrityStatus::Verified
        } else {
            IntegrityStatus::Unverified
        },
        reason: (!reasons.is_empty()).then_some(reason),
        checks,
    }
}

/// The receipt's stream part: text lines and the JSON `stream` object.
fn section(
    stream: &str,
    sandbox: &str,
    read: &SandboxRead,
    parts: &[Part],
) -> (String, serde_json::Value) {
    let mut text = format!(
        "  stream: {stream}, sandbox {sandbox}: {} gateway(s), {} message(s), {} bytes read\n",
        parts.len(),
        read.messages,
        read.bytes
    );
    let mut gateways = Vec::new();
    for p in parts {
        let (first, last) = p.seqs.unwrap_or((0, 0));
        let older = match p.older_chains {
            0 => String::new(),
            n => format!(", {n} older chain(s) on the subject not read"),
        };
        text.push_str(&format!(
            "    {}: seq {first}..{last}, {} request(s){}, complete: {} ({}){older}\n",
            p.gateway,
            p.receipt.total_requests(),
            if p.counts { "" } else { " not counted" },
            match p.complete.status {
                CheckStatus::Ok => "yes",
                CheckStatus::Failed => "failed",
                _ => "unknown",
            },
            p.complete.detail,
        ));
        gateways.push(serde_json::json!({
            "gateway": p.gateway,
            "subject": veris_fleet::ledger_subject(sandbox, &p.gateway),
            "first_seq": first,
            "last_seq": last,
            "requests": p.receipt.total_requests(),
            "counted": p.counts,
            "seal_key": p.receipt.seal_key,
            "integrity": p.receipt.integrity.status,
            "complete": p.complete,
            "older_chains": p.older_chains,
        }));
    }
    let json = serde_json::json!({
        "stream": stream,
        "sandbox": sandbox,
        "start_seq": read.start_seq,
        "messages": read.messages,
        "bytes": read.bytes,
        "gateways": gateways,
    });
    (text, json)
}
