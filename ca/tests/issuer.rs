//! Leaf cache tests: the bound, hits without minting, and one mint for concurrent misses.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Barrier};

use common::Scratch;
use veris_ca::{CertificateAuthority, Issuer};

fn issuer(name: &str, capacity: usize) -> (Scratch, Issuer) {
    let s = Scratch::new(name);
    let ca = CertificateAuthority::load_or_create(s.path(), &common::scope())
        .unwrap()
        .0;
    (s, Issuer::new(Arc::new(ca), capacity))
}

#[test]
fn default_capacity_is_ten_thousand() {
    assert_eq!(Issuer::DEFAULT_CAPACITY, 10_000);
}

#[test]
fn hits_do_not_mint_and_share_the_key() {
    let (_s, issuer) = issuer("issuer-hit", 16);
    let a = issuer.certified_key("api.stripe.com").unwrap();
    let b = issuer.certified_key("API.Stripe.com.").unwrap();
    assert!(Arc::ptr_eq(&a, &b), "normalized host must hit the cache");
    assert_eq!(issuer.minted(), 1);
    assert_eq!(issuer.cached(), 1);
    assert_eq!(a.cert.len(), 2);
    assert_eq!(&a.cert[1], issuer.ca().cert_der());
    assert!(issuer.certified_key("bad host").is_err());
}

#[test]
fn cache_stays_within_the_bound_and_evicts_least_recently_used() {
    let cap = 64;
    let (_s, issuer) = issuer("issuer-bound", cap);
    for i in 0..cap {
        issuer.certified_key(&format!("h{i}.example.com")).unwrap();
    }
    // Touch h0 so it becomes most recently used; h1 is now the oldest.
    issuer.certified_key("h0.example.com").unwrap();
    assert_eq!(issuer.minted(), cap as u64);
    for i in cap..cap * 3 {
        issuer.certified_key(&format!("h{i}.example.com")).unwrap();
        assert!(issuer.cached() <= cap);
    }
    assert_eq!(issuer.cached(), cap);
    assert_eq!(issuer.minted(), 3 * cap as u64);
    // The most recent host is still cached; an evicted one mints again.
    let before = issuer.minted();
    issuer
        .certified_key(&format!("h{}.example.com", cap * 3 - 1))
        .unwrap();
    assert_eq!(issuer.minted(), before);
    issuer.certified_key("h1.example.com").unwrap();
    assert_eq!(issuer.minted(), before + 1);
    assert_eq!(issuer.cached(), cap);
}

#[test]
fn ten_thousand_distinct_hosts_stay_within_default_bound() {
    let (_s, issuer) = issuer("issuer-10k", Issuer::DEFAULT_CAPACITY);
    let n = Issuer::DEFAULT_CAPACITY + 100;
    for i in 0..n {
        issuer.certified_key(&format!("h{i}.example.com")).unwrap();
    }
    assert_eq!(issuer.cached(), Issuer::DEFAULT_CAPACITY);
    assert_eq!(issuer.minted(), n as u64);
}

#[test]
fn concurrent_misses_for_one_host_mint_once() {
    let (_s, issuer) = issuer("issuer-race", 16);
    let issuer = Arc::new(issuer);
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let issuer = Arc::clone(&issuer);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                issuer.certified_key("new.example.com").unwrap()
            })
        })
        .collect();
    let keys: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(issuer.minted(), 1);
    assert!(keys.iter().all(|k| Arc::ptr_eq(k, &keys[0])));
}

#[test]
fn issuer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Issuer>();
    check::<CertificateAuthority>();
}
