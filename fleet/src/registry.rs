//! The fleet's sandbox registry (DESIGN §14, "shared sandboxes"): a
//! JetStream key-value bucket (`VERIS_SANDBOXES` by default, created when
//! missing) that every gateway of a fleet reads and writes. Key: the
//! sandbox id; value: its registration record as JSON, exactly what a
//! gateway keeps in `sandbox.json` (digests, never a password). A removal
//! is a put of the record with `revoked_ms` set (a delete marker, as an
//! operator's `nats kv del` leaves, reads as a removal too).
//!
//! This module moves bytes only: what a value means, and whether it may be
//! served, is the gateway's to judge (a bucket is storage an operator
//! controls, never trusted as it is).
//!
//! [`Registry::follow`] is a task that tells a gateway, in order: every
//! key's current value at each (re)connection ([`Event::Put`],
//! [`Event::Deleted`]), then [`Event::Synced`], then every change as it
//! happens; [`Event::Down`] when the server is gone (the task reconnects
//! and starts over with the current state).

use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::stream;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{check_token, Fleet, FleetError};

/// The bucket's default name.
pub const DEFAULT_BUCKET: &str = "VERIS_SANDBOXES";

/// What the bucket tells a gateway.
#[derive(Debug)]
pub enum Event {
    /// A key's value (at a (re)connection, or a change since).
    Put {
        key: String,
        value: Bytes,
        revision: u64,
    },
    /// A key deleted or purged.
    Deleted { key: String, revision: u64 },
    /// Every key's current value was told: what follows are changes.
    Synced,
    /// The server is unreachable (or the bucket is): why. The task retries.
    Down(String),
}

/// A key's value as stored now.
pub struct Current {
    /// None: no such key, or deleted.
    pub value: Option<Bytes>,
    pub revision: u64,
}

/// The key bucket's default name: the gateways' certified seal keys
/// (`veris_receipt::fleet_cert`), written by gateways, read by readers.
pub const KEYS_BUCKET: &str = "VERIS_KEYS";

/// The registry bucket of a fleet.
#[derive(Clone)]
pub struct Registry {
    fleet: Fleet,
    bucket: String,
    /// The stream's description when veris creates the bucket.
    description: &'static str,
}

impl Registry {
    pub fn new(fleet: &Fleet, bucket: &str) -> Result<Registry, FleetError> {
        Registry::named(
            fleet,
            bucket,
            "veris sandbox registry: key = sandbox id, value = its record",
        )
    }

    /// Another bucket of the same shape (one value per key, created when
    /// missing): the key bucket ([`KEYS_BUCKET`]).
    pub fn named(
        fleet: &Fleet,
        bucket: &str,
        description: &'static str,
    ) -> Result<Registry, FleetError> {
        check_token("the bucket name", bucket)?;
        Ok(Registry {
            fleet: fleet.clone(),
            bucket: bucket.to_string(),
            description,
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The bucket, created when missing: one value per key (the current
    /// registration is all a gateway needs), file storage. Created as the
    /// stream the KV protocol names (`KV_<bucket>` on `$KV.<bucket>.>`):
    /// the client crate's own creation first asks for account fields a 2.9
    /// server does not send.
    async fn store(&self) -> Result<kv::Store, String> {
        let js = self.fleet.jetstream();
        if let Ok(store) = js.get_key_value(&self.bucket).await {
            return Ok(store);
        }
        let config = stream::Config {
            name: format!("KV_{}", self.bucket),
            description: Some(self.description.into()),
            subjects: vec![format!("$KV.{}.>", self.bucket)],
            max_messages_per_subject: 1,
            max_message_size: 64 * 1024,
            storage: stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            num_replicas: 1,
            ..Default::default()
        };
        js.get_or_create_stream(config)
            .await
            .map_err(|e| format!("registry bucket {}: {e}", self.bucket))?;
        js.get_key_value(&self.bucket)
            .await
            .map_err(|e| format!("registry bucket {}: {e}", self.bucket))
    }

    /// `key`'s value now.
    pub async fn current(&self, key: &str) -> Result<Current, String> {
        let store = self.store().await?;
        let entry = store
            .entry(key)
            .await
            .map_err(|e| format!("reading {key} from {}: {e}", self.bucket))?;
        Ok(match entry {
            Some(e) if e.operation == Operation::Put => Current {
                value: Some(e.value),
                revision: e.revision,
            },
            Some(e) => Current {
                value: None,
                revision: e.revision,
            },
            None => Current {
                value: None,
                revision: 0,
            },
        })
    }

    /// Writes `value` under `key` if the key is still at `revision` (0: it
    /// never was written): a concurrent writer makes this fail rather than
    /// be overwritten. Its new revision.
    pub async fn put_at(&self, key: &str, value: Bytes, revision: u64) -> Result<u64, String> {
        let store = self.store().await?;
        let written = if revision == 0 {
            store.create(key, value).await.map_err(|e| e.to_string())
        } else {
            store
                .update(key, value, revision)
                .await
                .map_err(|e| e.to_string())
        };
        written.map_err(|e| format!("writing {key} to {}: {e}", self.bucket))
    }

    /// Deletes `key` (a delete marker: a removal every gateway reads).
    pub async fn delete(&self, key: &str) -> Result<(), String> {
        let store = self.store().await?;
        store
            .delete(key)
            .await
            .map_err(|e| format!("deleting {key} from {}: {e}", self.bucket))
    }

    /// Follows the bucket until `cancel`: see [`Event`]. Ends when the
    /// receiver is gone.
    pub async fn follow(&self, events: mpsc::Sender<Event>, cancel: CancellationToken) {
        let mut attempt = 0u32;
        loop {
            let why = tokio::select! {
                () = cancel.cancelled() => return,
                why = self.follow_once(&events, &mut attempt) => why,
            };
            if events.send(Event::Down(why)).await.is_err() {
                return;
            }
            let wait = Duration::from_millis((100u64 << attempt.min(4)).min(1000));
            attempt = attempt.saturating_add(1);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One connection's worth: the current state, then changes, until the
    /// server or the watch goes away; why it ended.
    async fn follow_once(&self, events: &mpsc::Sender<Event>, attempt: &mut u32) -> String {
        let client = self.fleet.jetstream().client();
        if client.connection_state() != async_nats::connection::State::Connected {
            return "not connected to NATS".into();
        }
        let store = match self.store().await {
            Ok(s) => s,
            Err(e) => return e,
        };
        // An empty bucket delivers nothing that could say "current".
        let values = match store.status().await {
            Ok(s) => s.values(),
            Err(e) => return format!("registry bucket {}: {e}", self.bucket),
        };
        let mut watch = match store.watch_with_history(">").await {
            Ok(w) => w,
            Err(e) => return format!("watching registry bucket {}: {e}", self.bucket),
        };
        let mut synced = values == 0;
        if synced && events.send(Event::Synced).await.is_err() {
            return "stopped".into();
        }
        *attempt = 0;
        loop {
            let next = tokio::select! {
                next = watch.next() => next,
                () = tokio::time::sleep(Duration::from_millis(250)) => {
                    if client.connection_state() != async_nats::connection::State::Connected {
                        return "disconnected from NATS".into();
                    }
                    continue;
                }
            };
            let entry = match next {
                Some(Ok(e)) => e,
                Some(Err(e)) => return format!("watching registry bucket {}: {e}", self.bucket),
                None => return format!("the watch of registry bucket {} ended", self.bucket),
            };
            let event = match entry.operation {
                Operation::Put => Event::Put {
                    key: entry.key,
                    value: entry.value,
                    revision: entry.revision,
                },
                Operation::Delete | Operation::Purge => Event::Deleted {
                    key: entry.key,
                    revision: entry.revision,
                },
            };
            if events.send(event).await.is_err() {
                return "stopped".into();
            }
            if !synced && entry.seen_current {
                synced = true;
                if events.send(Event::Synced).await.is_err() {
                    return "stopped".into();
                }
            }
        }
    }
}
