//! The env file that points a workload at the proxy and at the published trust material.
//!
//! `vars` builds the ordered variable matrix of DESIGN §5 from what the caller passes (the
//! library never reads the process environment); `render` turns it into a POSIX shell file
//! (`export NAME='value'`, single-quoted) or a docker `--env-file` (`NAME=value`, verbatim);
//! `write` does both and writes the result atomically. Variables that *replace* a client's
//! roots point at the bundle (system roots + veris CA); `NODE_EXTRA_CA_CERTS` adds to Node's
//! roots, so it points at the bare CA. `WGETRC` and `PHP_INI_SCAN_DIR` name the generated
//! config files of clients that read no CA variable (see [`crate::trust`]).

use std::path::Path;

use crate::fsutil::write_atomic;
use crate::trust::TrustFiles;
use crate::CaError;

/// Output syntax of the env file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvFormat {
    /// `export NAME='value'`, for `. FILE` in sh/bash.
    Posix,
    /// `NAME=value`, for `docker run --env-file FILE`.
    Docker,
}

/// What the env file describes.
#[derive(Debug, Clone, Copy)]
pub struct EnvSpec<'a> {
    /// e.g. "http://127.0.0.1:8080"
    pub proxy_url: &'a str,
    /// e.g. ["localhost","127.0.0.1","::1"]
    pub no_proxy: &'a [String],
    pub sandbox_id: &'a str,
    pub canary: &'a str,
    pub trust: &'a TrustFiles,
    /// Leave out every routing variable (transparent tier).
    pub trust_only: bool,
    /// Existing JAVA_TOOL_OPTIONS to append to (the library never reads env).
    pub java_tool_options_base: Option<&'a str>,
    /// Existing PHP_INI_SCAN_DIR to append the veris ini dir to; without one the value starts
    /// with `:`, which keeps PHP's compiled-in scan dir (the system's ini files) in front.
    pub php_ini_scan_dir_base: Option<&'a str>,
    /// Further variables the command gets as they are (a webhook signing
    /// secret), after veris's own.
    pub extra: &'a [(String, String)],
}

/// Proxy variables, in both cases because clients disagree on which they read.
const PROXY_VARS: [&str; 3] = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"];

/// Variables whose value replaces a client's root store: they get the bundle.
const BUNDLE_VARS: [&str; 18] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "AWS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
    "PIP_CERT",
    "npm_config_cafile",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "BUNDLE_SSL_CA_CERT",
    "COMPOSER_CAFILE",
    "HEX_CACERTS_PATH",
    "JULIA_SSL_CA_ROOTS_PATH",
    "NIX_SSL_CERT_FILE",
    "PERL_LWP_SSL_CA_FILE",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
    // httplib2 (and the Google API clients on it) reads its own bundle otherwise.
    "HTTPLIB2_CA_CERTS",
];

/// Ordered, the full matrix of DESIGN §5.
pub fn vars(spec: &EnvSpec) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |k: &str, v: String| out.push((k.to_owned(), v));
    let no_proxy = spec.no_proxy.join(",");
    if !spec.trust_only {
        for name in PROXY_VARS {
            push(name, spec.proxy_url.to_owned());
        }
        push("NO_PROXY", no_proxy.clone());
        for name in PROXY_VARS {
            push(&name.to_ascii_lowercase(), spec.proxy_url.to_owned());
        }
        push("no_proxy", no_proxy);
    }
    let path = |p: &Path| p.to_string_lossy().into_owned();
    push("NODE_EXTRA_CA_CERTS", path(&spec.trust.ca_pem));
    for name in BUNDLE_VARS {
        push(name, path(&spec.trust.bundle));
    }
    push("WGETRC", path(&spec.trust.wgetrc));
    push("PHP_INI_SCAN_DIR", php_ini_scan_dir(spec));
    push("JAVA_TOOL_OPTIONS", java_tool_options(spec));
    if !spec.trust_only {
        push("VERIS_PROXY_URL", spec.proxy_url.to_owned());
    }
    push("VERIS_SANDBOX_ID", spec.sandbox_id.to_owned());
    push("VERIS_CANARY", spec.canary.to_owned());
    out.extend(spec.extra.iter().cloned());
    out
}

/// PHP reads every dir of the `:`-separated list in turn; an empty element stands for the
/// compiled-in scan dir (`/etc/php/<v>/cli/conf.d` on Debian). Without that element the
/// variable *replaces* it and every extension the system enables there is lost.
fn php_ini_scan_dir(spec: &EnvSpec) -> String {
    let ours = spec.trust.php_ini_dir.to_string_lossy();
    match spec.php_ini_scan_dir_base.filter(|b| !b.is_empty()) {
        // The user's list as it was (it may drop the default on purpose), then ours.
        Some(base) => format!("{base}:{ours}"),
        None => format!(":{ours}"),
    }
}

/// The existing options (if any) followed by truststore and, unless trust-only, proxy flags.
fn java_tool_options(spec: &EnvSpec) -> String {
    let mut opts: Vec<String> = Vec::new();
    if let Some(base) = spec.java_tool_options_base.map(str::trim) {
        if !base.is_empty() {
            opts.push(base.to_owned());
        }
    }
    let t = spec.trust;
    opts.push(java_flag(
        "javax.net.ssl.trustStore",
        &t.truststore.to_string_lossy(),
    ));
    opts.push(java_flag(
        "javax.net.ssl.trustStorePassword",
        &t.truststore_password,
    ));
    opts.push(java_flag("javax.net.ssl.trustStoreType", t.truststore_type));
    if !spec.trust_only {
        if let Some((host, port)) = split_proxy_url(spec.proxy_url) {
            opts.push(java_flag("http.proxyHost", &host));
            opts.push(java_flag("http.proxyPort", &port.to_string()));
            opts.push(java_flag("https.proxyHost", &host));
            opts.push(java_flag("https.proxyPort", &port.to_string()));
        }
        if !spec.no_proxy.is_empty() {
            // Java matches `*.example.com`, where NO_PROXY conventionally says `.example.com`.
            let hosts: Vec<String> = spec
                .no_proxy
                .iter()
                .map(|h| match h.strip_prefix('.') {
                    Some(rest) => format!("*.{rest}"),
                    None => h.clone(),
                })
                .collect();
            opts.push(java_flag("http.nonProxyHosts", &hosts.join("|")));
        }
    }
    opts.join(" ")
}

/// `-Dname=value`; the JVM splits JAVA_TOOL_OPTIONS on whitespace but honours double quotes,
/// so a value with whitespace is quoted.
fn java_flag(name: &str, value: &str) -> String {
    if value.chars().any(char::is_whitespace) {
        format!("\"-D{name}={value}\"")
    } else {
        format!("-D{name}={value}")
    }
}

/// Host (without IPv6 brackets) and port of an `http://[user@]host[:port][/…]` URL.
fn split_proxy_url(url: &str) -> Option<(String, u16)> {
    let (default_port, rest) = if let Some(r) = url.strip_prefix("http://") {
        (80, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (443, r)
    } else {
        (80, url)
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default_port,
        };
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None if !authority.is_empty() => Some((authority.to_owned(), default_port)),
        None => None,
    }
}

/// The `NO_PROXY` veris sets, once a user's own is merged in ([`merge_no_proxy`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NoProxy {
    /// veris's entries first, then the user's kept ones, each once.
    pub entries: Vec<String>,
    /// User entries left out, each with the routed host pattern it would have sent around the
    /// proxy: the caller warns about them.
    pub dropped: Vec<(String, String)>,
}

/// Merges a user's `NO_PROXY`/`no_proxy` values (comma- or space-separated, as clients read
/// them) into veris's own `ours`: the union, without duplicates (compared case-insensitively),
/// veris's entries kept. A user entry that would exempt a routed vendor host from the proxy
/// (`*`, `.stripe.com`, `api.stripe.com:443`, `com`) is dropped instead: honouring it would
/// let the client call the vendor directly and the receipt miss it. `routed` holds the routed
/// host patterns (`api.stripe.com`, `*.stripe.com`).
pub fn merge_no_proxy(ours: &[String], user: &[&str], routed: &[String]) -> NoProxy {
    let mut out = NoProxy {
        entries: Vec::new(),
        dropped: Vec::new(),
    };
    let mut seen = std::collections::HashSet::new();
    for entry in ours {
        if seen.insert(entry.to_ascii_lowercase()) {
            out.entries.push(entry.clone());
        }
    }
    let user_entries = user
        .iter()
        .flat_map(|v| v.split([',', ' ', '\t', '\n']))
        .map(str::trim)
        .filter(|e| !e.is_empty());
    for entry in user_entries {
        if !seen.insert(entry.to_ascii_lowercase()) {
            continue;
        }
        match routed.iter().find(|p| no_proxy_covers(entry, p)) {
            Some(pattern) => out.dropped.push((entry.to_owned(), pattern.clone())),
            None => out.entries.push(entry.to_owned()),
        }
    }
    out
}

/// Whether a `NO_PROXY` entry exempts some host the routed `pattern` (`host` or `*.suffix`)
/// matches, under the loosest reading clients have: `*` is everything; an entry is a domain
/// suffix with or without a leading `.` or `*.` (curl, Python, Go, wget); a port is ignored.
fn no_proxy_covers(entry: &str, pattern: &str) -> bool {
    let e = entry.trim().to_ascii_lowercase();
    if e == "*" {
        return true;
    }
    let e = e.trim_start_matches("*.").trim_start_matches('.');
    // `host:port` (but not an IPv6 literal, which vendor patterns never are).
    let e = match e.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => e,
    };
    let e = e.trim_end_matches('.');
    if e.is_empty() {
        return false;
    }
    let p = pattern.to_ascii_lowercase();
    let under = |host: &str, domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
    match p.strip_prefix("*.") {
        // `*.stripe.com` routes stripe.com and every name under it: an entry for any of them,
        // or for a parent domain, exempts a routed host.
        Some(suffix) => under(e, suffix) || under(suffix, e),
        None => under(&p, e),
    }
}

/// Renders the variables; values are written as given (see `write` for what is rejected).
pub fn render(vars: &[(String, String)], format: EnvFormat) -> String {
    let mut out = String::from("# veris environment; generated, do not edit\n");
    match format {
        EnvFormat::Posix => {
            for (k, v) in vars {
                // Inside single quotes nothing is special except the quote itself, which is
                // written as: close quote, escaped quote, reopen quote.
                out.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
            }
        }
        EnvFormat::Docker => {
            for (k, v) in vars {
                out.push_str(&format!("{k}={v}\n"));
            }
        }
    }
    out
}

/// Atomic; posix 0600, docker 0644.
pub fn write(path: &Path, spec: &EnvSpec, format: EnvFormat) -> Result<(), CaError> {
    let vars = vars(spec);
    for (k, v) in &vars {
        let why = match format {
            _ if v.contains('\0') => Some("it contains a NUL byte"),
            EnvFormat::Docker if v.contains(['\n', '\r']) => {
                Some("docker env files cannot hold a line break")
            }
            _ => None,
        };
        if let Some(why) = why {
            return Err(CaError::EnvValue {
                name: k.clone(),
                format: match format {
                    EnvFormat::Posix => "posix",
                    EnvFormat::Docker => "docker",
                },
                why,
            });
        }
    }
    // No secret in it (proxy URL, trust paths, the canary the workload is
    // meant to see), and the workload, another uid in the transparent tier,
    // must be able to read it.
    let mode = 0o644;
    write_atomic(path, render(&vars, format).as_bytes(), mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_proxy_url_handles_ipv4_ipv6_and_defaults() {
        assert_eq!(
            split_proxy_url("http://127.0.0.1:8080"),
            Some(("127.0.0.1".into(), 8080))
        );
        assert_eq!(
            split_proxy_url("http://[::1]:3128/"),
            Some(("::1".into(), 3128))
        );
        assert_eq!(
            split_proxy_url("http://u:p@proxy.local"),
            Some(("proxy.local".into(), 80))
        );
        assert_eq!(split_proxy_url("http://"), None);
    }

    #[test]
    fn php_scan_dir_keeps_the_default_dir_or_the_users_list() {
        let trust = TrustFiles::at(Path::new("/v/trust"));
        let mut spec = EnvSpec {
            proxy_url: "http://127.0.0.1:1",
            no_proxy: &[],
            sandbox_id: "s",
            canary: "c",
            trust: &trust,
            trust_only: true,
            java_tool_options_base: None,
            php_ini_scan_dir_base: None,
            extra: &[],
        };
        assert_eq!(php_ini_scan_dir(&spec), ":/v/trust/php");
        spec.php_ini_scan_dir_base = Some("");
        assert_eq!(php_ini_scan_dir(&spec), ":/v/trust/php");
        spec.php_ini_scan_dir_base = Some("/etc/php/extra");
        assert_eq!(php_ini_scan_dir(&spec), "/etc/php/extra:/v/trust/php");
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_proxy_is_merged_deduplicated_and_never_exempts_a_routed_host() {
        let ours = strings(&["localhost", "127.0.0.1", "::1"]);
        let routed = strings(&["api.stripe.com", "*.stripe.com", "www.googleapis.com"]);
        let merged = merge_no_proxy(
            &ours,
            &[
                "LOCALHOST, internal.corp,.stripe.com",
                "internal.corp 10.0.0.0/8 *",
            ],
            &routed,
        );
        assert_eq!(
            merged.entries,
            strings(&[
                "localhost",
                "127.0.0.1",
                "::1",
                "internal.corp",
                "10.0.0.0/8"
            ])
        );
        assert_eq!(
            merged.dropped,
            vec![
                (".stripe.com".to_string(), "api.stripe.com".to_string()),
                ("*".to_string(), "api.stripe.com".to_string()),
            ]
        );
        for (entry, covers) in [
            ("stripe.com", true),
            ("files.stripe.com", true),
            ("*.stripe.com", true),
            ("api.stripe.com:443", true),
            ("com", true),
            ("googleapis.com", true),
            (".googleapis.com", true),
            ("calendar.googleapis.com", false),
            ("notstripe.com", false),
            ("stripe.co", false),
            ("10.0.0.0/8", false),
            ("::1", false),
            (".", false),
        ] {
            assert_eq!(
                routed.iter().any(|p| no_proxy_covers(entry, p)),
                covers,
                "{entry}"
            );
        }
    }
}
