//! gpu-admission: per-namespace GPU-model quota webhooks and a fragment-aware
//! kube-scheduler extender for tkestack gpu-manager clusters.
//!
//! Layering (the one rule worth enforcing): `placement` is the pure core (no HTTP,
//! no API calls); `cache` feeds it from the API server or a YAML file; `extender`
//! and `server` are thin HTTP adapters; `certs` bootstraps TLS.

pub mod admission;
pub mod backend;
pub mod cache;
pub mod certs;
pub mod cli;
pub mod config;
pub mod dra;
pub mod extender;
pub mod import;
pub mod metrics;
pub mod placement;
pub mod quota;
pub mod serve;
pub mod server;
pub mod simulate;
pub mod telemetry;
pub mod wire;
