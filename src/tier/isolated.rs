//! `veris run`'s isolated tier: the child runs in network, user, mount and
//! PID namespaces of its own, where nothing leaves except through the proxy.
//!
//! Three processes, each a step of this binary:
//!
//! - **the proxy** (`veris run`, host namespaces) starts the init step with a
//!   control socket on fd 3 ([`start`]), receives the listener sockets the
//!   init step created inside the new network namespace, serves them (the
//!   transparent tier's listeners, the QUIC sink and the DNS stub), and dials
//!   the twin and passthrough hosts from the host namespace as ever; its
//!   webhook deliveries connect sockets the init step makes inside on
//!   request, over a second socket pair on fd 4 ([`super::app_sockets`]).
//! - **the init step** (`veris __isolate`, [`init_main`]) creates the user,
//!   network and mount namespaces (unprivileged: the user namespace maps
//!   only the caller's uid, as uid 0), brings loopback up with a route for
//!   every destination through it, binds the listeners, installs the
//!   transparent ruleset with DNS sent to the stub (`deploy/veris.nft`), and
//!   hands the sockets over. Once the proxy is ready it bind-mounts the veris
//!   bundle (system roots + veris CA) over the system trust stores, creates a
//!   PID namespace (starting the socket factory's thread just before) and
//!   starts the next step; it then reports the UDP drop
//!   counter and the child's exit, and probes the canary through the
//!   redirect at the end. It is outside the child's PID namespace, so the
//!   child cannot signal it, and holds capabilities the child lacks, so the
//!   child cannot ptrace it.
//! - **pid 1** (`veris __isolate-init`, [`pid1_main`]) mounts a /proc for its
//!   PID namespace, starts the command with every capability gone and
//!   no_new_privs ([`crate::os::prctl::drop_capabilities_at_exec`]), reaps orphans
//!   and exits with the command's status; everything the command left
//!   behind dies with it.
//!
//! Why nothing leaves: the namespace has no interface but loopback, so a
//! packet can only reach a socket in it; the rules send every TCP
//! connection to the proxy's listeners, DNS to the stub, UDP 443 to the
//! sink and drop the rest; and the child, without CAP_NET_ADMIN in the
//! namespace's owner, cannot change them (deleting them would only cut it
//! off). Where any step is unavailable (no user namespaces, no `ip` or
//! `nft`), [`start`] says why and `veris run` falls back.

use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};
use veris_proxy::canary::{CanaryAnswer, ProbeError};
use veris_receipt::Entry;

use crate::os::ns::{MountFlags, UnshareFlags};
use crate::tier::app_sockets::{Factory, FACTORY_FD};
use crate::tier::transparent::{ruleset, RulesetParams};
use crate::tier::{Bound, Ran, Tier, Workload};
use futures_util::future::BoxFuture;

/// The control socket's fd in the init step.
const CONTROL_FD: i32 = 3;

/// How long the init step may take to set the namespace up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where distributions keep the system trust store as one PEM bundle:
/// Debian/Ubuntu/Alpine, Fedora/RHEL (two), openSUSE, and the OpenSSL
/// default many builds read.
pub const TRUST_STORES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The address the canary probe dials from inside: TEST-NET-1, which no
/// route reaches, so only the redirect can answer it.
const CANARY_DST: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::new(192, 0, 2, 1),
    80,
));

/// The init step's messages to the proxy, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FromInit {
    /// The namespace is ready; the five sockets travel with this line, in
    /// this order.
    Ready { ports: Ports },
    /// Isolation is not possible here, and why.
    Unavailable { why: String },
    /// The command started; these trust stores now hold the veris bundle.
    Started { trust_stores: Vec<String> },
    /// The namespace's dropped-UDP counter (a running total).
    UdpDropped { total: u64 },
    /// The command ended with this status (shell convention for signals).
    Exited { code: u8 },
    /// What the canary endpoint answered through the redirect, or why not.
    Canary {
        answer: std::result::Result<String, String>,
    },
    /// A failure after setup.
    Failed { why: String },
}

/// The proxy's messages to the init step.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ToInit {
    /// The proxy serves: start the command with this environment.
    Go {
        env: Vec<(String, String)>,
        bundle: PathBuf,
        /// The Java truststore (the same certificates), for keystores.
        truststore: PathBuf,
        /// Further bundle files to cover (`--trust-file`).
        extra_stores: Vec<PathBuf>,
        /// The bundles the command's runtimes ship, as the scan checked
        /// them ([`crate::tier::bundles`]).
        bundles: Vec<crate::tier::bundles::Bundle>,
        /// `--share-tmp`: the host's /tmp, /var/tmp and /dev/shm.
        share_tmp: bool,
        /// Paths carried into private ones (the working directory, the
        /// trust files), when they lie under them.
        keep: Vec<PathBuf>,
    },
    /// Probe the canary through the redirect.
    Canary,
    /// Nothing more: exit.
    Done,
}

/// The listeners' ports inside the namespace (the ruleset names them).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Ports {
    pub https: u16,
    pub http: u16,
    pub quic: u16,
    pub dns_udp: u16,
    pub dns_tcp: u16,
}

/// The sockets the init step created inside the namespace, now the proxy's.
pub struct Sockets {
    pub https: TcpListener,
    pub http: TcpListener,
    pub quic: UdpSocket,
    pub dns_udp: UdpSocket,
    pub dns_tcp: TcpListener,
    pub ports: Ports,
    /// `--share-tmp`: the command shares the host's scratch dirs.
    pub share_tmp: bool,
    /// The bundle files covered besides the system stores (`--trust-file`
    /// and the scan's), for the session line.
    pub bundles: Vec<String>,
}

impl Sockets {
    /// Where the command can still reach a host daemon's unix socket.
    fn sockets_reachable(&self) -> Vec<String> {
        let mut out = vec!["home directories".to_string()];
        if self.share_tmp {
            out.extend(TMP_DIRS.iter().map(|d| d.to_string()));
        }
        out
    }

    /// The coverage these rules give, for the session line.
    pub fn coverage(&self) -> veris_receipt::Coverage {
        veris_receipt::Coverage {
            isolation: Some("netns".into()),
            sockets_reachable: self.sockets_reachable(),
            bundles: self.bundles.clone(),
            ..params(self.ports).coverage("veris")
        }
    }
}

fn params(ports: Ports) -> RulesetParams {
    RulesetParams {
        proxy_uid: None,
        https_port: ports.https,
        http_port: ports.http,
        quic_port: ports.quic,
        allow_quic: false,
        egress_ports: Vec::new(),
        exempt_mark: false,
        resolvers: Vec::new(),
        dns_stub: Some((ports.dns_udp, ports.dns_tcp)),
    }
}

/// What the proxy side reads from the init step while the command runs.
pub enum Event {
    UdpDropped(u64),
    Exited(u8),
}

/// The proxy's handle on the init step.
pub struct Isolation {
    init: tokio::process::Child,
    reader: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
    /// Process group of the init step, pid 1 and the command.
    pub pgid: Option<u32>,
    /// Sockets made inside the namespace, for webhook deliveries to the app.
    pub app_sockets: Arc<Factory>,
}

/// Starts the init step for `command` and waits (bounded) for the sockets.
/// `Err` says why isolation is unavailable here, in a sentence.
pub async fn start(command: &[String]) -> std::result::Result<(Isolation, Sockets), String> {
    let pair = || UnixStream::pair().map_err(|e| format!("cannot create a socket pair ({e})"));
    let (ours, theirs) = pair()?;
    let (factory, factory_theirs) = pair()?;
    let app_sockets = Factory::new(factory)
        .map(Arc::new)
        .map_err(|e| format!("cannot set up the socket factory's pair ({e})"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the veris binary ({e})"))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("__isolate")
        .arg("--")
        .args(command)
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0);
    // Both pairs' fds here are above 4 (stdio and the runtime's own come
    // first), so neither dup2 overwrites the other's source.
    crate::os::fd::pass_fd(&mut cmd, theirs.as_raw_fd(), CONTROL_FD);
    crate::os::fd::pass_fd(&mut cmd, factory_theirs.as_raw_fd(), FACTORY_FD);
    let mut init = cmd
        .spawn()
        .map_err(|e| format!("cannot start the isolation step ({e})"))?;
    drop(theirs);
    drop(factory_theirs);
    let pgid = init.id();
    let received = tokio::task::spawn_blocking(move || {
        ours.set_read_timeout(Some(SETUP_TIMEOUT))?;
        let (line, fds) = recv_line_with_fds(&ours)?;
        ours.set_read_timeout(None)?;
        Ok::<_, std::io::Error>((ours, line, fds))
    })
    .await
    .map_err(|e| format!("the isolation step's reader failed ({e})"));
    let (ours, line, fds) = match received.and_then(|r| r.map_err(|e| e.to_string())) {
        Ok(r) => r,
        Err(e) => {
            let _ = init.start_kill();
            let _ = init.wait().await;
            return Err(format!("the isolation step did not answer ({e})"));
        }
    };
    let ports = match serde_json::from_slice::<FromInit>(&line) {
        Ok(FromInit::Ready { ports }) => ports,
        Ok(FromInit::Unavailable { why }) => {
            let _ = init.wait().await;
            return Err(why);
        }
        other => {
            let _ = init.start_kill();
            let _ = init.wait().await;
            return Err(format!(
                "the isolation step said something unexpected ({other:?})"
            ));
        }
    };
    let [https, http, quic, dns_udp, dns_tcp]: [OwnedFd; 5] =
        fds.try_into().map_err(|fds: Vec<OwnedFd>| {
            format!(
                "the isolation step handed over {} sockets, not 5",
                fds.len()
            )
        })?;
    let sockets = Sockets {
        https: https.into(),
        http: http.into(),
        quic: quic.into(),
        dns_udp: dns_udp.into(),
        dns_tcp: dns_tcp.into(),
        ports,
        share_tmp: false,
        bundles: Vec::new(),
    };
    let stream = ours
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(ours))
        .map_err(|e| format!("cannot use the control socket ({e})"))?;
    let (read, writer) = stream.into_split();
    Ok((
        Isolation {
            init,
            reader: tokio::io::BufReader::new(read),
            writer,
            pgid,
            app_sockets,
        },
        sockets,
    ))
}

impl Isolation {
    /// The proxy serves: the command starts with `env`, and the system
    /// trust stores, `extra_stores` and `bundles` hold `trust`'s bundle (a
    /// keystore its truststore). Returns the trust stores covered.
    pub async fn go(
        &mut self,
        env: Vec<(String, String)>,
        trust: &veris_ca::trust::TrustFiles,
        extra_stores: &[PathBuf],
        bundles: Vec<crate::tier::bundles::Bundle>,
        share_tmp: bool,
        keep: Vec<PathBuf>,
    ) -> Result<Vec<String>> {
        self.send(&ToInit::Go {
            env,
            bundle: trust.bundle.clone(),
            truststore: trust.truststore.clone(),
            extra_stores: extra_stores.to_vec(),
            bundles,
            share_tmp,
            keep,
        })
        .await?;
        match tokio::time::timeout(SETUP_TIMEOUT, self.recv()).await {
            Ok(Ok(FromInit::Started { trust_stores })) => Ok(trust_stores),
            Ok(Ok(FromInit::Failed { why })) => bail!("{why}"),
            Ok(Ok(other)) => bail!("the isolation step said something unexpected ({other:?})"),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                bail!("the isolation step did not start the command within {SETUP_TIMEOUT:?}")
            }
        }
    }

    /// The next report while the command runs.
    pub async fn next(&mut self) -> Result<Event> {
        match self.recv().await? {
            FromInit::UdpDropped { total } => Ok(Event::UdpDropped(total)),
            FromInit::Exited { code } => Ok(Event::Exited(code)),
            FromInit::Failed { why } => bail!("{why}"),
            other => bail!("the isolation step said something unexpected ({other:?})"),
        }
    }

    /// Probes the canary from inside the namespace, through the redirect:
    /// the body the proxy answered, or why there is none.
    pub async fn canary(&mut self) -> std::result::Result<String, String> {
        if let Err(e) = self.send(&ToInit::Canary).await {
            return Err(e.to_string());
        }
        match tokio::time::timeout(SETUP_TIMEOUT, self.recv()).await {
            Ok(Ok(FromInit::Canary { answer })) => answer,
            Ok(Ok(other)) => Err(format!("unexpected answer ({other:?})")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {SETUP_TIMEOUT:?}")),
        }
    }

    /// Lets the init step exit, and waits (bounded) for it.
    pub async fn done(&mut self) {
        let _ = self.send(&ToInit::Done).await;
        if tokio::time::timeout(Duration::from_secs(5), self.init.wait())
            .await
            .is_err()
        {
            let _ = self.init.start_kill();
            let _ = self.init.wait().await;
        }
    }

    async fn send(&mut self, message: &ToInit) -> Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.writer
            .write_all(&line)
            .await
            .context("the isolation step is gone")
    }

    async fn recv(&mut self) -> Result<FromInit> {
        let mut line = String::new();
        let n = (&mut self.reader)
            .take(1 << 20)
            .read_line(&mut line)
            .await
            .context("reading from the isolation step")?;
        if n == 0 {
            let status = self.init.wait().await?;
            bail!("the isolation step ended ({status}) without reporting the command's exit");
        }
        serde_json::from_str(&line).with_context(|| format!("the isolation step said {line:?}"))
    }
}

/// One line and the file descriptors sent with it (close-on-exec).
pub(super) fn recv_line_with_fds(sock: &UnixStream) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 4096];
    while !line.ends_with(b"\n") {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if msg.bytes == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the isolation step exited during setup",
            ));
        }
        line.extend_from_slice(&buf[..msg.bytes]);
        if line.len() > 1 << 16 {
            return Err(std::io::Error::other("over-long setup message"));
        }
    }
    Ok((line, fds))
}

// ---------------------------------------------------------------------------
// The init step, inside the namespaces. Single-threaded and synchronous: it
// runs before any runtime exists, as namespaces and fork want.

/// `veris __isolate -- CMD`: see the module doc. Returns the exit code.
pub fn init_main(command: Vec<String>) -> u8 {
    let Some(fd) = crate::os::fd::inherited_fd(CONTROL_FD) else {
        eprintln!("veris: __isolate is an internal step of `veris run`");
        return 1;
    };
    let mut control = UnixStream::from(fd);
    // The commands started from here (`ip`, `nft`, pid 1 and the command)
    // must inherit neither the control socket nor the socket factory's.
    let factory = crate::os::fd::inherited_fd(FACTORY_FD).map(UnixStream::from);
    for fd in std::iter::once(control.as_fd()).chain(factory.as_ref().map(AsFd::as_fd)) {
        if let Err(e) = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC) {
            eprintln!("veris: cannot set up the control sockets: {e}");
            return 1;
        }
    }
    crate::os::procs::survive_job_signals();
    let (sockets, counters) = match setup() {
        Ok(s) => s,
        Err(e) => {
            let _ = send(
                &mut control,
                &FromInit::Unavailable {
                    why: format!("{e:#}"),
                },
                &[],
            );
            return 1;
        }
    };
    // Only now: a non-dumpable process may not write its own uid map.
    let _ = crate::os::prctl::set_non_dumpable();
    let fds: Vec<BorrowedFd<'_>> = [
        sockets.https.as_fd(),
        sockets.http.as_fd(),
        sockets.quic.as_fd(),
        sockets.dns_udp.as_fd(),
        sockets.dns_tcp.as_fd(),
    ]
    .into();
    if send(
        &mut control,
        &FromInit::Ready {
            ports: sockets.ports,
        },
        &fds,
    )
    .is_err()
    {
        return 1;
    }
    drop(fds);
    // The proxy owns them now; ours would keep the ports open after it stops.
    drop(sockets);
    match run_command(&mut control, counters, factory, &command) {
        Ok(code) => code,
        Err(e) => {
            let _ = send(
                &mut control,
                &FromInit::Failed {
                    why: format!("{e:#}"),
                },
                &[],
            );
            1
        }
    }
}

/// Moves this (single-threaded) process into new user, network and mount
/// namespaces, mapped to its own uid and gid as 0, with private mounts and
/// loopback up: the first step of [`setup`], and all of [`probe_main`].
fn enter_namespaces() -> Result<()> {
    let (uid, gid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    crate::os::ns::unshare(UnshareFlags::NEWUSER | UnshareFlags::NEWNET | UnshareFlags::NEWNS).map_err(|e| {
        anyhow!("cannot create a user and network namespace ({e}): unprivileged user namespaces are disabled here (sysctl user.max_user_namespaces, kernel.apparmor_restrict_unprivileged_userns) or blocked by a seccomp profile")
    })?;
    // Only our own uid and gid, as 0 inside (what `unshare -r` does).
    std::fs::write("/proc/self/setgroups", "deny").context("writing /proc/self/setgroups")?;
    std::fs::write("/proc/self/uid_map", format!("0 {uid} 1")).context("writing the uid map")?;
    std::fs::write("/proc/self/gid_map", format!("0 {gid} 1")).context("writing the gid map")?;
    // Bind mounts made here stay here.
    crate::os::ns::make_private().context("making the mount namespace private")?;
    ip(&["link", "set", "lo", "up"])
}

/// `veris __isolate-probe` (for `veris doctor`, in a child of its own): the
/// namespace steps of an isolated run, then whether `nft` can load a table
/// in that namespace. Prints two lines, `userns: ok` (or what failed) and
/// `nft: ok` (or what failed, or `not tried`), and exits 0.
pub fn probe_main() -> u8 {
    let words = |r: &Result<()>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("{e:#}").replace('\n', " "),
    };
    let userns = enter_namespaces();
    println!("userns: {}", words(&userns));
    if userns.is_ok() {
        let nft = nft_apply(
            "table inet veris_probe {\n  chain c {\n    type filter hook output priority 0;\n  }\n}\n",
        );
        println!("nft: {}", words(&nft));
    } else {
        println!("nft: not tried");
    }
    0
}

/// The namespaces, loopback and its routes, the listeners and the rules.
fn setup() -> Result<(Sockets, Counters)> {
    enter_namespaces()?;

    // Loopback (up already), and a route for every destination through it: a
    // connection to anywhere then reaches the rules instead of failing with
    // "network unreachable", and no interface leads out.
    // The source must be a loopback address too: with none, replies to the
    // client's 0.0.0.0 would never arrive.
    ip(&["route", "add", "default", "dev", "lo", "src", "127.0.0.1"])?;
    // IPv6 may be disabled in this kernel; then nothing leaves over it either.
    let _ = ip(&["-6", "route", "add", "default", "dev", "lo", "src", "::1"]);

    let tcp = || {
        TcpListener::bind("[::]:0")
            .or_else(|_| TcpListener::bind("0.0.0.0:0"))
            .context("binding a listener in the namespace")
    };
    let udp = || {
        UdpSocket::bind("[::]:0")
            .or_else(|_| UdpSocket::bind("0.0.0.0:0"))
            .context("binding a UDP socket in the namespace")
    };
    let (https, http, quic, dns_udp, dns_tcp) = (tcp()?, tcp()?, udp()?, udp()?, tcp()?);
    let port = |a: std::io::Result<SocketAddr>| a.map(|a| a.port());
    let ports = Ports {
        https: port(https.local_addr())?,
        http: port(http.local_addr())?,
        quic: port(quic.local_addr())?,
        dns_udp: port(dns_udp.local_addr())?,
        dns_tcp: port(dns_tcp.local_addr())?,
    };
    nft_apply(&ruleset(&params(ports)))?;
    let counters = Counters::start();
    Ok((
        Sockets {
            https,
            http,
            quic,
            dns_udp,
            dns_tcp,
            ports,
            share_tmp: false,
            bundles: Vec::new(),
        },
        counters,
    ))
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new(crate::os::tool::tool("ip"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| anyhow!("cannot run `ip` ({e}). Next: install iproute2"))?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn nft_apply(rules: &str) -> Result<()> {
    let mut child = Command::new(crate::os::tool::tool("nft"))
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow!("cannot run `nft` ({e}). Next: install nftables"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(rules.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "installing the namespace's rules failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Reads the UDP drop counter through one `nft -i` started before the
/// command, so nothing the command could replace on disk is run later.
struct Counters {
    nft: Option<(Child, ChildStdin, BufReader<ChildStdout>)>,
}

impl Counters {
    fn start() -> Counters {
        use std::os::unix::process::CommandExt;
        // A group of its own: the command's `kill(0, …)` must not reach it.
        let spawned = Command::new(crate::os::tool::tool("nft"))
            .arg("-i")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let nft = spawned.ok().and_then(|mut child| {
            let stdin = child.stdin.take()?;
            let stdout = BufReader::new(child.stdout.take()?);
            Some((child, stdin, stdout))
        });
        Counters { nft }
    }

    /// The counter's packets, or `None` once `nft` stopped answering.
    fn udp_dropped(&mut self) -> Option<u64> {
        let (_, stdin, stdout) = self.nft.as_mut()?;
        let asked = stdin.write_all(b"list counter inet veris udp_dropped\n");
        let mut packets = None;
        if asked.is_ok() {
            // table inet veris { / counter udp_dropped { / packets N bytes M / } / }
            for _ in 0..16 {
                let mut line = String::new();
                if stdout.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if let Some(rest) = line.trim().strip_prefix("packets ") {
                    packets = rest.split(' ').next().and_then(|n| n.parse().ok());
                }
                if line.trim_end() == "}" {
                    return packets;
                }
            }
        }
        if let Some((mut child, ..)) = self.nft.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        None
    }
}

impl Drop for Counters {
    fn drop(&mut self) {
        if let Some((mut child, ..)) = self.nft.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// After the sockets are handed over: wait for `go`, mount the trust
/// stores, start pid 1, report until the command exits, then answer the
/// canary and wait for `done`.
fn run_command(
    control: &mut UnixStream,
    mut counters: Counters,
    factory: Option<UnixStream>,
    command: &[String],
) -> Result<u8> {
    let mut reader = BufReader::new(control.try_clone()?);
    let (env, sources, extra_stores, bundles, share_tmp, keep) = match read_message(&mut reader)? {
        Some(ToInit::Go {
            env,
            bundle,
            truststore,
            extra_stores,
            bundles,
            share_tmp,
            keep,
        }) => (
            env,
            (bundle, truststore),
            extra_stores,
            bundles,
            share_tmp,
            keep,
        ),
        Some(other) => bail!("expected go, got {other:?}"),
        None => return Ok(1),
    };
    if !share_tmp {
        private_tmp(&keep)?;
    }
    let trust_stores = mount_trust(&sources, &extra_stores, &bundles)?;
    hide_daemon_sockets();
    // A thread only now, and not later: the user namespace wanted a
    // single-threaded process, and once the PID namespace is unshared no
    // thread can be created (EINVAL).
    if let Some(factory) = factory {
        std::thread::Builder::new()
            .name("app-sockets".into())
            .spawn(move || super::app_sockets::serve(factory))
            .context("starting the socket factory for webhook deliveries")?;
    }
    crate::os::ns::unshare(UnshareFlags::NEWPID).context("creating the PID namespace")?;
    // This very binary, wherever its path now leads (a private /tmp may
    // hide the copy it was started from).
    let exe = PathBuf::from("/proc/self/exe");
    // Pid 1 and the command get a process group of their own: a command
    // signalling its group (`kill(0, …)`) reaches neither this step nor its
    // counter, and the signals `veris run` forwards here are passed on to it.
    let mut pid1 = {
        use std::os::unix::process::CommandExt;
        Command::new(exe)
            .arg("__isolate-init")
            .arg("--")
            .args(command)
            .env_clear()
            .envs(env)
            .process_group(0)
            .spawn()
            .context("starting the namespace's pid 1")?
    };
    crate::os::procs::forward_signals_to(pid1.id());
    send(control, &FromInit::Started { trust_stores }, &[])?;

    let mut reported = 0;
    let mut last_poll = Instant::now();
    let code = loop {
        if let Some(status) = pid1.try_wait()? {
            break exit_code(status);
        }
        if proxy_gone(control) {
            // Nobody records any more: end the command (and its namespace).
            let _ = pid1.kill();
            let _ = pid1.wait();
            return Ok(1);
        }
        if last_poll.elapsed() >= Duration::from_secs(1) {
            last_poll = Instant::now();
            report_drops(control, &mut counters, &mut reported)?;
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    report_drops(control, &mut counters, &mut reported)?;
    send(control, &FromInit::Exited { code }, &[])?;
    loop {
        match read_message(&mut reader)? {
            Some(ToInit::Canary) => {
                let answer = probe_canary();
                send(control, &FromInit::Canary { answer }, &[])?;
            }
            Some(ToInit::Done) | None => return Ok(code),
            Some(other) => bail!("unexpected {other:?}"),
        }
    }
}

fn report_drops(
    control: &mut UnixStream,
    counters: &mut Counters,
    reported: &mut u64,
) -> Result<()> {
    let alive = counters.nft.is_some();
    match counters.udp_dropped() {
        Some(total) if total != *reported => {
            *reported = total;
            send(control, &FromInit::UdpDropped { total }, &[])?;
        }
        Some(_) => {}
        // Datagrams are still dropped (the rules stay); only the count is lost.
        None if alive => eprintln!(
            "veris: the namespace's UDP drop counter stopped answering; later drops are not counted"
        ),
        None => {}
    }
    Ok(())
}

/// True when the proxy's end of the control socket closed.
fn proxy_gone(control: &UnixStream) -> bool {
    use rustix::net::{recv, RecvFlags};
    let mut byte = [0u8; 1];
    matches!(
        recv(control, &mut byte, RecvFlags::PEEK | RecvFlags::DONTWAIT),
        Ok((0, _))
    )
}

/// Bind-mounts `bundle` over each system trust store present here, so
/// clients that read only the system store (wget, PHP, Go, git) trust the
/// veris CA too, over each `extra` file (a bundled copy such as
/// certifi's), and over each of `bundles` (the truststore over a
/// keystore). Returns the paths covered; a failure leaves that system
/// store as it was (the trust variables still cover most clients), while an
/// `extra` file or a bundle that cannot be covered is an error: the user
/// asked for the one, the session line names the other.
fn mount_trust(
    (bundle, truststore): &(PathBuf, PathBuf),
    extra: &[PathBuf],
    bundles: &[crate::tier::bundles::Bundle],
) -> Result<Vec<String>> {
    let mut done: Vec<PathBuf> = Vec::new();
    let mut covered = Vec::new();
    for found in bundles {
        let source = match found.format {
            crate::tier::bundles::Format::Pem => bundle,
            crate::tier::bundles::Format::Keystore => truststore,
        };
        bind_over_checked(source, found).with_context(|| {
            format!(
                "cannot put the veris bundle over {} (found at start). Next: run it again; if a package was being installed meanwhile, let it finish first",
                found.path.display()
            )
        })?;
        covered.push(found.path.display().to_string());
        done.push(found.path.clone());
    }
    for file in extra {
        let real = std::fs::canonicalize(file)
            .ok()
            .filter(|r| r.is_file())
            .ok_or_else(|| anyhow!("--trust-file {}: not a file here", file.display()))?;
        if done.contains(&real) {
            continue;
        }
        bind_read_only(bundle, &real)
            .with_context(|| format!("--trust-file {}: cannot cover it", file.display()))?;
        covered.push(file.display().to_string());
        done.push(real);
    }
    for store in TRUST_STORES {
        let Ok(real) = std::fs::canonicalize(store) else {
            continue;
        };
        if done.contains(&real) || !real.is_file() {
            continue;
        }
        match bind_read_only(bundle, &real) {
            Ok(()) => {
                covered.push((*store).to_string());
                done.push(real);
            }
            Err(e) => eprintln!("veris: cannot put the veris bundle over {store}: {e}"),
        }
    }
    Ok(covered)
}

/// Bind-mounts `source` over the file `found` names, read-only, when its
/// path still leads to the very file the scan checked (device and inode):
/// the target is opened without following a final symlink and mounted over
/// through that descriptor, so nothing swapped in on the way is covered.
fn bind_over_checked(source: &Path, found: &crate::tier::bundles::Bundle) -> Result<()> {
    use rustix::fs::{open, Mode, OFlags};
    let fd = open(
        &found.path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    let regular =
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
    if !regular || st.st_dev != found.dev || st.st_ino != found.ino {
        bail!("it changed since veris checked it");
    }
    let target = format!("/proc/self/fd/{}", fd.as_raw_fd());
    crate::os::ns::bind(source, &target, false)?;
    // The mount sits on the path now: the read-only remount names it there.
    crate::os::ns::remount_read_only(&found.path)?;
    Ok(())
}

/// A fresh tmpfs over /run: the host's daemon sockets (Docker, systemd,
/// D-Bus, nscd, ssh-agent under /run/user) are paths, which a network
/// namespace does not separate, and any of them could carry traffic out.
/// /tmp, /var/tmp and /dev/shm are private too ([`private_tmp`]); sockets
/// elsewhere (a home dir) stay reachable (README).
fn hide_daemon_sockets() {
    if !Path::new("/run").is_dir() {
        return;
    }
    let flags = MountFlags::NOSUID | MountFlags::NODEV;
    if let Err(e) = crate::os::ns::mount_fs("tmpfs", "/run", flags) {
        eprintln!("veris: cannot hide the host's /run from the command: {e}");
    }
}

/// The shared scratch dirs a host daemon may keep sockets in (tmux,
/// X11, ssh-agent, language servers), private to the command by default.
const TMP_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

/// Whether a private /tmp ([`private_tmp`]) hides `path` from the
/// command: it lies in one of [`TMP_DIRS`] and under none of `keep`.
pub fn hidden_by_private_tmp(path: &Path, keep: &[PathBuf]) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    let under_tmp = TMP_DIRS
        .iter()
        .filter_map(|d| canonical(Path::new(d)))
        .any(|d| path.starts_with(d));
    under_tmp
        && !keep
            .iter()
            .filter_map(|k| canonical(k))
            .any(|k| path.starts_with(k))
}

/// A fresh tmpfs over each of [`TMP_DIRS`], with each path of `keep` that
/// lies under one carried over (bind-mounted back at the same path): the
/// working directory and the trust files the command is pointed at. A
/// path that is a whole scratch dir leaves that dir shared.
fn private_tmp(keep: &[PathBuf]) -> Result<()> {
    use rustix::fs::{open, Mode, OFlags};
    let dirs: Vec<(String, PathBuf)> = TMP_DIRS
        .iter()
        .filter_map(|d| Some((d.to_string(), std::fs::canonicalize(d).ok()?)))
        .filter(|(_, real)| real.is_dir())
        .collect();
    // Opened before the tmpfs hides them.
    let mut carried = Vec::new();
    for path in keep {
        let Ok(real) = std::fs::canonicalize(path) else {
            continue;
        };
        if !dirs.iter().any(|(_, d)| real.starts_with(d)) {
            continue;
        }
        let fd = open(&real, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).with_context(|| {
            format!("opening {} to carry it into a private /tmp", real.display())
        })?;
        carried.push((real, fd));
    }
    for (name, real) in &dirs {
        if carried.iter().any(|(k, _)| k == real) {
            // The command works in the scratch dir itself: it stays shared.
            continue;
        }
        crate::os::ns::mount_fs("tmpfs", real, MountFlags::NOSUID | MountFlags::NODEV)
        .with_context(|| format!("cannot give the command a private {name}. Next: run with --share-tmp to let it use the host's"))?;
    }
    for (real, fd) in &carried {
        if dirs.iter().any(|(_, d)| d == real) {
            continue;
        }
        let dir = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|m| m.is_dir())
            .unwrap_or(false);
        if dir {
            std::fs::create_dir_all(real)
        } else {
            real.parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::File::create(real).map(drop))
        }
        .with_context(|| format!("carrying {} into the private /tmp", real.display()))?;
        crate::os::ns::bind(format!("/proc/self/fd/{}", fd.as_raw_fd()), real, true)
            .with_context(|| format!("carrying {} into the private /tmp", real.display()))?;
    }
    Ok(())
}

/// Bind-mounts `bundle` over `target`, read-only: a write through the
/// system store's path must not land in the state dir's bundle.
fn bind_read_only(bundle: &Path, target: &Path) -> std::io::Result<()> {
    crate::os::ns::bind(bundle, target, false)?;
    crate::os::ns::remount_read_only(target)
}

/// A plain-HTTP canary request through the redirect (TEST-NET, port 80),
/// blocking: the init step runs no async runtime.
fn probe_canary() -> std::result::Result<String, String> {
    let dst = CANARY_DST;
    let req = veris_admin_client::Request::get(
        veris_proxy::canary::CANARY_PATH,
        veris_proxy::canary::CANARY_HOST,
    );
    let limits = veris_admin_client::Limits {
        body: 1 << 16,
        time: Duration::from_secs(5),
    };
    match veris_admin_client::call_blocking(dst, &req, limits) {
        Ok(answer) if answer.status == 200 => {
            Ok(String::from_utf8_lossy(&answer.body).into_owned())
        }
        Ok(answer) => Err(format!("not a canary answer: HTTP {}", answer.status)),
        Err(e) => Err(e.what()),
    }
}

fn read_message(reader: &mut BufReader<UnixStream>) -> Result<Option<ToInit>> {
    let mut line = String::new();
    if reader.by_ref().take(1 << 24).read_line(&mut line)? == 0 {
        return Ok(None);
    }
    Ok(Some(serde_json::from_str(&line)?))
}

/// Sends `message` as one JSON line, with `fds` (close-on-exec on arrival).
pub(super) fn send<T: Serialize>(
    control: &mut UnixStream,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    if fds.is_empty() {
        return control.write_all(&line);
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many sockets for one message"));
    }
    let sent = sendmsg(
        &*control,
        &[IoSlice::new(&line)],
        &mut ancillary,
        SendFlags::empty(),
    )?;
    // The descriptors went with the first byte; the rest is plain bytes.
    control.write_all(&line[sent..])
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(s)) => 128u8.saturating_add(u8::try_from(s).unwrap_or(0)),
        _ => 1,
    }
}

// ---------------------------------------------------------------------------
// Pid 1 of the command's PID namespace.

/// `veris __isolate-init -- CMD`: see the module doc. Returns the exit code.
pub fn pid1_main(command: Vec<String>) -> u8 {
    // The init step outside is our parent: if it dies, so does everything here.
    let _ = crate::os::prctl::die_with_parent();
    // A /proc of this PID namespace, in a mount namespace of our own so the
    // init step keeps its view. Without it (a container masking /proc), the
    // command sees the host's process list, which it still cannot signal.
    let fresh_proc = crate::os::ns::unshare(UnshareFlags::NEWNS).and_then(|()| {
        crate::os::ns::mount_fs(
            "proc",
            "/proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        )
    });
    if let Err(e) = fresh_proc {
        eprintln!(
            "veris: no /proc of the run's own (the command sees the host's process list): {e}"
        );
    }
    let Some((program, args)) = command.split_first() else {
        return 1;
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    crate::os::prctl::drop_capabilities_at_exec(&mut cmd);
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "veris: cannot start {program:?}: {e}. Next: check the command name and PATH"
            );
            return 127;
        }
    };
    let main = rustix::process::Pid::from_child(&child);
    // Reap every orphan; the command's own status ends the namespace.
    loop {
        match rustix::process::waitpid(None, rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid == main => {
                return match (status.exit_status(), status.terminating_signal()) {
                    (Some(c), _) => u8::try_from(c).unwrap_or(1),
                    (None, Some(s)) => 128u8.saturating_add(u8::try_from(s).unwrap_or(0)),
                    _ => 1,
                };
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                eprintln!("veris: waiting for the command: {e}");
                return 1;
            }
        }
    }
}
/// An isolated run's sockets, as the transparent tier serves them.
pub fn listeners(s: Sockets) -> Result<super::TransparentListeners> {
    let tcp = |l: std::net::TcpListener| {
        l.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(l)
    };
    let udp = |u: std::net::UdpSocket| {
        u.set_nonblocking(true)?;
        tokio::net::UdpSocket::from_std(u)
    };
    Ok(super::TransparentListeners {
        https: tcp(s.https)?,
        http: tcp(s.http)?,
        quic: Some(udp(s.quic)?),
        dns: Some((udp(s.dns_udp)?, tcp(s.dns_tcp)?)),
    })
}

/// The isolated tier: the command in namespaces of its own, started by
/// [`start`] before the stack, whose sockets the proxy then serves.
pub struct Isolated {
    isolation: Isolation,
    /// Taken by [`Tier::bind`].
    sockets: Option<Sockets>,
    /// `--share-tmp`.
    share_tmp: bool,
    /// `--trust-file`.
    given: Vec<PathBuf>,
    /// The bundle files the scan found, to cover.
    found: Vec<crate::tier::bundles::Bundle>,
}

impl Isolated {
    /// The tier for an isolation [`start`]ed, covering `given`
    /// (`--trust-file`) and `found` (the scan's) besides the system stores.
    pub fn new(
        isolation: Isolation,
        mut sockets: Sockets,
        share_tmp: bool,
        given: Vec<PathBuf>,
        found: Vec<crate::tier::bundles::Bundle>,
    ) -> Isolated {
        sockets.share_tmp = share_tmp;
        // Before the session line, which records them.
        sockets.bundles = given
            .iter()
            .map(|f| f.display().to_string())
            .chain(found.iter().map(|b| b.path.display().to_string()))
            .collect();
        Isolated {
            isolation,
            sockets: Some(sockets),
            share_tmp,
            given,
            found,
        }
    }
}

impl Tier for Isolated {
    fn bind(&mut self) -> BoxFuture<'_, Result<Bound>> {
        Box::pin(async move {
            let sockets = self
                .sockets
                .take()
                .context("the isolated run's sockets were bound already")?;
            let coverage = sockets.coverage();
            let dialer = Arc::clone(&self.isolation.app_sockets);
            Ok(Bound {
                listeners: Some(listeners(sockets)?),
                coverage: Some(coverage),
                redirected: None,
                app_dialer: Some(veris_proxy::callback::Dialer::Namespace(dialer)),
            })
        })
    }

    /// Starts the command in its namespace once the proxy serves, records
    /// what the init step reports, forwards signals, then has the canary
    /// probed from inside.
    fn run<'a>(&'a mut self, w: Workload<'a>) -> BoxFuture<'a, Result<Ran>> {
        Box::pin(async move {
            // No proxy variables inside: NO_PROXY means nothing there.
            let vars = veris_ca::env::vars(&veris_ca::env::EnvSpec {
                trust_only: true,
                ..w.env
            });
            let tmp = TmpPolicy {
                share: self.share_tmp,
                keep: std::env::current_dir().into_iter().collect(),
            };
            let files = CoveredFiles {
                given: &self.given,
                found: std::mem::take(&mut self.found),
            };
            let (code, answer) = run(
                &mut self.isolation,
                w.trust,
                w.ledger,
                vars,
                files,
                tmp,
                w.started,
            )
            .await?;
            Ok(Ran {
                code,
                canary: Some((answer, "from inside the namespace, through the redirect")),
            })
        })
    }
}

/// The bundle files an isolated run covers besides the system stores.
struct CoveredFiles<'a> {
    /// `--trust-file`.
    given: &'a [PathBuf],
    /// The scan's.
    found: Vec<crate::tier::bundles::Bundle>,
}

/// Whether an isolated command shares the host's /tmp, /var/tmp and
/// /dev/shm, and what to carry into private ones.
struct TmpPolicy {
    share: bool,
    keep: Vec<PathBuf>,
}

/// Runs the command in its namespace: starts it once the proxy serves,
/// records what the init step reports, forwards signals, then has the
/// canary probed from inside. Returns the command's status and the
/// canary's answer there.
async fn run(
    isolation: &mut Isolation,
    trust: &veris_ca::trust::TrustFiles,
    ledger: &veris_receipt::ledger::Ledger,
    trust_vars: Vec<(String, String)>,
    trust_files: CoveredFiles<'_>,
    tmp: TmpPolicy,
    started: std::time::Instant,
) -> Result<(u8, Result<CanaryAnswer, ProbeError>)> {
    // The parent's environment, minus any proxy settings (inside, every
    // connection reaches the proxy anyway, and a stale proxy variable would
    // only send clients to a CONNECT the redirect then catches) and the
    // admin token, plus the trust variables.
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            let k = k.to_ascii_uppercase();
            !(k.ends_with("_PROXY") || k == "VERIS_ADMIN_TOKEN" || k == "NODE_USE_ENV_PROXY")
        })
        .collect();
    env.retain(|(k, _)| !trust_vars.iter().any(|(t, _)| t == k));
    env.extend(trust_vars);
    let mut keep = tmp.keep;
    keep.extend(trust.bundle.parent().map(Path::to_path_buf));
    keep.extend(trust_files.given.iter().cloned());
    let stores = isolation
        .go(
            env,
            trust,
            trust_files.given,
            trust_files.found,
            tmp.share,
            keep,
        )
        .await?;
    info!(
        trust_stores = %stores.join(","),
        setup_ms = started.elapsed().as_millis() as u64,
        "the command runs isolated"
    );
    let pgid = isolation.pgid;
    let mut dropped = 0u64;
    let mut signals = 0;
    let code = {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        loop {
            let forwarded = tokio::select! {
                event = isolation.next() => match event {
                    Ok(Event::Exited(code)) => break code,
                    Ok(Event::UdpDropped(total)) => {
                        let new = total.saturating_sub(dropped);
                        dropped = total;
                        if new > 0 {
                            if let Err(e) = ledger.append(Entry::UdpDropped { packets: new }) {
                                warn!(error = %e, "cannot record dropped datagrams");
                            }
                        }
                        continue;
                    }
                    // The receipt still comes: the canary below cannot be
                    // probed without the init step, so it says unverified.
                    Err(e) => {
                        warn!(error = %e, "lost the isolated command");
                        break 1;
                    }
                },
                _ = term.recv() => Signal::TERM,
                _ = int.recv() => Signal::INT,
            };
            signals += 1;
            // The init step passes the first on to the command's group; a
            // second ends the init step, and with it the whole namespace.
            super::forward(
                pgid,
                if signals == 1 {
                    forwarded
                } else {
                    Signal::KILL
                },
            );
        }
    };
    let answer = isolation
        .canary()
        .await
        .map_err(ProbeError::Unreachable)
        .and_then(|body| {
            serde_json::from_str::<CanaryAnswer>(&body)
                .map_err(|e| ProbeError::NotVeris(e.to_string()))
        });
    isolation.done().await;
    Ok((code, answer))
}
