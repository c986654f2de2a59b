//! Prints what a leaf costs: median time to mint one (of 1,000) and of an Issuer cache hit.
//! A program that prints figures, never a timed assertion. Run with
//! `cargo run -p veris-ca --release --example bench_mint` for representative numbers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use veris_ca::{CertificateAuthority, Issuer};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("veris-ca-bench-{}", std::process::id()));
    let (ca, _) = CertificateAuthority::load_or_create(
        &dir,
        &veris_ca::Scope::of(&["bench.example", "api.stripe.com"])?,
    )?;
    let ca = Arc::new(ca);

    let n = 1_000;
    let mut mint = Vec::with_capacity(n);
    for i in 0..n {
        let host = format!("h{i}.bench.example");
        let t = Instant::now();
        let leaf = ca.mint_leaf(&host)?;
        mint.push(t.elapsed());
        std::hint::black_box(leaf);
    }

    let issuer = Issuer::new(Arc::clone(&ca), Issuer::DEFAULT_CAPACITY);
    let t = Instant::now();
    issuer.certified_key("api.stripe.com")?;
    let miss = t.elapsed();
    let mut hit = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let k = issuer.certified_key("api.stripe.com")?;
        hit.push(t.elapsed());
        std::hint::black_box(k);
    }

    println!(
        "mint_leaf (new P-256 key + CA signature): median {:?} of {n}",
        median(mint)
    );
    println!("Issuer miss (mint + rustls key load):      {miss:?} (single)");
    println!(
        "Issuer hit (cached CertifiedKey):          median {:?} of {n}",
        median(hit)
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
