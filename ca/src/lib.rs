//! veris-ca mints and stores certificates and publishes trust material. It does no network I/O.
//!
//! The crate owns five things: the persisted interception CA ([`CertificateAuthority`]) and the
//! names it may sign for ([`Scope`], its name constraints), the
//! per-host leaves minted from it and cached for the proxy ([`Issuer`]), the certificate a
//! listener presents as itself ([`ServerCert`]), the trust material the
//! workload reads ([`trust`]), and the env file that points clients at the proxy and that trust
//! material ([`env`]). It never reads environment variables itself: callers pass what they mean.
#![forbid(unsafe_code)]

mod authority;
pub mod env;
mod error;
pub mod fsutil;
mod issuer;
mod scope;
mod server;
pub mod trust;

pub use authority::{
    CertificateAuthority, Leaf, LoadOutcome, Previous, Rotated, CA_PREV_FILE, EXPIRY_WARNING,
};
pub use error::CaError;
pub use issuer::Issuer;
pub use scope::{Scope, Subnet};
pub use server::ServerCert;
