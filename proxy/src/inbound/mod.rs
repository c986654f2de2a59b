//! How connections arrive: the explicit listener's requests, connections
//! the kernel redirected (transparent tier), the first bytes that tell their
//! protocol apart ([`sniff`], [`clienthello`]), TLS termination with a minted
//! leaf ([`tls`], [`trust`]), and the isolated tier's UDP and DNS sinks
//! ([`quic`], [`dns`]). A new listener kind goes here.

pub mod clienthello;
pub mod dns;
pub mod explicit;
pub mod http;
pub mod quic;
pub mod sniff;
pub mod tls;
pub mod transparent;
pub mod trust;
