//! What isolation adds to `veris run`'s start: runs `veris run --tier
//! explicit` and `--tier isolated` on a command that prints the time it
//! started, interleaved, and prints the medians of "time until the command
//! runs" and "whole run" for each, and their difference (target: the
//! isolated start under 100 ms more than the explicit one).
//!
//! The isolated tier runs three ways, to show what the scan for the CA
//! bundles runtimes ship adds (target: under 10 ms with a typical Python and
//! Java installed): with a PATH that leads to no interpreter (nothing to
//! scan or cover), with this process's PATH (its `python3`, `python` and
//! `java`; the scan's cache warm), and the same with the cache removed
//! before each run (the walk itself).
//!
//! `cargo build --release && cargo run --release --example bench_run_startup -- [ROUNDS]`
//! (default 15 rounds; the binary is `target/release/veris`, or `$VERIS_BIN`).

// Prints figures, not veris: a failed unwrap or expect ends the run with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(15)
        .clamp(1, 200);
    let bin = std::env::var_os("VERIS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/veris"));
    assert!(
        bin.is_file(),
        "no {}: cargo build --release first",
        bin.display()
    );
    let state = std::env::temp_dir().join(format!("veris-bench-startup-{}", std::process::id()));
    // (label, tier, PATH without interpreters, cold scan cache)
    let variants = [
        ("explicit", "explicit", false, false),
        ("isolated, no python/java on PATH", "isolated", true, false),
        ("isolated, python/java on PATH", "isolated", false, false),
        ("isolated, same, cold scan", "isolated", false, true),
    ];
    let n = variants.len();
    let empty_path = state.join("empty-path");
    std::fs::create_dir_all(&empty_path).expect("creating an empty PATH dir");
    let mut to_child: Vec<Vec<Duration>> = vec![Vec::new(); n];
    let mut whole: Vec<Vec<Duration>> = vec![Vec::new(); n];
    for round in 0..rounds {
        // Rotate which variant goes first, so drift hits all alike.
        for k in 0..n {
            let i = (round + k) % n;
            let (_, tier, bare, cold) = variants[i];
            if cold {
                let _ = std::fs::remove_file(state.join("cache/bundles.json"));
            }
            let mut cmd = Command::new(&bin);
            cmd.args(["run", "--tier", tier, "--allow-empty", "--state-dir"])
                .arg(&state)
                .args(["--", "/bin/date", "+%s%N"])
                .env("VERIS_LOG", "error");
            if bare {
                cmd.env("PATH", &empty_path).env_remove("JAVA_HOME");
            }
            let epoch = SystemTime::now();
            let start = Instant::now();
            let out = cmd.output().expect("running veris");
            let took = start.elapsed();
            assert!(
                out.status.success(),
                "veris run ({}) failed: {}",
                variants[i].0,
                String::from_utf8_lossy(&out.stderr)
            );
            let started_ns: u128 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("the command printed its start time");
            let epoch_ns = epoch.duration_since(UNIX_EPOCH).unwrap().as_nanos();
            let ns = u64::try_from(started_ns.saturating_sub(epoch_ns)).unwrap_or(u64::MAX);
            to_child[i].push(Duration::from_nanos(ns));
            whole[i].push(took);
        }
    }
    let _ = std::fs::remove_dir_all(&state);
    println!("veris run start-up, {rounds} interleaved rounds, medians:");
    println!(
        "{:<34} {:>18} {:>12}",
        "variant", "until the command", "whole run"
    );
    for (i, (label, ..)) in variants.iter().enumerate() {
        println!(
            "{:<34} {:>15.1} ms {:>9.1} ms",
            label,
            ms(median(&mut to_child[i])),
            ms(median(&mut whole[i]))
        );
    }
    let to = |i: usize, v: &mut Vec<Vec<Duration>>| ms(median(&mut v[i]));
    let added = to(1, &mut to_child) - to(0, &mut to_child);
    let added_whole = to(1, &mut whole) - to(0, &mut whole);
    println!("isolation adds {added:.1} ms before the command runs ({added_whole:.1} ms to the whole run); target < 100 ms");
    let scan = to(2, &mut to_child) - to(1, &mut to_child);
    let cold = to(3, &mut to_child) - to(1, &mut to_child);
    println!("the bundle scan and its mounts add {scan:.1} ms before the command runs with its cache warm ({cold:.1} ms cold); target < 10 ms");
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
