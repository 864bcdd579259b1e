//! The API server as a webhook's client, as client-go's transport (Go's `net/http`)
//! behaves: one peer (127.0.0.1) keeping a pool of idle keep-alive HTTP/1.1 connections
//! over TLS (at most 25, client-go's `MaxIdleConnsPerHost`), each review sent on the
//! connection that went idle last, a new connection dialled when none is idle (a burst
//! dials many at once), a connection found closed dropped from the pool; a review
//! written on a connection the server then closes fails, except when nothing of it was
//! written (Go retries those on another connection). Every review has a deadline (the
//! webhook's `timeoutSeconds`); one not answered 200 by then is not answered, and the
//! API server applies the failure policy.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio_util::sync::CancellationToken;

use super::{BoxError, Outcome, connect_from, expect_ok, review};

/// client-go's `MaxIdleConnsPerHost`.
const MAX_IDLE: usize = 25;

/// When the API server sends reviews.
#[derive(Clone, Copy, Debug)]
pub struct Traffic {
    /// Reviews a second, evenly spaced.
    pub per_second: u32,
    /// Besides, this many reviews at once (a Deployment scaled up) every `burst_every`;
    /// 0: none.
    pub burst: usize,
    pub burst_every: Duration,
}

/// The modelled API server, sending reviews until dropped (or an hour has passed).
pub struct ApiServer {
    sent: super::Sent,
    patience: Duration,
    stop: CancellationToken,
    dialled: Arc<AtomicU64>,
}

type Pool = Arc<std::sync::Mutex<Vec<SendRequest<Body>>>>;

impl ApiServer {
    /// Starts sending reviews to the webhook door at `addr` as `traffic` says, each with
    /// `patience` to be answered.
    pub fn start(
        addr: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        traffic: Traffic,
        patience: Duration,
    ) -> ApiServer {
        let pool: Pool = Arc::default();
        let dialled = Arc::new(AtomicU64::new(0));
        let (record, sent) = tokio::sync::mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let until = stop.clone();
        let client = Client {
            addr,
            tls,
            pool,
            dialled: dialled.clone(),
        };
        tokio::spawn(async move {
            let steady = Duration::from_secs(1) / traffic.per_second.max(1);
            let mut ticks = tokio::time::interval(steady);
            let mut bursts = tokio::time::interval(traffic.burst_every.max(steady));
            let hour = tokio::time::sleep(Duration::from_secs(3600));
            tokio::pin!(hour);
            loop {
                let at_once = tokio::select! {
                    () = until.cancelled() => return,
                    () = &mut hour => return,
                    _ = ticks.tick(), if traffic.per_second > 0 => 1,
                    _ = bursts.tick(), if traffic.burst > 0 => traffic.burst,
                };
                for _ in 0..at_once {
                    let (client, record) = (client.clone(), record.clone());
                    tokio::spawn(async move {
                        let due = Instant::now();
                        let answered = tokio::time::timeout(patience, client.review())
                            .await
                            .unwrap_or_else(|_| Err("not answered in time".into()));
                        let answered = answered.map(|()| due.elapsed());
                        let _ = record.send((due, answered.map_err(|e| e.to_string())));
                    });
                }
            }
        });
        ApiServer {
            sent,
            patience,
            stop,
            dialled,
        }
    }

    /// What the reviews due in the next `window` saw (latency from the moment each was
    /// due).
    pub async fn measure(&mut self, window: Duration) -> Outcome {
        super::measure(&mut self.sent, self.patience, window).await
    }

    /// Connections it has dialled so far.
    pub fn dialled(&self) -> u64 {
        self.dialled.load(Ordering::Relaxed)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Clone)]
struct Client {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    pool: Pool,
    dialled: Arc<AtomicU64>,
}

impl Client {
    /// One review: on the connection that went idle last, or a new one.
    async fn review(&self) -> Result<(), BoxError> {
        let mut request = review_request()?;
        loop {
            let (mut sender, reused) = match self.idle() {
                Some(sender) => (sender, true),
                None => (self.dial().await?, false),
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    expect_ok(response).await?;
                    self.keep(sender);
                    return Ok(());
                }
                Err(mut failed) => match failed.take_message() {
                    // Nothing of it was written: Go sends it on another connection.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(failed.into_error().into()),
                },
            }
        }
    }

    /// The connection that went idle last, dropping those found closed.
    fn idle(&self) -> Option<SendRequest<Body>> {
        let mut pool = self.pool.lock().unwrap();
        while let Some(sender) = pool.pop() {
            if !sender.is_closed() && sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    /// Back to the pool once its answer was read, unless the pool is full.
    fn keep(&self, sender: SendRequest<Body>) {
        let mut pool = self.pool.lock().unwrap();
        if pool.len() < MAX_IDLE {
            pool.push(sender);
        }
    }

    /// A new keep-alive connection over TLS from 127.0.0.1.
    async fn dial(&self) -> Result<SendRequest<Body>, BoxError> {
        self.dialled.fetch_add(1, Ordering::Relaxed);
        let tcp = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok(sender)
    }
}

fn review_request() -> Result<axum::http::Request<Body>, BoxError> {
    Ok(axum::http::Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Body::from(review()))?)
}
