//! The crate's error type: one variant per thing that can fail, with the cause kept as source.

use std::path::PathBuf;

/// What failed in the CA crate. Messages are lower-case and name the file involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// A directory could not be created or its permissions set.
    #[error("cannot create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written (temp file, fsync or rename).
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The CA key file is readable by group or others: it is refused rather than trusted.
    #[error(
        "ca key {path} is readable by group or others (mode {mode:04o}); \
         next: run `chmod 600 {path}` (and make sure the key did not leak), \
         or delete the ca dir to generate a new CA"
    )]
    InsecureKeyPermissions { path: PathBuf, mode: u32 },
    /// The CA on disk could not be loaded after it was found usable.
    #[error("cannot load ca from {path}: {reason}")]
    LoadCa { path: PathBuf, reason: String },
    /// There is no usable CA in the dir (missing, unparsable or expired) and
    /// the caller asked not to create one.
    #[error("no usable ca in {dir}: {reason}")]
    NoCa { dir: PathBuf, reason: String },
    /// Generating or signing the CA certificate failed.
    #[error("cannot generate the ca certificate")]
    GenerateCa(#[source] rcgen::Error),
    /// The CA certificate's validity ended: it is refused, never silently replaced, since
    /// every client that trusts it would have to be given the new one.
    #[error(
        "the ca {path} expired on {not_after}; next: `veris ca rotate` makes the next one \
         (then give clients the new certificate file)"
    )]
    Expired { path: PathBuf, not_after: String },
    /// A scope without one DNS name: its certificate would constrain no DNS name at all.
    #[error("a ca's name constraints need at least one dns name")]
    EmptyScope,
    /// The name is outside the CA's name constraints: no client that checks them would
    /// accept a leaf for it, so none is minted.
    #[error(
        "{host} is outside the ca's name constraints; next: `veris ca rotate` with the route \
         (or `--name {host}`) makes a ca that may sign for it"
    )]
    OutsideConstraints { host: String },
    /// The host cannot be put in a certificate (empty, or not a DNS name or IP literal).
    #[error("invalid host for a certificate: {host:?}")]
    InvalidHost { host: String },
    /// Minting a leaf certificate failed.
    #[error("cannot mint a leaf certificate for {host}")]
    MintLeaf {
        host: String,
        #[source]
        source: rcgen::Error,
    },
    /// rustls refused the minted leaf key.
    #[error("cannot load the leaf key for {host} into rustls")]
    SigningKey {
        host: String,
        #[source]
        source: rustls::Error,
    },
    /// A listener's own certificate or key file is unusable (`reason` says why).
    #[error(
        "{path} {reason}; next: give the PEM certificate chain (leaf first) with --tls-cert \
         and its PEM private key with --tls-key, or leave both out to use a leaf of the gateway's CA"
    )]
    ServerCert { path: PathBuf, reason: String },
    /// The private key given for a listener's certificate belongs to another certificate.
    #[error(
        "the key {key} does not belong to the certificate {cert}; next: give the key the \
         certificate was issued for (compare `openssl x509 -pubkey -noout -in CERT` with \
         `openssl pkey -pubout -in KEY`)"
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    /// An env value cannot be represented in the chosen format (e.g. a newline in docker format).
    #[error("env variable {name} cannot be written in {format} format: {why}")]
    EnvValue {
        name: String,
        format: &'static str,
        why: &'static str,
    },
}
