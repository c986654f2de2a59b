//! How a delivery attempt reaches the app: the host's own connect; for a
//! gateway, the host's connect held to the gateway's dial policy (the
//! sandbox's app is reached only where the sandbox's own dials could go);
//! or, for an isolated `veris run` whose app listens inside the run's
//! network namespace, a socket made in that namespace and connected from
//! here.
//!
//! A socket belongs to the namespace it was created in, wherever it is used
//! afterwards: a socket the run's init step made inside and handed over
//! reaches the app's `127.0.0.1:4242` there, never a listener of the host
//! on the same port. The namespace has only loopback, so only loopback
//! addresses are dialed that way.

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::net::{TcpSocket, TcpStream};

/// Where fresh TCP sockets come from for [`Dialer::Namespace`].
pub trait SocketSource: Send + Sync {
    /// One fresh socket: TCP, unconnected, nonblocking, close-on-exec, of
    /// the IPv6 family when `ipv6`, else IPv4. Bounded in time: a source
    /// that stops answering fails, it does not hang.
    fn socket(&self, ipv6: bool) -> BoxFuture<'_, io::Result<OwnedFd>>;
}

/// How the engine connects to a webhook's `host:port`.
#[derive(Clone, Default)]
pub enum Dialer {
    /// The host's network, as any client of the host.
    #[default]
    Host,
    /// Sockets from a namespace's source, to its loopback addresses.
    Namespace(Arc<dyn SocketSource>),
    /// The host's network, each address the name resolves to judged by the
    /// dial policy the gateway enforces
    /// ([`crate::outbound::dial::enforce`]) and only a checked one dialed:
    /// a sandbox's webhook URL reaches nothing a sandbox's passthrough
    /// could not (its loopback, private networks, the metadata service)
    /// unless `--allow-dial` names it.
    Policed,
}

impl Dialer {
    /// A connection to `authority` (`host:port`), the first of its
    /// addresses that answers.
    pub async fn connect(&self, authority: &str) -> io::Result<TcpStream> {
        let source = match self {
            Dialer::Host => return TcpStream::connect(authority).await,
            Dialer::Policed => {
                let (host, port) = split_authority(authority)?;
                return crate::outbound::dial::connect_host_for_client(host, port, None).await;
            }
            Dialer::Namespace(source) => source,
        };
        let mut last = None;
        for addr in tokio::net::lookup_host(authority).await? {
            match connect_from(&**source, addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{authority} has no address"),
            )
        }))
    }
}

/// `host:port` (`[v6]:port`) split; the host as written.
pub fn split_authority(authority: &str) -> io::Result<(&str, u16)> {
    authority
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse().ok()?)))
        .filter(|(h, _)| !h.is_empty())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{authority:?} is not HOST:PORT"),
            )
        })
}

/// Connects a socket from `source` to `addr`, a loopback address.
async fn connect_from(source: &dyn SocketSource, addr: SocketAddr) -> io::Result<TcpStream> {
    if !addr.ip().is_loopback() {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("{addr} is not a loopback address, the only kind inside the run's namespace"),
        ));
    }
    let fd = source.socket(addr.is_ipv6()).await?;
    TcpSocket::from_std_stream(std::net::TcpStream::from(fd))
        .connect(addr)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Makes this process's own sockets, counting them, or fails.
    struct Local {
        made: AtomicUsize,
        fail: bool,
    }

    impl SocketSource for Local {
        fn socket(&self, ipv6: bool) -> BoxFuture<'_, io::Result<OwnedFd>> {
            Box::pin(async move {
                if self.fail {
                    return Err(io::Error::other("the namespace is gone"));
                }
                self.made.fetch_add(1, Ordering::Relaxed);
                let domain = if ipv6 {
                    socket2::Domain::IPV6
                } else {
                    socket2::Domain::IPV4
                };
                let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
                socket.set_nonblocking(true)?;
                Ok(OwnedFd::from(socket))
            })
        }
    }

    #[tokio::test]
    async fn a_namespace_dial_uses_the_sources_sockets_for_loopback_only() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let source = Arc::new(Local {
            made: AtomicUsize::new(0),
            fail: false,
        });
        let dialer = Dialer::Namespace(source.clone());
        let stream = dialer.connect(&addr.to_string()).await.expect("connects");
        let (accepted, _) = listener.accept().await.unwrap();
        assert_eq!(stream.local_addr().unwrap(), accepted.peer_addr().unwrap());
        assert_eq!(source.made.load(Ordering::Relaxed), 1);

        // Nothing but loopback: no socket is even asked for.
        let err = dialer.connect("192.0.2.1:80").await.unwrap_err();
        assert!(err.to_string().contains("not a loopback address"), "{err}");
        assert_eq!(source.made.load(Ordering::Relaxed), 1);

        let gone = Dialer::Namespace(Arc::new(Local {
            made: AtomicUsize::new(0),
            fail: true,
        }));
        let err = gone.connect(&addr.to_string()).await.unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }
}
