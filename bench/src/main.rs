//! `veris-bench`: prints figures, asserts nothing (BENCHMARKS.md).
//!
//!     cargo build --release && cargo run --release -p veris-bench -- [proxy|ledger|all] [ARGS]

mod ledger;

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "all".into());
    let rest: Vec<String> = args.collect();
    match what.as_str() {
        "ledger" => ledger::main(&rest),
        "all" => ledger::main(&rest),
        other => {
            eprintln!("veris-bench: unknown scenario group {other:?} (proxy, ledger, all)");
            std::process::exit(1);
        }
    }
}
