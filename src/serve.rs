//! `gpu-admission serve`: assemble config, cache, TLS, the background controllers
//! (`controllers::spawn_all`) and the listeners — one per door: webhooks, extender,
//! admin, and the optional plain extender port — and run until SIGTERM/SIGINT. Whether the server runs against the API or a file is decided here,
//! once, by which backend it builds.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::Backend;
use crate::cache::Projection;
use crate::certs::{self, CertFiles};
use crate::cli::ServeArgs;
use crate::config::Config;
use crate::metrics::ResultLabels;
use crate::server::listener;
use crate::server::listener::ConnectionLimits;
use crate::server::tls::{self, CertResolver, ReloadResult};
use crate::server::{
    AppState, admin::admin_router, extender_router, insecure_extender_router, webhook_router,
};

/// For the binary's `certs --install`.
pub use crate::api_client::kube_client;

const DEV_CERT_DIR: &str = "webhook-certs";

/// Connection cap of the admin listener (probes and metrics scrapes).
const ADMIN_CONNECTIONS: usize = 64;

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        address,
        extender_address,
        client_ca,
        limits,
        tls_cert,
        tls_key,
        tls_reload_interval,
        insecure_extender_address,
        admin_address,
        kubeconfig,
        master,
        config,
        cluster,
        shutdown_grace,
        release_queue,
        log: _,
    } = args;
    let config = match config {
        Some(path) => Config::load(&path)?,
        None => Config::default(),
    };
    let (cert, key) = tls_paths(tls_cert, tls_key)?;
    let resolver =
        CertResolver::load(&cert, &key).with_context(|| "loading the serving certificate")?;
    let shutdown = CancellationToken::new();
    let projection = Projection::from_config(&config);
    // The run mode is decided here, once: everything after talks to the backend.
    let backend = match &cluster {
        Some(path) => Backend::from_file(path, projection)?,
        None => {
            let client =
                crate::api_client::kube_client(kubeconfig.as_deref(), master.as_deref()).await?;
            let (backend, watches) = Backend::from_api(client, projection, shutdown.clone());
            tokio::spawn(watches.instrument(tracing::info_span!("cluster_cache")));
            backend
        }
    };
    let mode = backend.mode_name();
    let state = AppState::with_body_timeout(backend, config, limits.request_timeout);
    let lease_task = crate::controllers::spawn_all(&state, release_queue, &shutdown);
    state
        .metrics
        .tls_not_after
        .set(resolver.not_after().unwrap_or(0));

    let webhook_tls = match &client_ca {
        Some(ca) => tls::mutual_server_config(resolver.clone(), ca)
            .with_context(|| format!("--client-ca {}", ca.display()))?,
        None => tls::server_config(resolver.clone()),
    };
    let tls_listener = bind(address, "--address").await?;
    let extender_listener = bind(extender_address, "--extender-address").await?;
    let admin_listener = bind(admin_address, "--admin-address").await?;
    let insecure_listener = match insecure_extender_address {
        Some(addr) => Some(bind(addr, "--insecure-extender-address").await?),
        None => None,
    };
    let local = |l: &TcpListener| l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(
        address = local(&tls_listener),
        extender_address = local(&extender_listener),
        client_auth = client_ca.is_some(),
        admin_address = local(&admin_listener),
        insecure_extender_address = insecure_listener.as_ref().map(local),
        mode,
        policy = %state.config.placement.policy,
        "serving"
    );
    tokio::spawn(
        watch_certificates(
            resolver.clone(),
            tls_reload_interval,
            state.clone(),
            shutdown.clone(),
        )
        .instrument(tracing::info_span!("cert_reload")),
    );
    tokio::spawn(
        stop_on_signal(state.clone(), shutdown.clone()).instrument(tracing::info_span!("signals")),
    );

    let webhooks = listener::serve_tls(
        tls_listener,
        webhook_tls,
        webhook_router(state.clone()),
        shutdown.clone(),
        shutdown_grace,
        limits,
    );
    let extender = listener::serve_tls(
        extender_listener,
        tls::server_config(resolver),
        extender_router(state.clone()),
        shutdown.clone(),
        shutdown_grace,
        limits,
    );
    // Probes and scrapes need few connections; a flood of them must not take the
    // file descriptors the webhook door needs.
    let admin_limits = ConnectionLimits {
        max_connections: limits.max_connections.min(ADMIN_CONNECTIONS),
        ..limits
    };
    let admin = listener::serve_plain(
        admin_listener,
        admin_router(state.clone()),
        shutdown.clone(),
        shutdown_grace,
        admin_limits,
        listener::Callers::Redialing,
    );
    let insecure = async {
        match insecure_listener {
            Some(listener) => {
                listener::serve_plain(
                    listener,
                    insecure_extender_router(state.clone()),
                    shutdown.clone(),
                    shutdown_grace,
                    limits,
                    listener::Callers::KeepAlive,
                )
                .await
            }
            None => Ok(()),
        }
    };
    let (webhooks, extender, admin, insecure) = tokio::join!(webhooks, extender, admin, insecure);
    webhooks.context("webhook listener")?;
    extender.context("extender listener")?;
    admin.context("admin listener")?;
    insecure.context("insecure extender listener")?;
    if let Some(task) = lease_task {
        // The Lease given up before the process ends (bounded inside the task).
        let _ = task.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Explicit paths must exist; with none given, the default dev paths are created when empty.
fn tls_paths(cert: Option<PathBuf>, key: Option<PathBuf>) -> anyhow::Result<(PathBuf, PathBuf)> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok((cert, key)),
        (None, None) => {
            let files = CertFiles::in_dir(Path::new(DEV_CERT_DIR));
            let outcome = certs::ensure(
                &files,
                &certs::dev_request(),
                std::time::Duration::from_secs(7 * 24 * 3600),
                time::OffsetDateTime::now_utc(),
            )
            .context("creating development certificates")?;
            if outcome != certs::Outcome::Kept {
                tracing::warn!(
                    dir = DEV_CERT_DIR,
                    ?outcome,
                    "using a development CA and serving certificate (valid for localhost); do not use in production"
                );
            }
            Ok((files.cert, files.key))
        }
        (Some(_), None) => anyhow::bail!("--tls-cert was given without --tls-key"),
        (None, Some(_)) => anyhow::bail!("--tls-key was given without --tls-cert"),
    }
}

/// The kernel's queue of connections not yet accepted, per listener (capped by
/// `net.core.somaxconn`, 4096 on current kernels). The default, 128, overflows in the
/// bursts of a flood's reconnects, and the kernel then drops the SYN of an honest client,
/// which retries it only a second later (a kubelet probe's whole timeout).
const LISTEN_BACKLOG: u32 = 4096;

async fn bind(address: std::net::SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    let listen = || -> std::io::Result<TcpListener> {
        let socket = match address {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(address)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().with_context(|| format!("{flag} {address}: cannot listen"))
}

async fn watch_certificates(
    resolver: Arc<CertResolver>,
    every: std::time::Duration,
    state: AppState,
    shutdown: CancellationToken,
) {
    let metrics = state.metrics.clone();
    let watched = resolver.clone();
    tls::reload_loop(
        resolver,
        every,
        move |result| {
            let label = match result {
                ReloadResult::Unchanged => return,
                ReloadResult::Reloaded => "reloaded",
                ReloadResult::Failed => "failed",
            };
            metrics
                .tls_reloads
                .get_or_create(&ResultLabels { result: label })
                .inc();
            metrics.tls_not_after.set(watched.not_after().unwrap_or(0));
        },
        shutdown,
    )
    .await;
}

/// First SIGTERM/SIGINT: turn unready and drain; a second one exits at once.
async fn stop_on_signal(state: AppState, shutdown: CancellationToken) {
    wait_for_signal().await;
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    state.shutting_down.store(true, Ordering::Release);
    shutdown.cancel();
    wait_for_signal().await;
    tracing::warn!("second signal: exiting now");
    std::process::exit(130);
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
