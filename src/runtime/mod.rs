//! The runtime the commands share: starting and finishing the stack, the
//! live proxy's admin API and the checks a receipt needs, which ledger a
//! state dir means, and building and judging a receipt.

pub mod baseline;
pub mod ca_check;
pub mod checks;
pub mod fleet;
pub mod fleet_identity;
pub mod fleet_view;
pub mod gateway;
pub mod gateway_tls;
pub mod junit;
pub mod ledgers;
pub mod live;
pub mod receipt;
pub mod stack;
pub mod stream_receipt;
