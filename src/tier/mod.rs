//! The interception tiers: how the workload's traffic is made to reach the
//! proxy, and what that covers.

pub mod bundles;
pub mod handover;
pub mod isolated;
pub mod transparent;
