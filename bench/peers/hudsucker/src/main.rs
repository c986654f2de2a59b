//! A hudsucker proxy doing veris's job minus the record: the comparison peer
//! of `veris-bench` (BENCHMARKS.md).
//!
//! It terminates TLS for every CONNECT with leaves from a CA it generates at
//! start (written to `--ca-out` for the load generator to trust), sends
//! requests for `api.stripe.com` to `{twin}/s/{sandbox}/stripe{path}` with the
//! `X-Veris-*` headers veris adds, over one pooled client that trusts only
//! the twin's CA (`--twin-ca`, HTTP/2 by ALPN like veris), and answers any
//! other host with 403 itself, so nothing leaves the machine. It writes no
//! ledger: the difference to veris is what recording and routing cost.
//!
//!     veris-bench-hudsucker --twin https://127.0.0.1:PORT --twin-ca FILE --ca-out FILE [--sandbox ID]
//!
//! The first stdout line is the proxy URL (`http://127.0.0.1:PORT`).

use std::io::Write;
use std::sync::Arc;

use hudsucker::certificate_authority::RcgenAuthority;
use hudsucker::hyper::{header, Method, Request, Response, StatusCode, Uri};
use hudsucker::hyper_util::client::legacy::connect::HttpConnector;
use hudsucker::rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use hudsucker::rustls::crypto::aws_lc_rs;
use hudsucker::rustls::pki_types::pem::PemObject;
use hudsucker::rustls::pki_types::CertificateDer;
use hudsucker::rustls::{ClientConfig, RootCertStore};
use hudsucker::{Body, HttpContext, HttpHandler, Proxy, RequestOrResponse};

/// The one vendor host this peer routes, and its service name at the twin.
const HOST: &str = "api.stripe.com";
const SERVICE: &str = "stripe";

struct Args {
    twin: String,
    twin_ca: String,
    ca_out: String,
    sandbox: String,
}

fn parse_args() -> Result<Args, String> {
    let mut twin = None;
    let mut twin_ca = None;
    let mut ca_out = None;
    let mut sandbox = "sbx_local".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--twin" => twin = Some(value.trim_end_matches('/').to_string()),
            "--twin-ca" => twin_ca = Some(value),
            "--ca-out" => ca_out = Some(value),
            "--sandbox" => sandbox = value,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        twin: twin.ok_or("--twin URL is required")?,
        twin_ca: twin_ca.ok_or("--twin-ca FILE is required")?,
        ca_out: ca_out.ok_or("--ca-out FILE is required")?,
        sandbox,
    })
}

/// Rewrites vendor requests to the twin; refuses everything else.
#[derive(Clone)]
struct Route {
    /// `{twin}/s/{sandbox}/stripe`, the prefix veris puts before the path.
    upstream: Arc<str>,
    sandbox: Arc<str>,
}

impl HttpHandler for Route {
    async fn handle_request(
        &mut self,
        _ctx: &HttpContext,
        req: Request<Body>,
    ) -> RequestOrResponse {
        // The CONNECT itself comes here first; hudsucker takes the tunnel's
        // authority from it, so it must pass unchanged.
        if req.method() == Method::CONNECT {
            return req.into();
        }
        if req.uri().host() != Some(HOST) {
            return refuse(StatusCode::FORBIDDEN).into();
        }
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let Ok(uri) = format!("{}{path}", self.upstream).parse::<Uri>() else {
            return refuse(StatusCode::BAD_REQUEST).into();
        };
        let (mut parts, body) = req.into_parts();
        parts.uri = uri;
        parts.headers.remove(header::HOST);
        parts.headers.insert(
            "x-veris-original-host",
            header::HeaderValue::from_static(HOST),
        );
        parts
            .headers
            .insert("x-veris-service", header::HeaderValue::from_static(SERVICE));
        if let Ok(v) = header::HeaderValue::from_str(&self.sandbox) {
            parts.headers.insert("x-veris-sandbox", v);
        }
        Request::from_parts(parts, body).into()
    }
}

fn refuse(status: StatusCode) -> Response<Body> {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = status;
    res
}

/// A fresh CA for this run; its certificate goes to `ca_out`.
fn make_ca(ca_out: &str) -> Result<Issuer<'static, KeyPair>, String> {
    let key = KeyPair::generate().map_err(|e| format!("generating the CA key: {e}"))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| format!("CA parameters: {e}"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "veris-bench hudsucker CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("self-signing the CA: {e}"))?;
    std::fs::write(ca_out, cert.pem()).map_err(|e| format!("writing {ca_out}: {e}"))?;
    Ok(Issuer::new(params, key))
}

/// The upstream leg: TLS trusting only the twin's CA, h2 or HTTP/1.1 by ALPN.
fn twin_connector(twin_ca: &str) -> Result<hyper_rustls::HttpsConnector<HttpConnector>, String> {
    let mut roots = RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(twin_ca).map_err(|e| format!("reading {twin_ca}: {e}"))?
    {
        let cert = cert.map_err(|e| format!("parsing {twin_ca}: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("adding {twin_ca} to the roots: {e}"))?;
    }
    let config = ClientConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // hyper-rustls's own HttpConnector leaves Nagle on; veris's dials do not.
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp))
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("veris-bench-hudsucker: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let issuer = make_ca(&args.ca_out)?;
    let ca = RcgenAuthority::new(issuer, 1_000, aws_lc_rs::default_provider());
    let connector = twin_connector(&args.twin_ca)?;
    // TCP_NODELAY on the listener is inherited by every accepted socket
    // (Linux): hudsucker's accept loop does not set it, and with Nagle on,
    // a small answer written after the TLS session tickets waits for the
    // client's delayed ACK (~40 ms). veris sets it on each accepted socket.
    let listener = (|| {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_nodelay(true)?;
        socket.bind(([127, 0, 0, 1], 0).into())?;
        socket.listen(1024)
    })()
    .map_err(|e| format!("listening on 127.0.0.1:0: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("listener address: {e}"))?;
    let route = Route {
        upstream: format!("{}/s/{}/{SERVICE}", args.twin, args.sandbox).into(),
        sandbox: args.sandbox.into(),
    };
    let proxy = Proxy::builder()
        .with_listener(listener)
        .with_ca(ca)
        .with_http_connector(connector)
        .with_http_handler(route)
        .build()
        .map_err(|e| format!("building the proxy: {e}"))?;
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "http://{addr}");
        let _ = out.flush();
    }
    proxy.start().await.map_err(|e| format!("proxy: {e}"))
}
