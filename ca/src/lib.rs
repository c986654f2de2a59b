//! veris-ca mints and stores certificates and publishes trust material. It does no network I/O.
#![forbid(unsafe_code)]
