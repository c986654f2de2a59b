//! Helpers for the TUI end-to-end test: a private tmux server (its own
//! socket in the test's temp dir, killed on drop) whose pane runs the veris
//! binary, read back with `capture-pane`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Bound on every wait in these tests.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_veris"))
}

/// Prints `SKIP: why`, or fails under `VERIS_REQUIRE_ALL=1`.
pub fn skip(why: &str) {
    if std::env::var("VERIS_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("required test cannot run: {why}");
    }
    println!("SKIP: {why}");
}

/// A command with a clean environment: PATH and HOME only, so the
/// machine's CA and proxy variables never reach what the test runs.
pub fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()),
        )
        .stdin(Stdio::null());
    cmd
}

pub fn tool_works(program: &str, args: &[&str]) -> bool {
    clean(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A temp dir removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "veris-e2e-{label}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the test dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tmux server of our own, with one session; killed on drop.
pub struct Tmux {
    socket: PathBuf,
    pub session: String,
}

impl Tmux {
    /// Starts a detached session of `width`x`height` whose pane stays
    /// visible after its program exits (to read its exit status).
    pub fn start(dir: &Path, width: u16, height: u16) -> Tmux {
        let t = Tmux {
            socket: dir.join("tmux.sock"),
            session: "veris".into(),
        };
        let out = t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            &t.session,
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
        ]);
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = t.run(&["set-option", "-g", "remain-on-exit", "on"]);
        assert!(
            out.status.success(),
            "tmux set-option: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    pub fn run(&self, args: &[&str]) -> Output {
        clean("tmux")
            .env("TERM", "xterm-256color")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running tmux")
    }

    /// Replaces the pane's program with `command` (a shell command line).
    pub fn respawn(&self, command: &str) {
        let out = self.run(&["respawn-pane", "-k", "-t", &self.session, command]);
        assert!(
            out.status.success(),
            "tmux respawn-pane: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The pane's visible text.
    pub fn capture(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", &self.session]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", self.session.as_str()];
        args.extend_from_slice(keys);
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "tmux send-keys: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Polls the pane until `pred` holds; panics with the last screen after `timeout`.
    pub fn wait_screen(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let start = Instant::now();
        let mut last = String::new();
        // Bounded: at most timeout / 50 ms polls.
        while start.elapsed() < timeout {
            last = self.capture();
            if pred(&last) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}; the pane shows:\n{last}");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Single-quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
