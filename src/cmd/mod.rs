//! The commands: one module per subcommand, named after it. Each parses
//! nothing itself (clap did) and calls into the runtime below it.

pub mod baseline;
pub mod ca;
pub mod check;
pub mod completions;
pub mod confine;
pub mod demo;
pub mod doctor;
pub mod fleet_key;
pub mod gateway;
pub mod har;
pub mod man;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod receipt;
pub mod replay;
pub mod run;
pub mod runs;
pub mod serve;
pub mod trigger;
pub mod tui;
pub mod twin;
