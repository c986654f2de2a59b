//! Reading one sandbox's chains back from the stream, for the stream
//! receipt (`veris receipt --nats`): every message on
//! `veris.ledger.<sandbox>.*`, fetched by one ordered pull consumer (the
//! server sends them in batches, not one request per message), grouped by
//! the gateway its subject names, and each gateway's latest checkpoint.
//!
//! Nothing here is trusted: subjects, headers and payloads are what the
//! stream holds, which anyone with write access to it could have put there.
//! The receipt verifies the lines themselves (chain, seals, pinned keys).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::{checkpoint_subject, ledger_subject, HEADER_FIRST, HEADER_LAST, HEADER_LEDGER};

/// Longest a read of the stream may take before it gives up.
const READ_DEADLINE: Duration = Duration::from_secs(120);

/// One message of a gateway's ledger subject.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The stream's sequence.
    pub stream_seq: u64,
    /// `Veris-Ledger` (a hint: which chain the publisher said it is).
    pub ledger_id: String,
    pub first: u64,
    pub last: u64,
    /// Ledger lines, each with its `\n`.
    pub payload: Bytes,
}

/// The newest message on a gateway's checkpoint subject: one seal line.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub stream_seq: u64,
    /// The seal line's seq, from `Veris-Last-Seq` (a hint; the line says).
    pub seq: u64,
    /// The seal line without its `\n`.
    pub line: Bytes,
}

/// What the stream holds of one gateway's ledger of the sandbox.
#[derive(Debug, Clone, Default)]
pub struct GatewayChain {
    pub gateway: String,
    /// In stream order.
    pub chunks: Vec<Chunk>,
    pub checkpoint: Option<Checkpoint>,
}

/// A sandbox as the stream holds it.
#[derive(Debug, Clone, Default)]
pub struct SandboxRead {
    /// The stream's last sequence when the read began: a checkpoint stored
    /// after it was written after the reader started.
    pub start_seq: u64,
    /// The stream's last sequence once the checkpoints were read: the
    /// lines are read up to it.
    pub end_seq: u64,
    /// Per gateway name (the last token of the subject).
    pub gateways: BTreeMap<String, GatewayChain>,
    pub messages: u64,
    pub bytes: u64,
}

/// A connection to a stream.
pub struct Reader {
    stream: stream::Stream,
    name: String,
    js: jetstream::Context,
}

impl Reader {
    /// Connects to `url` with `creds` (as `--nats-creds`: a `.creds` file
    /// or a user nkey seed; a user and password go in the URL).
    pub async fn connect(url: &str, creds: Option<&Path>, stream: &str) -> Result<Reader, String> {
        crate::check_token("the stream name", stream).map_err(|e| e.to_string())?;
        let mut options = async_nats::ConnectOptions::new()
            .name("veris receipt")
            .connection_timeout(Duration::from_secs(5));
        if let Some(path) = creds {
            let text = std::fs::read_to_string(path).map_err(|e| {
                format!("reading the NATS credentials file {}: {e}", path.display())
            })?;
            options = match crate::nkey_seed(&text) {
                Some(seed) => options.nkey(seed),
                None => options
                    .credentials_file(path)
                    .await
                    .map_err(|e| format!("the NATS credentials file {}: {e}", path.display()))?,
            };
        }
        let client = crate::with_url_user(options, url)
            .connect(url)
            .await
            .map_err(|e| format!("connecting to NATS at {url}: {e}"))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(10))
            .build(client);
        let s = js
            .get_stream(stream)
            .await
            .map_err(|e| format!("stream {stream}: {e}"))?;
        Ok(Reader {
            stream: s,
            name: stream.to_string(),
            js,
        })
    }

    pub(crate) fn stream(&self) -> &stream::Stream {
        &self.stream
    }

    pub fn stream_name(&self) -> &str {
        &self.name
    }

    /// The values of `keys` in the key-value bucket `bucket` and their
    /// revisions, read on this connection without creating it: `Err` when
    /// the bucket cannot be opened, else per key its value and revision
    /// (`None`: nothing stored) or why it could not be read.
    #[allow(clippy::type_complexity)]
    pub async fn bucket_entries(
        &self,
        bucket: &str,
        keys: &[String],
    ) -> Result<Vec<Result<Option<(Bytes, u64)>, String>>, String> {
        let store = self.bucket(bucket).await?;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(
                store
                    .entry(key)
                    .await
                    .map(|e| {
                        e.filter(|e| e.operation == async_nats::jetstream::kv::Operation::Put)
                            .map(|e| (e.value, e.revision))
                    })
                    .map_err(|e| format!("reading {key} from bucket {bucket}: {e}")),
            );
        }
        Ok(out)
    }

    /// The keys of `bucket` that start with `prefix`, oldest write first,
    /// at most the newest `max`.
    pub async fn bucket_keys(
        &self,
        bucket: &str,
        prefix: &str,
        max: usize,
    ) -> Result<Vec<String>, String> {
        use futures_util::TryStreamExt;
        let store = self.bucket(bucket).await?;
        let mut keys = store
            .keys()
            .await
            .map_err(|e| format!("listing bucket {bucket}: {e}"))?;
        let mut out = std::collections::VecDeque::new();
        while let Some(k) = keys
            .try_next()
            .await
            .map_err(|e| format!("listing bucket {bucket}: {e}"))?
        {
            if k.starts_with(prefix) {
                if out.len() == max {
                    out.pop_front();
                }
                out.push_back(k);
            }
        }
        Ok(out.into())
    }

    async fn bucket(&self, bucket: &str) -> Result<async_nats::jetstream::kv::Store, String> {
        crate::check_token("the bucket name", bucket).map_err(|e| e.to_string())?;
        self.js
            .get_key_value(bucket)
            .await
            .map_err(|e| format!("bucket {bucket}: {e}"))
    }

    /// The stream's last sequence now.
    pub async fn last_seq(&mut self) -> Result<u64, String> {
        let info = self
            .stream
            .info()
            .await
            .map_err(|e| format!("stream {}: {e}", self.name))?;
        Ok(info.state.last_sequence)
    }

    /// The gateways with a subject of `sandbox` under `prefix`
    /// (`veris.ledger` or `veris.checkpoint`).
    async fn gateways(&self, prefix: &str, sandbox: &str) -> Result<Vec<String>, String> {
        let filter = format!("{prefix}.{sandbox}.*");
        let mut subjects = self
            .stream
            .info_with_subjects(&filter)
            .await
            .map_err(|e| format!("listing {filter}: {e}"))?;
        let mut out = Vec::new();
        while let Some(s) = subjects.next().await {
            let (subject, _count) = s.map_err(|e| format!("listing {filter}: {e}"))?;
            if let Some(gw) = subject.rsplit('.').next() {
                out.push(gw.to_string());
            }
        }
        Ok(out)
    }

    /// The newest checkpoint of `sandbox` by `gateway`.
    async fn checkpoint(&self, sandbox: &str, gateway: &str) -> Result<Option<Checkpoint>, String> {
        let subject = checkpoint_subject(sandbox, gateway);
        match self.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => {
                let seq = m
                    .headers
                    .get(HEADER_LAST)
                    .and_then(|v| v.as_str().parse().ok())
                    .unwrap_or(0);
                let mut line = m.payload;
                if line.ends_with(b"\n") {
                    line.truncate(line.len() - 1);
                }
                Ok(Some(Checkpoint {
                    stream_seq: m.sequence,
                    seq,
                    line,
                }))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(format!("reading {subject}: {e}")),
        }
    }

    /// Everything the stream holds of `sandbox`, its lines in memory.
    pub async fn sandbox(&mut self, sandbox: &str, wait: Duration) -> Result<SandboxRead, String> {
        let mut out = self.prepare(sandbox, wait).await?;
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let (read, ()) = tokio::join!(self.read_lines(sandbox, out.end_seq, tx), async {
            while let Some((gw, chunk)) = rx.recv().await {
                out.gateways
                    .entry(gw)
                    .or_insert_with_key(|gw| GatewayChain {
                        gateway: gw.clone(),
                        ..GatewayChain::default()
                    })
                    .chunks
                    .push(chunk);
            }
        });
        let (messages, bytes) = read?;
        out.messages = messages;
        out.bytes = bytes;
        Ok(out)
    }

    /// The first part of a read of `sandbox`: the stream's position, the
    /// gateways and their checkpoints; [`Reader::read_lines`] then reads
    /// the lines up to `end_seq`. With `wait`, first waits up to that long
    /// for every gateway to store a checkpoint after the read began (a
    /// live gateway seals its new lines every second).
    pub async fn prepare(&mut self, sandbox: &str, wait: Duration) -> Result<SandboxRead, String> {
        crate::check_token("the sandbox id", sandbox).map_err(|e| e.to_string())?;
        let start_seq = self.last_seq().await?;
        let mut out = SandboxRead {
            start_seq,
            ..SandboxRead::default()
        };
        // Checkpoints first, then the lines up to the stream's end after
        // them: a gateway publishes a seal line's checkpoint only once the
        // line is stored, so the lines it covers are read too.
        let mut names = self.gateways("veris.checkpoint", sandbox).await?;
        let deadline = Instant::now() + wait;
        let mut checkpoints = BTreeMap::new();
        loop {
            for gw in &names {
                checkpoints.insert(gw.clone(), self.checkpoint(sandbox, gw).await?);
            }
            let fresh = checkpoints
                .values()
                .all(|c| c.as_ref().is_some_and(|c| c.stream_seq > start_seq));
            if fresh || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            names = self.gateways("veris.checkpoint", sandbox).await?;
        }
        let end = self.last_seq().await?;
        for gw in self.gateways("veris.ledger", sandbox).await? {
            out.gateways.insert(
                gw.clone(),
                GatewayChain {
                    gateway: gw,
                    ..GatewayChain::default()
                },
            );
        }
        for (gw, c) in checkpoints {
            out.gateways
                .entry(gw.clone())
                .or_insert_with(|| GatewayChain {
                    gateway: gw,
                    ..GatewayChain::default()
                })
                .checkpoint = c;
        }
        out.end_seq = if out.gateways.is_empty() { 0 } else { end };
        Ok(out)
    }

    /// The messages of `veris.ledger.<sandbox>.*` up to stream sequence
    /// `end`, by an ordered consumer, each sent to `tx` with the gateway
    /// its subject names, in stream order. Returns the messages and bytes read.
    pub async fn read_lines(
        &self,
        sandbox: &str,
        end: u64,
        tx: tokio::sync::mpsc::Sender<(String, Chunk)>,
    ) -> Result<(u64, u64), String> {
        let (mut count, mut bytes) = (0, 0);
        if end == 0 {
            return Ok((0, 0));
        }
        let filter = ledger_subject(sandbox, "*");
        let consumer = self
            .stream
            .create_consumer(OrderedConfig {
                filter_subject: filter.clone(),
                deliver_policy: DeliverPolicy::All,
                // Messages per pull: up to 256 KiB each, so at most 8 MiB
                // in flight, which keeps the reader's memory flat.
                max_batch: 32,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("reading {filter}: {e}"))?;
        if consumer.cached_info().num_pending == 0 {
            return Ok((0, 0));
        }
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| format!("reading {filter}: {e}"))?;
        let prefix = format!("veris.ledger.{sandbox}.");
        let deadline = tokio::time::Instant::now() + READ_DEADLINE;
        loop {
            let next = tokio::time::timeout_at(deadline, messages.next())
                .await
                .map_err(|_| format!("reading {filter}: no end after {READ_DEADLINE:?}"))?;
            let Some(m) = next else {
                return Err(format!("reading {filter}: the consumer ended early"));
            };
            let m = m.map_err(|e| format!("reading {filter}: {e}"))?;
            let (stream_seq, pending) = {
                let info = m.info().map_err(|e| format!("reading {filter}: {e}"))?;
                (info.stream_sequence, info.pending)
            };
            if stream_seq > end {
                return Ok((count, bytes));
            }
            let header = |n: &str| {
                m.headers
                    .as_ref()
                    .and_then(|h| h.get(n))
                    .map(|v| v.as_str().to_string())
                    .unwrap_or_default()
            };
            let gateway = m
                .subject
                .as_str()
                .strip_prefix(&prefix)
                .unwrap_or_default()
                .to_string();
            let chunk = Chunk {
                stream_seq,
                ledger_id: header(HEADER_LEDGER),
                first: header(HEADER_FIRST).parse().unwrap_or(0),
                last: header(HEADER_LAST).parse().unwrap_or(0),
                payload: m.message.payload.clone(),
            };
            count += 1;
            bytes += chunk.payload.len() as u64;
            if tx.send((gateway, chunk)).await.is_err() {
                return Err(format!("reading {filter}: the reader stopped"));
            }
            if pending == 0 || stream_seq >= end {
                return Ok((count, bytes));
            }
        }
    }
}
