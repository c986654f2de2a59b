//! `veris-bench`: prints figures, asserts nothing (BENCHMARKS.md).
//!
//!     cargo build --release && cargo run --release -p veris-bench -- [proxy|ledger|gateway|stream|fleet-tui|all] [ARGS]
//!
//! `proxy` runs veris against direct and peer proxies (`proxy.rs`; `--help`
//! for its flags), `ledger` the ledger at scale (`ledger.rs`), `all` both;
//! `gateway` one `veris gateway` serving many sandboxes against `veris
//! serve` (`gateway.rs`); `stream` the receipt from a NATS stream of a
//! big sandbox ledger (`stream.rs`); `fleet-tui` the fleet view of `veris
//! tui --nats` over a stream of many sandboxes (`fleet_tui.rs`).

// Prints figures, not veris: a failed unwrap or expect ends the run with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_tui;
mod gateway;
mod ledger;
mod load;
mod peers;
mod procstat;
mod proxy;
mod report;
mod stream;

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "all".into());
    let rest: Vec<String> = args.collect();
    let ok = match what.as_str() {
        "proxy" => proxy::main(&rest),
        "gateway" => gateway::main(&rest),
        "stream" => stream::main(&rest),
        "fleet-tui" => fleet_tui::main(&rest),
        "ledger" => {
            ledger::main(&rest);
            true
        }
        "all" => {
            // The ledger figures run even when the proxy ones could not.
            let ok = proxy::main(&rest);
            ledger::main(&rest);
            ok
        }
        other => {
            eprintln!(
                "veris-bench: unknown scenario group {other:?} (proxy, ledger, gateway, stream, fleet-tui, all)"
            );
            false
        }
    };
    if !ok {
        std::process::exit(1);
    }
}
