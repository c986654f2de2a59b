//! veris-twin: a small built-in twin that speaks the twin contract.
#![forbid(unsafe_code)]
