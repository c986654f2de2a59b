//! The integrity tests' own helper: a fake twin on loopback whose request
//! log can be made to lie (to exercise the receipt's twin cross-check).
//! Everything generic (serve, admin calls, raw HTTP, commands) is in
//! `support` itself.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::DEADLINE;

/// A fake twin on loopback: answers every vendor request `200 {}` and serves
/// `/veris/requests` from what it saw, minus the first `hide` vendor rows
/// (a twin whose log does not account for a request).
pub struct FakeTwin {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl FakeTwin {
    pub fn start(hide: usize) -> FakeTwin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            let rows: Rows = Arc::new(std::sync::Mutex::new(Vec::new()));
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let rows = rows.clone();
                        std::thread::spawn(move || serve_one(s, &rows, hide));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeTwin { addr, stop }
    }
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FakeTwin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

type Rows = Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// Answers the requests on one connection (keep-alive) until it closes.
fn serve_one(mut s: TcpStream, rows: &Rows, hide: usize) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(DEADLINE));
    let mut buf = Vec::new();
    for _ in 0..1000 {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.len() > 65536 {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut parts = head.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        if method == "PRI" {
            return; // the proxy's h2c probe: not offered
        }
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + len);
        let path = target.split('?').next().unwrap_or("").to_string();
        // /s/{sandbox}/{service}/rest
        let segs: Vec<&str> = path.splitn(5, '/').collect();
        let rest = if segs.len() == 5 {
            format!("/{}", segs[4])
        } else {
            "/".into()
        };
        let mut rows = rows.lock().unwrap();
        let body = if rest == "/veris/requests" {
            let list: Vec<serde_json::Value> = rows
                .iter()
                .enumerate()
                .skip(hide)
                .map(|(i, (m, p))| {
                    serde_json::json!({"id": i + 1, "ts": "2026-11-29T00:00:00.000Z", "method": m, "path": p, "status": 200, "tier": "handler", "duration_ms": 0})
                })
                .collect();
            serde_json::json!({ "requests": list }).to_string()
        } else if rest.starts_with("/veris/") {
            r#"{"status":"ok"}"#.to_string()
        } else {
            rows.push((method.clone(), rest));
            "{}".to_string()
        };
        drop(rows);
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}
