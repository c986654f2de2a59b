//! Building and judging a receipt from a state dir or a ledger file: the
//! flags `receipt`, `run`, `har`, `runs` and the MCP tools share, the live
//! proxy's fresh seal as anchor and its checks, pins and baselines.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use veris_receipt::ledger::LedgerRead;
use veris_receipt::receipt::{
    self, Anchor, Check, CheckStatus, LiveChannel, Options, Receipt, Requirement, WindowSpec,
};
use veris_receipt::seal::{Pin, PublicKeys};
use veris_receipt::Line;

use crate::runtime::baseline::Baseline;
use crate::runtime::checks::{live_checks, LiveRun, Reader};
use crate::runtime::live::Discovery;

/// The requirement flags. Each counts answers the twin gave with a 2xx
/// status, unless the same argument ends in a status clause:
/// `status=402` (that code), `status=4xx` (that class) or `status=any`.
#[derive(Args, Clone, Debug, Default)]
pub struct RequireArgs {
    /// Require at least N requests of SERVICE answered 2xx (repeatable):
    /// 'SERVICE[:N] [status=CODE|Nxx|any]'.
    #[arg(long = "require", value_name = "SERVICE[:N] [status=…]")]
    pub require: Vec<String>,
    /// Require at least N requests to HOST answered 2xx (repeatable; only
    /// requests that reached the twin count, never passthrough):
    /// 'HOST[:N] [status=CODE|Nxx|any]'.
    #[arg(long = "require-host", value_name = "HOST[:N] [status=…]")]
    pub require_host: Vec<String>,
    /// Require one request answered 2xx (repeatable; one trailing slash of
    /// the path does not matter): 'SERVICE METHOD /path [status=CODE|Nxx|any]'.
    #[arg(
        long = "require-request",
        value_name = "'SERVICE METHOD /path [status=…]'"
    )]
    pub require_request: Vec<String>,
    /// Require at least N of veris's webhook deliveries to PATH answered
    /// 2xx by the app (repeatable; only deliveries of events the twin made
    /// for this run's requests count): 'PATH[:N] [status=CODE|Nxx|any]'.
    #[arg(long = "require-callback", value_name = "PATH[:N] [status=…]")]
    pub require_callback: Vec<String>,
    /// Do not fail when no request reached the twin.
    #[arg(long)]
    pub allow_empty: bool,
    /// Exit 3 unless integrity is `verified`. Use it in CI and agent tools:
    /// an `unverified` receipt cannot rule out a workload that forged it.
    #[arg(long)]
    pub require_verified: bool,
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
        for s in &self.require_callback {
            out.push(Requirement::parse_callback(s).context("--require-callback")?);
        }
        if self.require_verified {
            out.push(Requirement::Verified);
        }
        Ok(out)
    }
}

/// Which ledger and which window of it: shared by `veris receipt` and
/// `veris har`, so the two read the same lines for the same flags.
#[derive(Args, Debug, Clone, Default)]
pub struct WindowArgs {
    /// State dir whose ledger to read [default: $VERIS_STATE_DIR, else ~/.veris]:
    /// its live `veris serve`'s, else its `ledger.jsonl`, else its newest run's.
    #[arg(long, value_name = "DIR", conflicts_with = "ledger")]
    pub state_dir: Option<PathBuf>,
    /// Read this run's ledger (<state>/runs/ID/ledger.jsonl; `veris runs` lists them).
    #[arg(long, value_name = "ID", conflicts_with = "ledger")]
    pub run: Option<String>,
    /// Ledger file to read.
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Only what happened after this baseline (printed by `veris baseline`) or ledger seq.
    #[arg(long, value_name = "TOKEN", conflicts_with = "all")]
    pub since: Option<String>,
    /// The whole ledger, every session [default: the latest session].
    #[arg(long)]
    pub all: bool,
    /// Pin the seal key: its fingerprint (the receipt's `seal key`, or the
    /// one `veris serve` logs at start), or a file of fingerprints (one a
    /// line: every session seals with a key of its own) or `ed25519 <hex>`
    /// lines. Needed for `verified` offline; `ledger.pub` beside the ledger
    /// is never trusted for it.
    /// Repeatable: a gateway seals with a new key at each start.
    #[arg(long, value_name = "FINGERPRINT|FILE")]
    pub key: Vec<String>,
    /// Only this service.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// A gateway's sandbox: its ledger in the gateway's state dir
    /// (<state>/sandboxes/ID), read through the live gateway.
    #[arg(long, value_name = "ID", conflicts_with_all = ["ledger", "run"])]
    pub sandbox: Option<String>,
}

impl WindowArgs {
    /// The state dir to read: a gateway sandbox's own (`--sandbox`).
    pub fn state_dir(&self) -> Result<PathBuf> {
        let dir = crate::util::state_dir(self.state_dir.clone());
        match &self.sandbox {
            Some(id) => {
                crate::tier::gateway::valid_id(id)?;
                Ok(dir.join(crate::tier::gateway::SANDBOXES_DIR).join(id))
            }
            None => Ok(dir),
        }
    }
}

#[derive(Args, Debug)]
pub struct ReceiptArgs {
    #[command(flatten)]
    pub window: WindowArgs,
    /// Print the receipt as JSON (version 3; the fields: docs/receipt-formats.md).
    #[arg(long)]
    pub json: bool,
    /// Also write the verdict as a JUnit XML report here (one test case per
    /// requirement, integrity and non-emptiness), also when it fails.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// The JUnit suite's name (default `veris receipt`); its cases'
    /// `classname` is made of it (spaces become dots). Stable per job, so CI
    /// history lines up the same checks across runs.
    #[arg(long, value_name = "NAME", requires = "junit")]
    pub junit_suite: Option<String>,
    #[command(flatten)]
    pub require: RequireArgs,
    #[command(flatten)]
    pub stream: crate::runtime::stream_receipt::StreamArgs,
}

/// A built receipt and the verdict on it.
pub struct Report {
    pub receipt: Receipt,
    pub text: String,
    /// Derived from `verdict`, as are the `FAIL:` lines of `text`.
    pub exit_code: u8,
    pub verdict: receipt::Verdict,
    /// The ledger it was built from, when a state dir was read.
    pub source: Option<crate::runtime::ledgers::Source>,
    /// Read from the stream (`--nats`): what the stream held, per gateway
    /// (the JSON receipt's `stream`).
    pub stream: Option<serde_json::Value>,
}

impl Report {
    /// A line for stderr naming what was read when the reader did not name
    /// it (the newest of several runs). Printed by the commands, never by
    /// the TUI, whose screen stderr would overwrite.
    pub fn note(&self) -> Option<String> {
        self.source.as_ref().and_then(|s| s.note())
    }
}

/// Builds, renders and judges a receipt. The verdict lines follow the text.
pub fn report(
    read: &LedgerRead,
    options: &Options,
    reqs: &[Requirement],
    allow_empty: bool,
) -> Report {
    judge(receipt::build(read, options), reqs, allow_empty)
}

/// Renders and judges a built receipt. The verdict lines follow the text.
pub fn judge(receipt: Receipt, reqs: &[Requirement], allow_empty: bool) -> Report {
    let mut text = receipt::render_text(&receipt);
    let verdict = receipt::evaluate(&receipt, reqs, allow_empty);
    let mut receipt = receipt;
    receipt.requirements = verdict.requirements.clone();
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
        verdict,
        source: None,
        stream: None,
    }
}

/// Builds and judges the receipt `args` ask for, printing nothing: `veris
/// receipt` prints it, the MCP tool returns it. An error is a usage error
/// (exit 1): bad arguments, no ledger, a live proxy that cannot be asked.
pub async fn build(args: &ReceiptArgs) -> Result<Report> {
    build_with(args, |_, _| {}).await
}

/// [`build`], handing every line the receipt reads to `visit` in the same
/// pass, with the receipt's fold as it stands after the line (`veris har`
/// builds its document from exactly the lines the verdict was reached on).
pub async fn build_with(
    args: &ReceiptArgs,
    visit: impl FnMut(&Line, &receipt::Builder<'_>),
) -> Result<Report> {
    if args.stream.nats.is_some() {
        return crate::runtime::stream_receipt::build(args).await;
    }
    let reqs = args.require.parse()?;
    let baseline = match &args.window.since {
        Some(t) => Some(Baseline::parse(t)?),
        None => None,
    };
    let mut pin = crate::runtime::stream_receipt::pins(&args.window.key)?;
    let state_dir = args.window.state_dir()?;
    // A live serve for this state dir makes the full set of checks possible.
    let discovery = match (&args.window.ledger, &args.window.run) {
        (None, None) => Some(crate::runtime::live::discover(&state_dir).await),
        _ => None,
    };
    let serve_live = matches!(discovery, Some(Discovery::Live(_) | Discovery::Unusable(_)));
    let source = crate::runtime::ledgers::resolve(
        &state_dir,
        args.window.ledger.as_deref(),
        args.window.run.as_deref(),
        serve_live,
    )?;
    let path = source.path().to_path_buf();
    if let Some(pin) = pin.as_mut() {
        note_key_beside(pin, &path);
    }
    let mut unusable = None;
    let live = match discovery {
        Some(Discovery::Live(l)) => Some(l),
        Some(Discovery::Unusable(why)) => {
            unusable = Some(why);
            None
        }
        _ => None,
    };
    if live.is_none() && std::fs::symlink_metadata(&path).is_err() {
        match &source {
            crate::runtime::ledgers::Source::File(_) => bail!(
                "no ledger at {}. Next: pass --ledger an existing ledger file, or --state-dir DIR",
                path.display()
            ),
            _ => bail!("{}", crate::runtime::ledgers::no_ledger(&state_dir)),
        }
    }
    let mut options = Options {
        scope: if args.window.all {
            WindowSpec::All
        } else {
            match &baseline {
                Some(b) => WindowSpec::Since(b.seq),
                None => WindowSpec::LatestSession,
            }
        },
        service: args.window.service.clone(),
        hint_keys: seal_keys_beside(&path),
        pinned_key_file: pin.as_ref().and_then(|p| p.key_file.clone()),
        ..Options::default()
    };
    if let Some(why) = unusable {
        // Say why the live checks did not run, instead of "proxy not live".
        options.external_checks = ["canary", "twin_cross_check"]
            .into_iter()
            .map(|name| Check {
                name: name.into(),
                status: CheckStatus::Unverified,
                detail: why.clone(),
            })
            .collect();
    }
    match &live {
        Some(live) => {
            let status = live
                .status()
                .await
                .context("asking the live proxy for its status")?;
            // A requirement naming a service the proxy does not route could
            // never be met: a typo is a usage error listing the real names,
            // as in `veris run` (before the seal: a usage error writes nothing).
            // `--all` may reach back to sessions that routed other services.
            if !args.window.all {
                let routed: Vec<String> = status.services.iter().map(|s| s.name.clone()).collect();
                crate::runtime::receipt::known_services(&reqs, &routed)?;
            }
            // The fresh seal is appended before the file is read: a file cut
            // after an older seal cannot then pass for complete, and the
            // file's line at the seal's seq must be the one the proxy wrote.
            let fresh = live
                .seal()
                .await
                .context("asking the live proxy for a fresh seal")?;
            let facts = crate::runtime::live::SessionFacts::of_file(&path, fresh.seq)
                .with_context(|| format!("reading ledger {}", path.display()))?;
            if let Some(b) = &baseline {
                b.check_ledger(&facts.prefix)?;
            }
            options.proxy_live = true;
            options.until = Some(fresh.seq);
            let since = match options.scope {
                WindowSpec::Since(s) => s,
                WindowSpec::All => 0,
                WindowSpec::LatestSession => status.session_seq.saturating_sub(1),
            };
            // The twin's log position is known for the latest session (from
            // its session line) or a baseline inside it; earlier sessions of
            // the window count with the checks their proxy recorded.
            let session_since = facts.since;
            let (since, heads) = match &baseline {
                Some(b) if b.ledger.is_some() && b.seq >= session_since => {
                    (b.seq, Some(b.twin.clone()))
                }
                _ => (since.max(session_since), facts.twin_heads.clone()),
            };
            let run = LiveRun {
                tier: status.tier,
                proxy_url: &status.proxy_url,
                canary: &status.canary,
                run_id: &status.run_id,
                reader: Reader::Workload,
                services: &status.services,
                twin_heads: heads.as_ref(),
                ledger: &path,
                refresh: true,
                unrecorded: status.unrecorded.as_ref(),
            };
            options.external_checks = live_checks(&run, None, since, fresh.seq).await;
            if let Some(pin) = &pin {
                if !pin.fingerprints.contains(&fresh.key_id) {
                    options.external_checks.push(Check {
                        name: "pinned_key".into(),
                        status: CheckStatus::Failed,
                        detail: format!(
                            "the live proxy seals with key {}, not the pinned one (each session seals with a key of its own: pin the one `veris serve` logged at its start)",
                            fresh.key_id
                        ),
                    });
                }
            }
            options.anchor = Anchor::Live {
                seal: fresh,
                public_key: status.public_key.clone().unwrap_or_default(),
                // `--sandbox`: the reader names the state dir a gateway's,
                // whose sandboxes run elsewhere (it counts only for a
                // gateway's session).
                channel: match args.window.sandbox {
                    Some(_) => LiveChannel::Gateway,
                    None => LiveChannel::StateDir,
                },
            };
        }
        // What must be known before the fold: the ledger id a baseline
        // names, and the keys the session lines offer a pin (a cheap first
        // pass, skipped when neither is asked for).
        None if baseline.is_some() || pin.is_some() => {
            let facts = crate::runtime::live::SessionFacts::of_file(&path, u64::MAX)
                .with_context(|| format!("reading ledger {}", path.display()))?;
            if let Some(b) = &baseline {
                b.check_ledger(&facts.prefix)?;
            }
            if let Some(pin) = &pin {
                options.anchor = Anchor::Pinned(offered_keys(
                    pin,
                    &facts.public_keys,
                    options.hint_keys.as_ref(),
                ));
            }
        }
        None => {}
    };
    options.external_checks.extend(source.checks());
    // The receipt is a fold over the file, a line at a time.
    let built = receipt::build_file_with(&path, &options, visit)
        .with_context(|| format!("reading ledger {}", path.display()))?;
    let mut report = judge(built, &reqs, args.require.allow_empty);
    report.source = Some(source);
    Ok(report)
}

/// `--key`: a fingerprint, or a file holding fingerprints (one a line) or
/// `ed25519 <hex>` lines, or a private key file (an earlier `serve`'s
/// `seal.key`), whose pin is marked: that key sat where a workload could
/// read it, so it can never give `verified`.
pub fn parse_pin(arg: &str) -> Result<Pin> {
    if let Ok(pin) = Pin::parse(arg) {
        return Ok(pin);
    }
    let next = "Next: pass the `seal key` fingerprint a receipt (or `veris serve`'s log) printed, or a file of fingerprints, one a line";
    let bytes =
        crate::util::read_bounded_bytes(Path::new(arg), 64 * 1024, true).with_context(|| {
            format!("--key {arg:?} is neither a 64-digit fingerprint nor a readable file. {next}")
        })?;
    if let Some(pin) = Pin::of_key_file(&bytes, arg) {
        return Ok(pin);
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        anyhow::anyhow!("--key {arg}: the file is neither an Ed25519 private key nor text. {next}")
    })?;
    Pin::parse(&text).with_context(|| format!("reading the key pin in {arg}. {next}"))
}

/// Marks `pin` when the private key file an earlier `serve` left beside
/// `ledger` (`seal.key`) holds a pinned key.
pub fn note_key_beside(pin: &mut Pin, ledger: &Path) {
    let dir = ledger
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let path = dir.join(veris_receipt::seal::KEY_FILE);
    if let Ok(der) = crate::util::read_bounded_bytes(&path, 64 * 1024, false) {
        pin.note_key_file(&der, &path.display().to_string());
    }
}

/// The raw keys offered (by session lines, then `ledger.pub`), narrowed to
/// those the pin names.
pub fn offered_keys(pin: &Pin, offered: &[String], hint: Option<&PublicKeys>) -> PublicKeys {
    let hint_hex: Vec<String> = hint
        .map(|h| {
            h.keys
                .iter()
                .map(|k| veris_receipt::hash::hex(&k.raw))
                .collect()
        })
        .unwrap_or_default();
    pin.select(offered.iter().chain(hint_hex.iter()).map(String::as_str))
}

/// The public keys in `ledger.pub` beside a ledger file, if there is one.
pub fn seal_keys_beside(ledger: &Path) -> Option<PublicKeys> {
    let dir = ledger
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let path = dir.join(veris_receipt::seal::PUB_FILE);
    if !path.exists() {
        return None;
    }
    PublicKeys::load(&path).ok()
}

/// Every service a requirement names must be one this run routes, or the
/// requirement could never be met: a typo (`strip`) is a usage error that
/// lists the services there are.
pub fn known_services(reqs: &[Requirement], routed: &[String]) -> Result<()> {
    for r in reqs {
        let (flag, name) = match r {
            Requirement::Service { name, .. } => ("--require", name),
            Requirement::Request { service, .. } => ("--require-request", service),
            _ => continue,
        };
        if !routed.iter().any(|s| s == name) {
            bail!(
                "{flag}: unknown service {name:?}: this run routes {}. Next: use one of those names (the built-in catalog, --services, --route and the config file's services), or add it: --route {name}=HOST[/PREFIX], or with --config a `services` entry in that file (--route and --config do not mix)",
                routed.join(", ")
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_must_name_a_routed_service() {
        let routed = vec!["stripe".to_string(), "acme".to_string()];
        let ok = [
            Requirement::parse_service("stripe:1").unwrap(),
            Requirement::parse_request("acme GET /x").unwrap(),
            Requirement::parse_host("api.strip.com").unwrap(),
        ];
        known_services(&ok, &routed).unwrap();
        let e = known_services(&[Requirement::parse_service("strip:1").unwrap()], &routed)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--require: unknown service \"strip\"") && e.contains("stripe, acme"),
            "{e}"
        );
    }
}
