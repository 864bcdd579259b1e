//! The doors, as a hostile client meets them: each listener serves only its own routes,
//! the webhook door can require the API server's client certificate, bodies over a
//! route's limit get 413 with a reason (HTTP/1.1 and h2), slow bodies get 408, idle
//! connections are closed, and a listener holds at most its cap of connections.
#![allow(clippy::unwrap_used)]

mod common;
mod tls_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::StreamExt;
use gpu_admission::certs::{self, CertFiles};
use gpu_admission::config::Config;
use gpu_admission::server::tls::{
    CertResolver, ConnectionLimits, mutual_server_config, serve_tls, server_config,
};
use gpu_admission::server::{extender_router, webhook_router};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Upper bound for anything a test waits on; never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(10);

fn cluster() -> String {
    common::vcuda_node("t4-1", 400, 64, "Tesla-T4")
}

struct Door {
    addr: SocketAddr,
    ca: PathBuf,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// One door over real TLS (the webhook router unless `extender`), with `limits`.
async fn door(extender: bool, limits: ConnectionLimits, client_ca: Option<&Path>) -> Door {
    let dir = tempfile::tempdir().unwrap();
    let files = CertFiles::in_dir(dir.path());
    certs::ensure(
        &files,
        &certs::dev_request(),
        Duration::from_secs(86_400),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    let (mut state, _) = common::app(&cluster(), Config::default());
    state.body_timeout = limits.request_timeout;
    let router = if extender {
        extender_router(state)
    } else {
        webhook_router(state)
    };
    let resolver = CertResolver::load(&files.cert, &files.key).unwrap();
    let tls = match client_ca {
        Some(ca) => mutual_server_config(resolver, ca).unwrap(),
        None => server_config(resolver),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let token = shutdown.clone();
    tokio::spawn(async move {
        let _ = stopped.await;
        token.cancel();
    });
    tokio::spawn(serve_tls(
        listener,
        tls,
        router,
        shutdown,
        Duration::from_millis(100),
        limits,
    ));
    Door {
        addr,
        ca: files.ca_cert.clone(),
        _dir: dir,
        _stop: stop,
    }
}

async fn status_of(router: Router, method: &str, path: &str) -> StatusCode {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::from("{}"))
        .unwrap();
    router.oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn each_door_serves_only_its_own_routes() {
    let (state, _) = common::app(&cluster(), Config::default());
    let webhooks = webhook_router(state.clone());
    let extender = extender_router(state);
    for path in [
        "/scheduler/predicates",
        "/scheduler/filter",
        "/scheduler/vpredicates",
    ] {
        assert_eq!(
            status_of(webhooks.clone(), "POST", path).await,
            StatusCode::NOT_FOUND
        );
        assert_ne!(
            status_of(extender.clone(), "POST", path).await,
            StatusCode::NOT_FOUND
        );
    }
    for path in ["/validate", "/mutate"] {
        assert_eq!(
            status_of(extender.clone(), "POST", path).await,
            StatusCode::NOT_FOUND
        );
        assert_ne!(
            status_of(webhooks.clone(), "POST", path).await,
            StatusCode::NOT_FOUND
        );
    }
    for router in [webhooks, extender] {
        assert_eq!(
            status_of(router.clone(), "GET", "/version").await,
            StatusCode::OK
        );
        assert_eq!(
            status_of(router, "GET", "/metrics").await,
            StatusCode::NOT_FOUND
        );
    }
}

/// POST `body` over HTTP/1.1 or h2; `announce` sends Content-Length, else the body
/// streams in chunks of unknown total length.
async fn post(
    door: &Door,
    h2: bool,
    path: &str,
    body: Vec<u8>,
    announce: bool,
) -> (StatusCode, String) {
    let mut config = (*tls_support::client_config(&door.ca)).clone();
    config.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    let tls = tls_support::connect(door.addr, Arc::new(config), "localhost")
        .await
        .unwrap();
    let body = if announce {
        Body::from(body)
    } else {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            body.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
        Body::from_stream(futures::stream::iter(chunks))
    };
    let request = Request::post(format!("https://localhost{path}"))
        .header("host", "localhost")
        .body(body)
        .unwrap();
    let response = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Body>(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        sender.send_request(request).await
    } else {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        sender.send_request(request).await
    };
    let response = response.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_with_a_reason_on_http1_and_h2() {
    let webhooks = door(false, ConnectionLimits::default(), None).await;
    let extender = door(true, ConnectionLimits::default(), None).await;
    let review = vec![b' '; 10 << 20];
    let filter = vec![b' '; 40 << 20];
    for (door, path, body, limit) in [
        (&webhooks, "/validate", &review, "4 MiB"),
        (&extender, "/scheduler/predicates", &filter, "32 MiB"),
    ] {
        for (h2, announce) in [(false, true), (false, false), (true, true), (true, false)] {
            let (status, text) =
                tokio::time::timeout(PATIENCE, post(door, h2, path, body.clone(), announce))
                    .await
                    .unwrap();
            assert_eq!(
                status,
                StatusCode::PAYLOAD_TOO_LARGE,
                "h2={h2} announce={announce}"
            );
            assert!(text.contains(limit), "{text}");
        }
    }
}

#[tokio::test]
async fn a_client_that_sends_its_whole_oversized_body_first_still_reads_the_413() {
    let door = door(false, ConnectionLimits::default(), None).await;
    let mut tls =
        tls_support::connect(door.addr, tls_support::client_config(&door.ca), "localhost")
            .await
            .unwrap();
    let body = vec![b' '; 10 << 20];
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body)
        .await
        .expect("the server reset the connection mid-body");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, tls.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("limit of 4 MiB"), "{answer}");
}

#[tokio::test]
async fn a_body_trickled_slower_than_the_request_timeout_gets_408() {
    let limits = ConnectionLimits {
        request_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let door = door(false, limits, None).await;
    let tls = tls_support::connect(door.addr, tls_support::client_config(&door.ca), "localhost")
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    // One byte now, the rest never: the body does not arrive in time.
    let trickle = futures::stream::once(async { Ok::<_, std::io::Error>(b"{".to_vec()) })
        .chain(futures::stream::pending());
    let request = Request::post("/validate")
        .header("host", "localhost")
        .header("content-length", "100")
        .body(Body::from_stream(trickle))
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, sender.send_request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
}

#[tokio::test]
async fn idle_connections_are_closed_and_the_cap_holds_others_back() {
    let limits = ConnectionLimits {
        max_connections: 2,
        idle_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let door = door(false, limits, None).await;
    let config = tls_support::client_config(&door.ca);
    let mut first = tls_support::connect(door.addr, config.clone(), "localhost")
        .await
        .unwrap();
    let _second = tls_support::connect(door.addr, config.clone(), "localhost")
        .await
        .unwrap();
    // A third client waits: the server does not accept it while two are open...
    let third = tokio::spawn(tls_support::get(door.addr, config.clone(), "/version"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past the cap of 2"
    );
    // ...until the idle ones are closed by the server, then it is served.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(PATIENCE, first.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the idle connection must be closed"
    );
    let reply = tokio::time::timeout(PATIENCE, third)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
}

/// A new CA and a client certificate it signed (clientAuth): the CA's PEM file in
/// `dir`, and the certificate with its key.
fn client_pki(
    dir: &Path,
    name: &str,
) -> (PathBuf, CertificateDer<'static>, PrivateKeyDer<'static>) {
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
    let key = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    (ca_path, cert.der().clone(), key)
}

/// A client that trusts the door's CA and presents `cert`.
fn client_with(
    server_ca: &Path,
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(tls_support::der_of(server_ca)).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(vec![cert], key)
    .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[tokio::test]
async fn the_webhook_door_can_require_the_api_servers_client_certificate() {
    let pki = tempfile::tempdir().unwrap();
    let (client_ca, cert, key) = client_pki(pki.path(), "apiserver-ca");
    let (_, stranger_cert, stranger_key) = client_pki(pki.path(), "other-ca");
    let door = door(false, ConnectionLimits::default(), Some(&client_ca)).await;
    let review = |config| tls_support::get(door.addr, config, "/version");
    // Without a client certificate, or with one another CA signed: refused at the TLS
    // layer, nothing is served.
    assert!(review(tls_support::client_config(&door.ca)).await.is_err());
    assert!(
        review(client_with(&door.ca, stranger_cert, stranger_key))
            .await
            .is_err()
    );
    let reply = review(client_with(&door.ca, cert, key)).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
}
