//! Every shape of flooding connection, one flood at a time: what each connection does
//! (at a TLS door or a plain one), reopened after a pause once it ends. The random
//! sieges (tests/siege.rs) and the full-scale ones (benches/flood.rs) draw from these.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{ANNOUNCED, BoxError, Flood, Target, slow_post, spawn_flood};

/// What one flooding connection does until the server closes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Connects and never sends a byte (no TLS ClientHello, no request).
    Silent,
    /// Finishes TLS (at a TLS door; at a plain one it is [`Shape::Silent`]), then nothing.
    IdleAfterTls,
    /// One request answered, then idle, kept alive.
    IdleAfterOne,
    /// A request head sent a byte a second, never whole; `after_one`: on a connection
    /// that had one request answered first.
    SlowHead { after_one: bool },
    /// A whole head announcing 4 MB, `burst` bytes of the body at once, then silence.
    StalledBody { burst: usize },
    /// A whole head announcing 4 MB, then the body a byte a second.
    TrickledBody,
    /// h2: `streams` requests at once, each like [`Shape::TrickledBody`].
    SlowStreams { streams: usize },
    /// Connects (and finishes TLS at a TLS door), then closes at once: churn.
    Churn,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Silent => write!(f, "silent"),
            Shape::IdleAfterTls => write!(f, "idle after TLS"),
            Shape::IdleAfterOne => write!(f, "idle after one request"),
            Shape::SlowHead { after_one: false } => write!(f, "slow head"),
            Shape::SlowHead { after_one: true } => write!(f, "slow head after one request"),
            Shape::StalledBody { burst } => write!(f, "{burst} B of body, then silence"),
            Shape::TrickledBody => write!(f, "body a byte a second"),
            Shape::SlowStreams { streams } => write!(f, "h2, {streams} slow streams"),
            Shape::Churn => write!(f, "churn"),
        }
    }
}

/// How long a flood runs: until `for_at_most` has passed or `max_opens` connections were
/// opened.
#[derive(Clone, Copy, Debug)]
pub struct Until {
    pub for_at_most: Duration,
    pub max_opens: u64,
}

/// `total` connections of `shape` to `target`, spread over `sources`, each reopened
/// `pause` after it ended; bodies and heads go to `path`; for as long as `until` says.
pub fn flood(
    target: &Target,
    shape: Shape,
    path: &'static str,
    sources: &[IpAddr],
    total: usize,
    pause: Duration,
    until: Until,
) -> Flood {
    let Until {
        for_at_most,
        max_opens,
    } = until;
    let target = target.clone();
    spawn_flood(sources, total, for_at_most, move |source, opened| {
        let target = target.clone();
        async move {
            while opened.load(Ordering::Relaxed) < max_opens {
                if one(&target, shape, path, source, &opened).await.is_err() {
                    // The backlog is full, or the server closed it mid-way: as a client would.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                tokio::time::sleep(pause).await;
            }
        }
    })
}

/// One connection of `shape`, until it ends.
async fn one(
    target: &Target,
    shape: Shape,
    path: &str,
    source: IpAddr,
    opened: &AtomicU64,
) -> Result<(), BoxError> {
    let alpn: &[u8] = match shape {
        Shape::SlowStreams { .. } => b"h2",
        _ => b"http/1.1",
    };
    if shape == Shape::Silent {
        let mut tcp = super::connect_from(source, target.addr).await?;
        opened.fetch_add(1, Ordering::Relaxed);
        return until_closed(&mut tcp).await;
    }
    let mut io = target.open(source, alpn, opened).await?;
    match shape {
        Shape::Silent | Shape::IdleAfterTls => until_closed(&mut io).await,
        Shape::Churn => Ok(()),
        Shape::IdleAfterOne => {
            exchange(&mut io, &get(target)).await?;
            until_closed(&mut io).await
        }
        Shape::SlowHead { after_one } => {
            if after_one {
                exchange(&mut io, &get(target)).await?;
            }
            let head = format!("POST {path} HTTP/1.1\r\nhost: localhost\r\n");
            io.write_all(head.as_bytes()).await?;
            drip(&mut io, b"x-slow: ").await
        }
        Shape::StalledBody { burst } => {
            io.write_all(post_head(path).as_bytes()).await?;
            io.write_all(&vec![b' '; burst]).await?;
            until_closed(&mut io).await
        }
        Shape::TrickledBody => {
            io.write_all(post_head(path).as_bytes()).await?;
            drip(&mut io, b"").await
        }
        Shape::SlowStreams { streams } => slow_streams_on(io, path, streams).await,
    }
}

/// `GET /version` at a TLS door, `GET <target.path>` at a plain one.
fn get(target: &Target) -> String {
    let path = if target.tls.is_some() {
        "/version"
    } else {
        target.path
    };
    format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n")
}

fn post_head(path: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {ANNOUNCED}\r\n\r\n"
    )
}

/// Writes `request` and reads its answer (a head and a `content-length` body).
async fn exchange(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
    request: &str,
) -> Result<(), BoxError> {
    io.write_all(request.as_bytes()).await?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if seen.len() >= end + 4 + length {
                return Ok(());
            }
        }
        let n = io.read(&mut buf).await?;
        if n == 0 {
            return Err("closed before the answer".into());
        }
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Reads until the server closes the connection (EOF or an error).
async fn until_closed(io: &mut (impl AsyncRead + Unpin)) -> Result<(), BoxError> {
    let mut buf = [0u8; 4096];
    while io.read(&mut buf).await? > 0 {}
    Ok(())
}

/// Writes `first`, then a byte a second, until the server closes the connection.
async fn drip(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
    first: &[u8],
) -> Result<(), BoxError> {
    io.write_all(first).await?;
    let mut buf = [0u8; 4096];
    loop {
        tokio::select! {
            read = io.read(&mut buf) => if read? == 0 { return Ok(()) },
            () = tokio::time::sleep(Duration::from_secs(1)) => io.write_all(b"a").await?,
        }
    }
}

/// `streams` slow POSTs over h2 on `io`, held until the server closes the connection.
pub(super) async fn slow_streams_on(
    io: Box<dyn super::Stream>,
    path: &str,
    streams: usize,
) -> Result<(), BoxError> {
    let (sender, conn) = hyper::client::conn::http2::handshake::<_, _, Body>(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(io),
    )
    .await?;
    let closed = tokio::spawn(conn);
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let mut sender = sender.clone();
        let request = slow_post(path)?;
        requests.spawn(async move { sender.send_request(request).await });
    }
    let _ = closed.await;
    requests.abort_all();
    Ok(())
}

/// Addresses `127.<net>.x.y` from the `first`-th on, `count` of them (up to 64,000 in a
/// net): floods from many distinct peers.
pub fn addresses(net: u8, first: usize, count: usize) -> Vec<IpAddr> {
    (first..first + count)
        .map(|i| {
            let (x, y) = (i / 250, i % 250 + 1);
            IpAddr::from([127, net, x as u8, y as u8])
        })
        .collect()
}
