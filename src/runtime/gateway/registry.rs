//! Shared sandboxes (`veris gateway --nats`, DESIGN §14): the fleet's
//! sandbox registry in a JetStream key-value bucket
//! ([`veris_fleet::registry`]), so a sandbox added through any gateway is
//! served by every one, and a removal refuses it on every one.
//!
//! - Writes: an add through this gateway's admin API writes the record to
//!   the bucket before serving it (refused when the key holds a live
//!   sandbox, or the bucket is unreachable); a removal writes the record
//!   back `revoked` (retried after an outage until written).
//! - Reads ([`follow`]): every bucket entry is judged as `sandbox.json` is
//!   ([`parse`]: key a sandbox id, at most 64 KiB, a record whose id is its
//!   key, digests, limits); a bad one is logged, counted and skipped. A
//!   live entry is served here as a restored sandbox is (its own dir,
//!   ledger and publisher: this gateway's chain on
//!   `veris.ledger.<sandbox>.<gateway>`), a revoked or deleted one removed
//!   as `DELETE /sandboxes/{id}` removes it. A credential this gateway
//!   revoked (its `sandbox.json` says so) is never served again, whatever
//!   the bucket says.
//! - While NATS is down the gateway serves what it knows (its local
//!   records); `/status` says `registry.state: "down"`; on reconnection it
//!   reads the bucket's current state again.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{bail, Result};
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{info, warn};
use veris_fleet::registry::{Event, Registry};

use super::{reserve, sandbox_dir, start, Shared};
use crate::tier::gateway::valid_id;
use crate::tier::gateway_record::{self as record, Record};

/// The registry a gateway shares with its fleet, and what `/status` shows.
pub(super) struct Fleet {
    registry: Registry,
    status: Mutex<Status>,
    /// Removals not yet written to the bucket (it was unreachable).
    pending: Mutex<Vec<Record>>,
}

#[derive(Debug, Clone, Serialize)]
struct Status {
    bucket: String,
    /// `connecting` (not synced yet since the start), `synced` (the
    /// bucket's state is served; changes follow), or `down` (since it was
    /// synced; serving the sandboxes this gateway knows, from their local
    /// records, until it is back).
    state: &'static str,
    /// Unix ms of the last change of `state`.
    since_ms: u64,
    last_error: Option<String>,
    /// Entries skipped as malformed (or reviving a revoked credential).
    skipped: u64,
    /// Removals waiting for the bucket.
    pending_revocations: usize,
}

impl Fleet {
    pub(super) fn new(fleet: &veris_fleet::Fleet, bucket: &str) -> Result<Fleet> {
        let registry = Registry::new(fleet, bucket)?;
        Ok(Fleet {
            status: Mutex::new(Status {
                bucket: registry.bucket().to_string(),
                state: "connecting",
                since_ms: record::unix_ms(SystemTime::now()),
                last_error: None,
                skipped: 0,
                pending_revocations: 0,
            }),
            registry,
            pending: Mutex::default(),
        })
    }

    pub(super) fn status(&self) -> serde_json::Value {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.pending_revocations = self.pending.lock().map_or(0, |p| p.len());
        serde_json::to_value(s).unwrap_or_default()
    }

    fn set_state(&self, state: &'static str, error: Option<String>) {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if s.state != state {
            s.state = state;
            s.since_ms = record::unix_ms(SystemTime::now());
        }
        if error.is_some() || state == "synced" {
            s.last_error = error;
        }
    }

    fn skipped(&self) {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .skipped += 1;
    }

    /// Writes a new sandbox's record before it is served: refused when
    /// the key holds a live sandbox (registered through another gateway),
    /// or when the bucket cannot be written.
    pub(super) async fn register(&self, record: &Record) -> Result<()> {
        let current = self.registry.current(&record.id).await.map_err(|e| {
            anyhow::anyhow!("{e}. The fleet's registry is unreachable: no sandbox can be added until it is (those registered are served meanwhile)")
        })?;
        if let Some(value) = &current.value {
            // A malformed entry may be replaced; a live one may not, nor a
            // removed or expired one: an id is served once (its chains end
            // in their final seal, which a stream reader takes as the end).
            if let Ok(old) = parse(&record.id, value) {
                let bucket = self.registry.bucket();
                if old.revoked_ms.is_some() || old.expires().is_some_and(|e| SystemTime::now() >= e)
                {
                    bail!(
                        "sandbox {} was registered in the fleet before and has ended (removed or expired; bucket {bucket}): an id is served once, so that its receipt stays its own. Next: pick another id",
                        record.id
                    );
                }
                bail!(
                    "sandbox {} is registered already in the fleet (bucket {bucket}). Next: pick another id (an id is served once)",
                    record.id
                );
            }
        }
        self.registry
            .put_at(&record.id, encode(record)?, current.revision)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }

    /// Writes `revoked` (a removed sandbox's record) to the bucket; kept to
    /// retry when the bucket cannot be written now. Err: not written yet.
    pub(super) async fn revoke(&self, revoked: Record) -> Result<()> {
        match self.write_revoked(&revoked).await {
            Ok(()) => Ok(()),
            Err(e) => {
                if let Ok(mut p) = self.pending.lock() {
                    p.retain(|r| r.id != revoked.id);
                    p.push(revoked);
                }
                Err(e)
            }
        }
    }

    /// Revokes in the bucket a live sandbox this gateway does not serve
    /// (`DELETE /sandboxes/{id}` through any gateway); false: none.
    pub(super) async fn remove_unserved(&self, id: &str) -> Result<bool> {
        valid_id(id)?;
        let current = self
            .registry
            .current(id)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let Some(Ok(mut r)) = current.value.as_deref().map(|v| parse(id, v)) else {
            return Ok(false);
        };
        if r.revoked_ms.is_some() {
            return Ok(false);
        }
        r.revoked_ms = Some(record::unix_ms(SystemTime::now()));
        self.write_revoked(&r).await?;
        Ok(true)
    }

    /// The bucket's entry for the id revoked, unless it holds another
    /// registration already (a newer one wins; so does a removal).
    async fn write_revoked(&self, revoked: &Record) -> Result<()> {
        let current = self
            .registry
            .current(&revoked.id)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        match current.value.as_deref().map(|v| parse(&revoked.id, v)) {
            // Deleted, or never written: nothing serves it.
            None => return Ok(()),
            Some(Ok(r)) if r.revoked_ms.is_some() => return Ok(()),
            Some(Ok(r)) if r.password_sha256 != revoked.password_sha256 => return Ok(()),
            // Malformed: no gateway serves it; delete it all the same.
            Some(Err(_)) => {
                return self
                    .registry
                    .delete(&revoked.id)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))
            }
            Some(Ok(_)) => {}
        }
        self.registry
            .put_at(&revoked.id, encode(revoked)?, current.revision)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }

    /// Retries the removals the bucket missed.
    async fn flush_pending(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for r in pending {
            let id = r.id.clone();
            match self.revoke(r).await {
                Ok(()) => info!(sandbox = %id, "the removal reached the fleet's registry"),
                Err(e) => {
                    warn!(sandbox = %id, error = %format!("{e:#}"), "the removal still cannot reach the fleet's registry; retried")
                }
            }
        }
    }
}

/// A record as the bucket stores it.
fn encode(record: &Record) -> Result<Bytes> {
    Ok(Bytes::from(serde_json::to_vec(record)?))
}

/// A bucket entry judged as `sandbox.json` is: its key a sandbox id, at
/// most [`record::RECORD_CAP`] bytes, a record ([`Record::check`]) whose id
/// is its key.
fn parse(key: &str, value: &[u8]) -> Result<Record> {
    valid_id(key)?;
    if value.len() as u64 > record::RECORD_CAP {
        bail!("{} bytes (at most {})", value.len(), record::RECORD_CAP);
    }
    let r: Record =
        serde_json::from_slice(value).map_err(|e| anyhow::anyhow!("not a sandbox record: {e}"))?;
    r.check(key)?;
    Ok(r)
}

/// Follows the bucket until the gateway stops, serving what it says.
pub(super) async fn follow(shared: Arc<Shared>, fleet: Arc<Fleet>) {
    let (tx, mut rx) = mpsc::channel(256);
    let follower = {
        let (registry, cancel) = (fleet.registry.clone(), shared.cancel.clone());
        tokio::spawn(async move { registry.follow(tx, cancel).await })
    };
    while let Some(event) = rx.recv().await {
        match event {
            Event::Put {
                key,
                value,
                revision,
            } => match parse(&key, &value) {
                Ok(r) => apply(&shared, &fleet, r).await,
                Err(e) => {
                    fleet.skipped();
                    // The key is the writer's text: quoted, bounded.
                    let shown: String = key.chars().take(80).collect();
                    warn!(bucket = %fleet.registry.bucket(), key = ?shown, revision, error = %format!("{e:#}"), "skipped a registry entry that is not a sandbox record; what this gateway serves is unchanged");
                }
            },
            Event::Deleted { key, revision } => {
                if valid_id(&key).is_ok() && shared.sandboxes.get(&key).is_some() {
                    info!(sandbox = %key, revision, "removed from the fleet's registry; removing it here");
                    removed(&shared, &key).await;
                }
            }
            Event::Synced => {
                fleet.set_state("synced", None);
                info!(bucket = %fleet.registry.bucket(), sandboxes = shared.sandboxes.all().len(), "serving the fleet's registry");
                fleet.flush_pending().await;
            }
            Event::Down(why) => {
                let was = fleet.status.lock().map(|s| s.state).unwrap_or("down");
                if was == "synced" {
                    warn!(bucket = %fleet.registry.bucket(), error = %why, sandboxes = shared.sandboxes.all().len(), "the fleet's registry is unreachable; serving the sandboxes this gateway knows until it is back");
                }
                // Before the first sync it is still `connecting`.
                let state = if was == "connecting" { was } else { "down" };
                fleet.set_state(state, Some(why));
            }
        }
    }
    let _ = follower.await;
}

/// Serves what a valid entry says of its sandbox here.
async fn apply(shared: &Arc<Shared>, fleet: &Fleet, r: Record) {
    let id = r.id.clone();
    let local = shared.sandboxes.get(&id);
    if r.revoked_ms.is_some() {
        if local.is_some() {
            info!(sandbox = %id, "revoked in the fleet's registry; removing it here");
            removed(shared, &id).await;
        }
        return;
    }
    if let Some(local) = &local {
        if local.record == r {
            return;
        }
        // Registered again elsewhere (a new credential) or changed: the
        // old one is removed, the new one served.
        info!(sandbox = %id, "changed in the fleet's registry; serving its new registration");
        removed(shared, &id).await;
    } else if r.expires().is_some_and(|e| SystemTime::now() >= e) {
        return;
    } else if let Ok(Some(old)) = record::load(&sandbox_dir(shared, &id), &id) {
        // A credential this gateway revoked stays revoked.
        if old.revoked_ms.is_some() && old.password_sha256 == r.password_sha256 {
            fleet.skipped();
            warn!(sandbox = %id, "skipped a registry entry that revives a credential this gateway revoked");
            return;
        }
    }
    // Busy: being added or removed through this gateway's admin API,
    // which writes the bucket itself.
    let Ok(_reserved) = reserve(shared, &id) else {
        return;
    };
    let started = match crate::util::random_hex(32) {
        Ok(token) => start(shared, r, token).await,
        Err(e) => Err(e),
    };
    let served = match started {
        Ok(s) => {
            let saved = s.record.save(&sandbox_dir(shared, &id));
            match saved.and_then(|()| shared.sandboxes.insert(s.clone())) {
                Ok(()) => Ok(()),
                Err(e) => {
                    super::close(&s, &shared.sealer, veris_receipt::seal::SHUTDOWN).await;
                    Err(e)
                }
            }
        }
        Err(e) => Err(e),
    };
    match served {
        Ok(()) => info!(sandbox = %id, "serving a sandbox of the fleet's registry"),
        Err(e) => {
            warn!(sandbox = %id, error = %format!("{e:#}"), "cannot serve a sandbox of the fleet's registry; it stays refused here")
        }
    }
}

/// Removes a sandbox the registry removed, as `DELETE /sandboxes/{id}` does
/// (its record here revoked, its connections closed, its final seal).
async fn removed(shared: &Arc<Shared>, id: &str) {
    match super::remove(shared, id, false).await {
        Some(Ok(())) | None => {}
        Some(Err(e)) => {
            warn!(sandbox = %id, error = %format!("{e:#}"), "sandbox removed, its record here not revoked")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tier::gateway_record::sample as good;

    #[test]
    fn a_bucket_entry_is_judged_as_a_record_file_is() {
        let bytes = |r: &Record| serde_json::to_vec(r).unwrap();
        assert_eq!(
            parse("sbx-a", &bytes(&good("sbx-a"))).unwrap(),
            good("sbx-a")
        );
        // Its id must be its key, and the key a sandbox id.
        assert!(parse("sbx-b", &bytes(&good("sbx-a"))).is_err());
        assert!(parse("SBX", &bytes(&good("SBX"))).is_err());
        assert!(parse("a.b", &bytes(&good("a.b"))).is_err());
        assert!(parse("sbx-a", b"not json").is_err());
        assert!(parse("sbx-a", b"{\"v\":1}").is_err());
        let mut v = serde_json::to_value(good("sbx-a")).unwrap();
        v["admin"] = true.into();
        assert!(parse("sbx-a", &serde_json::to_vec(&v).unwrap()).is_err());
        let mut bad = good("sbx-a");
        bad.password_sha256 = "zz".into();
        assert!(parse("sbx-a", &bytes(&bad)).is_err());
        let mut big = serde_json::to_vec(&good("sbx-a")).unwrap();
        big.extend(std::iter::repeat_n(b' ', record::RECORD_CAP as usize));
        assert!(parse("sbx-a", &big).is_err());
    }
}
