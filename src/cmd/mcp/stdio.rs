//! The stdio front of `veris mcp`: what stands between the client's lines
//! and rmcp's session, so that every line the client sends gets the answer
//! JSON-RPC 2.0 and MCP give it, and none ends the session.
//!
//! - A line that is not JSON (or is longer than [`MAX_LINE`]) is answered
//!   with a parse error whose `id` is `null` (JSON-RPC §5: the id could not
//!   be read), and a warning on stderr.
//! - JSON that is not an object (a batch, which MCP dropped in 2025-06-18,
//!   or a bare value) is an invalid request, `id: null`.
//! - Before `initialize`, a request gets error -32002 ("not initialized",
//!   as LSP numbers it) and a `ping` gets its empty result (MCP allows
//!   pings then); notifications are dropped with a warning. rmcp ends a
//!   session whose first message is not `initialize`, so it only ever sees
//!   one that starts right.
//!
//! Everything else is passed to rmcp unchanged. Answers written here and
//! rmcp's own go to stdout through one writer, a whole line at a time, so
//! they never interleave.

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bound on one message line, as rmcp's own.
pub const MAX_LINE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// JSON-RPC error codes the front answers with.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
/// Not in JSON-RPC or MCP: the server-defined range, LSP's number for it.
const NOT_INITIALIZED: i64 = -32002;

/// The session's transport: what rmcp reads (the client's lines that are
/// its to answer) and where it writes (into the one writer of `output`).
pub fn front(
    input: impl AsyncRead + Send + Unpin + 'static,
    output: impl AsyncWrite + Send + Unpin + 'static,
) -> (impl AsyncRead, impl AsyncWrite) {
    let (session_in, mut to_session) = tokio::io::duplex(64 * 1024);
    let (from_session, session_out) = tokio::io::duplex(64 * 1024);
    let (answers, answered) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(write_lines(from_session, answered, output));
    tokio::spawn(async move {
        let mut input = tokio::io::BufReader::new(input);
        let mut initialized = false;
        let mut line = Vec::new();
        loop {
            line.clear();
            let limit = (MAX_LINE + 1) as u64;
            let n = match (&mut input).take(limit).read_until(b'\n', &mut line).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(error = %e, "veris mcp: reading stdin");
                    break;
                }
            };
            let verdict = if n > MAX_LINE && !line.ends_with(b"\n") {
                if skip_line(&mut input).await.is_err() {
                    break;
                }
                Line::Answer(error_reply(
                    Value::Null,
                    PARSE_ERROR,
                    &format!("Parse error: a line longer than {MAX_LINE} bytes"),
                ))
            } else {
                judge(line.trim_ascii(), &mut initialized)
            };
            match verdict {
                Line::Skip => {}
                Line::Pass => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    if to_session.write_all(&line).await.is_err() {
                        break;
                    }
                }
                Line::Answer(reply) => {
                    if answers.send(reply).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `to_session` is the end of input for the session.
    });
    (session_in, session_out)
}

/// What the front does with one line.
#[derive(Debug, PartialEq)]
enum Line {
    /// Nothing to pass on or answer (blank, or a notification before
    /// `initialize`).
    Skip,
    /// rmcp's to answer.
    Pass,
    /// Answered here, with this line.
    Answer(Vec<u8>),
}

fn judge(body: &[u8], initialized: &mut bool) -> Line {
    if body.is_empty() {
        return Line::Skip;
    }
    let message: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(bytes = body.len(), error = %e, "veris mcp: a line on stdin is not JSON; answered with a parse error, the session goes on");
            return Line::Answer(error_reply(
                Value::Null,
                PARSE_ERROR,
                &format!("Parse error: {e}"),
            ));
        }
    };
    let Some(object) = message.as_object() else {
        return Line::Answer(error_reply(
            Value::Null,
            INVALID_REQUEST,
            "Invalid Request: a message is one JSON object (MCP has no batches)",
        ));
    };
    if *initialized {
        return Line::Pass;
    }
    let method = object.get("method").and_then(Value::as_str);
    let id = object.get("id").cloned();
    match (method, id) {
        (Some("initialize"), Some(_)) => {
            *initialized = true;
            Line::Pass
        }
        (Some("ping"), Some(id)) => Line::Answer(line_of(&json!({
            "jsonrpc": "2.0",
            "id": id,
            "result": {},
        }))),
        (Some(method), Some(id)) => Line::Answer(error_reply(
            id,
            NOT_INITIALIZED,
            &format!("Server not initialized: `{method}` came before `initialize`. Next: send `initialize` first, then `notifications/initialized`"),
        )),
        (Some(method), None) => {
            tracing::warn!(%method, "veris mcp: a notification before `initialize`; dropped");
            Line::Skip
        }
        // A response (or something with no method) before any request of ours.
        (None, id) => Line::Answer(error_reply(
            id.unwrap_or(Value::Null),
            INVALID_REQUEST,
            "Invalid Request: no `method`, and nothing was asked of the client yet",
        )),
    }
}

fn error_reply(id: Value, code: i64, message: &str) -> Vec<u8> {
    line_of(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    }))
}

fn line_of(v: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The one writer of stdout: rmcp's lines and the front's answers, each
/// written whole. Ends when both have ended.
async fn write_lines(
    session: impl AsyncRead + Unpin,
    mut answers: mpsc::Receiver<Vec<u8>>,
    mut out: impl AsyncWrite + Unpin,
) {
    let mut session = tokio::io::BufReader::new(session);
    let mut line = Vec::new();
    let (mut session_open, mut answers_open) = (true, true);
    while session_open || answers_open {
        tokio::select! {
            read = session.read_until(b'\n', &mut line), if session_open => {
                match read {
                    Ok(0) | Err(_) => session_open = false,
                    Ok(_) => {}
                }
                if !line.is_empty() {
                    if out.write_all(&line).await.is_err() || out.flush().await.is_err() {
                        return;
                    }
                    line.clear();
                }
            }
            reply = answers.recv(), if answers_open => match reply {
                Some(reply) => {
                    if out.write_all(&reply).await.is_err() || out.flush().await.is_err() {
                        return;
                    }
                }
                None => answers_open = false,
            },
        }
    }
}

/// Reads up to and including the next newline, keeping nothing.
async fn skip_line(input: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> std::io::Result<()> {
    loop {
        let buf = input.fill_buf().await?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines the front passes to the session and the answers it writes,
    /// for `input` (the session's own output is empty: nothing answers).
    async fn through(input: Vec<u8>) -> (String, Vec<Value>) {
        let (out_w, mut out_r) = tokio::io::duplex(1 << 20);
        let (mut to_rmcp, from_rmcp) = front(std::io::Cursor::new(input), out_w);
        drop(from_rmcp);
        let mut passed = String::new();
        to_rmcp.read_to_string(&mut passed).await.unwrap();
        let mut written = String::new();
        out_r.read_to_string(&mut written).await.unwrap();
        let answers = written
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (passed, answers)
    }

    const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;

    #[tokio::test]
    async fn garbage_gets_a_parse_error_with_a_null_id_and_the_rest_passes_unchanged() {
        let input = format!("not json\n{INIT}\r\n\n  \n{{\"b\":\n[1, 2]\n{{\"c\":2}}");
        let (passed, answers) = through(input.into_bytes()).await;
        assert_eq!(passed, format!("{INIT}\r\n{{\"c\":2}}\n"));
        let codes: Vec<_> = answers.iter().map(|a| a["error"]["code"].clone()).collect();
        assert_eq!(codes, [json!(-32700), json!(-32700), json!(-32600)]);
        assert!(answers.iter().all(|a| a["id"].is_null()), "{answers:?}");
        assert!(answers.iter().all(|a| a["jsonrpc"] == "2.0"));
    }

    #[tokio::test]
    async fn an_overlong_line_is_answered_and_dropped_whole() {
        let mut input = vec![b'"'; MAX_LINE + 10];
        input.extend_from_slice(format!("\n{INIT}\n").as_bytes());
        let (passed, answers) = through(input).await;
        assert_eq!(passed, format!("{INIT}\n"));
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0]["error"]["code"], -32700);
        assert!(answers[0]["id"].is_null());
    }

    #[tokio::test]
    async fn before_initialize_a_request_is_refused_a_ping_answered_a_notification_dropped() {
        let input = [
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            INIT,
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/list"}"#,
        ]
        .join("\n");
        let (passed, answers) = through(input.into_bytes()).await;
        assert_eq!(
            passed,
            format!("{INIT}\n{{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/list\"}}\n")
        );
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert_eq!(answers[0]["id"], "a");
        assert_eq!(answers[0]["error"]["code"], -32002);
        assert!(answers[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("initialize"));
        assert_eq!(answers[1], json!({"jsonrpc": "2.0", "id": 7, "result": {}}));
    }
}
