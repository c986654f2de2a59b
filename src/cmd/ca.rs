//! `veris ca init|show|path|env|rotate`.

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

/// What a new CA may sign for besides the built-in catalog and veris's own
/// names (the canary host, localhost and loopback addresses).
#[derive(Args, Debug, Clone, Default)]
pub struct ScopeArgs {
    /// Config file whose routes the CA must be able to sign for (its
    /// `ca_dir` is used unless --ca-dir is given).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Route the CA must be able to sign for, repeatable: SERVICE=HOST[/PREFIX],
    /// as `veris serve --route`.
    #[arg(long = "route", value_name = "SERVICE=HOST[/PREFIX]")]
    pub routes: Vec<String>,
    /// Another name the CA may sign for, repeatable: a DNS name (it and the
    /// names under it), an IP address or a subnet, e.g. the gateway's
    /// --tls-name or a TLS twin's address.
    #[arg(long = "name", value_name = "NAME")]
    pub names: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ScopedDirs {
    #[command(flatten)]
    pub dirs: CaDirs,
    #[command(flatten)]
    pub scope: ScopeArgs,
}

#[derive(Subcommand, Debug)]
pub enum CaCommand {
    /// Create the CA (if needed) and publish trust material, without serving.
    /// A new CA may sign only for the catalog, the routes given, the --name
    /// names and veris's own names (its X.509 name constraints).
    Init(ScopedDirs),
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
    /// Make the next CA (a new key, valid one year, may sign for the
    /// catalog, the routes given and the --name names), keep the previous
    /// certificate as veris-ca.prev.pem, and say what changed. Every client
    /// that trusts the CA file must then be given the new one.
    Rotate(ScopedDirs),
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
        Err(e @ veris_ca::CaError::Expired { .. }) => {
            eprintln!("veris ca {command}: {e}");
            Ok(Err("expired".into()))
        }
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("loading the CA in {}", ca_dir.display())))
        }
    }
}

/// The CA in `dirs` (created, constrained to `scope`, when there is none
/// usable) and its published trust material.
fn load(dirs: &CaDirs, scope: &ScopeArgs) -> Result<Loaded> {
    let (state, ca_dir, router) = scoped(dirs, scope)?;
    let names = veris_proxy::scope::scope(router.as_ref(), &scope.names)
        .context("the names the CA may sign for (--name)")?;
    let (ca, outcome) = CertificateAuthority::load_or_create(&ca_dir, &names)
        .with_context(|| format!("loading the CA in {}", ca_dir.display()))?;
    if let LoadOutcome::Created { reason } = outcome {
        eprintln!("veris: created a new CA in {} ({reason})", ca_dir.display());
    }
    let trust = publish(&state, &ca)?;
    Ok(Loaded { ca, trust })
}

/// Publishes `ca`'s trust material in `<state>/trust`.
fn publish(state: &Path, ca: &CertificateAuthority) -> Result<veris_ca::trust::TrustFiles> {
    let bundle = veris_ca::trust::find_system_bundle(
        std::env::var_os("VERIS_SYSTEM_CA_BUNDLE")
            .as_deref()
            .map(Path::new),
    );
    veris_ca::trust::publish(&state.join("trust"), ca, bundle.as_deref())
        .context("publishing trust material")
}

/// The state and CA dirs, and the routes `scope` names (its config file's
/// `ca_dir` counts when no --ca-dir is given).
fn scoped(
    dirs: &CaDirs,
    scope: &ScopeArgs,
) -> Result<(
    PathBuf,
    PathBuf,
    Option<veris_proxy::request::route::Router>,
)> {
    use veris_proxy::config::{Flags, Settings};
    let (state, mut ca_dir) = dirs_of(dirs);
    let settings = match &scope.config {
        Some(path) => {
            if !scope.routes.is_empty() {
                anyhow::bail!("--route and --config {} both name routes. Next: put the routes in the config file, or drop --config", path.display());
            }
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config {}", path.display()))?;
            let settings = Settings::from_json(&text, &path.display().to_string())?;
            if let (None, Some(dir)) = (&dirs.ca_dir, &settings.ca_dir) {
                ca_dir = dir.clone();
            }
            Some(settings)
        }
        None if scope.routes.is_empty() => None,
        // Only the routes' hosts are read: any twin will do.
        None => Some(Settings::from_flags(Flags {
            listen: "127.0.0.1:0",
            twin: "http://127.0.0.1:1",
            sandbox_id: DEFAULT_SANDBOX,
            services: &[],
            routes: &scope.routes,
            mode: veris_receipt::Mode::Passthrough,
            allow_passthrough: &[],
        })?),
    };
    Ok((state, ca_dir, settings.map(|s| s.router)))
}

/// `veris ca rotate`: the next CA, and what changed.
fn rotate(args: &ScopedDirs) -> Result<()> {
    let (state, ca_dir, router) = scoped(&args.dirs, &args.scope)?;
    let names = veris_proxy::scope::scope(router.as_ref(), &args.scope.names)
        .context("the names the CA may sign for (--name)")?;
    let rotated = CertificateAuthority::rotate(&ca_dir, &names)
        .with_context(|| format!("making the next CA in {}", ca_dir.display()))?;
    let ca = &rotated.ca;
    let trust = publish(&state, ca)?;
    let now: Vec<String> = names.subtrees();
    crate::outln!("made the next CA in {}", ca_dir.display());
    crate::outln!("sha256:      {}", ca.fingerprint_sha256());
    crate::outln!("not after:   {}", utc(ca.not_after()));
    crate::outln!("certificate: {}", ca.cert_path().display());
    crate::outln!("may sign for ({}): {}", now.len(), now.join(", "));
    match &rotated.previous {
        None => crate::outln!("previous:    none usable was there"),
        Some(prev) => {
            crate::outln!(
                "previous:    sha256 {} (not after {}), kept as {}; its key is gone",
                prev.fingerprint,
                utc(prev.not_after),
                prev.path.display()
            );
            match &prev.scope {
                None => crate::outln!(
                    "changed:     the previous CA could sign for any name; this one only for the names above"
                ),
                Some(before) => {
                    let before = before.subtrees();
                    let added: Vec<&String> = now.iter().filter(|n| !before.contains(n)).collect();
                    let removed: Vec<&String> =
                        before.iter().filter(|n| !now.contains(n)).collect();
                    let list = |v: &[&String]| {
                        if v.is_empty() {
                            "none".to_string()
                        } else {
                            v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                        }
                    };
                    crate::outln!("added:       {}", list(&added));
                    crate::outln!("removed:     {}", list(&removed));
                }
            }
        }
    }
    crate::outln!(
        "Next: give every client the new {} (trust bundle: {}); until then they refuse every intercepted connection. A gateway fleet: put it in every sandbox image and the fleet's --ca-dir, then restart the gateways; running proxies keep the previous CA until restarted.",
        ca.cert_path().display(),
        trust.bundle.display()
    );
    Ok(())
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
        CaCommand::Init(args) => {
            let l = load(&args.dirs, &args.scope)?;
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
            match ca.scope() {
                Some(scope) => crate::outln!(
                    "may sign for: {}",
                    scope.subtrees().join(", ")
                ),
                None => crate::outln!(
                    "may sign for: any name (unconstrained; `veris ca rotate` makes a constrained one)"
                ),
            }
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
        CaCommand::Rotate(args) => rotate(&args)?,
        CaCommand::Path(dirs) => {
            let (_, ca_dir) = dirs_of(&dirs);
            // The path either way: a script may configure clients before
            // the CA exists; the note on stderr says it does not yet.
            let _ = load_existing("path", &ca_dir)?;
            crate::outln!("{}", CertificateAuthority::cert_path_in(&ca_dir).display());
        }
        CaCommand::Env(args) => {
            let l = load(&args.dirs, &ScopeArgs::default())?;
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
