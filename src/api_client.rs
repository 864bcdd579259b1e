//! The kube client gpu-admission talks to the API server with: kube's own stack (base
//! URI, authentication, rustls) on a connector with TCP_NODELAY, and a deadline on every
//! request.
//!
//! Why a deadline: neither kube's default client nor this one has a read timeout, so a
//! `get` or `patch` sent on a connection whose peer has gone silent (a half-open
//! connection after a failover: no reset ever comes) would wait until the kernel gives
//! up, and with it the quota queue's releaser, the reconciler or the lease. Admission
//! requests are bounded by the listener's request timeout already. The answer's headers
//! must come within the deadline, and then each piece of its body (a long list arrives
//! in many). A watch is long-running, but never silent for long: the API server sends a
//! bookmark about every minute to a watch that asks for them (kube's watcher does), so a
//! watch that has sent nothing for [`WATCH_SILENCE`] is cut and listed again
//! (`cache/watch.rs`). Without that, a watch whose connection died without a reset left a
//! replica's cache frozen for minutes, while its requests, on other connections, went
//! through (docs/design.md, "Watches").

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use tower::{BoxError, Layer, Service};
use tower_http::timeout::TimeoutBody;

/// A little past kube-apiserver's own `--request-timeout` (60 s by default), so no
/// request the server would still answer is cut.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(70);

/// How long a watch may send nothing, not even a bookmark, before it is cut: two of the
/// API server's bookmark periods (a minute each).
pub(crate) const WATCH_SILENCE: Duration = Duration::from_secs(120);

/// How long the client waits on the API server.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadlines {
    /// For an answer's headers, and then for each piece of a body that is not a watch's.
    pub(crate) answer: Duration,
    /// For each piece of a watch's body.
    pub(crate) watch_silence: Duration,
}

impl Deadlines {
    pub(crate) const DEFAULT: Deadlines = Deadlines {
        answer: REQUEST_DEADLINE,
        watch_silence: WATCH_SILENCE,
    };
}

/// A kube client on `config`, with TCP_NODELAY (kube's default connector leaves Nagle
/// on, and a small status write then waits out the apiserver's delayed ACK, ~40 ms, on
/// every quota charge) and `deadlines` on each request.
pub(crate) fn client(
    config: kube::Config,
    deadlines: Deadlines,
) -> Result<kube::Client, kube::Error> {
    use kube::client::ConfigExt;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(DeadlineLayer(deadlines))
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .map_err(BoxError::from)
        .service(client);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// Whether a request to `uri` is a watch (`?watch=true`, as kube's watcher asks).
fn is_watch(uri: &axum::http::Uri) -> bool {
    let query = uri.query().unwrap_or_default();
    query
        .split('&')
        .any(|pair| matches!(pair, "watch=true" | "watch=1"))
}

/// [`Deadline`] for every service it wraps.
#[derive(Clone, Copy)]
struct DeadlineLayer(Deadlines);

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;
    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            deadlines: self.0,
        }
    }
}

/// A request fails when its answer's headers do not come within `deadlines.answer`, or
/// a piece of its body within that (a watch's: `deadlines.watch_silence`).
#[derive(Clone)]
struct Deadline<S> {
    inner: S,
    deadlines: Deadlines,
}

/// The error of a request cut by [`Deadline`].
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within {0:?}")]
struct NoAnswer(Duration);

/// An answer's body, bounded or not.
type AnswerBody = UnsyncBoxBody<Bytes, BoxError>;

type Answer = axum::http::Response<AnswerBody>;

impl<S, B, A> Service<axum::http::Request<B>> for Deadline<S>
where
    S: Service<axum::http::Request<B>, Response = axum::http::Response<A>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    A: hyper::body::Body<Data = Bytes> + Send + 'static,
    A::Error: Into<BoxError>,
{
    type Response = Answer;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let Deadlines {
            answer: after,
            watch_silence,
        } = self.deadlines;
        let between = match is_watch(request.uri()) {
            true => watch_silence,
            false => after,
        };
        let call = self.inner.call(request);
        Box::pin(async move {
            let answer = match tokio::time::timeout(after, call).await {
                Ok(answer) => answer.map_err(Into::into)?,
                Err(_) => return Err(NoAnswer(after).into()),
            };
            let bounded = |body: A| TimeoutBody::new(between, body.map_err(Into::into));
            Ok(answer.map(|body| bounded(body).boxed_unsync()))
        })
    }
}

/// Whether `error` is certain to have left the request unsent: no connection to the API
/// server could be made. Then nothing was stored, whatever the request was.
pub(crate) fn never_sent(error: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(client) = error.downcast_ref::<hyper_util::client::legacy::Error>() {
            return client.is_connect();
        }
        source = error.source();
    }
    false
}

/// A kube client from `--kubeconfig` (or the usual inference) and an optional `--master`.
pub async fn kube_client(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found and not running in a cluster")?,
    };
    if let Some(master) = master {
        config.cluster_url = master
            .parse()
            .with_context(|| format!("--master {master:?} is not a URL"))?;
    }
    Ok(client(config, Deadlines::DEFAULT)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, WatchParams};

    #[test]
    fn watches_are_told_from_one_shot_requests_by_their_query() {
        let watch = "/api/v1/namespaces/ns/pods?&watch=true&timeoutSeconds=290";
        assert!(is_watch(&watch.parse().unwrap()));
        assert!(!is_watch(&"/api/v1/namespaces/ns/pods/p".parse().unwrap()));
        let list = "/api/v1/pods?labelSelector=watch%3Dtrue";
        assert!(
            !is_watch(&list.parse().unwrap()),
            "a selector is not a watch"
        );
    }

    /// An API server that accepts connections and never answers (a peer gone silent).
    async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        (url, held)
    }

    /// An API server that answers one request with `pieces`, each written after the
    /// pause before it, then goes silent with the socket held open (a peer gone dead
    /// without a reset).
    async fn answering_then_silent(
        pieces: Vec<(Duration, String)>,
    ) -> (String, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 64 * 1024];
            let _ = socket.read(&mut request).await.unwrap(); // a GET: its head only
            for (pause, piece) in pieces {
                tokio::time::sleep(pause).await;
                socket.write_all(piece.as_bytes()).await.unwrap();
            }
            std::future::pending::<()>().await;
        });
        (url, server)
    }

    /// Pods in namespace `ns` of the API server at `url`, through [`client`].
    fn pods_at(url: &str, deadlines: Deadlines) -> Api<Pod> {
        let config = kube::Config::new(url.parse().unwrap());
        Api::namespaced(client(config, deadlines).unwrap(), "ns")
    }

    #[tokio::test]
    async fn an_answer_whose_body_stops_coming_fails_at_the_deadline() {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                    content-length: 1000\r\n\r\n{\"kind\": \"Pod\"";
        let (url, _server) = answering_then_silent(vec![(Duration::ZERO, head.into())]).await;
        // Long enough for the head to come on a loaded machine (the test is about the
        // body: a head later than the deadline fails with the other error).
        let deadlines = Deadlines {
            answer: Duration::from_secs(2),
            watch_silence: Duration::from_secs(2),
        };
        let pods = pods_at(&url, deadlines);
        let error = tokio::time::timeout(Duration::from_secs(10), pods.get("p"))
            .await
            .expect("the body's silence is cut by the deadline, not waited out")
            .unwrap_err();
        assert!(error.to_string().contains("not received within"), "{error}");
    }

    #[tokio::test]
    async fn a_request_or_watch_to_a_silent_api_server_fails_at_the_deadline() {
        let (url, _server) = silent_server().await;
        let deadlines = Deadlines {
            answer: Duration::from_millis(300),
            watch_silence: Duration::from_secs(3600),
        };
        let pods = pods_at(&url, deadlines);
        let started = std::time::Instant::now();
        let error = tokio::time::timeout(Duration::from_secs(10), pods.get("p"))
            .await
            .expect("the get is cut by the deadline, not left waiting")
            .unwrap_err();
        assert!(
            error.to_string().contains("did not answer within"),
            "{error}"
        );
        assert!(started.elapsed() >= deadlines.answer);
        let params = WatchParams::default();
        let watch = tokio::time::timeout(Duration::from_secs(10), pods.watch(&params, "0"));
        let error = watch
            .await
            .expect("a watch's head is due like any answer's");
        assert!(error.is_err(), "a watch whose head never comes fails");
    }

    #[tokio::test]
    async fn a_request_no_connection_was_made_for_is_known_unsent() {
        // A port nothing listens on: the connection is refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let pods = pods_at(&url, Deadlines::DEFAULT);
        let refused = pods.get("p").await.unwrap_err();
        assert!(never_sent(&refused), "{refused}");
        // An answer that was sent and never came may have been acted on.
        let (url, _server) = silent_server().await;
        let deadlines = Deadlines {
            answer: Duration::from_millis(300),
            watch_silence: Duration::from_secs(3600),
        };
        let pods = pods_at(&url, deadlines);
        let unanswered = pods.get("p").await.unwrap_err();
        assert!(!never_sent(&unanswered), "{unanswered}");
    }

    /// A watch that keeps sending bookmarks lives past its silence deadline; once it
    /// goes silent (its connection dead without a reset) it fails, to be listed again.
    #[tokio::test]
    async fn a_watch_that_goes_silent_is_cut_but_one_that_keeps_talking_is_not() {
        use futures::StreamExt;
        const BOOKMARKS: usize = 8;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                    transfer-encoding: chunked\r\n\r\n";
        let mut pieces = vec![(Duration::ZERO, head.to_string())];
        for version in 0..BOOKMARKS {
            let line = format!(
                "{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{{\"resourceVersion\":\"{version}\"}}}}}}\n"
            );
            // Together far longer than the silence deadline, each far shorter.
            let pause = Duration::from_millis(if version == 0 { 0 } else { 400 });
            pieces.push((pause, format!("{:x}\r\n{line}\r\n", line.len())));
        }
        let (url, _server) = answering_then_silent(pieces).await;
        let deadlines = Deadlines {
            answer: Duration::from_secs(5),
            watch_silence: Duration::from_secs(2),
        };
        let pods = pods_at(&url, deadlines);
        let params = WatchParams::default();
        let events = pods.watch(&params, "0");
        let mut events = events.await.unwrap().boxed();
        let mut bookmarks = 0;
        let ended = loop {
            let next = tokio::time::timeout(Duration::from_secs(60), events.next());
            match next.await.expect("the silence is cut, not waited out") {
                Some(Ok(_)) => bookmarks += 1,
                Some(Err(error)) => break Some(error),
                None => break None,
            }
        };
        assert_eq!(bookmarks, BOOKMARKS, "every bookmark before the silence");
        assert!(ended.is_some(), "the silent watch ends in an error");
    }
}
