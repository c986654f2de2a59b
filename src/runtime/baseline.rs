//! `veris baseline`: a token that marks "now" in the ledger and in each
//! twin log, so `veris receipt --since TOKEN` reports exactly what happened
//! after it (one test of many against a long-running proxy).
//!
//! Token format: `vb2:<ledger id>:<seq>` followed by
//! `:<service>=<twin request id>` per service whose twin log could be read,
//! e.g. `vb2:3f9a0c1d2e4b5a69:42:stripe=17`. The ledger id is the first 16
//! hex digits of the hash of the ledger's first line: a token is bound to
//! its ledger, and one from another ledger (another state dir, or a ledger
//! a restart moved aside) is refused rather than silently applied. A bare
//! number is accepted as a ledger seq of whatever ledger is read.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use veris_receipt::ledger::LedgerRead;

use crate::runtime::live;

/// A parsed baseline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Baseline {
    /// The ledger the token was taken on; `None` for a bare seq.
    pub ledger: Option<String>,
    /// Ledger seq at the baseline: the window is `seq > this`.
    pub seq: u64,
    /// Newest twin request id per service at the baseline.
    pub twin: BTreeMap<String, u64>,
}

impl Baseline {
    pub fn token(&self) -> String {
        let mut t = format!("vb2:{}:{}", self.ledger.as_deref().unwrap_or(""), self.seq);
        for (service, id) in &self.twin {
            t.push_str(&format!(":{service}={id}"));
        }
        t
    }

    pub fn parse(s: &str) -> Result<Baseline> {
        let s = s.trim();
        if let Ok(seq) = s.parse::<u64>() {
            return Ok(Baseline {
                ledger: None,
                seq,
                twin: BTreeMap::new(),
            });
        }
        let bad = || {
            anyhow::anyhow!(
                "bad baseline {s:?}. Next: pass what `veris baseline` printed (vb2:LEDGER:SEQ[:SERVICE=ID…]) or a ledger seq"
            )
        };
        let mut parts = s.split(':');
        match parts.next() {
            Some("vb2") => {}
            Some("vb1") => bail!("baseline {s:?} comes from an older veris and names no ledger, so it cannot be checked against this one. Next: take a new one with `veris baseline`"),
            _ => return Err(bad()),
        }
        let ledger = parts
            .next()
            .filter(|id| id.len() == LEDGER_ID_LEN && id.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(bad)?
            .to_ascii_lowercase();
        let seq = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let mut twin = BTreeMap::new();
        for p in parts {
            let (service, id) = p.split_once('=').ok_or_else(bad)?;
            if service.is_empty() {
                return Err(bad());
            }
            twin.insert(service.to_string(), id.parse().map_err(|_| bad())?);
        }
        Ok(Baseline {
            ledger: Some(ledger),
            seq,
            twin,
        })
    }

    /// Refuses a token taken on another ledger.
    pub fn check_ledger(&self, read: &LedgerRead) -> Result<()> {
        let Some(expected) = &self.ledger else {
            return Ok(());
        };
        match ledger_id(read) {
            Some(id) if id == *expected => Ok(()),
            found => bail!(
                "baseline {} was taken on another ledger (its ledger id is {expected}, this ledger's is {}). Next: take a baseline against this state dir with `veris baseline`, or read the ledger it was taken on",
                self.token(),
                found.as_deref().unwrap_or("none: it is empty")
            ),
        }
    }
}

/// Hex digits of a ledger id.
const LEDGER_ID_LEN: usize = 16;

/// The first 16 hex digits of the hash of the ledger's first line.
pub fn ledger_id(read: &LedgerRead) -> Option<String> {
    let hash = match read.lines.len() {
        0 => return None,
        1 => read.head.1.as_str(),
        _ => read.lines[1].prev.as_str(),
    };
    Some(hash.get(..LEDGER_ID_LEN)?.to_string())
}

/// Marks now: on the live proxy of `state_dir` (its head seq and each
/// twin's newest request id), else on the end of the ledger file the state
/// dir means (`crate::runtime::ledgers::resolve`: `ledger`, `run`, the serve's, the
/// newest run's). `veris baseline` and the MCP tool both call this.
pub async fn take(state_dir: &Path, ledger: Option<&Path>, run: Option<&str>) -> Result<Baseline> {
    let live = match (ledger, run) {
        (None, None) => match live::discover(state_dir).await {
            live::Discovery::Live(l) => Some(l),
            live::Discovery::NotLive => None,
            live::Discovery::Unusable(why) => bail!("{why}"),
        },
        _ => None,
    };
    Ok(match live {
        Some(live) => {
            let status = live.status().await.context("asking the live proxy")?;
            // The twin ids are read after the seq: a request in between is
            // then in the window of both (it is counted, never lost).
            let seq = status.head_seq;
            let twin = live::twin_newest_ids(&status.services).await;
            let path = state_dir.join("ledger.jsonl");
            let read = veris_receipt::ledger::read(&path)
                .with_context(|| format!("reading ledger {}", path.display()))?;
            Baseline {
                ledger: ledger_id(&read),
                seq,
                twin,
            }
        }
        None => {
            let source = crate::runtime::ledgers::resolve(state_dir, ledger, run, false)?;
            let path = source.path().to_path_buf();
            if std::fs::symlink_metadata(&path).is_err() {
                match source {
                    crate::runtime::ledgers::Source::File(_) => bail!(
                        "no ledger at {}. Next: pass --ledger an existing ledger file, or --state-dir DIR",
                        path.display()
                    ),
                    _ => bail!("{}", crate::runtime::ledgers::no_ledger(state_dir)),
                }
            }
            if let Some(note) = source.note() {
                eprintln!("{note}");
            }
            let read = veris_receipt::ledger::read(&path)
                .with_context(|| format!("reading ledger {}", path.display()))?;
            Baseline {
                ledger: ledger_id(&read),
                seq: read.head.0,
                twin: BTreeMap::new(),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        let b = Baseline {
            ledger: Some("0123456789abcdef".into()),
            seq: 42,
            twin: [
                ("stripe".to_string(), 17),
                ("google-calendar".to_string(), 0),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(
            b.token(),
            "vb2:0123456789abcdef:42:google-calendar=0:stripe=17"
        );
        assert_eq!(Baseline::parse(&b.token()).unwrap(), b);
        assert_eq!(Baseline::parse("7").unwrap().seq, 7);
        for bad in [
            "",
            "vb2:1",
            "vb1:1",
            "vb2",
            "vb2:1",
            "vb2:0123456789abcdef:x",
            "vb2:0123456789abcdeg:1",
            "vb2:0123456789abcdef:1:stripe",
            "vb2:0123456789abcdef:1:=3",
            "vb2:0123456789abcdef:1:s=x",
        ] {
            assert!(Baseline::parse(bad).is_err(), "{bad}");
        }
    }
}
