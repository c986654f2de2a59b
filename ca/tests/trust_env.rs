//! Trust material and env file tests: modes, bundle order, keytool, golden env files, sh.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{clean_command, have_tool, Scratch};
use veris_ca::env::{self, EnvFormat, EnvSpec};
use veris_ca::trust::{self, TrustFiles};
use veris_ca::CertificateAuthority;

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn publish_writes_ca_bundle_and_truststore_with_modes() {
    let s = Scratch::new("trust-publish");
    let (ca, _) =
        CertificateAuthority::load_or_create(&s.path().join("ca"), &common::scope()).unwrap();
    // A stand-in system bundle: another CA's certificate, without a trailing newline.
    let (sys_ca, _) =
        CertificateAuthority::load_or_create(&s.path().join("sys"), &common::scope()).unwrap();
    let sys_bundle = s.path().join("system.crt");
    fs::write(&sys_bundle, sys_ca.cert_pem().trim_end()).unwrap();

    let trust_dir = s.path().join("trust");
    let files = trust::publish(&trust_dir, &ca, Some(&sys_bundle)).unwrap();
    assert_eq!(files, TrustFiles::at(&trust_dir));
    assert_eq!(mode(&trust_dir), 0o755);
    let php_ini = files.php_ini_dir.join(trust::PHP_INI_FILE);
    for f in [
        &files.ca_pem,
        &files.bundle,
        &files.truststore,
        &files.wgetrc,
        &php_ini,
    ] {
        assert_eq!(mode(f), 0o644, "{}", f.display());
    }
    assert_eq!(mode(&files.php_ini_dir), 0o755);
    // wget and PHP are pointed at the bundle, which is what they replace their roots with.
    let bundle_path = files.bundle.display().to_string();
    let wgetrc = fs::read_to_string(&files.wgetrc).unwrap();
    assert!(
        wgetrc
            .lines()
            .any(|l| l == format!("ca_certificate = {bundle_path}")),
        "{wgetrc}"
    );
    assert!(wgetrc.lines().any(|l| l == "use_proxy = on"), "{wgetrc}");
    let ini = fs::read_to_string(&php_ini).unwrap();
    for key in ["openssl.cafile", "curl.cainfo"] {
        assert!(
            ini.lines()
                .any(|l| l == format!("{key} = \"{bundle_path}\"")),
            "{ini}"
        );
    }
    assert_eq!(fs::read_to_string(&files.ca_pem).unwrap(), ca.cert_pem());
    let bundle = fs::read_to_string(&files.bundle).unwrap();
    assert!(bundle.starts_with(sys_ca.cert_pem().trim_end()));
    assert!(
        bundle.trim_end().ends_with(ca.cert_pem().trim_end()),
        "veris CA must come last"
    );
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2);
    // The key never leaves the CA dir.
    for f in fs::read_dir(&trust_dir)
        .unwrap()
        .chain(fs::read_dir(&files.php_ini_dir).unwrap())
    {
        let path = f.unwrap().path();
        if path.is_dir() {
            continue;
        }
        let text = fs::read(&path).unwrap();
        assert!(!String::from_utf8_lossy(&text).contains("PRIVATE KEY"));
    }
    assert_eq!(files.truststore_type, "JKS");
    let jks = fs::read(&files.truststore).unwrap();
    assert_eq!(&jks[..4], &[0xFE, 0xED, 0xFE, 0xED]);
    assert_eq!(&jks[8..12], &2u32.to_be_bytes(), "system root + veris ca");

    // Without a system bundle the bundle is the veris CA alone.
    let files = trust::publish(&trust_dir, &ca, None).unwrap();
    let bundle = fs::read_to_string(&files.bundle).unwrap();
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 1);
    assert!(bundle.contains(ca.cert_pem().trim_end()));
}

#[test]
fn keytool_reads_the_truststore_with_system_roots() {
    if !have_tool("keytool", "-help") {
        return;
    }
    let s = Scratch::new("trust-keytool");
    let (ca, _) =
        CertificateAuthority::load_or_create(&s.path().join("ca"), &common::scope()).unwrap();
    let system = trust::find_system_bundle(None);
    let roots = system
        .as_ref()
        .map(|p| {
            fs::read_to_string(p)
                .unwrap()
                .matches("BEGIN CERTIFICATE")
                .count()
        })
        .unwrap_or(0);
    let files = trust::publish(&s.path().join("trust"), &ca, system.as_deref()).unwrap();
    let out = clean_command("keytool")
        .args(["-list", "-keystore"])
        .arg(&files.truststore)
        .args([
            "-storepass",
            &files.truststore_password,
            "-storetype",
            files.truststore_type,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("veris-ca"), "{text}");
    assert!(
        text.contains(&format!("Your keystore contains {} entries", roots + 1)),
        "{text}"
    );
    assert_eq!(text.matches("trustedCertEntry").count(), roots + 1);
    // keytool prints the SHA-256 fingerprint in the same form we do.
    assert!(text.contains(&ca.fingerprint_sha256()), "{text}");

    // A wrong password fails the JDK's integrity check: the digest is really verified.
    let out = clean_command("keytool")
        .args(["-list", "-keystore"])
        .arg(&files.truststore)
        .args(["-storepass", "wrong-password", "-storetype", "JKS"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

fn fixed_trust() -> TrustFiles {
    TrustFiles {
        dir: PathBuf::from("/veris/trust"),
        ca_pem: PathBuf::from("/veris/trust/ca.pem"),
        bundle: PathBuf::from("/veris/trust/bundle.pem"),
        truststore: PathBuf::from("/veris/trust/truststore.jks"),
        wgetrc: PathBuf::from("/veris/trust/wgetrc"),
        php_ini_dir: PathBuf::from("/veris/trust/php"),
        truststore_password: "changeit".into(),
        truststore_type: "JKS",
    }
}

fn no_proxy() -> Vec<String> {
    vec![
        "localhost".into(),
        "127.0.0.1".into(),
        "::1".into(),
        ".internal".into(),
    ]
}

const BUNDLE_VARS: &[&str] = &[
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
    "HTTPLIB2_CA_CERTS",
];

fn golden(prefix: &str, proxy: bool, java: &str) -> String {
    let mut g = String::from("# veris environment; generated, do not edit\n");
    let q = |v: &str| match prefix {
        "export " => format!("'{v}'"),
        _ => v.to_owned(),
    };
    let mut line = |k: &str, v: &str| g.push_str(&format!("{prefix}{k}={}\n", q(v)));
    if proxy {
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            line(k, "http://127.0.0.1:8080");
        }
        line("NO_PROXY", "localhost,127.0.0.1,::1,.internal");
        for k in ["http_proxy", "https_proxy", "all_proxy"] {
            line(k, "http://127.0.0.1:8080");
        }
        line("no_proxy", "localhost,127.0.0.1,::1,.internal");
    }
    line("NODE_EXTRA_CA_CERTS", "/veris/trust/ca.pem");
    for k in BUNDLE_VARS {
        line(k, "/veris/trust/bundle.pem");
    }
    line("WGETRC", "/veris/trust/wgetrc");
    line("PHP_INI_SCAN_DIR", ":/veris/trust/php");
    line("JAVA_TOOL_OPTIONS", java);
    if proxy {
        line("VERIS_PROXY_URL", "http://127.0.0.1:8080");
    }
    line("VERIS_SANDBOX_ID", "sbx_a1b2c3");
    line("VERIS_CANARY", "cnry_0123456789abcdef0123456789abcdef");
    g
}

const JAVA_TRUST: &str = "-Djavax.net.ssl.trustStore=/veris/trust/truststore.jks \
-Djavax.net.ssl.trustStorePassword=changeit -Djavax.net.ssl.trustStoreType=JKS";

fn spec<'a>(trust: &'a TrustFiles, np: &'a [String], trust_only: bool) -> EnvSpec<'a> {
    EnvSpec {
        proxy_url: "http://127.0.0.1:8080",
        no_proxy: np,
        sandbox_id: "sbx_a1b2c3",
        canary: "cnry_0123456789abcdef0123456789abcdef",
        trust,
        trust_only,
        java_tool_options_base: Some("-Xmx512m"),
        php_ini_scan_dir_base: None,
        extra: &[],
    }
}

#[test]
fn golden_posix_and_docker() {
    let trust = fixed_trust();
    let np = no_proxy();
    let java = format!(
        "-Xmx512m {JAVA_TRUST} -Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort=8080 \
-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=8080 \
-Dhttp.nonProxyHosts=localhost|127.0.0.1|::1|*.internal"
    );
    let vars = env::vars(&spec(&trust, &np, false));
    assert_eq!(
        env::render(&vars, EnvFormat::Posix),
        golden("export ", true, &java)
    );
    assert_eq!(
        env::render(&vars, EnvFormat::Docker),
        golden("", true, &java)
    );
}

#[test]
fn golden_trust_only_leaves_out_every_routing_variable() {
    let trust = fixed_trust();
    let np = no_proxy();
    let vars = env::vars(&spec(&trust, &np, true));
    let java = format!("-Xmx512m {JAVA_TRUST}");
    assert_eq!(
        env::render(&vars, EnvFormat::Posix),
        golden("export ", false, &java)
    );
    assert_eq!(
        env::render(&vars, EnvFormat::Docker),
        golden("", false, &java)
    );
    for (k, v) in &vars {
        let up = k.to_ascii_uppercase();
        assert!(!up.ends_with("_PROXY") && up != "VERIS_PROXY_URL", "{k}");
        assert!(
            !v.contains("proxyHost") && !v.contains("nonProxyHosts"),
            "{k}={v}"
        );
    }
}

#[test]
fn posix_quoting_survives_sh_and_docker_is_verbatim() {
    if !have_tool("sh", "-c") {
        return;
    }
    let s = Scratch::new("env-sh");
    let dir = s.path().join("it's a \"dir\" with $HOME and `x`");
    let trust = TrustFiles::at(&dir);
    let np = no_proxy();
    let mut sp = spec(&trust, &np, false);
    sp.canary = "can'ary \\ $(echo no) \"q\"";
    sp.java_tool_options_base = Some("-Dfoo='bar baz'");
    let expected = env::vars(&sp);

    let posix = s.path().join("veris.env");
    env::write(&posix, &sp, EnvFormat::Posix).unwrap();
    assert_eq!(
        mode(&posix),
        0o644,
        "the workload (another uid) must read it"
    );
    let out = std::process::Command::new("sh")
        .env_clear()
        .arg("-c")
        .arg(". \"$1\" && env -0")
        .arg("sh")
        .arg(&posix)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: HashMap<String, String> = String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    for (k, v) in &expected {
        assert_eq!(got.get(k), Some(v), "{k}");
    }
    assert!(got["JAVA_TOOL_OPTIONS"].contains("\"-Djavax.net.ssl.trustStore="));

    let docker = s.path().join("veris.docker.env");
    env::write(&docker, &sp, EnvFormat::Docker).unwrap();
    assert_eq!(mode(&docker), 0o644);
    let text = fs::read_to_string(&docker).unwrap();
    for (k, v) in &expected {
        assert!(text.lines().any(|l| l == format!("{k}={v}")), "{k}");
    }

    // A line break cannot be expressed in a docker env file.
    sp.canary = "a\nb";
    assert!(env::write(&docker, &sp, EnvFormat::Docker).is_err());
    env::write(&posix, &sp, EnvFormat::Posix).unwrap();
}

const JAVA_PROBE: &str = r#"
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.Proxy;
import java.net.URL;

public class Probe {
    public static void main(String[] args) throws Exception {
        HttpURLConnection c = (HttpURLConnection) new URL(args[0]).openConnection(Proxy.NO_PROXY);
        try (InputStream in = c.getInputStream()) {
            System.out.print(new String(in.readAllBytes()));
        }
    }
}
"#;

/// Java, configured only through the env file's JAVA_TOOL_OPTIONS, trusts a minted leaf: the
/// truststore loads, its password and type are right, and a path with a space survives quoting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_trusts_minted_leaf_through_java_tool_options() {
    if !have_tool("java", "-version") {
        return;
    }
    use std::sync::Arc;
    let s = Scratch::new("java");
    let (ca, _) =
        CertificateAuthority::load_or_create(&s.path().join("ca"), &common::scope()).unwrap();
    let ca = Arc::new(ca);
    let files = trust::publish(
        &s.path().join("trust dir"),
        &ca,
        trust::find_system_bundle(None).as_deref(),
    )
    .unwrap();
    let issuer = Arc::new(veris_ca::Issuer::new(Arc::clone(&ca), 16));
    let port = common::serve_hello(issuer).await;
    let probe = s.path().join("Probe.java");
    fs::write(&probe, JAVA_PROBE).unwrap();

    let np = no_proxy();
    let mut sp = spec(&files, &np, true);
    sp.java_tool_options_base = None;
    let vars = env::vars(&sp);
    let java_opts = &vars
        .iter()
        .find(|(k, _)| k == "JAVA_TOOL_OPTIONS")
        .unwrap()
        .1;
    let url = format!("https://127.0.0.1:{port}/");

    let mut cmd = clean_command("java");
    cmd.env("JAVA_TOOL_OPTIONS", java_opts)
        .arg(&probe)
        .arg(&url);
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    assert!(
        out.status.success(),
        "JAVA_TOOL_OPTIONS={java_opts}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hello");

    // Java's own default roots do not include the veris CA: the trust came from our store.
    let mut cmd = clean_command("java");
    cmd.arg(&probe).arg(&url);
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    assert!(!out.status.success());
}
