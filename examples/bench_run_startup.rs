//! What isolation adds to `veris run`'s start: runs `veris run --tier
//! explicit` and `--tier isolated` on a command that prints the time it
//! started, interleaved, and prints the medians of "time until the command
//! runs" and "whole run" for each, and their difference (target: the
//! isolated start under 100 ms more than the explicit one).
//!
//! `cargo build --release && cargo run --release --example bench_run_startup -- [ROUNDS]`
//! (default 15 rounds; the binary is `target/release/veris`, or `$VERIS_BIN`).

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
    let tiers = ["explicit", "isolated"];
    let mut to_child: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut whole: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        // Alternate which tier goes first, so drift hits both alike.
        for i in [round % 2, 1 - round % 2] {
            let epoch = SystemTime::now();
            let start = Instant::now();
            let out = Command::new(&bin)
                .args(["run", "--tier", tiers[i], "--allow-empty", "--state-dir"])
                .arg(&state)
                .args(["--", "date", "+%s%N"])
                .env("VERIS_LOG", "error")
                .output()
                .expect("running veris");
            let took = start.elapsed();
            assert!(
                out.status.success(),
                "veris run --tier {} failed: {}",
                tiers[i],
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
        "{:<10} {:>18} {:>12}",
        "tier", "until the command", "whole run"
    );
    for (i, tier) in tiers.iter().enumerate() {
        println!(
            "{:<10} {:>15.1} ms {:>9.1} ms",
            tier,
            ms(median(&mut to_child[i])),
            ms(median(&mut whole[i]))
        );
    }
    let added = ms(median(&mut to_child[1])) - ms(median(&mut to_child[0]));
    let added_whole = ms(median(&mut whole[1])) - ms(median(&mut whole[0]));
    println!("isolation adds {added:.1} ms before the command runs ({added_whole:.1} ms to the whole run); target < 100 ms");
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
