//! `veris doctor`: checks what makes runs fail, one line each (`ok`, `warn`
//! or `FAIL`), with the next step for every problem. It changes nothing: it
//! reads the state dir, the environment of the shell it runs in and the
//! system trust store, asks a live proxy found by discovery for its status
//! and canary, and tries the isolated run's namespace steps in a child of
//! its own (`veris __isolate-probe`), since a sysctl can say yes where a
//! seccomp profile or an LSM says no.
//!
//! Exit codes: 0 when nothing FAILs (warnings allowed), 2 when a check
//! FAILs (as `veris check`), 1 for usage errors.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use time::OffsetDateTime;
use veris_ca::env::EnvSpec;
use veris_ca::trust::TrustFiles;
use veris_ca::{CaError, CertificateAuthority, EXPIRY_WARNING};
use veris_receipt::receipt::CheckStatus;

use crate::outln;
use crate::runtime::live::{Discovery, LiveStatus, ADDR_FILE, TOKEN_FILE};

/// Exit code when a check FAILs: the same as a failed `veris check`.
pub const EXIT_FAILED: u8 = 2;
/// Bound on the namespace probe (it runs `ip` and `nft`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on the entries the permission walk looks at.
const MAX_WALK: usize = 10_000;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// State dir to check [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// CA dir to check, as given to serve and run [default: <state>/ca].
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug)]
struct Finding {
    name: &'static str,
    level: Level,
    detail: String,
    /// What to do about it (problems only).
    next: Option<String>,
}

impl Finding {
    fn ok(name: &'static str, detail: impl Into<String>) -> Finding {
        Finding {
            name,
            level: Level::Ok,
            detail: detail.into(),
            next: None,
        }
    }
    fn warn(name: &'static str, detail: impl Into<String>, next: impl Into<String>) -> Finding {
        Finding {
            name,
            level: Level::Warn,
            detail: detail.into(),
            next: Some(next.into()),
        }
    }
    fn fail(name: &'static str, detail: impl Into<String>, next: impl Into<String>) -> Finding {
        Finding {
            name,
            level: Level::Fail,
            detail: detail.into(),
            next: Some(next.into()),
        }
    }

    fn line(&self) -> String {
        let level = match self.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        match &self.next {
            Some(next) => format!("{level} {}: {}. Next: {next}", self.name, self.detail),
            None => format!("{level} {}: {}", self.name, self.detail),
        }
    }
}

pub async fn doctor(args: DoctorArgs) -> Result<u8> {
    let state = crate::util::state_dir(args.state_dir);
    let ca_dir = args.ca_dir.unwrap_or_else(|| state.join("ca"));
    let s = shown(&state);
    let live = live(&state).await;
    let (ca_finding, ca) = ca(&state, &ca_dir, live.status.is_some());
    let pem = ca.as_ref().map(|ca| cert_body(ca.cert_pem()));
    let status = live.status.as_ref();
    let mut findings = vec![
        ca_finding,
        clock(ca.as_ref(), &s, &ca_dir, OffsetDateTime::now_utc()),
        trust_files(&state, pem.as_deref()),
        system_trust(&state, pem.as_deref()),
        permissions(&state, &ca_dir),
        custody(&state),
    ];
    let env: BTreeMap<String, String> = std::env::vars().collect();
    findings.push(environment(&state, &env, status, pem.as_deref()));
    let (userns, nft) = namespaces().await;
    findings.push(userns);
    findings.push(nft);
    findings.push(live.finding);
    findings.push(ledger(&state, status.is_some()));
    findings.push(canary(status).await);

    outln!("veris doctor: state dir {s}");
    for f in &findings {
        outln!("{}", f.line());
    }
    let count = |l: Level| findings.iter().filter(|f| f.level == l).count();
    let (fails, warns) = (count(Level::Fail), count(Level::Warn));
    outln!(
        "{} FAIL, {} warn, {} ok",
        fails,
        warns,
        findings.len() - fails - warns
    );
    Ok(if fails > 0 { EXIT_FAILED } else { 0 })
}

/// Whether a pin of this state dir's sessions can give `verified`: every
/// current session's key lives only in the proxy's memory, but a `seal.key`
/// an earlier veris left held its key on disk, where a workload of the
/// proxy's uid could have read it.
fn custody(state: &Path) -> Finding {
    let key = state.join(veris_receipt::seal::KEY_FILE);
    if std::fs::symlink_metadata(&key).is_ok() {
        return Finding::warn(
            "custody",
            format!(
                "{} holds a seal key an earlier veris kept on disk: a receipt pinned to it can never be verified",
                shown(&key)
            ),
            format!(
                "delete {} (veris now keeps every session's key in memory only) and pin the fingerprint `veris serve` logs at start",
                shown(&key)
            ),
        );
    }
    Finding::ok(
        "custody",
        "no seal key on disk: each session's key lives only in its proxy's memory (pin the fingerprint `veris serve` logs at start, or the `seal key` a receipt prints; live reads of a serve whose workload may share its uid stay unverified without --workload-uid)",
    )
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// `--state-dir STATE`, and `--ca-dir DIR` when it is not the default.
fn dir_flags(state: &Path, ca_dir: &Path) -> String {
    if ca_dir == state.join("ca") {
        format!("--state-dir {}", shown(state))
    } else {
        format!("--state-dir {} --ca-dir {}", shown(state), shown(ca_dir))
    }
}

/// The CA in `dir` (`--ca-dir`, else `<state>/ca`), loaded as serve
/// would load it (nothing created). A missing CA is no problem on a fresh
/// machine (`run` and `serve` create it on first use), only when a proxy is
/// live on this state dir: that proxy then uses a CA from elsewhere.
fn ca(state: &Path, dir: &Path, proxy_live: bool) -> (Finding, Option<CertificateAuthority>) {
    let init = format!(
        "`veris ca init {}` (serve and run create one too)",
        dir_flags(state, dir)
    );
    let rotate = format!("`veris ca rotate {}`", dir_flags(state, dir));
    match CertificateAuthority::load(dir) {
        Ok(ca) => {
            let detail = format!(
                "{} in {} (sha256 {}…)",
                ca.subject(),
                shown(dir),
                ca.fingerprint_sha256().get(..23).unwrap_or_default()
            );
            let finding = match ca.scope() {
                Some(scope) => Finding::ok(
                    "ca",
                    format!(
                        "{detail}, name-constrained to {} subtrees",
                        scope.subtrees().len()
                    ),
                ),
                None => Finding::warn(
                    "ca",
                    format!("{detail} is unconstrained: made before veris constrained its CAs, it can sign for any name, so whoever copies its key can intercept anything that trusts it"),
                    format!("{rotate} makes one that can sign only for the names veris routes; then give clients the new CA file"),
                ),
            };
            (finding, Some(ca))
        }
        Err(CaError::Expired { not_after, .. }) => (
            Finding::fail(
                "ca",
                format!(
                    "the CA in {} expired on {not_after} (or this clock is ahead): serve and run refuse it",
                    shown(dir)
                ),
                format!("check the clock (`date -u`); if it is right, {rotate} makes the next CA, which clients must trust again"),
            ),
            None,
        ),
        Err(CaError::NoCa { reason, .. }) if reason.starts_with("missing") && !proxy_live => (
            Finding::ok(
                "ca",
                format!(
                    "no CA yet in {}: `veris run` and `veris serve` create it on first use (`veris ca init {}` makes it now)",
                    shown(dir),
                    dir_flags(state, dir)
                ),
            ),
            None,
        ),
        Err(CaError::NoCa { reason, .. }) if reason.starts_with("missing") => (
            Finding::fail(
                "ca",
                format!(
                    "no CA in {} ({reason}), but a proxy is live on this state dir: it uses a CA from elsewhere (its --ca-dir)",
                    shown(dir)
                ),
                format!(
                    "`veris ca init {}` makes one there; or pass `veris doctor` the --ca-dir the proxy was given",
                    dir_flags(state, dir)
                ),
            ),
            None,
        ),
        Err(CaError::NoCa { reason, .. }) => (
            Finding::fail(
                "ca",
                format!("the CA in {} cannot be used ({reason})", shown(dir)),
                format!("{init} replaces it; clients must trust the new one"),
            ),
            None,
        ),
        Err(CaError::InsecureKeyPermissions { path, mode }) => (
            Finding::fail(
                "ca",
                format!(
                    "the CA key {} is mode {mode:04o}: group or others can read it, so veris refuses it",
                    shown(&path)
                ),
                format!("chmod 600 {}", shown(&path)),
            ),
            None,
        ),
        Err(CaError::Read { path, source })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            (
                Finding::warn(
                    "ca",
                    format!(
                        "cannot read {} as this user (in the transparent tier it belongs to the proxy uid, as it should)",
                        shown(&path)
                    ),
                    "run `veris doctor` as the proxy uid or root to check the CA",
                ),
                None,
            )
        }
        Err(e) => (
            Finding::fail("ca", format!("{e:#}"), init),
            None,
        ),
    }
}

/// The clock against the CA's validity: a CA "not yet valid" or expired
/// makes every client refuse every leaf.
fn clock(
    ca: Option<&CertificateAuthority>,
    state: &str,
    ca_dir: &Path,
    now: OffsetDateTime,
) -> Finding {
    let flags = dir_flags(Path::new(state), ca_dir);
    let ca_dir = shown(ca_dir);
    let Some(ca) = ca else {
        return Finding::warn(
            "clock",
            "not checked: no usable CA to compare with",
            "see the ca line (until a CA exists there is nothing to compare with)",
        );
    };
    let when = |t: OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|_| t.to_string())
    };
    let (nb, na) = (ca.not_before(), ca.not_after());
    if now < nb {
        Finding::fail(
            "clock",
            format!(
                "this clock says {} but the CA is valid only from {}: the clock is behind (or the CA came from a machine whose clock is ahead), and clients refuse every leaf",
                when(now),
                when(nb)
            ),
            format!("set the clock (`timedatectl set-ntp true`, or the container host's); else `rm -r {ca_dir} && veris ca init {flags}` and trust the new CA"),
        )
    } else if now >= na {
        Finding::fail(
            "clock",
            format!("the CA expired at {} (now {})", when(na), when(now)),
            format!("check the clock; if it is right, `veris ca rotate {flags}` makes the next CA"),
        )
    } else if na - now < EXPIRY_WARNING {
        Finding::warn(
            "clock",
            format!("the CA expires at {}", when(na)),
            format!("after it does, serve and run refuse it: `veris ca rotate {flags}` makes the next one now, which clients must trust again"),
        )
    } else {
        Finding::ok(
            "clock",
            format!(
                "now ({}) is within the CA's validity ({} to {})",
                when(now),
                when(nb),
                when(na)
            ),
        )
    }
}

/// The base64 of each `CERTIFICATE` block in `pem`, whitespace removed:
/// enough to tell whether a bundle holds a certificate, without decoding.
fn cert_bodies(pem: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in pem.lines() {
        let line = line.trim();
        if line == "-----BEGIN CERTIFICATE-----" {
            current = Some(String::new());
        } else if line == "-----END CERTIFICATE-----" {
            if let Some(body) = current.take() {
                out.push(body);
            }
        } else if let Some(body) = current.as_mut() {
            body.extend(line.chars().filter(|c| !c.is_whitespace()));
        }
    }
    out
}

/// The base64 body of the first certificate in `pem`.
fn cert_body(pem: &str) -> String {
    cert_bodies(pem).into_iter().next().unwrap_or_default()
}

/// Whether the file at `path` holds the certificate whose body is `body`;
/// `Err` says why it could not be read.
fn holds(path: &Path, body: &str) -> std::result::Result<bool, String> {
    // A system bundle is a few hundred KB; a FIFO or /dev/zero planted
    // here must not hang or fill the doctor.
    match crate::util::read_bounded(path, 64 << 20, true) {
        Ok(text) => Ok(cert_bodies(&text).iter().any(|b| b == body)),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(e.to_string()),
        Err(e) => Err(e.kind().to_string()),
    }
}

/// `<state>/trust`: what the env variables and isolated runs hand clients.
fn trust_files(state: &Path, ca: Option<&str>) -> Finding {
    let trust = TrustFiles::at(&state.join("trust"));
    let Some(ca) = ca else {
        return Finding::warn(
            "trust files",
            "not checked: no usable CA",
            "see the ca line (until a CA exists there is nothing to compare with)",
        );
    };
    let publish = format!(
        "`veris ca init --state-dir {}` publishes them again",
        shown(state)
    );
    for path in [&trust.ca_pem, &trust.bundle] {
        match holds(path, ca) {
            Ok(true) => {}
            Ok(false) => {
                return Finding::fail(
                    "trust files",
                    format!(
                        "{} does not hold the current CA (published for an older one): clients given it refuse veris's leaves",
                        shown(path)
                    ),
                    publish,
                )
            }
            Err(why) => {
                return Finding::fail(
                    "trust files",
                    format!("cannot read {} ({why})", shown(path)),
                    publish,
                )
            }
        }
    }
    Finding::ok(
        "trust files",
        format!(
            "{} and {} hold the CA",
            shown(&trust.ca_pem),
            shown(&trust.bundle)
        ),
    )
}

/// Whether the machine's own trust store (what clients that ignore the
/// variables read) holds the veris CA.
fn system_trust(state: &Path, ca: Option<&str>) -> Finding {
    let Some(ca) = ca else {
        return Finding::warn(
            "system trust",
            "not checked: no usable CA",
            "see the ca line (until a CA exists there is nothing to compare with)",
        );
    };
    let Some(store) = crate::tier::isolated::TRUST_STORES
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
    else {
        return Finding::warn(
            "system trust",
            "no system trust bundle found (looked in /etc/ssl, /etc/pki)",
            "install the ca-certificates package",
        );
    };
    let install = format!(
        "as root, `cp {}/trust/ca.pem /usr/local/share/ca-certificates/veris.crt && update-ca-certificates` (Debian/Ubuntu; `trust anchor` on Fedora); isolated `veris run`s need none of this",
        shown(state)
    );
    match holds(store, ca) {
        Ok(true) => Finding::ok(
            "system trust",
            format!("{} holds the veris CA", shown(store)),
        ),
        Ok(false) => Finding::warn(
            "system trust",
            format!(
                "{} does not hold the veris CA: outside an isolated run, clients that read only the system store (wget, Go, PHP, git) refuse veris's leaves",
                shown(store)
            ),
            install,
        ),
        Err(why) => Finding::warn(
            "system trust",
            format!("cannot read {} ({why})", shown(store)),
            install,
        ),
    }
}

/// What the permission walk found wrong.
#[derive(Debug, Default, PartialEq)]
struct Modes {
    /// Paths group or others can write (anyone could plant a CA, a ledger, an address).
    writable: Vec<String>,
    /// Secrets group or others can read, or the CA dir open to them.
    exposed: Vec<String>,
    /// Secrets (or the CA dir) that are symlinks: `(link, what it points at)`.
    linked: Vec<(String, String)>,
}

/// The secrets of a state dir, relative to it.
const SECRETS: [&str; 3] = ["ca/veris-ca-key.pem", "seal.key", TOKEN_FILE];

/// What `mode` means for the entry at `rel` (a path inside the state dir).
fn judge_mode(rel: &Path, is_dir: bool, mode: u32, shown: String, m: &mut Modes) {
    let secret = SECRETS.map(Path::new);
    // `admin.addr` (0644) names no secret: a reader of another uid that was
    // given the token (`VERIS_ADMIN_TOKEN`) finds the proxy through it. Like
    // everything else, it must not be writable by others.
    if mode & 0o022 != 0 {
        m.writable.push(format!("{shown} ({:04o})", mode & 0o7777));
    } else if ((is_dir && rel == Path::new("ca")) || secret.contains(&rel)) && mode & 0o077 != 0 {
        m.exposed.push(format!("{shown} ({:04o})", mode & 0o7777));
    }
}

/// Walks the state dir (not following links, bounded) and judges each mode.
fn walk_modes(state: &Path) -> Modes {
    let mut m = Modes::default();
    walk_into(state, Path::new(""), &mut m);
    m
}

/// Walks `root` as if it were `as_rel` inside a state dir (`""` for the
/// state dir, `ca` for a CA dir given with `--ca-dir`).
fn walk_into(root: &Path, as_rel: &Path, m: &mut Modes) {
    let state = root;
    let mut stack = vec![state.to_path_buf()];
    let mut seen = 0;
    while let Some(path) = stack.pop() {
        seen += 1;
        if seen > MAX_WALK {
            break;
        }
        let Ok(mut meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let rel = as_rel.join(path.strip_prefix(state).unwrap_or(&path));
        let rel = rel.as_path();
        // A link's own mode is always 0777 and means nothing: the state dir
        // itself is judged by what it points at; a secret (or `ca/`) that is
        // a link is a finding (its target's modes and owner are anyone's).
        if meta.file_type().is_symlink() {
            if path == state {
                match std::fs::metadata(&path) {
                    Ok(target) => meta = target,
                    Err(_) => continue,
                }
            } else {
                if rel == Path::new("ca") || SECRETS.map(Path::new).contains(&rel) {
                    m.linked.push((shown(&path), link_target(&path)));
                }
                continue;
            }
        }
        judge_mode(
            rel,
            meta.is_dir(),
            meta.permissions().mode(),
            shown(&path),
            m,
        );
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
}

/// Where the link at `path` leads: the resolved path, or the raw target of
/// a dangling link.
fn link_target(path: &Path) -> String {
    match std::fs::canonicalize(path) {
        Ok(target) => shown(&target),
        Err(_) => match std::fs::read_link(path) {
            Ok(raw) => format!("{} (missing)", shown(&raw)),
            Err(_) => "an unreadable target".into(),
        },
    }
}

/// The finding for secrets that are symlinks: what each points at, why
/// that matters, and how to replace the link (chmod would only change the
/// target, and the link would still lead wherever its target is moved).
fn linked_secrets(linked: &[(String, String)]) -> Finding {
    let mut fixes = Vec::new();
    for (link, target) in linked {
        if Path::new(link).file_name() == Some(std::ffi::OsStr::new("ca")) {
            fixes.push(format!(
                "`rm {link}` and pass `--ca-dir {target}` to serve, run and doctor (or move that dir to {link})"
            ));
        } else {
            fixes.push(format!(
                "`cp --remove-destination {target} {link} && chmod 600 {link}`"
            ));
        }
    }
    let found: Vec<String> = linked
        .iter()
        .map(|(link, target)| format!("{link} -> {target}"))
        .collect();
    Finding::fail(
        "permissions",
        format!(
            "secrets that are symlinks: {} (a link's modes say nothing: whoever can write its target, or a dir on the way there, can read or swap the key or token, and veris would use it)",
            found.join(", ")
        ),
        format!("replace each link with a file of the state dir's own: {}", fixes.join("; ")),
    )
}

fn permissions(state: &Path, ca_dir: &Path) -> Finding {
    let s = shown(state);
    match std::fs::symlink_metadata(state) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Finding::warn(
                "permissions",
                format!("the state dir {s} does not exist yet"),
                "`veris ca init`, serve or run create it (0700 for its CA)",
            )
        }
        Err(e) => {
            return Finding::fail(
                "permissions",
                format!("cannot read the state dir {s} ({})", e.kind()),
                "run as the user that owns it, or root",
            )
        }
        Ok(_) => {}
    }
    let mut m = walk_modes(state);
    // A CA dir given with --ca-dir is judged as `<state>/ca` would be.
    if ca_dir != state.join("ca") && std::fs::symlink_metadata(ca_dir).is_ok() {
        walk_into(ca_dir, Path::new("ca"), &mut m);
        // Inside the state dir, its entries were seen twice.
        for found in [&mut m.writable, &mut m.exposed] {
            let mut seen = std::collections::BTreeSet::new();
            found.retain(|f| seen.insert(f.clone()));
        }
    }
    // Each finding is `path (why)`; the fix names the paths alone.
    let fail = |found: &[String], what: &str, why: &str, chmod: &str| {
        let paths: Vec<&str> = found
            .iter()
            .map(|p| p.rsplit_once(" (").map_or(p.as_str(), |(p, _)| p))
            .collect();
        Finding::fail(
            "permissions",
            format!("{what}: {} ({why})", found.join(", ")),
            format!("chmod {chmod} {}", paths.join(" ")),
        )
    };
    if !m.writable.is_empty() {
        return fail(
            &m.writable,
            "writable by group or others",
            "anyone could replace the CA, the ledger or the address a reader trusts",
            "go-w",
        );
    }
    if !m.linked.is_empty() {
        return linked_secrets(&m.linked);
    }
    if !m.exposed.is_empty() {
        return fail(
            &m.exposed,
            "open to group or others",
            "the CA dir must be 0700, keys and the admin token 0600",
            "go-rwx",
        );
    }
    let dirs = if ca_dir == state.join("ca") {
        s
    } else {
        format!("{s} and {}", shown(ca_dir))
    };
    Finding::ok(
        "permissions",
        format!("{dirs}: nothing writable by group or others; CA dir 0700, keys and token 0600"),
    )
}

/// `scheme://user:pass@host…` with the user info left out, for printing.
fn without_userinfo(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if scheme.is_empty() {
        format!("{host}{tail}")
    } else {
        format!("{scheme}://{host}{tail}")
    }
}

/// How a variable veris writes is meant to be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VarKind {
    /// A proxy URL (`HTTPS_PROXY`, …, `VERIS_PROXY_URL`).
    Proxy,
    /// A PEM file clients read roots from: it must hold the veris CA.
    Trust,
    VerisCanary,
}

/// The variables veris writes ([`veris_ca::env::vars`]) and how each is meant.
fn veris_vars(state: &Path) -> Vec<(String, VarKind)> {
    const PROXY: &str = "http://veris-doctor.invalid:1";
    let trust = TrustFiles::at(&state.join("trust"));
    let spec = EnvSpec {
        proxy_url: PROXY,
        no_proxy: &[],
        sandbox_id: "",
        canary: "cnry",
        trust: &trust,
        trust_only: false,
        java_tool_options_base: None,
        php_ini_scan_dir_base: None,
        extra: &[],
    };
    let (ca, bundle) = (shown(&trust.ca_pem), shown(&trust.bundle));
    veris_ca::env::vars(&spec)
        .into_iter()
        .filter_map(|(name, value)| {
            let kind = if value == PROXY {
                VarKind::Proxy
            } else if value == ca || value == bundle {
                VarKind::Trust
            } else if name == "VERIS_CANARY" {
                VarKind::VerisCanary
            } else {
                return None;
            };
            Some((name, kind))
        })
        .collect()
}

/// The shell's variables against this state dir's proxy and CA.
fn environment(
    state: &Path,
    env: &BTreeMap<String, String>,
    live: Option<&LiveStatus>,
    ca: Option<&str>,
) -> Finding {
    let s = shown(state);
    let source = match live {
        Some(l) => format!(
            "`eval \"$(veris ca env --state-dir {s} --proxy {})\"` (or source the file serve's --write-env wrote)",
            l.proxy_url
        ),
        None => format!(
            "start `veris serve --state-dir {s} --write-env FILE` and `. FILE`; `veris run` sets them for its command itself"
        ),
    };
    let set: Vec<(&str, &str, VarKind)> = veris_vars(state)
        .iter()
        .filter_map(|(name, kind)| {
            let (name, value) = env.get_key_value(name.as_str())?;
            (!value.trim().is_empty()).then_some((name.as_str(), value.as_str(), *kind))
        })
        .collect();
    let of = |kind: VarKind| set.iter().filter(move |(_, _, k)| *k == kind);
    let routed = of(VarKind::Proxy).next().is_some();

    // Trust variables whose file does not hold the CA, grouped by file.
    let mut untrusting: BTreeMap<String, (Vec<&str>, String)> = BTreeMap::new();
    if let Some(ca) = ca {
        for (name, value, _) in of(VarKind::Trust) {
            let why = match holds(Path::new(value), ca) {
                Ok(true) => continue,
                Ok(false) => "does not hold this state dir's CA".to_string(),
                Err(why) => format!("cannot be read ({why})"),
            };
            let entry = untrusting
                .entry(value.to_string())
                .or_insert_with(|| (Vec::new(), why));
            entry.0.push(name);
        }
    }
    let untrusting: Vec<String> = untrusting
        .iter()
        .map(|(value, (names, why))| format!("{} = {value}, which {why}", names.join(", ")))
        .collect();

    if !routed {
        let all_hold = ca.is_some() && untrusting.is_empty() && of(VarKind::Trust).next().is_some();
        return if all_hold {
            Finding::ok(
                "env",
                "trust variables only (no proxy variable), all holding the CA: right for the transparent tier",
            )
        } else if untrusting.is_empty() || ca.is_none() {
            Finding::warn(
                "env",
                "no veris variable in this shell: clients started from it go straight out (`veris run` sets them for its command)",
                source,
            )
        } else {
            Finding::warn(
                "env",
                format!(
                    "no proxy variable in this shell, and {}: a client pointed at veris from it would refuse veris's leaves",
                    untrusting.join("; ")
                ),
                source,
            )
        };
    }

    let Some(l) = live else {
        // Maybe another proxy altogether: `veris run` sets its own
        // variables, so only a shell meant for a serve of this state dir
        // is wrong, and none is live.
        let names: Vec<String> = of(VarKind::Proxy)
            .map(|(name, value, _)| format!("{name}={}", without_userinfo(value)))
            .collect();
        return Finding::warn(
            "env",
            format!(
                "{} but no proxy of this state dir is live: clients from this shell do not reach veris",
                names.join(", ")
            ),
            source,
        );
    };
    let mut problems = Vec::new();
    for (name, value, _) in of(VarKind::Proxy) {
        if value.trim_end_matches('/') != l.proxy_url.trim_end_matches('/') {
            problems.push(format!(
                "{name}={} but this state dir's proxy is {}",
                without_userinfo(value),
                l.proxy_url
            ));
        }
    }
    problems.extend(untrusting);
    if !problems.is_empty() {
        return Finding::fail("env", problems.join("; "), source);
    }
    if let Some((name, value, _)) = of(VarKind::VerisCanary).next() {
        if *value != l.canary {
            return Finding::warn(
                "env",
                format!(
                    "{name} is another run's canary, not this proxy's (run {}): `veris check` says so and exits 2",
                    l.run_id
                ),
                source,
            );
        }
    }
    let names: Vec<&str> = set.iter().map(|(n, _, _)| *n).collect();
    Finding::ok(
        "env",
        format!(
            "{} veris variable(s) point at this state dir's proxy and CA ({})",
            names.len(),
            names.join(", ")
        ),
    )
}

/// The isolated run's namespace steps, tried in a child: (userns, nft).
async fn namespaces() -> (Finding, Finding) {
    let nft_path = crate::os::tool::find_tool("nft");
    let probe = async {
        let exe = std::env::current_exe().ok()?;
        let child = tokio::process::Command::new(exe)
            .arg("__isolate-probe")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        let out = tokio::time::timeout(PROBE_TIMEOUT, child.wait_with_output())
            .await
            .ok()?
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let said = probe.await.unwrap_or_default();
    let field = |key: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
    };
    let userns = match field("userns:") {
        Some(v) if v == "ok" => Finding::ok(
            "userns",
            "user, network and mount namespaces can be made here: `veris run` isolates its command",
        ),
        Some(why) => Finding::warn(
            "userns",
            format!("{why}; `veris run` falls back to Landlock or the explicit tier, and `--isolate` fails"),
            "allow unprivileged user namespaces (`sysctl -w user.max_user_namespaces=15000`; Ubuntu 24.04+: `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; in a container, a seccomp profile that allows unshare), or run as root",
        ),
        None => Finding::warn(
            "userns",
            "the namespace probe gave no answer",
            "try `veris run --isolate -- true` to see why isolation fails",
        ),
    };
    let nft = match (&nft_path, field("nft:")) {
        (None, _) => Finding::warn(
            "nft",
            "nft not found on PATH: isolated runs and the transparent tier need it",
            "install nftables (`apt-get install nftables`)",
        ),
        (Some(path), Some(v)) if v == "ok" => Finding::ok(
            "nft",
            format!("{} loads rules in an unprivileged namespace", shown(path)),
        ),
        (Some(path), Some(v)) if v == "not tried" => Finding::ok(
            "nft",
            format!(
                "{} is present (not tried: no namespace to try it in)",
                shown(path)
            ),
        ),
        (Some(path), Some(why)) => Finding::warn(
            "nft",
            format!("{} cannot load rules in a namespace: {why}", shown(path)),
            "check that the kernel has nf_tables (`modprobe nf_tables`)",
        ),
        (Some(path), None) => Finding::ok("nft", format!("{} is present", shown(path))),
    };
    (userns, nft)
}

/// Which ledger `veris receipt`, `har`, `tui` and `baseline` read in this
/// state dir, by the one rule (`crate::runtime::ledgers::resolve`).
fn ledger(state: &Path, serve_live: bool) -> Finding {
    use crate::runtime::ledgers::Source;
    let s = shown(state);
    let runs = crate::runtime::ledgers::list_runs(state);
    let unreadable = runs.iter().filter(|r| r.unusable.is_some()).count();
    match crate::runtime::ledgers::resolve(state, None, None, serve_live) {
        Ok(Source::Run { id, .. }) => Finding::ok(
            "ledger",
            format!(
                "readers read run {id}, the newest of {} run(s) here (`veris runs --state-dir {s}` lists them; --run ID picks another)",
                runs.len() - unreadable
            ),
        ),
        Ok(source) => Finding::ok(
            "ledger",
            format!(
                "readers read the serve's {} ({} run(s) beside it: --run ID reads one)",
                shown(source.path()),
                runs.len() - unreadable
            ),
        ),
        Err(_) => Finding::warn(
            "ledger",
            format!(
                "nothing to read yet: no live serve, no {s}/ledger.jsonl and no readable run under {s}/runs ({unreadable} unreadable entr{})",
                if unreadable == 1 { "y" } else { "ies" }
            ),
            format!("run a command under veris (`veris run --state-dir {s} -- CMD`) or start `veris serve --state-dir {s}`"),
        ),
    }
}

/// The live proxy found by discovery, and its line.
struct Live {
    finding: Finding,
    status: Option<LiveStatus>,
}

async fn live(state: &Path) -> Live {
    let s = shown(state);
    let serve = format!("`veris serve --state-dir {s}`");
    match crate::runtime::live::discover(state).await {
        Discovery::Live(proxy) => match proxy.status().await {
            Ok(status) => match status.writes_ledger(&state.join("ledger.jsonl")) {
                // Admin files copied from another state dir reach a proxy
                // that answers to the token but writes another ledger: not
                // this state dir's proxy, so nothing else is judged against it.
                Err(why) => Live {
                    finding: Finding::fail(
                        "proxy",
                        format!(
                            "the proxy at {} (run {}) is not the one writing this state dir's ledger: {why}",
                            proxy.base, status.run_id
                        ),
                        format!(
                            "{s}/{ADDR_FILE} and {s}/{TOKEN_FILE} name another state dir's proxy (copied, or left by a proxy that moved): do not trust them; remove both and start {serve}, or run doctor with that proxy's own --state-dir"
                        ),
                    ),
                    status: None,
                },
                Ok(()) => Live {
                    finding: Finding::ok(
                        "proxy",
                        format!(
                            "live at {} (run {}, {} tier, proxy {})",
                            proxy.base,
                            status.run_id,
                            status.tier.word(),
                            status.proxy_url
                        ),
                    ),
                    status: Some(status),
                },
            },
            Err(e) => Live {
                finding: Finding::fail(
                    "proxy",
                    format!("the proxy at {} stopped answering ({e:#})", proxy.base),
                    format!("look at its log; restart it with {serve}"),
                ),
                status: None,
            },
        },
        Discovery::Unusable(why) => Live {
            finding: Finding::fail(
                "proxy",
                why,
                "run `veris doctor` as the proxy uid or root, or with VERIS_ADMIN_TOKEN set",
            ),
            status: None,
        },
        Discovery::NotLive => {
            let addr = crate::util::read_bounded(&state.join(ADDR_FILE), 4096, false).ok();
            let finding = match addr {
                Some(addr) => Finding::fail(
                    "proxy",
                    format!(
                        "{s}/{ADDR_FILE} names {} but no veris proxy of this state dir answers there (a serve that crashed or was killed)",
                        addr.trim()
                    ),
                    format!("start {serve} (it writes a new address), or remove {s}/{ADDR_FILE} and {s}/{TOKEN_FILE}"),
                ),
                None => Finding::warn(
                    "proxy",
                    "no live proxy announced in this state dir (`veris run` starts its own)",
                    format!("for a long-running proxy, {serve}"),
                ),
            };
            Live {
                finding,
                status: None,
            }
        }
    }
}

/// The live proxy's canary along its interception path.
async fn canary(status: Option<&LiveStatus>) -> Finding {
    let Some(status) = status else {
        return Finding::warn(
            "canary",
            "not checked: no live proxy",
            "fix the proxy line first",
        );
    };
    let path = crate::runtime::checks::probe_path(status.tier, &status.proxy_url);
    let check = crate::runtime::checks::canary_check(
        &path,
        &status.canary,
        &status.run_id,
        Duration::from_secs(5),
    )
    .await;
    match check.status {
        CheckStatus::Ok => Finding::ok("canary", check.detail),
        _ => Finding::fail(
            "canary",
            check.detail,
            "the proxy does not answer its own canary on its interception path: check its listener (--listen), a firewall, or in the transparent tier the redirect (run doctor as the workload's uid)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM_A: &str = "-----BEGIN CERTIFICATE-----\nQUFB\nQkJC\n-----END CERTIFICATE-----\n";
    const PEM_B: &str = "-----BEGIN CERTIFICATE-----\r\nQ0ND\r\n-----END CERTIFICATE-----\r\n";

    #[test]
    fn a_bundle_holds_a_certificate_whatever_its_line_breaks() {
        assert_eq!(cert_body(PEM_A), "QUFBQkJC");
        let bundle = format!("# roots\n{PEM_B}\n{PEM_A}");
        assert_eq!(cert_bodies(&bundle), ["Q0ND", "QUFBQkJC"]);
        assert_eq!(cert_body("no pem"), "");
    }

    #[test]
    fn modes_are_judged_by_what_the_file_is() {
        let mut m = Modes::default();
        let judge = |rel: &str, dir: bool, mode: u32, m: &mut Modes| {
            judge_mode(Path::new(rel), dir, mode, rel.to_string(), m)
        };
        judge("", true, 0o40755, &mut m);
        judge("ca", true, 0o40700, &mut m);
        judge("ca/veris-ca-key.pem", false, 0o100600, &mut m);
        judge("admin.token", false, 0o100600, &mut m);
        judge("trust/bundle.pem", false, 0o100644, &mut m);
        assert_eq!(m, Modes::default());
        judge("", true, 0o40777, &mut m);
        judge("ca", true, 0o40755, &mut m);
        judge("seal.key", false, 0o100640, &mut m);
        judge("admin.addr", false, 0o100644, &mut m);
        judge("ledger.jsonl", false, 0o100664, &mut m);
        assert_eq!(m.writable, [" (0777)", "ledger.jsonl (0664)"]);
        assert_eq!(m.exposed, ["ca (0755)", "seal.key (0640)"]);
        judge("admin.addr", false, 0o100664, &mut m);
        assert_eq!(m.writable.last().unwrap(), "admin.addr (0664)");
    }

    /// A state dir reached through a link is walked; a secret that is a link
    /// is a finding whatever its target's mode.
    #[test]
    fn links_to_the_state_dir_are_followed_and_linked_secrets_are_findings() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("veris-doctor-links-{}", std::process::id()));
        let real = base.join("real");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("ledger.jsonl"), "").unwrap();
        std::fs::set_permissions(
            real.join("ledger.jsonl"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        std::fs::write(base.join("key"), "k").unwrap();
        std::fs::set_permissions(base.join("key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(base.join("key"), real.join("seal.key")).unwrap();
        let link = base.join("state");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let m = walk_modes(&link);
        assert!(
            m.writable.iter().any(|w| w.contains("ledger.jsonl")),
            "{m:?}"
        );
        assert_eq!(
            m.linked,
            [(
                shown(&link.join("seal.key")),
                shown(&std::fs::canonicalize(base.join("key")).unwrap())
            )],
            "{m:?}"
        );
        let line = linked_secrets(&m.linked).line();
        assert!(line.contains("cp --remove-destination"), "{line}");
        assert!(!line.contains("chmod go-rwx"), "{line}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    fn status(proxy_url: &str) -> LiveStatus {
        serde_json::from_value(serde_json::json!({
            "run_id": "run_1", "canary": "cnry_1", "tier": "explicit",
            "proxy_url": proxy_url, "head_seq": 1,
        }))
        .unwrap()
    }

    #[test]
    fn the_env_is_judged_against_the_live_proxy_and_the_ca() {
        let dir = std::env::temp_dir().join(format!("veris-doctor-env-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("trust")).unwrap();
        let bundle = dir.join("trust/bundle.pem");
        std::fs::write(&bundle, format!("{PEM_B}{PEM_A}")).unwrap();
        let other = dir.join("other.pem");
        std::fs::write(&other, PEM_B).unwrap();
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let ca = cert_body(PEM_A);
        let live = status("http://127.0.0.1:9");
        let b = bundle.to_str().unwrap();

        let f = environment(&dir, &env(&[("PATH", "/bin")]), Some(&live), Some(&ca));
        assert_eq!(f.level, Level::Warn, "{}", f.line());
        // Ambient trust variables without a proxy variable: a warning.
        let ambient = env(&[("SSL_CERT_FILE", other.to_str().unwrap())]);
        let f = environment(&dir, &ambient, Some(&live), Some(&ca));
        assert_eq!(f.level, Level::Warn, "{}", f.line());
        // Trust only, holding the CA: the transparent tier's env.
        let f = environment(&dir, &env(&[("SSL_CERT_FILE", b)]), None, Some(&ca));
        assert_eq!(f.level, Level::Ok, "{}", f.line());

        let good = env(&[
            ("HTTPS_PROXY", "http://127.0.0.1:9/"),
            ("SSL_CERT_FILE", b),
            ("VERIS_CANARY", "cnry_1"),
        ]);
        let f = environment(&dir, &good, Some(&live), Some(&ca));
        assert_eq!(f.level, Level::Ok, "{}", f.line());

        let wrong = env(&[
            ("HTTPS_PROXY", "http://user:secret@127.0.0.1:8/"),
            ("SSL_CERT_FILE", other.to_str().unwrap()),
        ]);
        let f = environment(&dir, &wrong, Some(&live), Some(&ca));
        assert_eq!(f.level, Level::Fail);
        let line = f.line();
        assert!(
            line.contains("SSL_CERT_FILE = ") && line.contains("which does not hold"),
            "{line}"
        );
        assert!(line.contains("HTTPS_PROXY=http://127.0.0.1:8/"), "{line}");
        assert!(!line.contains("secret"), "{line}");
        assert!(line.contains("Next: "), "{line}");

        // Pointed at a proxy while none of this state dir is live: maybe
        // another proxy; `veris run` sets its own. A warning.
        let f = environment(
            &dir,
            &env(&[("HTTPS_PROXY", "http://127.0.0.1:9")]),
            None,
            Some(&ca),
        );
        assert_eq!(f.level, Level::Warn, "{}", f.line());

        let stale = env(&[
            ("HTTPS_PROXY", "http://127.0.0.1:9"),
            ("VERIS_CANARY", "cnry_0"),
        ]);
        let f = environment(&dir, &stale, Some(&live), Some(&ca));
        assert_eq!(f.level, Level::Warn, "{}", f.line());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn user_info_is_left_out_of_a_printed_url() {
        assert_eq!(without_userinfo("http://u:p@h:1/x?y"), "http://h:1/x?y");
        assert_eq!(without_userinfo("h:1"), "h:1");
    }
}
