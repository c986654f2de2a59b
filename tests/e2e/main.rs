//! The end-to-end tests of the `veris` binary, one test binary (one link
//! step) with a module per area: `cargo test --release --test e2e` runs
//! them all, `cargo test --release --test e2e isolated::` one area. Each
//! module drives the release binary with real clients (curl, python3, ...)
//! and reaches only loopback or namespaces it creates. [`support`] holds
//! what they share (see its module comment).

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod ca_constraints;
mod capture;
mod cli;
mod client_matrix;
mod clients;
mod confine;
mod cut_request;
mod cut_response;
mod docs;
mod doctor;
mod egress;
mod egress_env;
mod explicit;
mod faults;
mod fleet;
mod fleet_keys;
mod fleet_receipt;
mod fleet_registry;
mod fleet_tui;
mod forgery;
mod gateway;
mod gateway_attacks;
mod gateway_ca;
mod gateway_cap;
mod gateway_inside;
mod gateway_java;
mod gateway_limits;
mod gateway_restart;
mod gateway_tls;
mod gateway_views;
mod gateway_webhook;
mod har;
mod integrity;
mod isolated;
mod junit;
mod logs;
mod mcp;
mod metrics;
mod report_files;
mod run;
mod runs;
mod systemd;
mod transparent;
mod trust_evidence;
mod tui;
mod twin_credential;
mod veris_headers;
mod webhook;
mod webhook_faults;
mod webhook_ingress;
mod webhook_isolated;
mod webhook_queue;
mod webhook_tls;
