//! Helpers for the TUI end-to-end test: a private tmux server (its own
//! socket in the test's temp dir, killed on drop) whose pane runs the veris
//! binary, read back with `capture-pane`. Everything generic (commands with
//! a cleared environment, temp dirs, SKIP) is in `support` itself.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use super::command;

/// Bound on every wait for the screen, and for `veris run` and the TUI's
/// exit, in these tests (longer than `support::DEADLINE`).
pub const TUI_DEADLINE: Duration = Duration::from_secs(60);

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
        super::output(
            command("tmux")
                .env("TERM", "xterm-256color")
                .arg("-S")
                .arg(&self.socket)
                .args(args),
        )
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
