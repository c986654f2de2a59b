//! `veris baseline`: a token that marks "now" in the ledger and in each
//! twin log, so `veris receipt --since TOKEN` reports exactly what happened
//! after it (one test of many against a long-running proxy).
//!
//! Token format: `vb1:<seq>` followed by `:<service>=<twin request id>` per
//! service whose twin log could be read, e.g. `vb1:42:stripe=17`. A bare
//! number is accepted as a ledger seq.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::live;

/// A parsed baseline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Baseline {
    /// Ledger seq at the baseline: the window is `seq > this`.
    pub seq: u64,
    /// Newest twin request id per service at the baseline.
    pub twin: BTreeMap<String, u64>,
}

impl Baseline {
    pub fn token(&self) -> String {
        let mut t = format!("vb1:{}", self.seq);
        for (service, id) in &self.twin {
            t.push_str(&format!(":{service}={id}"));
        }
        t
    }

    pub fn parse(s: &str) -> Result<Baseline> {
        let s = s.trim();
        if let Ok(seq) = s.parse::<u64>() {
            return Ok(Baseline {
                seq,
                twin: BTreeMap::new(),
            });
        }
        let bad = || {
            anyhow::anyhow!(
                "bad baseline {s:?}. Next: pass what `veris baseline` printed (vb1:SEQ[:SERVICE=ID…]) or a ledger seq"
            )
        };
        let mut parts = s.split(':');
        if parts.next() != Some("vb1") {
            return Err(bad());
        }
        let seq = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let mut twin = BTreeMap::new();
        for p in parts {
            let (service, id) = p.split_once('=').ok_or_else(bad)?;
            if service.is_empty() {
                return Err(bad());
            }
            twin.insert(service.to_string(), id.parse().map_err(|_| bad())?);
        }
        Ok(Baseline { seq, twin })
    }
}

#[derive(Args, Debug)]
pub struct BaselineArgs {
    /// State dir of the proxy [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR", conflicts_with = "ledger")]
    pub state_dir: Option<PathBuf>,
    /// Ledger file to read when no proxy is live.
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
}

/// `veris baseline`: prints the token on stdout.
pub async fn baseline(args: BaselineArgs) -> Result<u8> {
    let state_dir = crate::state_dir(args.state_dir.clone());
    let live = match &args.ledger {
        Some(_) => None,
        None => match live::discover(&state_dir).await {
            live::Discovery::Live(l) => Some(l),
            live::Discovery::NotLive => None,
            live::Discovery::Unusable(why) => bail!("{why}"),
        },
    };
    let baseline = match live {
        Some(live) => {
            let status = live.status().await.context("asking the live proxy")?;
            // The twin ids are read after the seq: a request in between is
            // then in the window of both (it is counted, never lost).
            let seq = status.head_seq;
            let twin = live::twin_newest_ids(&status.services).await;
            Baseline { seq, twin }
        }
        None => {
            let path = args
                .ledger
                .clone()
                .unwrap_or_else(|| state_dir.join("ledger.jsonl"));
            if !path.exists() {
                bail!(
                    "no live proxy and no ledger at {}. Next: start the proxy (`veris serve`) with this state dir",
                    path.display()
                );
            }
            let read = veris_receipt::ledger::read(&path)
                .with_context(|| format!("reading ledger {}", path.display()))?;
            Baseline {
                seq: read.head.0,
                twin: BTreeMap::new(),
            }
        }
    };
    crate::outln!("{}", baseline.token());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        let b = Baseline {
            seq: 42,
            twin: [
                ("stripe".to_string(), 17),
                ("google-calendar".to_string(), 0),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(b.token(), "vb1:42:google-calendar=0:stripe=17");
        assert_eq!(Baseline::parse(&b.token()).unwrap(), b);
        assert_eq!(Baseline::parse("7").unwrap().seq, 7);
        for bad in [
            "",
            "vb2:1",
            "vb1",
            "vb1:x",
            "vb1:1:stripe",
            "vb1:1:=3",
            "vb1:1:s=x",
        ] {
            assert!(Baseline::parse(bad).is_err(), "{bad}");
        }
    }
}
