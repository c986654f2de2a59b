//! The client × tier matrix behind CLIENTS.md: each real client calls
//! `GET https://api.stripe.com/v1/customers` under `veris run`, configured
//! by nothing but what veris gives it, in the explicit tier (proxy and trust
//! variables) and in the isolated tier (its own namespaces, every connection
//! redirected, trust variables and the bundle over the system stores).
//!
//! A client *works* when it printed the twin's answer (or, for a client
//! that cannot use the answer, such as git, when its request is in the
//! receipt) and *fails* when it never reached the twin. Each client's
//! expected outcome per tier is written down here with the reason; a
//! measured outcome that differs fails the test. Every measured outcome is
//! appended to the file `VERIS_CLIENTS_LOG` names (support::record_client);
//! `scripts/clients-md` renders CLIENTS.md from those lines.
//!
//! The transparent tier (`veris serve --transparent` and its nftables
//! redirect in a test namespace, trust variables from `--write-env
//! --env-trust-only`) runs the same clients in one test,
//! `transparent_tier`: it needs root or a working `unshare -rn`.
//!
//! Network safety: the explicit tier runs inside a network namespace with
//! only `lo` (support::lo_only), so a client that ignores the proxy finds
//! no route and no resolver and fails; the isolated tier has no route off
//! the machine by construction; the transparent tier's namespace routes
//! TEST-NET (where its hosts file puts api.stripe.com) into a sink. Vendor
//! names are never resolved by real DNS.
//! Package installs (npm, for axios and stripe-node) go to the registry.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use support::{output_within, skip, text, tool_works, TempDir};

/// A JVM compiling a single-file program, or Node loading the stripe
/// package, is the slowest client here.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

const URL: &str = "https://api.stripe.com/v1/customers";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    Explicit,
    Isolated,
    /// The isolated tier with every trust variable unset inside: what the
    /// files veris covers (the system stores, and the bundles the
    /// command's runtimes ship) do alone.
    IsolatedFiles,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Tier::Explicit => "explicit",
            Tier::Isolated => "isolated",
            Tier::IsolatedFiles => "isolated-files",
        }
    }
}

/// Every variable by which veris tells a client about its CA, unset by the
/// command itself in [`Tier::IsolatedFiles`].
const TRUST_VARIABLES: &[&str] = &[
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
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
    "JAVA_TOOL_OPTIONS",
    "WGETRC",
    "PHP_INI_SCAN_DIR",
    "HTTPLIB2_CA_CERTS",
];

/// What a client does in [`Tier::IsolatedFiles`], and why: which file it
/// reads its roots from, and whether veris covered it.
fn files_expect(key: &str) -> Option<Expect> {
    Some(match key {
        "curl-h1" | "curl-h2" | "openssl-s-client" | "python-urllib" | "ruby-net-http"
        | "go-net-http" | "php-curl" => {
            Expect::Works("the system store (OpenSSL's, Go's default path), covered")
        }
        "wget" | "git" => Expect::Works("the system store (GnuTLS's default), covered"),
        "python-aiohttp" | "python-aiohttp-trust-env" => {
            Expect::Works("the system store or certifi's cacert.pem, both covered")
        }
        "python-requests" | "python-httpx-h1" | "python-httpx-h2" => {
            Expect::Works("certifi's cacert.pem, found at start in the python3's site-packages and covered")
        }
        "python-httplib2" => Expect::Works(
            "its own httplib2/cacerts.txt (or certifi's), found at start and covered",
        ),
        "python-stripe" => Expect::Works(
            "its own stripe/data/ca-certificates.crt, found at start and covered",
        ),
        "java-httpclient" | "java-urlconnection" => Expect::Works(
            "its JDK's lib/security/cacerts, found from the java on PATH and covered with the truststore",
        ),
        "node-https" | "node-fetch" | "node-axios" | "node-stripe" => Expect::Fails(
            "Node's roots are compiled into its binary, no file to cover: it needs NODE_EXTRA_CA_CERTS",
        ),
        _ => return None,
    })
}

/// What a client is expected to do in a tier, and why.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Works(&'static str),
    Fails(&'static str),
}

/// How a client's success shows.
#[derive(Clone, Copy, Debug)]
enum Proof {
    /// Exit 0 and every string printed on stdout (the twin's list, a
    /// protocol version).
    Prints(&'static [&'static str]),
    /// The request is in the receipt (the client may still fail on the
    /// twin's answer).
    Reached,
}

/// One client: its label in CLIENTS.md, the command (run through `sh -c`
/// with the URL as `$1`), what proves success, the expectation per tier,
/// extra `veris run` flags per tier, extra environment.
struct Client {
    label: &'static str,
    script: String,
    proof: Proof,
    explicit: Option<Expect>,
    isolated: Option<Expect>,
    /// The transparent tier's, where it differs from the isolated one's.
    transparent: Option<Expect>,
    isolated_flags: Vec<String>,
    env: Vec<(String, String)>,
}

/// The twin's customer list, as every client prints it.
const LIST: &[&str] = &["status=200", "\"list\""];

fn python(code: &str) -> String {
    format!("exec python3 -c '{code}' \"$1\"")
}

fn client(key: &str) -> Result<Client, String> {
    let simple = |label, script: String, proof, explicit, isolated| Client {
        label,
        script,
        proof,
        explicit: Some(explicit),
        isolated: Some(isolated),
        transparent: None,
        isolated_flags: Vec::new(),
        env: Vec::new(),
    };
    // `how` is "<what routes it to the proxy>; <what makes it trust veris>":
    // a redirected tier needs only the second part.
    let works_both = |label, script: String, proof, how: &'static str| {
        let trust = how.split_once("; ").map_or(how, |(_, trust)| trust);
        let redirected: &'static str = Box::leak(format!("redirected; {trust}").into_boxed_str());
        simple(
            label,
            script,
            proof,
            Expect::Works(how),
            Expect::Works(redirected),
        )
    };
    let py_needs = |module: &str| {
        if tool_works("python3", &["-c", &format!("import {module}")]) {
            Ok(())
        } else {
            Err(format!(
                "python3 module {module} not installed (pip install {module})"
            ))
        }
    };
    let needs = |tool: &str, args: &[&str], install: &str| {
        if tool_works(tool, args) {
            Ok(())
        } else {
            Err(format!("{tool} not installed ({install})"))
        }
    };
    Ok(match key {
        "curl-h1" => {
            needs("curl", &["--version"], "apt install curl")?;
            works_both(
                "curl (HTTP/1.1)",
                "exec curl -sS --max-time 20 --http1.1 -w '\\nstatus=%{http_code} http=%{http_version}\\n' \"$1\"".into(),
                Proof::Prints(&["status=200", "\"list\"", "http=1.1"]),
                "HTTPS_PROXY; CURL_CA_BUNDLE / SSL_CERT_FILE",
            )
        }
        "curl-h2" => {
            needs("curl", &["--version"], "apt install curl")?;
            works_both(
                "curl (HTTP/2)",
                "exec curl -sS --max-time 20 --http2 -w '\\nstatus=%{http_code} http=%{http_version}\\n' \"$1\"".into(),
                Proof::Prints(&["status=200", "\"list\"", "http=2"]),
                "HTTPS_PROXY; CURL_CA_BUNDLE; h2 by ALPN",
            )
        }
        "wget" => {
            needs("wget", &["--version"], "apt install wget")?;
            works_both(
                "wget",
                "wget -q -O - --tries=1 --timeout=20 \"$1\" && printf '\\nstatus=200\\n'".into(),
                Proof::Prints(LIST),
                "https_proxy; WGETRC (ca_certificate = the bundle): GnuTLS reads no CA variable",
            )
        }
        "python-requests" => {
            py_needs("requests")?;
            works_both(
                "Python requests",
                python("import sys, requests; r = requests.get(sys.argv[1], timeout=20); print(\"status=%d\" % r.status_code); print(r.text)"),
                Proof::Prints(LIST),
                "HTTPS_PROXY; REQUESTS_CA_BUNDLE",
            )
        }
        "python-httpx-h1" => {
            py_needs("httpx")?;
            works_both(
                "Python httpx (HTTP/1.1)",
                python("import sys, httpx; r = httpx.get(sys.argv[1], timeout=20); print(\"status=%d http=%s\" % (r.status_code, r.http_version)); print(r.text)"),
                Proof::Prints(&["status=200", "\"list\"", "http=HTTP/1.1"]),
                "HTTPS_PROXY; SSL_CERT_FILE",
            )
        }
        "python-httpx-h2" => {
            py_needs("httpx")?;
            py_needs("h2")?;
            works_both(
                "Python httpx (HTTP/2)",
                python("import sys, httpx\nwith httpx.Client(http2=True, timeout=20) as c:\n    r = c.get(sys.argv[1])\nprint(\"status=%d http=%s\" % (r.status_code, r.http_version)); print(r.text)"),
                Proof::Prints(&["status=200", "\"list\"", "http=HTTP/2"]),
                "HTTPS_PROXY; SSL_CERT_FILE; h2 by ALPN",
            )
        }
        "python-urllib" => {
            needs("python3", &["-c", ""], "apt install python3")?;
            works_both(
                "Python urllib",
                python("import sys, urllib.request as u; r = u.urlopen(sys.argv[1], timeout=20); print(\"status=%d\" % r.status); print(r.read().decode())"),
                Proof::Prints(LIST),
                "https_proxy; SSL_CERT_FILE (OpenSSL default paths)",
            )
        }
        "python-aiohttp" => {
            py_needs("aiohttp")?;
            simple(
                "Python aiohttp",
                python("import sys, asyncio, aiohttp\nasync def main():\n    async with aiohttp.ClientSession() as s:\n        async with s.get(sys.argv[1]) as r:\n            print(\"status=%d\" % r.status); print(await r.text())\nasyncio.run(main())"),
                Proof::Prints(LIST),
                Expect::Fails("ignores HTTPS_PROXY unless trust_env=True: goes direct"),
                Expect::Works("redirected; SSL_CERT_FILE"),
            )
        }
        "python-aiohttp-trust-env" => {
            py_needs("aiohttp")?;
            works_both(
                "Python aiohttp (trust_env=True)",
                python("import sys, asyncio, aiohttp\nasync def main():\n    async with aiohttp.ClientSession(trust_env=True) as s:\n        async with s.get(sys.argv[1]) as r:\n            print(\"status=%d\" % r.status); print(await r.text())\nasyncio.run(main())"),
                Proof::Prints(LIST),
                "HTTPS_PROXY (trust_env=True); SSL_CERT_FILE",
            )
        }
        "python-httplib2" => {
            py_needs("httplib2")?;
            // httplib2 speaks to any proxy through PySocks, and without it
            // ignores the proxy variables altogether.
            let explicit = if tool_works("python3", &["-c", "import socks"]) {
                Expect::Works("https_proxy (through PySocks); HTTPLIB2_CA_CERTS (it bundles its own CA list otherwise)")
            } else {
                Expect::Fails("without PySocks installed it ignores https_proxy: goes direct")
            };
            simple(
                "Python httplib2",
                python("import sys, httplib2; resp, body = httplib2.Http(timeout=20).request(sys.argv[1]); print(\"status=%d\" % resp.status); print(body.decode())"),
                Proof::Prints(LIST),
                explicit,
                Expect::Works("redirected; HTTPLIB2_CA_CERTS (it bundles its own CA list otherwise)"),
            )
        }
        "python-stripe" => {
            py_needs("stripe")?;
            let mut c = simple(
                "stripe-python SDK",
                python("import stripe; stripe.api_key = \"sk_test_veris\"; c = stripe.Customer.list(); print(\"status=200\"); print(c)"),
                Proof::Prints(LIST),
                Expect::Fails("verifies against its own bundled CA file (stripe/data/ca-certificates.crt), which no variable replaces"),
                Expect::Works("redirected; its own CA file (stripe/data/ca-certificates.crt), found at start in the python3's site-packages and covered with the bundle"),
            );
            c.transparent = Some(Expect::Fails(
                "its own bundled CA file is neither a variable nor a system store, and nothing covers it outside `veris run`",
            ));
            c
        }
        "python-stripe-trust-file" => {
            py_needs("stripe")?;
            let bundle = python_stripe_bundle()?;
            Client {
                label: "stripe-python SDK, `--trust-file` its bundle",
                script: python("import stripe; stripe.api_key = \"sk_test_veris\"; c = stripe.Customer.list(); print(\"status=200\"); print(c)"),
                proof: Proof::Prints(LIST),
                explicit: None,
                isolated: Some(Expect::Works(
                    "redirected; --trust-file puts the bundle over its CA file",
                )),
                transparent: None,
                isolated_flags: vec!["--trust-file".into(), bundle],
                env: Vec::new(),
            }
        }
        "node-https" => {
            needs("node", &["--version"], "apt install nodejs")?;
            simple(
                "Node https (Node 20)",
                "exec node -e 'require(\"https\").get(process.argv[1], (r) => { let b = \"\"; r.on(\"data\", (c) => b += c); r.on(\"end\", () => console.log(`status=${r.statusCode}\\n${b}`)); }).on(\"error\", (e) => { console.error(e.code || e.message); process.exit(1); })' \"$1\"".into(),
                Proof::Prints(LIST),
                Expect::Fails("Node 20 ignores HTTPS_PROXY: goes direct"),
                Expect::Works("redirected; NODE_EXTRA_CA_CERTS"),
            )
        }
        "node-fetch" => {
            needs("node", &["--version"], "apt install nodejs")?;
            simple(
                "Node fetch (Node 20)",
                "exec node -e 'fetch(process.argv[1]).then(async (r) => console.log(`status=${r.status}\\n${await r.text()}`)).catch((e) => { console.error(String(e.cause || e)); process.exit(1); })' \"$1\"".into(),
                Proof::Prints(LIST),
                Expect::Fails("Node 20's fetch ignores HTTPS_PROXY: goes direct"),
                Expect::Works("redirected; NODE_EXTRA_CA_CERTS"),
            )
        }
        "node-axios" => {
            let modules = npm_modules()?;
            let mut c = simple(
                "axios (npm)",
                "exec node -e 'require(\"axios\").get(process.argv[1]).then((r) => console.log(`status=${r.status}\\n${JSON.stringify(r.data)}`)).catch((e) => { console.error(e.code || e.message); process.exit(1); })' \"$1\"".into(),
                Proof::Prints(LIST),
                Expect::Works("reads HTTPS_PROXY itself; NODE_EXTRA_CA_CERTS"),
                Expect::Works("redirected; NODE_EXTRA_CA_CERTS"),
            );
            c.env.push(("NODE_PATH".into(), modules));
            c
        }
        "node-stripe" => {
            let modules = npm_modules()?;
            let mut c = simple(
                "stripe-node SDK (npm)",
                "exec node -e 'require(\"stripe\")(\"sk_test_veris\").customers.list().then((l) => console.log(`status=200\\n${JSON.stringify(l)}`)).catch((e) => { console.error(e.type || e.code || e.message); process.exit(1); })' \"$1\"".into(),
                Proof::Prints(LIST),
                Expect::Fails("ignores HTTPS_PROXY (its own https agent): goes direct"),
                Expect::Works("redirected; NODE_EXTRA_CA_CERTS"),
            );
            c.env.push(("NODE_PATH".into(), modules));
            c
        }
        "java-httpclient" | "java-urlconnection" => {
            needs("java", &["-version"], "apt install default-jdk-headless")?;
            let probe = java_probe()?;
            let (label, mode, proof): (_, _, &'static [&'static str]) = if key == "java-httpclient"
            {
                (
                    "Java 17 HttpClient",
                    "httpclient",
                    &["status=200", "\"list\"", "http=HTTP_2"],
                )
            } else {
                ("Java 17 HttpURLConnection", "urlconnection", LIST)
            };
            works_both(
                label,
                format!("exec java {probe} {mode} \"$1\""),
                Proof::Prints(proof),
                "JAVA_TOOL_OPTIONS proxy flags (-Dhttps.proxyHost…); its JKS truststore (-Djavax.net.ssl.trustStore)",
            )
        }
        "go-net-http" => {
            let bin = go_client()?;
            works_both(
                "Go net/http",
                format!("exec {bin} \"$1\""),
                Proof::Prints(LIST),
                "HTTPS_PROXY; SSL_CERT_FILE",
            )
        }
        "ruby-net-http" => {
            needs("ruby", &["-e", "require 'net/http'"], "apt install ruby")?;
            works_both(
                "Ruby Net::HTTP",
                "exec ruby -rnet/http -e 'r = Net::HTTP.get_response(URI(ARGV[0])); puts \"status=#{r.code}\"; puts r.body' \"$1\"".into(),
                Proof::Prints(LIST),
                "https_proxy; SSL_CERT_FILE",
            )
        }
        "php-curl" => {
            needs(
                "php",
                &["-r", "exit(function_exists('curl_init') ? 0 : 1);"],
                "apt install php-cli php-curl",
            )?;
            works_both(
                "PHP curl",
                "exec php -r '$c = curl_init($argv[1]); curl_setopt($c, CURLOPT_RETURNTRANSFER, true); $r = curl_exec($c); if ($r === false) { fwrite(STDERR, curl_error($c)); exit(1); } echo \"status=\" . curl_getinfo($c, CURLINFO_HTTP_CODE) . \"\\n\" . $r;' \"$1\"".into(),
                Proof::Prints(LIST),
                "https_proxy; PHP_INI_SCAN_DIR (curl.cainfo = the bundle): libcurl reads no CA variable",
            )
        }
        "git" => {
            needs("git", &["--version"], "apt install git")?;
            let mut c = works_both(
                "git (https clone)",
                "exec git clone --quiet --depth 1 https://api.stripe.com/v1/veris.git \"$(mktemp -d)/clone\"".into(),
                Proof::Reached,
                "https_proxy; GIT_SSL_CAINFO. The twin is no git server: the clone itself fails (404), the request is in the receipt",
            );
            c.env.push(("GIT_TERMINAL_PROMPT".into(), "0".into()));
            c
        }
        "openssl-s-client" => {
            needs("openssl", &["version"], "apt install openssl")?;
            works_both(
                "openssl s_client",
                "p=${HTTPS_PROXY#http://}; set -- ${p:+-proxy \"$p\"}; printf 'GET /v1/customers HTTP/1.1\\r\\nHost: api.stripe.com\\r\\nConnection: close\\r\\n\\r\\n' | openssl s_client -quiet -verify_return_error \"$@\" -connect api.stripe.com:443 -servername api.stripe.com 2>/dev/null | sed 's/^HTTP\\/1.1 \\([0-9]*\\).*/status=\\1/'".into(),
                Proof::Prints(LIST),
                "-proxy from HTTPS_PROXY; SSL_CERT_FILE (OpenSSL default paths)",
            )
        }
        other => panic!("no client {other}"),
    })
}

/// The stripe-python package's own CA file.
fn python_stripe_bundle() -> Result<String, String> {
    let out = output_within(
        support::command("python3").args(["-c", "import stripe; print(stripe.ca_bundle_path)"]),
        support::DEADLINE,
    );
    let path = text(&out).0.trim().to_string();
    if out.status.success() && Path::new(&path).is_file() {
        Ok(path)
    } else {
        Err(format!("stripe.ca_bundle_path not found: {:?}", text(&out)))
    }
}

/// Where this process keeps what it builds or installs once for all tests.
fn scratch() -> &'static Path {
    static DIR: OnceLock<TempDir> = OnceLock::new();
    DIR.get_or_init(|| TempDir::new("matrix")).path()
}

/// axios and stripe installed from the npm registry into a temp dir, once;
/// its `node_modules`.
pub(crate) fn npm_modules() -> Result<String, String> {
    static MODULES: OnceLock<Result<String, String>> = OnceLock::new();
    MODULES
        .get_or_init(|| {
            if !tool_works("npm", &["--version"]) {
                return Err("npm not installed (apt install npm)".into());
            }
            let dir = scratch().join("npm");
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            // The machine's own environment: whatever it needs to reach the
            // registry (a proxy, a CA) is for npm, not for the clients.
            let mut cmd = Command::new("npm");
            cmd.args([
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&dir)
            .args(["axios", "stripe"]);
            let out = output_within(&mut cmd, Duration::from_secs(300));
            if !out.status.success() {
                return Err(format!("npm install axios stripe failed: {}", text(&out).1));
            }
            Ok(dir.join("node_modules").display().to_string())
        })
        .clone()
}

const PROBE_JAVA: &str = r#"
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.URL;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

public class Probe {
    public static void main(String[] args) throws Exception {
        if (args[0].equals("urlconnection")) {
            HttpURLConnection c = (HttpURLConnection) new URL(args[1]).openConnection();
            c.setConnectTimeout(20000);
            c.setReadTimeout(20000);
            int status = c.getResponseCode();
            InputStream in = status < 400 ? c.getInputStream() : c.getErrorStream();
            ByteArrayOutputStream body = new ByteArrayOutputStream();
            if (in != null) in.transferTo(body);
            System.out.println("status=" + status);
            System.out.println(body.toString(StandardCharsets.UTF_8));
        } else {
            HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(20)).build();
            HttpRequest req = HttpRequest.newBuilder(URI.create(args[1])).timeout(Duration.ofSeconds(20)).build();
            HttpResponse<String> res = client.send(req, HttpResponse.BodyHandlers.ofString());
            System.out.println("status=" + res.statusCode() + " http=" + res.version());
            System.out.println(res.body());
        }
    }
}
"#;

fn java_probe() -> Result<String, String> {
    let path = scratch().join("Probe.java");
    std::fs::write(&path, PROBE_JAVA).map_err(|e| e.to_string())?;
    Ok(path.display().to_string())
}

const GO_MAIN: &str = r#"package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Get(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "error", err)
		os.Exit(1)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("status=%d\n%s\n", resp.StatusCode, body)
}
"#;

/// The Go client, built once (`go build`, no module downloads).
fn go_client() -> Result<String, String> {
    static BIN: OnceLock<Result<String, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if !tool_works("go", &["version"]) {
            return Err("go not installed (apt install golang-go)".into());
        }
        let dir = scratch().join("go");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let main = dir.join("main.go");
        std::fs::write(&main, GO_MAIN).map_err(|e| e.to_string())?;
        let bin = dir.join("client");
        let mut cmd = support::command("go");
        cmd.args(["build", "-o"])
            .arg(&bin)
            .arg(&main)
            .env("GOCACHE", dir.join("cache"))
            .env("GOPATH", dir.join("path"))
            .env("GOPROXY", "off")
            .env("GOTOOLCHAIN", "local")
            .env("GO111MODULE", "off");
        let out = output_within(&mut cmd, Duration::from_secs(300));
        if !out.status.success() {
            return Err(format!("go build failed: {}", text(&out).1));
        }
        Ok(bin.display().to_string())
    })
    .clone()
}

/// What one run showed.
struct Measured {
    works: bool,
    detail: String,
}

/// `veris run --tier TIER` with the client, judged by its proof.
fn measure(c: &Client, tier: Tier, state: &Path) -> Result<Measured, String> {
    let receipt = state.with_extension(format!("{}.json", tier.name()));
    let mut cmd = match tier {
        Tier::Explicit => support::lo_only(support::bin()),
        Tier::Isolated | Tier::IsolatedFiles => support::command(support::bin().to_str().unwrap()),
    };
    let run_tier = match tier {
        Tier::Explicit => "explicit",
        Tier::Isolated | Tier::IsolatedFiles => "isolated",
    };
    cmd.args(["run", "--tier", run_tier, "--allow-empty", "--state-dir"])
        .arg(state)
        .arg("--receipt")
        .arg(&receipt);
    if tier != Tier::Explicit {
        cmd.args(&c.isolated_flags);
        // The command's /tmp is its own: the clients built once for all
        // tests live in the scratch dir, carried in as the working dir.
        cmd.current_dir(scratch());
    }
    let script = match tier {
        Tier::IsolatedFiles => format!("unset {}; {}", TRUST_VARIABLES.join(" "), c.script),
        _ => c.script.clone(),
    };
    cmd.args(["--", "sh", "-c", &script, "sh", URL]);
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    let (stdout, stderr) = text(&out);
    if tier != Tier::Explicit
        && out.status.code() == Some(1)
        && stderr.contains("cannot isolate the command")
    {
        return Err(format!("isolation unavailable: {}", stderr.trim()));
    }
    let receipt: serde_json::Value = std::fs::read_to_string(&receipt)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| panic!("no receipt from {}:\n{stdout}\n{stderr}", c.label));
    let reached = receipt["services"]["stripe"]["requests"]
        .as_u64()
        .unwrap_or(0);
    let works = match c.proof {
        Proof::Prints(all) => {
            out.status.success() && reached >= 1 && all.iter().all(|s| stdout.contains(s))
        }
        Proof::Reached => reached >= 1,
    };
    // The client's own last words (its error), for the report.
    let detail = stderr
        .lines()
        .take_while(|l| !l.starts_with("Veris receipt"))
        .filter(|l| !l.trim().is_empty() && !l.starts_with("Picked up JAVA_TOOL_OPTIONS"))
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    Ok(Measured {
        works,
        detail: format!(
            "exit {:?}, {reached} request(s) in the receipt; {detail}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            out.status.code()
        ),
    })
}

/// Runs `key` in both tiers, records what happened, and checks it against
/// the expectation.
fn case(key: &str) {
    let c = match client(key) {
        Ok(c) => c,
        Err(why) => return skip(&why),
    };
    let dir = TempDir::new(&format!("matrix-{key}"));
    let mut wrong = Vec::new();
    for (tier, expect) in [
        (Tier::Explicit, c.explicit),
        (Tier::Isolated, c.isolated),
        (Tier::IsolatedFiles, files_expect(key)),
    ] {
        let Some(expect) = expect else { continue };
        if tier == Tier::Explicit {
            if let Some(why) = support::lo_only_unavailable() {
                skip(&format!("{}: {why}", c.label));
                continue;
            }
        }
        let state = dir.join(format!("state-{}", tier.name()));
        let m = match measure(&c, tier, &state) {
            Ok(m) => m,
            Err(why) => {
                skip(&format!("{}: {why}", c.label));
                continue;
            }
        };
        let (expected_works, reason) = match expect {
            Expect::Works(how) => (true, how),
            Expect::Fails(why) => (false, why),
        };
        if m.works == expected_works {
            support::record_client(
                c.label,
                tier.name(),
                if m.works { "works" } else { "fails" },
                reason,
            );
        } else {
            // Recorded as measured, so a regenerated CLIENTS.md cannot claim
            // what did not happen.
            let first = m.detail.lines().next().unwrap_or("").to_string();
            support::record_client(
                c.label,
                tier.name(),
                if m.works { "works" } else { "fails" },
                &format!("unexpected: {first}"),
            );
            wrong.push(format!(
                "{} in the {} tier: expected {}, measured {}\n{}",
                c.label,
                tier.name(),
                if expected_works { "works" } else { "fails" },
                if m.works { "works" } else { "fails" },
                m.detail
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

macro_rules! clients {
    ($($test:ident => $key:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                case($key);
            }
        )*
    };
}

clients! {
    curl_http1 => "curl-h1",
    curl_http2 => "curl-h2",
    wget => "wget",
    python_requests => "python-requests",
    python_httpx_http1 => "python-httpx-h1",
    python_httpx_http2 => "python-httpx-h2",
    python_urllib => "python-urllib",
    python_aiohttp => "python-aiohttp",
    python_aiohttp_trust_env => "python-aiohttp-trust-env",
    python_httplib2 => "python-httplib2",
    python_stripe_sdk => "python-stripe",
    python_stripe_sdk_trust_file => "python-stripe-trust-file",
    node_https => "node-https",
    node_fetch => "node-fetch",
    node_axios => "node-axios",
    node_stripe_sdk => "node-stripe",
    java_httpclient => "java-httpclient",
    java_httpurlconnection => "java-urlconnection",
    go_net_http => "go-net-http",
    ruby_net_http => "ruby-net-http",
    php_curl => "php-curl",
    git_clone => "git",
    openssl_s_client => "openssl-s-client",
}

/// Every client whose isolated run needs no flag of `veris run`.
const TRANSPARENT_CLIENTS: &[&str] = &[
    "curl-h1",
    "curl-h2",
    "wget",
    "python-requests",
    "python-httpx-h1",
    "python-httpx-h2",
    "python-urllib",
    "python-aiohttp",
    "python-aiohttp-trust-env",
    "python-httplib2",
    "python-stripe",
    "node-https",
    "node-fetch",
    "node-axios",
    "node-stripe",
    "java-httpclient",
    "java-urlconnection",
    "go-net-http",
    "ruby-net-http",
    "php-curl",
    "git",
    "openssl-s-client",
];

fn request_count(state: &Path) -> usize {
    support::netns::ledger(state)
        .iter()
        .filter(|l| l["kind"] == "request")
        .count()
}

#[test]
fn transparent_tier() {
    use support::netns::{Netns, Veris, VENDOR_V4};
    if let Some(why) = support::netns::unavailable() {
        return skip(&why);
    }
    if !support::netns::rootless_works(None) {
        return skip("`unshare -rnm` does not work here (user namespaces)");
    }
    let dir = support::netns::TempDir::new("matrix-transparent");
    let ns = Netns::create_rootless("matrix", None);
    let hosts = dir.join("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n::1 localhost\n{VENDOR_V4} api.stripe.com\n"),
    )
    .unwrap();
    ns.bind_hosts(&hosts);
    let env_file = dir.join("client.env");
    let veris = Veris::start(
        &ns,
        &dir,
        &[
            "--mode",
            "strict",
            "--write-env",
            env_file.to_str().unwrap(),
            "--env-format",
            "docker",
            "--env-trust-only",
        ],
    );
    let vars: Vec<(String, String)> = std::fs::read_to_string(&env_file)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut wrong = Vec::new();
    for key in TRANSPARENT_CLIENTS {
        let c = match client(key) {
            Ok(c) => c,
            Err(why) => {
                skip(&why);
                continue;
            }
        };
        let Some(expect) = c.transparent.or(c.isolated) else {
            continue;
        };
        let before = request_count(&veris.state);
        let mut cmd = ns.command("sh");
        cmd.args(["-c", &c.script, "sh", URL])
            .envs(vars.iter().cloned());
        for var in ["PATH", "PYENV_ROOT", "PYENV_VERSION", "JAVA_HOME"] {
            if let Some(v) = std::env::var_os(var) {
                cmd.env(var, v);
            }
        }
        for (k, v) in &c.env {
            cmd.env(k, v);
        }
        let out = ns.output(&mut cmd, RUN_TIMEOUT);
        let (stdout, stderr) = text(&out);
        let reached = request_count(&veris.state) - before;
        let works = match c.proof {
            Proof::Prints(all) => {
                out.status.success() && reached >= 1 && all.iter().all(|s| stdout.contains(s))
            }
            Proof::Reached => reached >= 1,
        };
        let (expected_works, reason) = match expect {
            Expect::Works(how) => (true, how),
            Expect::Fails(why) => (false, why),
        };
        let outcome = if works { "works" } else { "fails" };
        if works == expected_works {
            support::record_client(c.label, "transparent", outcome, reason);
        } else {
            support::record_client(
                c.label,
                "transparent",
                outcome,
                &format!(
                    "unexpected: exit {:?}, {reached} request(s)",
                    out.status.code()
                ),
            );
            wrong.push(format!(
                "{} in the transparent tier: expected {}, measured {outcome}; exit {:?}, {reached} request(s)\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
                c.label,
                if expected_works { "works" } else { "fails" },
                out.status.code()
            ));
        }
    }
    let status = veris.stop();
    assert!(status.success(), "veris exit: {status}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}
