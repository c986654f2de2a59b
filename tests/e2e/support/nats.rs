//! A real `nats-server -js` for the fleet tests (G2): on a free loopback
//! port with a temporary store, stopped on drop; with
//! deploy/nats/nats-server.conf (its users) or without authentication; a
//! subject's messages read back with `veris_fleet::read`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{skip, wait_for, Guard, TempDir, DEADLINE};

/// A `nats-server -js` on loopback, stopped on drop.
pub struct Nats {
    pub dir: TempDir,
    pub port: u16,
    process: Option<Guard>,
    /// Started with deploy/nats/nats-server.conf: its environment, and the
    /// URL with the reader's credentials.
    auth: Option<(Vec<(String, String)>, String)>,
}

/// Passwords of deploy/nats/nats-server.conf's users in the tests.
pub const READER_PASSWORD: &str = "reader-test-password";
pub const SANDBOX_PASSWORD: &str = "sandbox-test-password";

impl Nats {
    /// `None` (after `SKIP`) when nats-server is not installed.
    pub fn start() -> Option<Nats> {
        if !super::tool_works("nats-server", &["--version"]) {
            skip("nats-server is not installed (apt-get install nats-server)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut nats = Nats {
            dir: TempDir::new("nats"),
            port,
            process: None,
            auth: None,
        };
        nats.run();
        Some(nats)
    }

    /// With deploy/nats/nats-server.conf: the gateway `gw1` authenticates
    /// with the nkey `gateway_nkey` (public), `reader` and `sandbox` with
    /// the passwords above.
    pub fn start_with_auth(gateway_nkey: &str) -> Option<Nats> {
        if !super::tool_works("nats-server", &["--version"]) {
            skip("nats-server is not installed (apt-get install nats-server)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = TempDir::new("nats-auth");
        let env = vec![
            (
                "VERIS_NATS_STORE".to_string(),
                dir.join("store").display().to_string(),
            ),
            ("VERIS_GATEWAY_NKEY".to_string(), gateway_nkey.to_string()),
            (
                "VERIS_READER_PASSWORD".to_string(),
                READER_PASSWORD.to_string(),
            ),
            (
                "VERIS_SANDBOX_PASSWORD".to_string(),
                SANDBOX_PASSWORD.to_string(),
            ),
        ];
        let reader = format!("nats://reader:{READER_PASSWORD}@127.0.0.1:{port}");
        let mut nats = Nats {
            dir,
            port,
            process: None,
            auth: Some((env, reader)),
        };
        nats.run();
        Some(nats)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server on its port and store, and waits until it accepts.
    pub fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("nats.log"))
            .expect("nats log");
        let mut cmd = Command::new("nats-server");
        match &self.auth {
            // The config names the store (from VERIS_NATS_STORE).
            Some((env, _)) => {
                let conf =
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nats/nats-server.conf");
                cmd.arg("-c").arg(conf).envs(env.iter().cloned());
            }
            None => {
                cmd.arg("-sd").arg(self.dir.join("store"));
            }
        }
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.process = Some(Guard::spawn(&mut cmd));
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let log = self.dir.join("nats.log");
        wait_for("nats-server to accept", DEADLINE, || {
            let up = TcpStream::connect(addr).is_ok()
                && std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .matches("Server is ready")
                    .count()
                    >= self.starts();
            up.then_some(())
        });
    }

    pub fn starts(&self) -> usize {
        1 + std::fs::read_to_string(self.dir.join("nats.log"))
            .unwrap_or_default()
            .matches("Server Exiting")
            .count()
    }

    /// Stops the server (SIGKILL: as an outage looks to a client).
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.signal("KILL");
            p.wait();
            // A killed server logs no exit line: count it by hand.
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(self.dir.join("nats.log"))
                .expect("nats log");
            std::io::Write::write_all(&mut f, b"(test) Server Exiting\n").expect("log");
        }
    }

    /// Every message on `subject`, oldest first.
    pub fn messages(&self, subject: &str) -> Vec<veris_fleet::read::Stored> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let url = match &self.auth {
            Some((_, reader)) => reader.clone(),
            None => self.url(),
        };
        rt.block_on(veris_fleet::read::messages(
            &url,
            veris_fleet::DEFAULT_STREAM,
            subject,
        ))
        .expect("reading the stream")
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A NATS client as whoever `url` names (`nats://USER:PASS@…`), or with
/// no credentials, running `f` on a JetStream context.
pub fn with_js<T>(
    url: &str,
    f: impl AsyncFnOnce(async_nats::jetstream::Context) -> T,
) -> Result<T, String> {
    with_js_as(url, None, f)
}

/// [`with_js`], as the user of the nkey `seed` when given (a gateway of
/// deploy/nats/nats-server.conf).
pub fn with_js_as<T>(
    url: &str,
    seed: Option<&str>,
    f: impl AsyncFnOnce(async_nats::jetstream::Context) -> T,
) -> Result<T, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let addr: async_nats::ServerAddr = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let mut options =
            async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5));
        if let (Some(user), Some(pass)) = (addr.username(), addr.password()) {
            options = options.user_and_password(user.into(), pass.into());
        }
        if let Some(seed) = seed {
            options = options.nkey(seed.to_string());
        }
        let client = options
            .connect(url)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        let js = async_nats::jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(2))
            .build(client);
        Ok(f(js).await)
    })
}
