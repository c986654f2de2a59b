//! The seal key, the ledger and the session line a start writes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use tracing::warn;
use veris_proxy::Identity;
use veris_receipt::ledger::{Ledger, OpenReport};
use veris_receipt::seal::{PublicKeys, Sealer, PUB_FILE};
use veris_receipt::{Coverage, Entry, SessionLine};

use super::*;

/// The seal key and the ledger for `role` (see [`Role`]). Every session
/// seals with a fresh key held only in this process's memory (DESIGN
/// §7a.13); `ledger.pub` lists it beside the ledger as a hint. `serve`
/// continues `<state>/ledger.jsonl` when its last line is a seal by a key
/// `ledger.pub` lists (an earlier session's), and moves anything else aside;
/// a run starts a file of its own.
pub(super) fn open_ledger(
    state_dir: &Path,
    role: Role,
    run_id: &str,
) -> Result<(Arc<Sealer>, Ledger, veris_receipt::OpenReport)> {
    let sealer = Sealer::generate().context("generating this session's seal key")?;
    let dir = match role {
        Role::Serve => state_dir.to_path_buf(),
        Role::Run => {
            let dir = state_dir.join(RUNS_DIR).join(run_id);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("creating the run dir {}", dir.display()))?;
            dir
        }
    };
    let path = dir.join("ledger.jsonl");
    // The keys of the sessions before this one: the file's tail must be a
    // seal by one of them to be continued. Which one does not decide any
    // verdict (every reader checks each session's seals against its own
    // pin), so the hint file is enough here.
    let mut own = PublicKeys::load(&dir.join(PUB_FILE))
        .with_context(|| format!("reading {}", dir.join(PUB_FILE).display()))?;
    own.keys.push(sealer.public_key());
    sealer
        .publish(&dir)
        .with_context(|| {
            format!(
                "writing {}. Next: free space where the state dir lives (or fix the write error) and start again",
                dir.join(PUB_FILE).display()
            )
        })?;
    let (ledger, report) = Ledger::open_sealed_by(&path, &own)
        .with_context(|| format!("opening the ledger {}", path.display()))?;
    if let Some(torn) = &report.torn_tail {
        let saved = report
            .torn_saved_to
            .as_ref()
            .map_or("nowhere".to_string(), |p| p.display().to_string());
        warn!(line = torn.line, bytes = torn.bytes, %saved, "the ledger ended in a torn line (a crash mid-write); it was moved aside and is recorded in the session line");
    }
    if let Some(moved) = &report.moved_aside {
        warn!(to = %moved.file, why = %moved.why, "the existing ledger could not be verified with this proxy's key; it was moved aside and a new chain starts");
    }
    Ok((Arc::new(sealer), ledger, report))
}

/// What the session line records, gathered by [`Stack::start`].
pub(super) struct SessionFacts<'a> {
    pub(super) args: &'a ServeArgs,
    pub(super) role: Role,
    pub(super) identity: &'a Identity,
    pub(super) twin: &'a str,
    pub(super) listen: SocketAddr,
    pub(super) report: &'a OpenReport,
    pub(super) sealer: &'a Sealer,
    pub(super) twin_heads: &'a BTreeMap<String, u64>,
    /// The uid this process had before any privilege drop.
    pub(super) euid: u32,
    pub(super) coverage: Option<Coverage>,
}

/// The session line: who runs, how traffic is intercepted, which key seals.
pub(super) fn session_entry(f: SessionFacts<'_>) -> Entry {
    let t = &f.args.transparent;
    Entry::Session(SessionLine {
        run_id: f.identity.run_id.clone(),
        sandbox_id: f.identity.sandbox_id.clone(),
        mode: f.identity.mode,
        tier: f.identity.tier,
        twin: f.twin.to_string(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        listen: f.listen.to_string(),
        recovered_torn_tail: f.report.torn_tail,
        key_id: Some(f.sealer.key_id().to_string()),
        public_key: Some(f.sealer.public_key_hex()),
        key_storage: Some("memory".into()),
        proxy_uid: Some(if t.install_redirect || t.redirect_external {
            t.proxy_uid
        } else {
            f.euid
        }),
        workload_uid: match f.role {
            // The child runs as this process's uid, but never sees the key.
            Role::Run => Some(f.euid),
            Role::Serve => t.workload_uid,
        },
        twin_heads: Some(f.twin_heads.clone()),
        moved_aside: f.report.moved_aside.clone(),
        coverage: f.coverage.map(Box::new),
    })
}
