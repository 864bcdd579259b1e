//! End-to-end tests on a real control plane: etcd, kube-apiserver, kube-scheduler with
//! gpu-admission as its extender, and the `gpu-admission serve` binary watching the cluster.
//! `hack/e2e.sh` builds and starts all of that, then runs
//! `cargo test --test e2e -- --test-threads=1` with these variables set:
//!
//! - `GPU_ADMISSION_E2E_KUBECONFIG` — admin kubeconfig of the test cluster. Without it every
//!   test prints that it did NOT run and returns (so a plain `cargo test` stays offline).
//!   With it, an unreachable cluster is a failure, never a skip.
//! - `GPU_ADMISSION_E2E_CTL` — a script taking `stop` / `start` (and optionally the replica,
//!   `a` by default) that stops and restarts a gpu-admission process (the outage scenarios
//!   need it).
//! - `GPU_ADMISSION_E2E_SCHEDULER` — the scheduler profile name (default `gpu-scheduler`).
//! - `GPU_ADMISSION_E2E_SERVER_URL` / `GPU_ADMISSION_E2E_SERVER_URL_B` — https URLs of the
//!   webhook doors (`/mutate`, `/validate`; mutual TLS) of gpu-admission replica `a` and of
//!   a second replica `b` (the script takes `start|stop a|b`);
//!   `GPU_ADMISSION_E2E_EXTENDER_URL` — replica `a`'s extender door (`/scheduler/*`, the
//!   kube-scheduler's extender); `GPU_ADMISSION_E2E_CA_FILE` — their serving CA (webhook
//!   `caBundle`); `GPU_ADMISSION_E2E_CLIENT_CERT` / `_KEY` — the client certificate
//!   kube-apiserver presents to the webhooks, `GPU_ADMISSION_E2E_CLIENT_CA` — its CA
//!   (gpu-admission's `--client-ca`); `GPU_ADMISSION_E2E_CERT_DIR` — the directory of the
//!   certificate files both serve (re-read every second); `GPU_ADMISSION_E2E_ADMIN_URL` —
//!   replica `a`'s admin port.
//!
//! - `GPU_ADMISSION_E2E_BIN` — the gpu-admission binary the run serves (a copy of this
//!   checkout's build; `certs` and `quota import` run it too).
//! - `GPU_ADMISSION_E2E_PROMETHEUS` / `GPU_ADMISSION_E2E_PROMTOOL` — Prometheus and promtool
//!   (hack/e2e/build-prometheus.sh); `GPU_ADMISSION_E2E_CHART_MONITORING` — the chart's
//!   ServiceMonitor, PrometheusRule and dashboard ConfigMap, rendered (the observability
//!   scenario).
//!
//! Helpers (cluster access, fake nodes, pods, bounded waits, webhook registration, an
//! HTTPS client for calling the doors directly) are in `support/`; one module per
//! family of scenarios.
//!
//! No kubelets run: nodes are API objects whose `status` the tests write, and a bound
//! pod simply stays Pending. Each scenario uses its own namespace, its own node names
//! (labelled `gpu-admission-e2e/scenario`) and its own GPU model, and deletes its nodes
//! when it ends, so a failed scenario cannot disturb the next one.
#![allow(clippy::unwrap_used)]

#[path = "../repo/mod.rs"]
mod repo;
mod support;

mod cohort;
mod controllers;
mod defrag;
mod devices;
mod doors;
mod dra;
mod manifests;
mod marks;
mod measure;
mod node;
mod observability;
mod outages;
mod placement;
mod queue;
mod quota;
mod volcano;
mod waiting;
mod webhooks;
