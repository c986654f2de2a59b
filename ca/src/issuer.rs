//! The leaf cache the proxy consults on every TLS handshake.
//!
//! One `Issuer` is shared by all connections. It maps a normalized host to a slot holding the
//! rustls `CertifiedKey`; the map is a bounded LRU so a client cycling through hostnames cannot
//! grow memory without limit. Minting happens outside the map lock, under the slot's own lock,
//! so concurrent misses for one host mint once while misses for other hosts proceed in parallel.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustls::sign::CertifiedKey;
use time::{Duration, OffsetDateTime};

use crate::authority::{normalize_host, LEAF_VALIDITY};
use crate::{CaError, CertificateAuthority};

/// Leaves are re-minted this long before they expire, so a long-running proxy never serves
/// an expired leaf from its cache.
pub(crate) const RENEW_BEFORE: Duration = Duration::days(1);

/// A minted leaf and when it must be replaced.
struct Minted {
    key: Arc<CertifiedKey>,
    renew_at: OffsetDateTime,
}

/// One host's cache entry; the mutex serializes minting for that host.
type Slot = Arc<Mutex<Option<Minted>>>;

/// LRU bookkeeping: `tick` orders entries by last use.
struct Lru {
    map: HashMap<String, (Slot, u64)>,
    order: BTreeMap<u64, String>,
    tick: u64,
}

/// Mints and caches per-host leaves. `Send + Sync`; share it in an `Arc`.
pub struct Issuer {
    ca: Arc<CertificateAuthority>,
    capacity: usize,
    lru: Mutex<Lru>,
    minted: AtomicU64,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("capacity", &self.capacity)
            .field("cached", &self.cached())
            .field("minted", &self.minted())
            .finish_non_exhaustive()
    }
}

/// A poisoned lock only means another thread panicked mid-update of plain data; the cache
/// stays structurally valid, so keep serving rather than cascading the panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Issuer {
    pub const DEFAULT_CAPACITY: usize = 10_000;

    /// A cache of at most `capacity` hosts (at least one).
    pub fn new(ca: Arc<CertificateAuthority>, capacity: usize) -> Issuer {
        Issuer {
            ca,
            capacity: capacity.max(1),
            lru: Mutex::new(Lru {
                map: HashMap::new(),
                order: BTreeMap::new(),
                tick: 0,
            }),
            minted: AtomicU64::new(0),
        }
    }

    /// Cached leaf as a rustls CertifiedKey (signing key from the default aws-lc-rs provider).
    /// Concurrent misses for one host mint once.
    pub fn certified_key(&self, host: &str) -> Result<Arc<CertifiedKey>, CaError> {
        let host = normalize_host(host)?;
        let slot = self.slot(&host);
        let mut guard = lock(&slot);
        let now = OffsetDateTime::now_utc();
        if let Some(m) = guard.as_ref() {
            if now < m.renew_at {
                return Ok(Arc::clone(&m.key));
            }
        }
        let leaf = self.ca.mint_leaf(&host)?;
        self.minted.fetch_add(1, Ordering::Relaxed);
        let signing_key =
            rustls::crypto::aws_lc_rs::sign::any_ecdsa_type(&leaf.key).map_err(|source| {
                CaError::SigningKey {
                    host: host.clone(),
                    source,
                }
            })?;
        let key = Arc::new(CertifiedKey::new(leaf.chain, signing_key));
        let leaf_not_after = (now + LEAF_VALIDITY).min(self.ca.not_after());
        *guard = Some(Minted {
            key: Arc::clone(&key),
            renew_at: leaf_not_after - RENEW_BEFORE,
        });
        Ok(key)
    }

    /// Finds or inserts the slot for `host`, marking it most recently used and evicting the
    /// least recently used host when over capacity.
    fn slot(&self, host: &str) -> Slot {
        let mut lru = lock(&self.lru);
        lru.tick += 1;
        let tick = lru.tick;
        if let Some((slot, last)) = lru.map.get_mut(host) {
            let old = std::mem::replace(last, tick);
            let slot = Arc::clone(slot);
            lru.order.remove(&old);
            lru.order.insert(tick, host.to_owned());
            return slot;
        }
        let slot: Slot = Arc::new(Mutex::new(None));
        lru.map.insert(host.to_owned(), (Arc::clone(&slot), tick));
        lru.order.insert(tick, host.to_owned());
        while lru.map.len() > self.capacity {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            // A connection still minting into an evicted slot keeps its Arc and finishes;
            // the result is simply not cached.
            lru.map.remove(&oldest);
        }
        slot
    }

    /// The CA the leaves are signed by.
    pub fn ca(&self) -> &Arc<CertificateAuthority> {
        &self.ca
    }

    /// Entries in the cache (hosts seen and not evicted).
    pub fn cached(&self) -> usize {
        lock(&self.lru).map.len()
    }

    /// Total leaves minted since creation (for tests and the bench).
    pub fn minted(&self) -> u64 {
        self.minted.load(Ordering::Relaxed)
    }
}
