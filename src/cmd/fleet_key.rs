//! `veris fleet-key new|certify` (G2, DESIGN §14): the fleet's operator
//! key, kept offline, and the gateway identities it certifies. A reader
//! pins the operator key's fingerprint (`veris receipt --fleet-key`); a
//! gateway started with `--fleet-identity DIR` certifies each run's seal
//! key with its identity ([`crate::runtime::fleet_identity`]).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use veris_receipt::fleet_cert::IdentityCert;
use veris_receipt::seal::Sealer;

use crate::runtime::fleet_identity::{load_private_key, now_ms, IDENTITY_CERT, IDENTITY_KEY};

/// The operator directory's files.
const OPERATOR_KEY: &str = "operator.key";
const OPERATOR_PUB: &str = "operator.pub";

#[derive(Subcommand, Debug)]
pub enum FleetKeyCommand {
    /// Make the operator key: DIR/operator.key (0600: keep it offline, on
    /// the machine that certifies gateways) and DIR/operator.pub. Prints
    /// the fingerprint readers pin (veris receipt --fleet-key). Never
    /// overwrites a key.
    New(NewArgs),
    /// Certify a gateway's identity: DIR/identity.key (0600) and
    /// DIR/identity.cert, signed by the operator key, for the gateway's
    /// --fleet-identity DIR.
    Certify(CertifyArgs),
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// Directory for operator.key and operator.pub (created 0700).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct CertifyArgs {
    /// The operator's private key (operator.key, mode 0600).
    #[arg(long, value_name = "FILE")]
    pub operator_key: PathBuf,
    /// The gateway's name: its --nats-name, the token in its subjects.
    #[arg(long, value_name = "NAME")]
    pub gateway: String,
    /// Directory for identity.key and identity.cert (created 0700); give it
    /// to the gateway (--fleet-identity DIR).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Days the identity certifies seal keys (0: no end). After them a
    /// reader trusts none of its seal keys, old chains' included.
    #[arg(long, value_name = "DAYS", default_value_t = 0)]
    pub valid_days: u64,
}

pub fn fleet_key(cmd: FleetKeyCommand) -> Result<u8> {
    match cmd {
        FleetKeyCommand::New(a) => {
            let (key, der) = Sealer::generate_pkcs8().context("generating the operator key")?;
            make_dir(&a.out)?;
            write_new(&a.out.join(OPERATOR_KEY), &der, 0o600)?;
            let public = format!("ed25519 {}\n", key.public_key_hex());
            write_new(&a.out.join(OPERATOR_PUB), public.as_bytes(), 0o644)?;
            eprintln!(
                "veris: operator key in {}: keep it offline (it certifies every gateway); readers pin its fingerprint: veris receipt --nats URL --sandbox ID --fleet-key {}",
                a.out.join(OPERATOR_KEY).display(),
                key.key_id()
            );
            crate::outln!("{}", key.key_id());
        }
        FleetKeyCommand::Certify(a) => {
            veris_fleet::check_token("the gateway name", &a.gateway)?;
            let operator = load_private_key(&a.operator_key, "operator key")?;
            let (identity, der) =
                Sealer::generate_pkcs8().context("generating the identity key")?;
            let issued = now_ms();
            let not_after = (a.valid_days > 0)
                .then(|| issued.saturating_add(a.valid_days.saturating_mul(86_400_000)));
            let cert = IdentityCert::issue(
                &operator,
                &a.gateway,
                &identity.public_key(),
                issued,
                not_after,
            );
            make_dir(&a.out)?;
            write_new(&a.out.join(IDENTITY_KEY), &der, 0o600)?;
            let text = format!("{}\n", serde_json::to_string_pretty(&cert)?);
            write_new(&a.out.join(IDENTITY_CERT), text.as_bytes(), 0o644)?;
            eprintln!(
                "veris: identity of gateway {} certified by operator key {}; start it with --nats-name {} --fleet-identity {}",
                a.gateway,
                operator.key_id(),
                a.gateway,
                a.out.display()
            );
            crate::outln!("{}", identity.key_id());
        }
    }
    Ok(0)
}

fn make_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Writes a new file with `mode`: never over an existing file (a key is
/// never replaced by accident), never through a link planted at `path`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (veris never overwrites a key file). Next: name another --out directory, or remove the old files if you mean to replace them",
                path.display()
            )
        })?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}
