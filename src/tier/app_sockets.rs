//! Sockets into an isolated run's network namespace, for webhook
//! deliveries to the app that listens there (DESIGN §15).
//!
//! A socket belongs to the network namespace it was created in. The proxy
//! runs in the host's, the app in the run's; so the init step (`veris
//! __isolate`, inside the namespace, outside the command's PID namespace)
//! serves a socket pair of its own, apart from the control socket: per
//! request one fresh TCP socket, unconnected, nonblocking, close-on-exec,
//! passed back with `SCM_RIGHTS` ([`serve`], a thread of the init step).
//! The proxy connects it to the webhook's loopback address
//! ([`Factory`], a [`veris_proxy::callback::SocketSource`]), which reaches
//! the app's `127.0.0.1:4242` inside, never a listener of the host.
//!
//! Nothing here is the workload's: only the proxy holds the other end of
//! the pair (the init step's end is close-on-exec, so neither pid 1 nor the
//! command inherits it), and a socket made here is one the command could
//! make itself, inside the same rules. Requests are made one at a time and
//! each answer is bounded in time ([`ANSWER_TIMEOUT`]); a factory that
//! stops answering, or whose namespace is gone (the command ended and the
//! init step with it), fails every later request at once, and the engine
//! records the delivery as failed.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// The factory's end of the pair in the init step.
pub const FACTORY_FD: i32 = 4;

/// How long the init step may take to answer one request.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The proxy's request: one socket of this family.
#[derive(Debug, Serialize, Deserialize)]
struct Make {
    ipv6: bool,
}

/// The init step's answer; `Made` travels with the socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Made,
    Failed { why: String },
}

/// The proxy's side: asks the init step for sockets.
pub struct Factory {
    /// Why the pair is no use any more, once the init step is gone or
    /// stopped answering (a late answer would be taken for the next
    /// request's): every later request fails at once with that reason.
    conn: tokio::sync::Mutex<Result<UnixStream, String>>,
}

impl Factory {
    /// The proxy's end of the pair.
    pub fn new(conn: UnixStream) -> std::io::Result<Factory> {
        conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        conn.set_write_timeout(Some(ANSWER_TIMEOUT))?;
        Ok(Factory {
            conn: tokio::sync::Mutex::new(Ok(conn)),
        })
    }
}

impl veris_proxy::callback::SocketSource for Factory {
    fn socket(&self, ipv6: bool) -> BoxFuture<'_, std::io::Result<OwnedFd>> {
        Box::pin(async move {
            // One request at a time: answers come in order, and at most one
            // blocking thread waits on the init step.
            let mut slot = self.conn.lock().await;
            let conn = match std::mem::replace(&mut *slot, Err(CUT.into())) {
                Ok(conn) => conn,
                Err(why) => {
                    *slot = Err(why.clone());
                    return Err(std::io::Error::new(std::io::ErrorKind::NotConnected, why));
                }
            };
            let (conn, answer) = tokio::task::spawn_blocking(move || {
                let answer = ask(&conn, ipv6);
                (conn, answer)
            })
            .await
            .map_err(|e| std::io::Error::other(format!("{CUT}: {e}")))?;
            match answer {
                // A refusal came in order: the pair still serves.
                Ok(made) => {
                    *slot = Ok(conn);
                    made.map_err(|why| {
                        std::io::Error::other(format!("the run's namespace made no socket: {why}"))
                    })
                }
                Err(e) => {
                    *slot = Err(e.to_string());
                    Err(e)
                }
            }
        })
    }
}

/// Why the pair is unusable after a request that did not finish.
const CUT: &str = "a request for a socket in the run's namespace failed";

fn gone() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the run's namespace is gone (the command ended)",
    )
}

/// One request and its answer, blocking (bounded by the socket's
/// timeouts): the socket, or why the init step made none; `Err` when the
/// pair is no use any more.
fn ask(conn: &UnixStream, ipv6: bool) -> std::io::Result<Result<OwnedFd, String>> {
    let mut line = serde_json::to_vec(&Make { ipv6 }).map_err(std::io::Error::other)?;
    line.push(b'\n');
    std::io::Write::write_all(&mut &*conn, &line).map_err(|e| lost(&e))?;
    let (line, fds) = super::isolated::recv_line_with_fds(conn).map_err(|e| lost(&e))?;
    let mut fds = fds.into_iter();
    match serde_json::from_slice::<Answer>(&line) {
        Ok(Answer::Made) => match (fds.next(), fds.next()) {
            (Some(fd), None) => Ok(checked(fd, ipv6)),
            _ => Err(lost(&std::io::Error::other(
                "not one socket with its answer",
            ))),
        },
        Ok(Answer::Failed { why }) => Ok(Err(why)),
        Err(e) => Err(lost(&std::io::Error::other(e))),
    }
}

/// `fd` if it is what was asked for: a TCP socket of the family, not
/// connected, made nonblocking here. Only the init step holds the pair's
/// other end; checked all the same, since the proxy connects whatever it
/// gets here.
fn checked(fd: OwnedFd, ipv6: bool) -> Result<OwnedFd, String> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let family = if ipv6 {
        AddressFamily::INET6
    } else {
        AddressFamily::INET
    };
    let what = (sockopt::socket_type(&fd), sockopt::socket_domain(&fd));
    if what != (Ok(SocketType::STREAM), Ok(family)) {
        return Err("the answer was not a TCP socket of the family asked for".into());
    }
    if rustix::net::getpeername(&fd).is_ok() {
        return Err("the answer was a socket connected already".into());
    }
    rustix::io::ioctl_fionbio(&fd, true).map_err(|e| e.to_string())?;
    Ok(fd)
}

/// The pair is no use any more: why, for the delivery's record.
fn lost(e: &std::io::Error) -> std::io::Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::ConnectionReset => gone(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the run's namespace made no socket within {ANSWER_TIMEOUT:?}"),
        ),
        _ => std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            format!("the run's namespace's socket factory failed: {e}"),
        ),
    }
}

/// The init step's side, on a thread of its own: answers each request with
/// a fresh socket made in this (the run's) network namespace, until the
/// proxy's end closes.
pub fn serve(conn: UnixStream) {
    let Ok(read) = conn.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let mut conn = conn;
    loop {
        let mut line = String::new();
        match reader.by_ref().take(1 << 10).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let sent = match serde_json::from_str::<Make>(&line) {
            Ok(Make { ipv6 }) => match socket(ipv6) {
                Ok(fd) => super::isolated::send(&mut conn, &Answer::Made, &[fd.as_fd()]),
                Err(e) => {
                    super::isolated::send(&mut conn, &Answer::Failed { why: e.to_string() }, &[])
                }
            },
            // Only the proxy writes here; anything else ends the service.
            Err(_) => return,
        };
        if sent.is_err() {
            return;
        }
    }
}

/// A TCP socket of this namespace: unconnected, nonblocking, close-on-exec.
fn socket(ipv6: bool) -> rustix::io::Result<OwnedFd> {
    use rustix::net::{socket_with, AddressFamily, SocketFlags, SocketType};
    let family = if ipv6 {
        AddressFamily::INET6
    } else {
        AddressFamily::INET
    };
    socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{sockopt, SocketType};
    use veris_proxy::callback::SocketSource;

    #[tokio::test]
    async fn each_request_gets_a_fresh_unconnected_tcp_socket() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        std::thread::spawn(move || serve(theirs));
        let factory = Factory::new(ours).unwrap();
        let a = factory.socket(false).await.expect("a socket");
        let b = factory.socket(false).await.expect("another");
        for fd in [&a, &b] {
            assert_eq!(sockopt::socket_type(fd).unwrap(), SocketType::STREAM);
            assert!(rustix::net::getpeername(fd).is_err());
        }
        assert_ne!(
            rustix::fs::fstat(&a).unwrap().st_ino,
            rustix::fs::fstat(&b).unwrap().st_ino
        );
        // A kernel without IPv6 refuses the socket: said, and the pair still serves.
        if let Err(e) = factory.socket(true).await {
            assert!(e.to_string().contains("made no socket"), "{e}");
        }
        assert!(factory.socket(false).await.is_ok());
    }

    #[tokio::test]
    async fn a_gone_init_step_fails_every_request_at_once() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        drop(theirs);
        let factory = Factory::new(ours).unwrap();
        for _ in 0..2 {
            let e = factory.socket(false).await.unwrap_err();
            assert!(e.to_string().contains("namespace is gone"), "{e}");
        }
    }

    /// An init step that never answers costs one request its bound, and
    /// every later one fails at once, saying why.
    #[tokio::test]
    async fn a_silent_init_step_fails_in_bounded_time_then_at_once() {
        let (ours, _silent) = UnixStream::pair().unwrap();
        let factory = Factory::new(ours).unwrap();
        for _ in 0..2 {
            let e = factory.socket(false).await.unwrap_err();
            assert!(e.to_string().contains("made no socket within"), "{e}");
        }
    }

    /// Whatever the other end hands over is checked: a connected socket
    /// (somewhere the proxy was not asked to go) is refused, and the pair
    /// serves the next request.
    #[tokio::test]
    async fn a_connected_socket_is_refused() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let elsewhere = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fake = std::thread::spawn(move || {
            let mut conn = theirs;
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            super::super::isolated::send(&mut conn, &Answer::Made, &[elsewhere.as_fd()]).unwrap();
            line.clear();
            reader.read_line(&mut line).unwrap();
            let fresh = socket(false).unwrap();
            super::super::isolated::send(&mut conn, &Answer::Made, &[fresh.as_fd()]).unwrap();
        });
        let factory = Factory::new(ours).unwrap();
        let e = factory.socket(false).await.unwrap_err();
        assert!(e.to_string().contains("connected already"), "{e}");
        assert!(factory.socket(false).await.is_ok());
        fake.join().unwrap();
    }
}
