//! The reader side: what the stream holds for a subject, message by
//! message, in stream order. Tests use it to compare the stream with the
//! ledger file; the stream receipt (a later part of G2) will start here.

use std::time::Duration;

use async_nats::jetstream::stream::LastRawMessageErrorKind;

use crate::{HEADER_FIRST, HEADER_LAST, HEADER_LEDGER};

/// One stored message.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The stream's sequence.
    pub sequence: u64,
    pub ledger_id: String,
    pub first: u64,
    pub last: u64,
    pub msg_id: String,
    /// The lines, each with its `\n`.
    pub payload: Vec<u8>,
}

/// Every message on `subject` in stream `stream` at `url`, oldest first.
pub async fn messages(url: &str, stream: &str, subject: &str) -> Result<Vec<Stored>, String> {
    let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5));
    let client = crate::with_url_user(options, url)
        .connect(url)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| format!("stream {stream}: {e}"))?;
    let mut out = Vec::new();
    let mut seq = 1;
    loop {
        let got = stream
            .raw_message_builder()
            .next_by_subject(subject.to_string())
            .sequence(seq)
            .send()
            .await;
        let m = match got {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(out),
            Err(e) => return Err(format!("reading {subject} from {seq}: {e}")),
        };
        let header = |n: &str| {
            m.headers
                .get(n)
                .map(|v| v.as_str().to_string())
                .unwrap_or_default()
        };
        out.push(Stored {
            sequence: m.sequence,
            ledger_id: header(HEADER_LEDGER),
            first: header(HEADER_FIRST).parse().unwrap_or(0),
            last: header(HEADER_LAST).parse().unwrap_or(0),
            msg_id: header("Nats-Msg-Id"),
            payload: m.payload.to_vec(),
        });
        seq = m.sequence + 1;
    }
}
