//! A connection flood and the honest callers that must get through it, shared by
//! tests/doors.rs (does every honest call succeed) and benches/flood.rs (how fast,
//! before and after).
//!
//! The flood comes from loopback addresses other than 127.0.0.1 (Linux routes all of
//! 127.0.0.0/8 on `lo`), the honest callers from 127.0.0.1: on one machine, the
//! flooders are other pods and the honest callers the API server and the kubelet.
//! Every flooding connection is reopened as soon as the server closes it; every loop is
//! bounded by a deadline and a count. The kinds: [`half_open`] (never a byte),
//! [`idle_after_one`] (one request, then idle), [`slow_bodies`] (a full head announcing
//! 4 MB, then a byte a second), [`slow_streams`] (h2, streams sending their bodies a byte
//! a second), [`scrapes`] (requests back to back); every other shape, one flood at a
//! time: [`flood`] with a [`Shape`]. The modelled API server, a client-go webhook
//! client: [`ApiServer`].
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

mod api_server;
mod kubelet;
mod shapes;
pub use api_server::{ApiServer, Traffic};
#[allow(unused_imports)]
pub use kubelet::Kubelet;
// Not every includer floods with every shape.
#[allow(unused_imports)]
pub use shapes::{Shape, Until, addresses, flood};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `count` loopback addresses from 127.0.0.`first`.
pub fn loopback(first: u8, count: u8) -> Vec<IpAddr> {
    loopback_in(0, first, count)
}

/// `count` loopback addresses from 127.0.`net`.`first`.
pub fn loopback_in(net: u8, first: u8, count: u8) -> Vec<IpAddr> {
    (0..count)
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, net, first + i)))
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

/// A door to flood: its address, and the client TLS config when it is a TLS door.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// What the flood asks for: `/validate` at the webhook door, `/livez` at the admin's.
    pub path: &'static str,
}

/// A byte stream to a door: plain TCP or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

impl Target {
    /// A connection from `source`, through TLS (offering `alpn`) at a TLS door; counted in
    /// `opened` once connected.
    async fn open(
        &self,
        source: IpAddr,
        alpn: &[u8],
        opened: &AtomicU64,
    ) -> Result<Box<dyn Stream>, BoxError> {
        let tcp = connect_from(source, self.addr).await?;
        opened.fetch_add(1, Ordering::Relaxed);
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let mut config = (**tls).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        Ok(Box::new(tls))
    }
}

/// Runs `each` for every connection of a flood, reopening at once (after a short pause
/// when the connect itself fails: the backlog is full) until `max_opens` were opened.
async fn reopening<F, Fut>(max_opens: u64, opened: &AtomicU64, mut each: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    while opened.load(Ordering::Relaxed) < max_opens {
        if each().await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `total` connections to `target`, spread over `sources`, that each make one request
/// (`GET /version` at a TLS door, `GET target.path` at a plain one) and then sit idle,
/// kept alive, until the server closes them.
pub fn idle_after_one(
    target: &Target,
    sources: &[IpAddr],
    total: usize,
    for_at_most: Duration,
    max_opens: u64,
) -> Flood {
    let target = target.clone();
    spawn_flood(sources, total, for_at_most, move |source, opened| {
        let target = target.clone();
        async move {
            let path = if target.tls.is_some() {
                "/version"
            } else {
                target.path
            };
            reopening(max_opens, &opened, || async {
                let io = target.open(source, b"http/1.1", &opened).await?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(io)).await?;
                let closed = tokio::spawn(conn);
                let request = axum::http::Request::get(path)
                    .header("host", "localhost")
                    .body(Body::empty())?;
                let response = sender.send_request(request).await?;
                axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await?;
                let _ = closed.await;
                Ok(())
            })
            .await;
        }
    })
}

/// A body that sends a byte a second.
fn trickle() -> Body {
    let bytes = futures::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((Ok::<_, std::io::Error>(Bytes::from_static(b" ")), ()))
    });
    Body::from_stream(bytes)
}

/// What a slow body announces.
pub const ANNOUNCED: &str = "4000000";

/// `POST path` with `Content-Length: 4000000` and the body a byte a second.
pub fn slow_post(path: &str) -> Result<axum::http::Request<Body>, BoxError> {
    Ok(axum::http::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("content-length", ANNOUNCED)
        .body(trickle())?)
}

/// `total` HTTP/1.1 connections to `target`, spread over `sources`, each sending a full
/// request head announcing 4 MB and then the body a byte a second.
pub fn slow_bodies(
    target: &Target,
    sources: &[IpAddr],
    total: usize,
    for_at_most: Duration,
    max_opens: u64,
) -> Flood {
    let target = target.clone();
    spawn_flood(sources, total, for_at_most, move |source, opened| {
        let target = target.clone();
        async move {
            reopening(max_opens, &opened, || async {
                let io = target.open(source, b"http/1.1", &opened).await?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(io)).await?;
                tokio::spawn(conn);
                let response = sender.send_request(slow_post(target.path)?).await?;
                axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await?;
                Ok(())
            })
            .await;
        }
    })
}

/// `total` h2 connections to `target` (ALPN `h2`, or prior knowledge at a plain door),
/// spread over `sources`, each with `streams` requests like [`slow_bodies`]' at once,
/// held until the server closes the connection.
pub fn slow_streams(
    target: &Target,
    sources: &[IpAddr],
    total: usize,
    streams: usize,
    for_at_most: Duration,
    max_opens: u64,
) -> Flood {
    let target = target.clone();
    spawn_flood(sources, total, for_at_most, move |source, opened| {
        let target = target.clone();
        async move {
            reopening(max_opens, &opened, || async {
                let io = target.open(source, b"h2", &opened).await?;
                shapes::slow_streams_on(io, target.path, streams).await
            })
            .await;
        }
    })
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
/// A probe not answered within its patience says how long its connect took.
pub async fn probe_once(addr: SocketAddr, patience: Duration) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let connected = std::sync::Mutex::new(None);
    tokio::time::timeout(patience, async {
        let tcp = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr).await?;
        *connected.lock().unwrap() = Some(started.elapsed());
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let request = axum::http::Request::get("/livez")
            .header("host", "localhost")
            .body(Body::empty())?;
        expect_ok(sender.send_request(request).await?).await
    })
    .await
    .map_err(|_| match *connected.lock().unwrap() {
        Some(took) => format!("not answered in {patience:?}; connected in {took:?}"),
        None => format!("not even connected in {patience:?}"),
    })??;
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

/// What a caller sends: when each request was due, and what it saw (its latency from
/// then, or why it failed).
type Sent = tokio::sync::mpsc::UnboundedReceiver<(Instant, Result<Duration, String>)>;

/// What the requests of `sent` due in the next `window` saw, once each has reported
/// (`patience` after the window, with a margin).
async fn measure(sent: &mut Sent, patience: Duration, window: Duration) -> Outcome {
    let from = Instant::now();
    tokio::time::sleep(window).await;
    let to = Instant::now();
    tokio::time::sleep(patience + Duration::from_millis(200)).await;
    let mut outcome = Outcome::default();
    while let Ok((due, result)) = sent.try_recv() {
        if due >= from && due < to {
            outcome.record(result.map_err(BoxError::from));
        }
    }
    outcome
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

    /// Calls made.
    pub fn total(&self) -> usize {
        self.latencies.len() + self.failures.len()
    }

    /// Whether at least `percent` of the calls were answered.
    pub fn answered_at_least(&self, percent: usize) -> bool {
        self.latencies.len() * 100 >= self.total() * percent
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

/// Packets the kernel's connection tracking has dropped in this network namespace
/// because its table was full (`drop` in `/proc/net/stat/nf_conntrack`, summed over the
/// CPUs), or `None` where it is not loaded. A flood that churns connections fills the
/// table with closed ones (each kept two minutes, `nf_conntrack_tcp_timeout_time_wait`);
/// then new connections (a probe's, a redial's) lose their SYNs before any server sees
/// them. A bench or test that counts drops can tell that apart from the server's doing.
pub fn conntrack_drops() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/net/stat/nf_conntrack").ok()?;
    let mut lines = stat.lines();
    let column = lines.next()?.split_whitespace().position(|h| h == "drop")?;
    let per_cpu = lines.map(|line| {
        let value = line.split_whitespace().nth(column).unwrap_or("0");
        u64::from_str_radix(value, 16).unwrap_or(0)
    });
    Some(per_cpu.sum())
}

/// What [`conntrack_drops`] counted since `before`, as a phrase for a failure message.
pub fn conntrack_note(before: Option<u64>) -> String {
    match (before, conntrack_drops()) {
        (Some(before), Some(now)) if now > before => format!(
            "; meanwhile the kernel dropped {} packets for a full conntrack table",
            now - before
        ),
        _ => String::new(),
    }
}

/// Held by each test that floods, so that floods (and the CPU they take) do not overlap.
pub static ONE_FLOOD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Honest calls made one after another, `every` apart, for `window`.
pub async fn honest_for<F, Fut>(window: Duration, every: Duration, call: F) -> Outcome
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Duration, BoxError>>,
{
    let until = Instant::now() + window;
    let mut outcome = Outcome::default();
    while Instant::now() < until {
        outcome.record(call().await);
        tokio::time::sleep(every).await;
    }
    outcome
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
