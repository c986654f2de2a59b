//! The kernel calls this crate makes beyond what tokio does, each through
//! the crate made for it: asking a redirected socket where it was really
//! going (`SO_ORIGINAL_DST` for IPv4, `IP6T_SO_ORIGINAL_DST` for IPv6, via
//! `rustix`), which conntrack remembers after an nftables `redirect`
//! rewrote the destination to our listener; marking our own outbound
//! sockets (`SO_MARK`, via `socket2`) so that redirect lets them leave;
//! and listing this host's interface addresses (`getifaddrs`).

use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;

/// The destination `stream`'s client dialed before the redirect. IPv4 peers
/// of a dual-stack listener (`::ffff:a.b.c.d`) are asked over IPv4, where
/// conntrack keeps them.
pub fn original_dst(stream: &tokio::net::TcpStream) -> std::io::Result<SocketAddr> {
    let peer = stream.peer_addr()?;
    let ipv4 = match peer {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    if ipv4 {
        let dst: SocketAddrV4 = rustix::net::sockopt::ip_original_dst(stream)?;
        Ok(SocketAddr::V4(dst))
    } else {
        Ok(SocketAddr::V6(rustix::net::sockopt::ipv6_original_dst(
            stream,
        )?))
    }
}

/// Sets `SO_MARK` on a socket. Needs CAP_NET_ADMIN in the user namespace
/// that owns the socket's network namespace; without it the kernel answers
/// `EPERM`, which the caller decides about.
pub fn set_mark(socket: &impl AsFd, mark: u32) -> std::io::Result<()> {
    socket2::SockRef::from(socket).set_mark(mark)
}

/// Every address of every interface of this host (its network namespace),
/// IPv4 and IPv6, link-local ones included, from `getifaddrs(3)`.
pub fn interface_addresses() -> std::io::Result<Vec<std::net::IpAddr>> {
    Ok(if_addrs::get_if_addrs()?
        .into_iter()
        .map(|interface| interface.ip())
        .collect())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_that_was_not_redirected_has_no_original_dst_or_its_own() {
        // Without a redirect, conntrack (when loaded) reports the address that
        // was dialed, which is the listener; without conntrack the call fails.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        match original_dst(&server) {
            Ok(dst) => assert_eq!(dst, addr),
            Err(e) => assert!(e.raw_os_error().is_some(), "{e}"),
        }
    }
}
