//! How connections arrive: the explicit listener's requests, connections
//! the kernel redirected (transparent tier), the first bytes that tell their
//! protocol apart ([`sniff`], [`clienthello`]), TLS termination with a minted
//! leaf ([`tls`], [`trust`]), and the isolated tier's UDP and DNS sinks
//! ([`quic`], [`dns`]), and the gateway tier's listener ([`gateway`]) with its
//! proxy protocols: SOCKS5 ([`socks5`]) and HTTP proxy authentication
//! ([`proxy_auth`]). A new
//! listener kind goes here.

pub mod clienthello;
pub mod dns;
pub mod explicit;
pub mod gateway;
pub mod http;
pub mod proxy_auth;
pub mod quic;
pub mod sniff;
pub mod socks5;
pub mod tls;
pub mod transparent;
pub mod trust;
