//! The env file that points a workload at the proxy and at the published trust material.
//!
//! `vars` builds the ordered variable matrix of DESIGN §5 from what the caller passes (the
//! library never reads the process environment); `render` turns it into a POSIX shell file
//! (`export NAME='value'`, single-quoted) or a docker `--env-file` (`NAME=value`, verbatim);
//! `write` does both and writes the result atomically. Variables that *replace* a client's
//! roots point at the bundle (system roots + veris CA); `NODE_EXTRA_CA_CERTS` adds to Node's
//! roots, so it points at the bare CA.

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
    push("JAVA_TOOL_OPTIONS", java_tool_options(spec));
    if !spec.trust_only {
        push("VERIS_PROXY_URL", spec.proxy_url.to_owned());
    }
    push("VERIS_SANDBOX_ID", spec.sandbox_id.to_owned());
    push("VERIS_CANARY", spec.canary.to_owned());
    out
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
}
