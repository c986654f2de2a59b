//! `veris ca init|show|path|env`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use veris_ca::env::{self, EnvSpec};
use veris_ca::{CertificateAuthority, LoadOutcome};

use crate::runtime::stack::{merged_no_proxy, EnvBase, EnvFormatArg, DEFAULT_SANDBOX};

#[derive(Args, Debug, Clone)]
pub struct CaDirs {
    /// State dir [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// CA dir [default: <state>/ca].
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum CaCommand {
    /// Create the CA (if needed) and publish trust material, without serving.
    Init(CaDirs),
    /// Print the CA's subject, fingerprint, validity and paths. Creates
    /// nothing: without a usable CA it says so, and how to make one, and
    /// exits 1.
    Show(CaDirs),
    /// Print the CA certificate's path (for scripts): where it is, or where
    /// `veris ca init` (or serve/run) will create it. Creates nothing;
    /// without a usable CA a note on stderr says so, and it still exits 0.
    Path(CaDirs),
    /// Print the client env file for a proxy URL.
    Env(EnvArgs),
}

#[derive(Args, Debug)]
pub struct EnvArgs {
    #[command(flatten)]
    pub dirs: CaDirs,
    /// Proxy URL clients should use.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080")]
    pub proxy: String,
    #[arg(long, value_name = "ID", default_value = DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// Canary token of the proxy run (from its env file or ready file).
    #[arg(long, value_name = "TOKEN", default_value = "")]
    pub canary: String,
    #[arg(long, value_enum, default_value = "posix")]
    pub format: EnvFormatArg,
    /// Only trust variables, no proxy variables.
    #[arg(long)]
    pub trust_only: bool,
}

struct Loaded {
    ca: CertificateAuthority,
    trust: veris_ca::trust::TrustFiles,
}

/// The state dir and the CA dir the flags name.
fn dirs_of(dirs: &CaDirs) -> (PathBuf, PathBuf) {
    let state = crate::util::state_dir(dirs.state_dir.clone());
    let ca_dir = dirs.ca_dir.clone().unwrap_or_else(|| state.join("ca"));
    (state, ca_dir)
}

/// The CA as it is, creating and writing nothing. `Ok(Err(reason))` when
/// there is none usable (that reason is also printed, with the fix).
fn load_existing(command: &str, ca_dir: &Path) -> Result<Result<CertificateAuthority, String>> {
    match CertificateAuthority::load(ca_dir) {
        Ok(ca) => Ok(Ok(ca)),
        Err(veris_ca::CaError::NoCa { reason, .. }) => {
            eprintln!(
                "veris ca {command}: no CA in {} ({reason}). Next: `veris ca init` creates it (so do `veris serve` and `veris run`)",
                ca_dir.display()
            );
            Ok(Err(reason))
        }
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("loading the CA in {}", ca_dir.display())))
        }
    }
}

fn load(dirs: &CaDirs) -> Result<Loaded> {
    let (state, ca_dir) = dirs_of(dirs);
    let (ca, outcome) = CertificateAuthority::load_or_create(&ca_dir)
        .with_context(|| format!("loading the CA in {}", ca_dir.display()))?;
    if let LoadOutcome::Created { reason } = outcome {
        eprintln!("veris: created a new CA in {} ({reason})", ca_dir.display());
    }
    let bundle = veris_ca::trust::find_system_bundle(
        std::env::var_os("VERIS_SYSTEM_CA_BUNDLE")
            .as_deref()
            .map(Path::new),
    );
    let trust = veris_ca::trust::publish(&state.join("trust"), &ca, bundle.as_deref())
        .context("publishing trust material")?;
    Ok(Loaded { ca, trust })
}

/// A certificate date as `2026-12-03 06:23:28 UTC` (the `time` crate's own
/// Display is `2026-12-03 6:23:28.0 +00:00:00`).
fn utc(t: time::OffsetDateTime) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second] UTC");
    t.to_offset(time::UtcOffset::UTC)
        .format(format)
        .unwrap_or_else(|_| t.to_string())
}

pub fn ca(cmd: CaCommand) -> Result<u8> {
    match cmd {
        CaCommand::Init(dirs) => {
            let l = load(&dirs)?;
            crate::outln!("{}", l.ca.cert_path().display());
        }
        CaCommand::Show(dirs) => {
            let (state, ca_dir) = dirs_of(&dirs);
            let Ok(ca) = load_existing("show", &ca_dir)? else {
                return Ok(crate::util::EXIT_USAGE);
            };
            // Where the trust material is published; showing writes none.
            let trust = veris_ca::trust::TrustFiles::at(&state.join("trust"));
            crate::outln!("subject:     {}", ca.subject());
            crate::outln!("sha256:      {}", ca.fingerprint_sha256());
            crate::outln!("not before:  {}", utc(ca.not_before()));
            crate::outln!("not after:   {}", utc(ca.not_after()));
            crate::outln!("certificate: {}", ca.cert_path().display());
            crate::outln!("key:         {}", ca.key_path().display());
            crate::outln!("trust dir:   {}", trust.dir.display());
            crate::outln!("bundle:      {}", trust.bundle.display());
            crate::outln!(
                "truststore:  {} ({})",
                trust.truststore.display(),
                trust.truststore_type
            );
        }
        CaCommand::Path(dirs) => {
            let (_, ca_dir) = dirs_of(&dirs);
            // The path either way: a script may configure clients before
            // the CA exists; the note on stderr says it does not yet.
            let _ = load_existing("path", &ca_dir)?;
            crate::outln!("{}", CertificateAuthority::cert_path_in(&ca_dir).display());
        }
        CaCommand::Env(args) => {
            let l = load(&args.dirs)?;
            let text = env_file(
                &l.trust,
                (!args.trust_only).then_some(args.proxy.as_str()),
                &args.sandbox,
                &args.canary,
                args.format,
            );
            crate::out!("{text}");
        }
    }
    Ok(0)
}

/// The client env file for the trust files `trust`: the trust variables,
/// and the proxy variables for `proxy` unless it is `None` (trust only).
/// `veris ca env` and `veris gateway ca --env` print it.
pub fn env_file(
    trust: &veris_ca::trust::TrustFiles,
    proxy: Option<&str>,
    sandbox: &str,
    canary: &str,
    format: EnvFormatArg,
) -> String {
    // No routes here: every catalog host is kept out of NO_PROXY.
    let catalog: Vec<String> = veris_proxy::catalog::CATALOG
        .iter()
        .flat_map(|s| s.claims.iter().map(|(host, _)| host.to_string()))
        .collect();
    // Trust only: no NO_PROXY is written, so nothing to warn about.
    let no_proxy = match proxy {
        Some(_) => merged_no_proxy(&catalog),
        None => Vec::new(),
    };
    let base = EnvBase::from_env();
    let spec = EnvSpec {
        proxy_url: proxy.unwrap_or_default(),
        no_proxy: &no_proxy,
        sandbox_id: sandbox,
        canary,
        trust,
        trust_only: proxy.is_none(),
        java_tool_options_base: base.java_tool_options.as_deref(),
        php_ini_scan_dir_base: base.php_ini_scan_dir.as_deref(),
        extra: &[],
    };
    env::render(&env::vars(&spec), format.into())
}
