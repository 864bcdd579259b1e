//! A connection flood and the honest callers that must get through it, shared by
//! tests/doors.rs (does every honest call succeed) and benches/flood.rs (how fast,
//! before and after).
//!
//! The flood comes from loopback addresses other than 127.0.0.1 (Linux routes all of
//! 127.0.0.0/8 on `lo`), the honest callers from 127.0.0.1: on one machine, the
//! flooders are other pods and the honest callers the API server and the kubelet.
//! Every loop is bounded by a deadline and a count.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `count` loopback addresses from 127.0.0.`first`.
pub fn loopback(first: u8, count: u8) -> Vec<IpAddr> {
    (0..count)
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, first + i)))
        .collect()
}

/// Flooding connections, running until stopped (or dropped) or their deadline.
pub struct Flood {
    /// Connections opened so far (the first round and every reopening).
    pub opened: Arc<AtomicU64>,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl Flood {
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Waits (at most `patience`) until `n` connections have been opened.
    pub async fn wait_for(&self, n: u64, patience: Duration) {
        let until = Instant::now() + patience;
        while self.opened() < n && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(mut self) -> u64 {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        self.opened()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A TCP connection to `addr` from `source` (any port).
async fn connect_from(source: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(addr).await
}

/// `total` connections to `addr`, spread over `sources`, that never send a byte (no
/// TLS ClientHello, no HTTP request); each is reopened as soon as the server closes it,
/// until `for_at_most` has passed or `max_opens` were opened.
pub fn half_open(
    addr: SocketAddr,
    sources: &[IpAddr],
    total: usize,
    for_at_most: Duration,
    max_opens: u64,
) -> Flood {
    spawn_flood(
        sources,
        total,
        for_at_most,
        move |source, opened| async move {
            while opened.load(Ordering::Relaxed) < max_opens {
                let Ok(mut stream) = connect_from(source, addr).await else {
                    // The backlog is full: try again shortly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                // Hold it until the server closes it.
                let _ = stream.read(&mut [0u8; 64]).await;
            }
        },
    )
}

/// `total` keep-alive HTTP/1.1 connections to the plain listener at `addr`, spread over
/// `sources`, each sending `GET path` back to back (reconnecting when closed), until
/// `for_at_most` has passed or `max_opens` requests or connections were made.
pub fn scrapes(
    addr: SocketAddr,
    sources: &[IpAddr],
    total: usize,
    path: &'static str,
    for_at_most: Duration,
    max_opens: u64,
) -> Flood {
    spawn_flood(
        sources,
        total,
        for_at_most,
        move |source, opened| async move {
            while opened.load(Ordering::Relaxed) < max_opens {
                let Ok(stream) = connect_from(source, addr).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                let _ = scrape_until_closed(stream, path, &opened, max_opens).await;
            }
        },
    )
}

/// `total` tasks, the i-th running `each(sources[i % len], opened)` until it ends, the
/// flood is stopped, or `for_at_most` has passed.
fn spawn_flood<F, Fut>(sources: &[IpAddr], total: usize, for_at_most: Duration, each: F) -> Flood
where
    F: Fn(IpAddr, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let opened = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let deadline = tokio::time::Instant::now() + for_at_most;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let work = each(sources[i % sources.len()], opened.clone());
        let stop = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep_until(deadline) => {}
                () = work => {}
            }
        });
    }
    Flood {
        opened,
        stop,
        tasks,
    }
}

async fn scrape_until_closed(
    stream: TcpStream,
    path: &str,
    count: &AtomicU64,
    max: u64,
) -> Result<(), BoxError> {
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    while count.fetch_add(1, Ordering::Relaxed) < max {
        let request = axum::http::Request::get(path)
            .header("host", "localhost")
            .body(Body::empty())?;
        let response = sender.send_request(request).await?;
        axum::body::to_bytes(Body::new(response.into_body()), 16 << 20).await?;
    }
    Ok(())
}

/// An AdmissionReview of a pod without GPUs: allowed, charges nobody.
pub fn review() -> String {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "honest-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web", "namespace": "default",
            "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            },
            "oldObject": null, "dryRun": false
        }
    })
    .to_string()
}

/// One `POST /validate` on a fresh TLS connection from 127.0.0.1: how long it took, or
/// what went wrong (an error, a status other than 200, no answer within `patience`).
pub async fn validate_once(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    patience: Duration,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    tokio::time::timeout(patience, async {
        let tcp = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr).await?;
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(tls)
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let request = axum::http::Request::post("/validate")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Body::from(review()))?;
        expect_ok(sender.send_request(request).await?).await
    })
    .await??;
    Ok(started.elapsed())
}

/// One `GET /livez` on a fresh plain connection from 127.0.0.1, as the kubelet probes.
pub async fn probe_once(addr: SocketAddr, patience: Duration) -> Result<Duration, BoxError> {
    let started = Instant::now();
    tokio::time::timeout(patience, async {
        let tcp = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let request = axum::http::Request::get("/livez")
            .header("host", "localhost")
            .body(Body::empty())?;
        expect_ok(sender.send_request(request).await?).await
    })
    .await??;
    Ok(started.elapsed())
}

async fn expect_ok(response: hyper::Response<hyper::body::Incoming>) -> Result<(), BoxError> {
    let status = response.status();
    let body = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await?;
    if status != axum::http::StatusCode::OK {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)).into());
    }
    Ok(())
}

/// What a series of honest calls saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub latencies: Vec<Duration>,
    pub failures: Vec<String>,
}

impl Outcome {
    pub fn record(&mut self, result: Result<Duration, BoxError>) {
        match result {
            Ok(took) => self.latencies.push(took),
            Err(err) => self.failures.push(err.to_string()),
        }
    }

    /// The `q` quantile (0..=1) of the successful calls' latencies.
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    pub fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        format!(
            "{} ok, {} failed; p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.latencies.len(),
            self.failures.len(),
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99)),
            ms(self.quantile(1.0)),
        )
    }
}

/// `calls` honest calls made one after another, `every` apart.
pub async fn honest<F, Fut>(calls: usize, every: Duration, call: F) -> Outcome
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Duration, BoxError>>,
{
    let mut outcome = Outcome::default();
    for _ in 0..calls {
        outcome.record(call().await);
        tokio::time::sleep(every).await;
    }
    outcome
}

/// A new CA and a client certificate it signed (clientAuth): the CA's PEM file in
/// `dir`, and the certificate with its key.
pub fn client_pki(
    dir: &std::path::Path,
    name: &str,
) -> (
    std::path::PathBuf,
    rustls::pki_types::CertificateDer<'static>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["kube-apiserver".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let ca_path = dir.join(format!("{name}.crt"));
    std::fs::write(&ca_path, ca_cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    (ca_path, cert.der().clone(), key)
}
