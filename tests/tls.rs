//! The TLS layer end to end: certificates from `certs::ensure`, the real
//! `serve_tls` accept loop, a tokio-rustls client that trusts only our CA.
#![allow(clippy::unwrap_used)]

mod tls_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use gpu_admission::certs::{self, CertFiles, Outcome};
use gpu_admission::server::listener::{ConnectionLimits, serve_tls};
use gpu_admission::server::tls::{
    CertResolver, ReloadResult, TlsError, reload_loop, server_config,
};
use time::OffsetDateTime;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use tls_support::{Reply, client_config, der_of, dns_sans};

const DAY: Duration = Duration::from_secs(86_400);
/// Upper bound for anything the test waits on; never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(5);

fn fresh_certs() -> (tempfile::TempDir, CertFiles) {
    let dir = tempfile::tempdir().unwrap();
    let files = CertFiles::in_dir(dir.path());
    let outcome = certs::ensure(
        &files,
        &certs::dev_request(),
        DAY,
        OffsetDateTime::now_utc(),
    );
    assert_eq!(outcome.unwrap(), Outcome::Created);
    (dir, files)
}

/// Reissues the leaf under the same CA with one more DNS name.
fn rotate(files: &CertFiles, extra_host: &str) {
    let mut req = certs::dev_request();
    req.hosts.push(extra_host.into());
    let outcome = certs::ensure(files, &req, DAY, OffsetDateTime::now_utc()).unwrap();
    assert_eq!(outcome, Outcome::Renewed);
}

/// Waits (bounded) for the reload loop to report `want`.
async fn next_result(rx: &mut mpsc::UnboundedReceiver<ReloadResult>, want: ReloadResult) {
    let wait = async {
        while let Some(r) = rx.recv().await {
            if r == want {
                return;
            }
        }
        panic!("reload loop ended");
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("no {want:?} from the reload loop within {PATIENCE:?}"));
}

/// Opens new connections until one presents `want` (bounded).
async fn poll_until_served(
    addr: std::net::SocketAddr,
    client: &Arc<rustls::ClientConfig>,
    want: &rustls::pki_types::CertificateDer<'_>,
) -> Reply {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let reply = tls_support::get(addr, client.clone(), "/hello")
            .await
            .unwrap();
        if reply.peer == *want {
            return reply;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "new certificate not served within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/slow` signals `entered` and then waits for `release`, so the test can
/// hold a request in flight across shutdown without sleeping.
fn app(entered: Arc<Notify>, release: Arc<Notify>) -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route(
            "/slow",
            get(move || async move {
                entered.notify_one();
                release.notified().await;
                "slow done"
            }),
        )
}

#[tokio::test]
async fn serves_reloads_keeps_old_pair_on_garbage_and_shuts_down_gracefully() {
    let (_dir, files) = fresh_certs();
    let resolver = CertResolver::load(&files.cert, &files.key).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let server = tokio::spawn(serve_tls(
        listener,
        server_config(resolver.clone()),
        app(entered.clone(), release.clone()),
        shutdown.clone(),
        PATIENCE,
        ConnectionLimits::default(),
    ));
    let (tx, mut results) = mpsc::unbounded_channel();
    let on_result = move |r| {
        let _ = tx.send(r);
    };
    let reloader = tokio::spawn(reload_loop(
        resolver.clone(),
        Duration::from_millis(50),
        on_result,
        shutdown.clone(),
    ));
    let client = client_config(&files.ca_cert);

    // 1. A client trusting only our CA gets through and sees our leaf.
    let first = tls_support::get(addr, client.clone(), "/hello")
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.body, "hello");
    assert_eq!(first.peer, der_of(&files.cert));
    assert!(dns_sans(&first.peer).contains(&"localhost".to_string()));

    // 2. A new leaf on disk is served on new connections, no restart.
    rotate(&files, "rotated.example");
    let rotated = der_of(&files.cert);
    assert_ne!(rotated, first.peer);
    let second = poll_until_served(addr, &client, &rotated).await;
    assert!(dns_sans(&second.peer).contains(&"rotated.example".to_string()));
    next_result(&mut results, ReloadResult::Reloaded).await;

    // 3. Garbage on disk is rejected once, and the previous pair stays.
    // Renamed into place, as a Secret update is, so the loop never reads a
    // half-written file (which would be a second, different bad content).
    let tmp = files.cert.with_extension("tmp");
    std::fs::write(&tmp, b"-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    std::fs::rename(&tmp, &files.cert).unwrap();
    next_result(&mut results, ReloadResult::Failed).await;
    for _ in 0..2 {
        let r = tokio::time::timeout(PATIENCE, results.recv())
            .await
            .unwrap();
        assert_eq!(r, Some(ReloadResult::Unchanged), "bad pair retried");
    }
    let third = tls_support::get(addr, client.clone(), "/hello")
        .await
        .unwrap();
    assert_eq!(third.peer, rotated);
    assert_eq!(third.body, "hello");

    // 4. Graceful shutdown: an in-flight request finishes, then the server
    //    returns and the port refuses connections.
    let slow = tokio::spawn(tls_support::get(addr, client.clone(), "/slow"));
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .unwrap();
    shutdown.cancel();
    release.notify_one();
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.body, "slow done");
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("serve_tls did not return after shutdown")
        .unwrap()
        .unwrap();
    tokio::time::timeout(PATIENCE, reloader)
        .await
        .unwrap()
        .unwrap();
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(refused.is_err(), "port still accepting after shutdown");
}

#[tokio::test]
async fn client_trusting_another_ca_fails_the_handshake_and_server_keeps_going() {
    let (_dir, files) = fresh_certs();
    let (_other_dir, other) = fresh_certs();
    let resolver = CertResolver::load(&files.cert, &files.key).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let notify = Arc::new(Notify::new());
    let server = tokio::spawn(serve_tls(
        listener,
        server_config(resolver),
        app(notify.clone(), notify),
        shutdown.clone(),
        PATIENCE,
        ConnectionLimits::default(),
    ));

    let stranger = tls_support::connect(addr, client_config(&other.ca_cert), "localhost").await;
    let Err(err) = stranger else {
        panic!("handshake must fail for a client that does not trust our CA");
    };
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");

    // A client that connects and says nothing is left to its own task.
    let silent = tokio::net::TcpStream::connect(addr).await.unwrap();

    // A client speaking plain HTTP to the TLS port does not break the loop.
    {
        use tokio::io::AsyncWriteExt;
        let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
        plain.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    }
    let ok = tls_support::get(addr, client_config(&files.ca_cert), "/hello")
        .await
        .unwrap();
    assert_eq!(ok.body, "hello");

    // h2 over TLS (ALPN) works too.
    let (status, body) = tls_support::get_h2(addr, &files.ca_cert, "/hello")
        .await
        .unwrap();
    assert_eq!((status.as_u16(), body.as_str()), (200, "hello"));

    drop(silent);
    shutdown.cancel();
    tokio::time::timeout(PATIENCE, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn serve_plain_answers_http1_and_stops() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let router = Router::new().route("/livez", get(|| async { "ok" }));
    let server = tokio::spawn(gpu_admission::server::listener::serve_plain(
        listener,
        router,
        shutdown.clone(),
        PATIENCE,
        ConnectionLimits::default(),
        gpu_admission::server::listener::Callers::Redialing,
    ));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, axum::body::Body>(
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = axum::http::Request::get("/livez")
        .header("host", "localhost")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(sender);
    shutdown.cancel();
    tokio::time::timeout(PATIENCE, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

// --- CertResolver without a server -------------------------------------

fn load(files: &CertFiles) -> Result<Arc<CertResolver>, TlsError> {
    CertResolver::load(&files.cert, &files.key)
}

#[test]
fn load_errors_name_the_problem_and_the_path() {
    let (dir, files) = fresh_certs();
    let missing = dir.path().join("nope.crt");
    match CertResolver::load(&missing, &files.key) {
        Err(TlsError::Missing { path }) => assert_eq!(path, missing),
        other => panic!("unexpected {other:?}"),
    }

    // Key file holding a certificate: no private key.
    match CertResolver::load(&files.cert, &files.ca_cert) {
        Err(TlsError::NoPrivateKey { path }) => assert_eq!(path, files.ca_cert),
        other => panic!("unexpected {other:?}"),
    }

    // The CA key with the leaf cert: a valid key, the wrong one.
    match CertResolver::load(&files.cert, &files.ca_key) {
        Err(TlsError::KeyMismatch { cert, key }) => {
            assert_eq!((cert, key), (files.cert.clone(), files.ca_key.clone()));
        }
        other => panic!("unexpected {other:?}"),
    }

    // Outside its validity window, either way.
    let (_old_dir, expired) = certs_at(OffsetDateTime::now_utc() - time::Duration::days(400));
    assert!(matches!(load(&expired), Err(TlsError::Expired { .. })));
    let (_new_dir, early) = certs_at(OffsetDateTime::now_utc() + time::Duration::hours(1));
    assert!(matches!(load(&early), Err(TlsError::NotYetValid { .. })));

    std::fs::write(&files.cert, b"not pem at all").unwrap();
    match load(&files) {
        Err(TlsError::NoCertificate { path }) => assert_eq!(path, files.cert),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn reload_if_changed_swaps_good_pairs_and_reports_a_bad_one_once() {
    let (_dir, files) = fresh_certs();
    let resolver = load(&files).unwrap();
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Unchanged);
    assert_served(&resolver, &files.cert);

    rotate(&files, "a.example");
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Reloaded);
    assert_served(&resolver, &files.cert);
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Unchanged);

    // Mismatched pair: the key of the CA next to the leaf.
    std::fs::copy(&files.ca_key, &files.key).unwrap();
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Failed);
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Unchanged);
    let rotated = files.cert.clone();
    assert_served(&resolver, &rotated);

    // Missing file: reported once too.
    std::fs::remove_file(&files.cert).unwrap();
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Failed);
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Unchanged);

    // A good pair again is picked up.
    rotate_from_scratch(&files);
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Reloaded);
    assert_served(&resolver, &files.cert);
}

/// A CA and leaf created as if the clock said `now`.
fn certs_at(now: OffsetDateTime) -> (tempfile::TempDir, CertFiles) {
    let dir = tempfile::tempdir().unwrap();
    let files = CertFiles::in_dir(dir.path());
    certs::ensure(&files, &certs::dev_request(), DAY, now).unwrap();
    (dir, files)
}

#[test]
fn a_not_yet_valid_pair_is_reported_once_and_the_old_one_kept() {
    let (_dir, files) = fresh_certs();
    let resolver = load(&files).unwrap();
    let (_early_dir, early) = certs_at(OffsetDateTime::now_utc() + time::Duration::hours(1));
    std::fs::copy(&early.cert, &files.cert).unwrap();
    std::fs::copy(&early.key, &files.key).unwrap();
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Failed);
    // Re-checked (it may become valid as time passes) but not re-reported.
    assert_eq!(resolver.reload_if_changed(), ReloadResult::Unchanged);
    assert_ne!(resolver.current().cert[0], der_of(&files.cert));
}

/// Issues a fresh leaf after the test broke the files on purpose.
fn rotate_from_scratch(files: &CertFiles) {
    let outcome =
        certs::ensure(files, &certs::dev_request(), DAY, OffsetDateTime::now_utc()).unwrap();
    assert_eq!(outcome, Outcome::Renewed);
}

fn assert_served(resolver: &CertResolver, cert: &Path) {
    assert_eq!(resolver.current().cert[0], der_of(cert));
    let expiry = certs::not_after(&std::fs::read(cert).unwrap()).unwrap();
    assert_eq!(resolver.not_after(), Some(expiry.unix_timestamp()));
}
