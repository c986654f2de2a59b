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

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> veris_ca::Issuer {
        let dir = std::env::temp_dir().join(format!("veris-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (ca, _) = veris_ca::CertificateAuthority::load_or_create(&dir).expect("ca");
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
