//! How veris dials out: its own TCP dials and name resolution ([`dial`]),
//! the pooled HTTP client to twins and re-originated requests
//! ([`upstream`]), and which addresses the gateway tier may dial for a
//! sandbox ([`policy`]).

pub mod dial;
pub mod passthrough;
pub mod policy;
pub mod upstream;
