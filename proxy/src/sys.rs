//! The one module of this crate that calls the kernel directly: asking a
//! redirected socket where it was really going (`SO_ORIGINAL_DST` for IPv4,
//! `IP6T_SO_ORIGINAL_DST` for IPv6), which conntrack remembers after an
//! nftables `redirect` rewrote the destination to our listener; and marking
//! our own outbound sockets (`SO_MARK`) so that redirect lets them leave;
//! and listing this host's interface addresses (`getifaddrs`).
#![allow(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

/// The destination `stream`'s client dialed before the redirect. IPv4 peers
/// of a dual-stack listener (`::ffff:a.b.c.d`) are asked over IPv4, where
/// conntrack keeps them.
pub fn original_dst(stream: &tokio::net::TcpStream) -> std::io::Result<SocketAddr> {
    let peer = stream.peer_addr()?;
    let ipv4 = match peer {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    let fd = stream.as_raw_fd();
    if ipv4 {
        let mut addr: libc::sockaddr_in = zeroed_in();
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `addr` is a properly aligned sockaddr_in that lives across
        // the call, `len` holds its exact size, and the kernel writes at most
        // `len` bytes; `fd` is an open socket borrowed from `stream`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_IP,
                libc::SO_ORIGINAL_DST,
                (&mut addr as *mut libc::sockaddr_in).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
        Ok(SocketAddr::V4(SocketAddrV4::new(
            ip,
            u16::from_be(addr.sin_port),
        )))
    } else {
        let mut addr: libc::sockaddr_in6 = zeroed_in6();
        let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        // SAFETY: as above, with a sockaddr_in6 and its exact size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_IPV6,
                libc::IP6T_SO_ORIGINAL_DST,
                (&mut addr as *mut libc::sockaddr_in6).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let ip = Ipv6Addr::from(addr.sin6_addr.s6_addr);
        Ok(SocketAddr::V6(SocketAddrV6::new(
            ip,
            u16::from_be(addr.sin6_port),
            addr.sin6_flowinfo,
            addr.sin6_scope_id,
        )))
    }
}

/// Sets `SO_MARK` on a socket. Needs CAP_NET_ADMIN in the user namespace
/// that owns the socket's network namespace; without it the kernel answers
/// `EPERM`, which the caller decides about.
pub fn set_mark(socket: &impl AsRawFd, mark: u32) -> std::io::Result<()> {
    let value: libc::c_uint = mark;
    // SAFETY: the pointer and length describe `value`, alive for the call;
    // the kernel only reads it. The fd is an open socket borrowed from `socket`.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&value as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn zeroed_in() -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: 0,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: 0 },
        sin_zero: [0; 8],
    }
}

fn zeroed_in6() -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: 0,
        sin6_port: 0,
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
        sin6_scope_id: 0,
    }
}

/// Every address of every interface of this host (its network namespace),
/// IPv4 and IPv6, from `getifaddrs(3)`.
pub fn interface_addresses() -> std::io::Result<Vec<std::net::IpAddr>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated into `head`, freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet
        // freed; `ifa_addr`, when not NULL, points to a sockaddr whose
        // family says which sockaddr_* it is.
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
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
