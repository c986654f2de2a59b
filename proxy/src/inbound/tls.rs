//! Terminating a client's TLS (phase 4a): the ClientHello, a leaf minted
//! for the name it will verify, the handshake, then HTTP/1.1 or HTTP/2 by
//! ALPN into the request lifecycle ([`Proxy::terminate`]).
//!
//! Server-side TLS for intercepted connections: one rustls config per
//! minted leaf, built once and reused by every connection presenting that
//! leaf, all sharing one ticket key. A client's next connection then
//! resumes (an abbreviated handshake: no certificate, no signature) instead
//! of paying a full one, and no connection allocates a config of its own.
//!
//! Resumption changes nothing the receipt relies on: a ticket is issued only
//! after a full handshake the client accepted (a client that refuses our CA
//! never gets one), and rustls resumes a session only for the server name it
//! was issued under.

use std::convert::Infallible;

use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio_rustls::LazyConfigAcceptor;
use tracing::{debug, info, warn};
use veris_receipt::BlockedLine;
use veris_receipt::{Entry, Mode};

use crate::body::meter;
use crate::inbound::http::serve_auto;
use crate::inbound::trust;
use crate::request::route::Route;
use crate::request::Leg;
use crate::Proxy;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustls::server::{ProducesTickets, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// A leaf and the config presenting it.
type Presented = (Arc<CertifiedKey>, Arc<ServerConfig>);

/// Per-leaf server configs, at most `capacity` (the leaf cache's size).
#[derive(Debug)]
pub struct ServerConfigs {
    /// `None` only when the system RNG failed at start: configs then
    /// resume from rustls's per-config session cache alone.
    ticketer: Option<Arc<dyn ProducesTickets>>,
    configs: Mutex<HashMap<String, Presented>>,
    capacity: usize,
}

impl ServerConfigs {
    pub fn new(capacity: usize) -> ServerConfigs {
        let ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()
            .inspect_err(|e| tracing::warn!(error = %e, "no TLS session tickets"))
            .ok();
        ServerConfigs {
            ticketer,
            configs: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The config presenting `key` for `name`: the cached one while the
    /// issuer hands out the same leaf, a new one after it minted another
    /// (expiry, eviction).
    pub fn for_leaf(&self, name: &str, key: Arc<CertifiedKey>) -> Arc<ServerConfig> {
        let mut configs = self.configs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cached, config)) = configs.get(name) {
            if Arc::ptr_eq(cached, &key) {
                return config.clone();
            }
        }
        let mut config = leaf_config(key.clone());
        if let Some(ticketer) = &self.ticketer {
            config.ticketer = ticketer.clone();
        }
        let config = Arc::new(config);
        if configs.len() >= self.capacity && !configs.contains_key(name) {
            // The leaf cache evicts the same way: any entry will do, the
            // next connection for it builds its config again.
            if let Some(victim) = configs.keys().next().cloned() {
                configs.remove(&victim);
            }
        }
        configs.insert(name.to_string(), (key, config.clone()));
        config
    }

    /// Configs held (hosts seen and not evicted).
    pub fn cached(&self) -> usize {
        self.configs.lock().map(|c| c.len()).unwrap_or(0)
    }
}

/// A rustls server config presenting one leaf, offering h2 and http/1.1.
pub fn leaf_config(key: Arc<CertifiedKey>) -> ServerConfig {
    #[derive(Debug)]
    struct One(Arc<CertifiedKey>);
    impl ResolvesServerCert for One {
        fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            Some(self.0.clone())
        }
    }
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(One(key)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

impl Proxy {
    /// Phase 4a: TLS with a minted leaf, then HTTP/1.1 or HTTP/2 by ALPN.
    pub(crate) async fn terminate<IO>(self: Arc<Self>, io: IO, leg: Leg)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // The handshake and the HTTP server each run in a future of their
        // own on the heap: an idle connection's task then holds the server
        // alone, not also the slots of the handshake's values (its task was
        // 11.8 KB with them inline, 4.6 KB boxed in place).
        let Some((tls, name)) = Box::pin(self.accept_tls(io, &leg)).await else {
            return;
        };
        // Plaintext bytes the client sent: none at all, and then its close,
        // is how a client that rejects our leaf after the handshake (GnuTLS)
        // leaves.
        let alpn = tls
            .get_ref()
            .1
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let (tls, meter) = meter::Metered::new(tls);
        let leg = Arc::new(leg);
        let proxy = self.clone();
        let served = leg.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let proxy = proxy.clone();
            let leg = served.clone();
            async move { Ok::<_, Infallible>(proxy.handle(req, leg).await) }
        });
        let served = serve_auto(tls, service, &self.cancel, self.limits.request_head);
        if let Err(e) = Box::pin(served).await {
            debug!(error = %e, "intercepted connection ended with an error");
        }
        if meter.read() == 0 && meter.peer_closed() {
            self.record_tls_abandoned(&name, &leg, trust::Stage::NoRequest, None, alpn)
                .await;
        }
    }

    /// Phase 4a, first half: the client's ClientHello, a leaf for the name
    /// it will verify, the handshake. `None` (recorded where it says
    /// something) when the client sent no TLS, was too slow, or refused.
    pub(crate) async fn accept_tls<IO>(
        &self,
        io: IO,
        leg: &Leg,
    ) -> Option<(tokio_rustls::server::TlsStream<IO>, String)>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let handshake = self.limits.handshake;
        let hello = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
        let start = match tokio::time::timeout(handshake, hello).await {
            Ok(Ok(start)) => start,
            Ok(Err(e)) => {
                info!(error = %e, host = %leg.host, "client sent no TLS ClientHello after CONNECT");
                self.record_unmapped_without_tls(leg, "it sent no TLS ClientHello")
                    .await;
                return None;
            }
            Err(_) => {
                info!(host = %leg.host, "no TLS ClientHello within {handshake:?}; closing");
                self.record_unmapped_without_tls(leg, "no TLS ClientHello came in time")
                    .await;
                return None;
            }
        };
        // Mint for the name the client will verify (SNI), else the CONNECT host.
        let name = start
            .client_hello()
            .server_name()
            .map(str::to_owned)
            .unwrap_or_else(|| leg.host.clone());
        let key = match self.issuer.certified_key(&name) {
            Ok(key) => key,
            Err(veris_ca::CaError::OutsideConstraints { .. }) => {
                // No client that checks the CA's name constraints would accept a leaf for
                // this name, so none is minted: a refusal by us, recorded as `blocked`,
                // never a client's `trust_failure`. The handshake ends with an
                // `access_denied` alert (what rustls sends when it has no certificate).
                info!(host = %name, "outside the CA's name constraints; refusing the handshake");
                let _ = tokio::time::timeout(handshake, start.into_stream(no_certificate())).await;
                self.record_outside_constraints(&name, leg).await;
                return None;
            }
            Err(e) => {
                warn!(error = %e, host = %name, "cannot mint a leaf; closing the connection");
                return None;
            }
        };
        let config = self.tls.for_leaf(&name, key);
        match tokio::time::timeout(handshake, start.into_stream(config)).await {
            Ok(Ok(tls)) => Some((tls, name)),
            // A client too slow to finish is not one that refused our leaf.
            Err(_) => {
                info!(host = %name, "TLS handshake not finished within {handshake:?}; closing");
                None
            }
            Ok(Err(e)) => {
                info!(error = %e, host = %name, "TLS handshake with the client failed");
                // Our leaf was on its way: an alert naming it is a refusal,
                // a close or another alert only an abandoned handshake.
                if let Some(how) = trust::classify(&e) {
                    self.record_handshake_failure(&name, leg, how).await;
                }
                None
            }
        }
    }

    /// A connection for `name`, outside the CA's name constraints, refused
    /// without a certificate.
    async fn record_outside_constraints(&self, name: &str, leg: &Leg) {
        let unmapped = self.router.route_connection(name) == Route::Unmapped;
        let why = if unmapped && self.identity.mode == Mode::Strict {
            "strict mode: unmapped host"
        } else {
            "the name the client asked for"
        };
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: name.to_string(),
            port: leg.port,
            tier: leg.tier,
            method: Some("CONNECT".into()),
            path: None,
            reason: format!(
                "{why} is outside the CA's name constraints: no certificate a client accepts can be made for it"
            ),
            dst: leg.headed_to(),
        }))
        .await;
    }

    /// Strict mode: a `CONNECT` to a host no service routes is terminated
    /// only so its refusal reaches the client as words; a client that then
    /// speaks no TLS is refused all the same, and that refusal is recorded.
    pub(crate) async fn record_unmapped_without_tls(&self, leg: &Leg, why: &str) {
        if self.identity.mode != Mode::Strict
            || self.router.route_connection(&leg.host) != Route::Unmapped
        {
            return;
        }
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some("CONNECT".into()),
            path: None,
            reason: format!("strict mode: unmapped host, and {why}"),
            dst: leg.headed_to(),
        }))
        .await;
    }
}

/// A server config with no certificate: rustls ends the handshake with an
/// `access_denied` alert.
fn no_certificate() -> Arc<ServerConfig> {
    #[derive(Debug)]
    struct None_;
    impl ResolvesServerCert for None_ {
        fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            None
        }
    }
    Arc::new(
        ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(None_)),
    )
}

/// A rustls server config presenting one minted leaf, offering h2 and
/// http/1.1 (the built-in twin's; the proxy keeps one per leaf in [`ServerConfigs`]).
pub fn server_config(key: Arc<rustls::sign::CertifiedKey>) -> Arc<rustls::ServerConfig> {
    Arc::new(leaf_config(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> veris_ca::Issuer {
        let dir = std::env::temp_dir().join(format!("veris-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (ca, _) = veris_ca::CertificateAuthority::load_or_create(
            &dir,
            &crate::scope::scope(None, &["example".into()]).unwrap(),
        )
        .expect("ca");
        let _ = std::fs::remove_dir_all(&dir);
        veris_ca::Issuer::new(Arc::new(ca), 2)
    }

    #[test]
    fn one_config_per_leaf_reused_and_bounded() {
        let issuer = issuer();
        let configs = ServerConfigs::new(2);
        let a = issuer.certified_key("a.example").expect("leaf");
        let first = configs.for_leaf("a.example", a.clone());
        assert!(Arc::ptr_eq(&first, &configs.for_leaf("a.example", a)));
        assert!(first.ticketer.enabled(), "tickets for resumption");
        for host in ["b.example", "c.example", "d.example"] {
            configs.for_leaf(host, issuer.certified_key(host).expect("leaf"));
        }
        assert_eq!(configs.cached(), 2);
    }

    #[test]
    fn a_new_leaf_gets_a_new_config() {
        let issuer = issuer();
        let configs = ServerConfigs::new(4);
        let a = issuer.certified_key("a.example").expect("leaf");
        let first = configs.for_leaf("a.example", a);
        let other = issuer.certified_key("b.example").expect("leaf");
        let second = configs.for_leaf("a.example", other);
        assert!(!Arc::ptr_eq(&first, &second));
    }
}
