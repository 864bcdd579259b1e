//! gpu-admission: per-namespace GPU-model quota webhooks and a fragment-aware
//! kube-scheduler extender for tkestack gpu-manager clusters.
//!
//! Layers, top to bottom (docs/design.md draws them): `serve` and the CLI; `server`
//! (HTTP doors) with `wire` (every request decoder); the verbs in `admission` and
//! `extender` (the placement transaction is `extender::plan`); `backend`, the only
//! module that knows the run mode (API or a file); `cache`, synchronous state fed by
//! watches or the file; and the pure core — `quota`, `dra`, `placement` — with no
//! HTTP, no API calls and no async. `certs` bootstraps TLS. `explain` and `defrag` judge
//! and plan on the cache for the CLI and the admin port; `tell` writes their verdicts
//! onto pending pods.

// Private by default: the docs are for who works on the crate
// (`cargo doc --document-private-items`), and they link to private items freely.
#![allow(rustdoc::private_intra_doc_links)]

pub(crate) mod admission;
pub(crate) mod api_client;
pub mod backend;
pub mod cache;
pub mod certs;
pub mod cli;
pub mod config;
pub(crate) mod controllers;
pub mod defrag;
pub mod dra;
pub mod explain;
pub(crate) mod extender;
pub mod import;
pub mod marks;
pub(crate) mod metrics;
pub mod placement;
pub mod quota;
pub mod serve;
pub mod server;
pub mod simulate;
pub(crate) mod snapshot;
pub mod telemetry;
pub mod wire;
