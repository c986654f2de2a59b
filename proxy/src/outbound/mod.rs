//! How veris dials out: its own TCP dials and name resolution ([`dial`])
//! and the pooled HTTP client to twins and re-originated requests
//! ([`upstream`]).

pub mod dial;
pub mod passthrough;
pub mod upstream;
