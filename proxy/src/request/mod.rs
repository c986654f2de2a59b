//! What happens to a request once it is read: routed ([`route`]), screened
//! ([`reserved`]), forwarded to its twin or answered by the proxy itself
//! ([`respond`]), and recorded ([`recorder`]).

pub mod recorder;
pub mod reserved;
pub mod respond;
pub mod route;
