//! The real binary, as an operator runs it: `serve --cluster` with development
//! certificates, the extender over TLS (trusting only the dev CA), the plain extender
//! port, the probes and metrics on the admin port, and a clean exit on SIGTERM.
#![allow(clippy::unwrap_used)]

mod repo;
mod tls_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use axum::body::Body;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-admission");

fn example(name: &str) -> String {
    repo::path(&format!("examples/{name}"))
}

struct Server {
    child: Child,
    tls: SocketAddr,
    extender: SocketAddr,
    admin: SocketAddr,
    insecure: SocketAddr,
    logs: mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `serve` in `dir` on ephemeral ports; learn them from the "serving" log line.
fn start(dir: &Path) -> Server {
    start_on(dir, &example("cluster.yaml"))
}

/// [`start`] on the cluster file `cluster`.
fn start_on(dir: &Path, cluster: &str) -> Server {
    let mut child = Command::new(BIN)
        .args(["serve", "--cluster", cluster, "--log-format", "json"])
        .args(["--address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"])
        .args(["--extender-address", "127.0.0.1:0"])
        .args(["--insecure-extender-address", "127.0.0.1:0"])
        .current_dir(dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, logs) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    loop {
        let Ok(line) = logs.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("server did not report serving");
        };
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if event["message"] == "serving" {
            let addr = |key: &str| event[key].as_str().unwrap().parse().unwrap();
            return Server {
                tls: addr("address"),
                extender: addr("extender_address"),
                admin: addr("admin_address"),
                insecure: addr("insecure_extender_address"),
                child,
                logs,
            };
        }
    }
}

/// One plain HTTP/1.1 request.
async fn plain(addr: SocketAddr, method: &str, path: &str, body: String) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send(&mut sender, method, path, body).await
}

/// One HTTPS/1.1 request, trusting only the CA in `ca`.
async fn tls(addr: SocketAddr, ca: &Path, method: &str, path: &str, body: String) -> (u16, String) {
    let stream = tls_support::connect(addr, tls_support::client_config(ca), "localhost")
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send(&mut sender, method, path, body).await
}

async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Body>,
    method: &str,
    path: &str,
    body: String,
) -> (u16, String) {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn serves_extender_over_tls_and_probes_then_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path());
    let ca = dir.path().join("webhook-certs/ca.crt");
    assert!(ca.exists(), "dev mode must create a CA");

    let (status, body) = plain(server.admin, "GET", "/readyz", String::new()).await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(
        plain(server.admin, "GET", "/livez", String::new()).await.0,
        200
    );

    let share = std::fs::read_to_string(example("filter-share.json")).unwrap();
    // The webhook door does not serve the extender: only the scheduler's door does.
    let (status, _) = tls(
        server.tls,
        &ca,
        "POST",
        "/scheduler/predicates",
        share.clone(),
    )
    .await;
    assert_eq!(status, 404, "the webhook listener serves only the webhooks");
    let (status, body) = tls(
        server.extender,
        &ca,
        "POST",
        "/scheduler/predicates",
        share.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let result: Value = serde_json::from_str(&body).unwrap();
    let node = result["NodeNames"][0].as_str().unwrap().to_string();
    assert_eq!(result["NodeNames"].as_array().unwrap().len(), 1, "{result}");
    assert_eq!(
        node, "t4-node-1",
        "team-a's pods go to Tesla-T4 nodes, and fgd packs beside notebook-1: {result}"
    );

    let (status, body) = tls(server.tls, &ca, "GET", "/version", String::new()).await;
    assert_eq!(status, 200);
    assert!(body.contains(env!("CARGO_PKG_VERSION")));

    // The plain extender port serves the same extender (re-filter: same node kept).
    let (status, body) = plain(server.insecure, "POST", "/scheduler/predicates", share).await;
    assert_eq!(status, 200);
    assert!(
        body.contains(&format!("\"NodeNames\":[\"{node}\"]")),
        "{body}"
    );
    let (status, _) = plain(server.insecure, "GET", "/version", String::new()).await;
    assert_eq!(
        status, 404,
        "the plain port serves only the extender and probes"
    );

    let (_, metrics) = plain(server.admin, "GET", "/metrics", String::new()).await;
    assert!(
        metrics.contains(r#"gpu_admission_requests_total{route="predicates",decision="placed"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"gpu_admission_requests_total{route="predicates",decision="kept"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("gpu_admission_tls_cert_not_after_timestamp_seconds"));
    // team-a: notebook-1 (0.5 GPU) from the file plus inference-1 (0.3) just placed.
    assert!(
        metrics.contains(r#"gpu_admission_quota_used_gpus{namespace="team-a",quota="default",model="Tesla-T4"} 0.8"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"gpu_admission_quota_hard_gpus{namespace="team-a",quota="default",model="Tesla-T4"} 2.0"#), "{metrics}");
    // team-c: its ResourceClaim holds one A100-SXM4-40GB a ResourceSlice publishes, so a
    // claim for two more (pinned, as the mutating webhook leaves it) is refused.
    assert!(
        metrics.contains(r#"gpu_admission_quota_used_gpus{namespace="team-c",quota="default",model="A100-SXM4-40GB"} 1.0"#),
        "{metrics}"
    );
    // Showback: GPU-seconds grow at what bound pods and allocated claims hold (team-a:
    // notebook-1's half T4; inference-1 is placed but not bound; team-c: its claim's A100).
    let gpu_seconds = |metrics: &str, namespace: &str, model: &str| {
        let series = format!(
            r#"gpu_admission_gpu_seconds_total{{namespace="{namespace}",model="{model}"}} "#
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let before = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, later) = plain(server.admin, "GET", "/metrics", String::new()).await;
    let elapsed = before.elapsed().as_secs_f64();
    for (namespace, model, held) in [
        ("team-a", "Tesla-T4", 0.5),
        ("team-c", "A100-SXM4-40GB", 1.0),
    ] {
        let grew = gpu_seconds(&later, namespace, model) - gpu_seconds(&metrics, namespace, model);
        // Between the scrapes: at least the sleep, at most the time measured around it
        // (and the first answer's way back).
        assert!(
            grew >= held * 0.99 && grew <= held * (elapsed + 0.5),
            "{namespace} {model}: {grew} GPU-s in {elapsed} s\n{later}"
        );
    }
    let review = std::fs::read_to_string(example("review-claim.json")).unwrap();
    let (status, body) = tls(server.tls, &ca, "POST", "/validate/resourceclaims", review).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#"GPU quota exceeded in namespace \"team-c\" for A100-SXM4-40GB: requested 2, used 1 of 2"#),
        "{body}"
    );
    // The learnt mix is inference-1's 0.3 GPU (30 cores, 20 memory). Beside notebook-1
    // (50 free) or on an idle T4 GPU (100 free), one 0.3 task fewer fits and the
    // leftover (20, 10) is the same, so fgd packed it beside notebook-1 (asserted above
    // through the node). What no 0.3 task can use: 20 on that GPU, 10 on each idle GPU
    // (3 fit, 10 left): 20 + 3 * 10 on t4-node-1, 4 * 10 on t4-node-2, 6 * 10 on the
    // A100 node's idle GPUs = 150 of 320 + 400 + 600 free cores.
    let fragmentation = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gpu_admission_gpu_fragmentation_ratio "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    assert!((fragmentation - 150.0 / 1320.0).abs() < 1e-9, "{metrics}");
    // Free GPUs by cause, with the same mix: on t4-node-1's shared GPU the 20 cores
    // left fit no 0.3 task (fragmented); every other free GPU is usable and nobody
    // waits on quota (idle). Per model the causes sum to the free capacity.
    let free = |model: &str, cause: &str| {
        let series = format!(r#"gpu_admission_free_gpus{{model="{model}",cause="{cause}"}} "#);
        let line = metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()));
        line.and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN)
    };
    for (model, fragmented, idle, capacity) in [
        ("Tesla-T4", 0.2, 7.0, 8.0 - 0.8),
        ("A100-SXM4-80GB", 0.0, 6.0, 8.0 - 2.0),
    ] {
        assert!(
            (free(model, "fragmented") - fragmented).abs() < 1e-9,
            "{metrics}"
        );
        assert!((free(model, "idle") - idle).abs() < 1e-9, "{metrics}");
        let causes = ["unavailable", "fragmented", "quota_blocked", "idle"];
        let sum: f64 = causes.iter().map(|c| free(model, c)).sum();
        assert!((sum - capacity).abs() < 1e-9, "{model}: {sum}\n{metrics}");
    }

    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = wait_exit(&mut server.child, Duration::from_secs(30));
    assert!(
        exit.success(),
        "SIGTERM must end the server cleanly: {exit:?}"
    );
    // The reader thread may not have passed on the last lines yet: read until the
    // exited server's stderr closes (the sender then drops), not just what is queued.
    let logs: Vec<String> =
        std::iter::from_fn(|| server.logs.recv_timeout(Duration::from_secs(10)).ok()).collect();
    assert!(logs.iter().any(|l| l.contains("\"stopped\"")), "{logs:?}");
    // A background task's lines carry its span: the signal handler's, here.
    let signalled = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("shutting down"))
        });
    assert_eq!(
        signalled.as_ref().map(|e| &e["span"]["name"]),
        Some(&Value::from("signals")),
        "{logs:?}"
    );
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Text logs into a pipe (a pod's stderr) are plain text: no terminal colour codes for
/// `kubectl logs` and log collectors to store.
#[test]
fn text_logs_into_a_pipe_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--cluster", &example("cluster.yaml")])
        .args(["--address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"])
        .args(["--extender-address", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let serving = std::iter::from_fn(|| lines.recv_timeout(Duration::from_secs(30)).ok())
        .find(|line| line.contains(" serving ") && line.contains("mode"));
    let _ = child.kill();
    let _ = child.wait();
    let serving = serving.expect("the server logs that it serves");
    assert!(!serving.contains('\u{1b}'), "{serving:?}");
    assert!(serving.contains(r#"mode="offline""#), "{serving}");
}

#[test]
fn startup_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "placement:\n  polcy: spread\n").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let cluster = example("cluster.yaml");
    let err = run(&[
        "serve",
        "--cluster",
        &cluster,
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(err.contains("polcy"), "{err}");
    let err = run(&[
        "serve",
        "--cluster",
        &cluster,
        "--tls-cert",
        "missing.crt",
        "--tls-key",
        "missing.key",
    ]);
    assert!(err.contains("missing.crt"), "{err}");
    let err = run(&[
        "serve",
        "--cluster",
        "nowhere.yaml",
        "--address",
        "127.0.0.1:0",
        "--admin-address",
        "127.0.0.1:0",
        "--extender-address",
        "127.0.0.1:0",
    ]);
    assert!(err.contains("nowhere.yaml"), "{err}");
    std::fs::write(dir.path().join("bad.yaml"), "kind: Pod\nspec: 7\n").unwrap();
    let err = run(&[
        "serve",
        "--cluster",
        "bad.yaml",
        "--address",
        "127.0.0.1:0",
        "--admin-address",
        "127.0.0.1:0",
        "--extender-address",
        "127.0.0.1:0",
    ]);
    assert!(err.contains("bad.yaml, document 1"), "{err}");
}

/// `defrag` on the bundled fragmented cluster: the one pod that may move is moved,
/// printed as JSON a tool can read and as text; a broken file names its document.
#[test]
fn defrag_prints_the_plan_for_the_bundled_fragmented_cluster() {
    let cluster = example("fragmented.yaml");
    let run = |args: &[&str]| Command::new(BIN).arg("defrag").args(args).output().unwrap();
    let out = run(&["--cluster", &cluster, "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = &report["plans"][0];
    assert_eq!(plan["pod"], "team-a/train-0");
    assert_eq!(plan["node"], "t4-a");
    let moves = plan["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 1, "{report}");
    assert_eq!(moves[0]["pod"], "team-b/infer-a-7f9-x2");
    assert_eq!(report["unplanned"][0]["pod"], "team-a/train-big");

    let out = run(&["--cluster", &cluster, "--pod", "team-a/train-0"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("team-a/train-0: fits on t4-a"), "{text}");
    assert!(!text.contains("train-big"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "kind: Node\nmetadata: {name: n}\n---\nkind: Pod\nspec: 7\n",
    )
    .unwrap();
    let out = run(&["--cluster", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("document 2"), "{err}");
}

/// The admin port's `/explain` answers as `gpu-admission explain -o json` does, judged on
/// the server's cache (offline: nobody to ask who calls, docs/explain.md), and names
/// what is wrong with a question it cannot answer.
#[tokio::test]
async fn the_admin_port_explains_a_pod_and_a_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_on(dir.path(), &example("fragmented.yaml"));
    let get = |path: &'static str| plain(server.admin, "GET", path, String::new());
    let (status, body) = get("/explain?pod=team-a/train-0").await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["pod"], "team-a/train-0");
    assert_eq!(answer["code"], "Fragmented", "{answer}");
    assert_eq!(answer["stages"][0]["code"], "Fits", "{answer}");
    assert_eq!(answer["stages"][1]["stage"], "placement");
    let cli = Command::new(BIN)
        .args(["explain", "team-a/train-0", "-o", "json", "--cluster"])
        .arg(example("fragmented.yaml"))
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(
        cli["stages"], answer["stages"],
        "the same verdict as the CLI"
    );

    let (status, body) = get("/explain?pod=team-a/nobody").await;
    assert_eq!(
        (status, body.as_str()),
        (
            404,
            "pod team-a/nobody is not in the cluster, or asks for no GPU"
        )
    );
    for bad in ["/explain", "/explain?pod=train-0", "/explain?pod=a/b/c"] {
        let (status, body) = get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }

    let manifest = json!({
        "metadata": {"name": "one-t4", "namespace": "team-a",
            "annotations": {"gpu-admission.io/gpu-type": "Tesla-T4"}},
        "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"tencent.com/vcuda-core": "100"}}}]},
    });
    let (status, body) = plain(server.admin, "POST", "/explain", manifest.to_string()).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["pod"], "team-a/one-t4");
    assert_eq!(answer["code"], "Fits", "{answer}");
    let (status, body) = plain(server.admin, "POST", "/explain", "{\"spec\": 7".into()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.starts_with("the manifest"), "{body}");
}

/// Kibibytes of a `/proc/<pid>/status` field (VmRSS now, VmHWM the peak so far).
fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Hostile bodies of ~3 MB (what a pod on the cluster network could send the webhook
/// door): a million empty node objects, a pod of a million empty volumes, a million
/// junk keys.
fn hostile_bodies() -> Vec<String> {
    let million = |item: &str| vec![item; 1_000_000].join(",");
    vec![
        format!(
            r#"{{"Pod": {{}}, "Nodes": {{"items": [{}]}}}}"#,
            million("{}")
        ),
        format!(
            r#"{{"Pod": {{"spec": {{"volumes": [{}]}}}}, "NodeNames": []}}"#,
            million("{}")
        ),
        format!(
            r#"{{"Pod": {{"metadata": {{"annotations": {{{}}}}}}}, "NodeNames": []}}"#,
            (0..300_000)
                .map(|i| format!(r#""{i}":"""#))
                .collect::<Vec<_>>()
                .join(",")
        ),
    ]
}

#[tokio::test]
async fn hostile_bodies_are_refused_in_bounded_memory_while_probes_keep_answering() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let ca = dir.path().join("webhook-certs/ca.crt");
    let pid = server.child.id();
    let idle_kib = proc_kib(pid, "VmRSS:");
    let bodies = hostile_bodies();
    for body in &bodies {
        assert!(
            (2_500_000..3_500_000).contains(&body.len()),
            "{}",
            body.len()
        );
    }
    // Two clients send the hostile bodies over and over, in parallel...
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (bodies, ca) = (bodies.clone(), ca.clone());
            let addr = server.extender;
            tokio::spawn(async move {
                for _ in 0..4 {
                    for body in &bodies {
                        let (status, text) =
                            tls(addr, &ca, "POST", "/scheduler/predicates", body.clone()).await;
                        assert_eq!(status, 400, "{text}");
                    }
                }
                std::time::Instant::now()
            })
        })
        .collect();
    // ...while the liveness probe is asked, as the kubelet would.
    let mut probes = Vec::new();
    while senders.iter().any(|s| !s.is_finished()) {
        let asked = std::time::Instant::now();
        let (status, _) = plain(server.admin, "GET", "/livez", String::new()).await;
        assert_eq!(status, 200);
        probes.push((asked.elapsed(), std::time::Instant::now()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut finished = Vec::new();
    for sender in senders {
        finished.push(sender.await.unwrap());
    }
    let first_probe = probes.first().expect("no probe was answered").1;
    assert!(
        finished.iter().all(|&done| first_probe < done),
        "/livez must answer while the large requests are still being decoded"
    );
    let peak_kib = proc_kib(pid, "VmHWM:");
    let slowest = probes
        .iter()
        .map(|(took, _)| *took)
        .max()
        .unwrap_or_default();
    eprintln!(
        "idle RSS {idle_kib} KiB, peak {peak_kib} KiB (+{} MiB); {} probes, slowest {slowest:?}",
        peak_kib.saturating_sub(idle_kib) / 1024,
        probes.len()
    );
    assert!(
        peak_kib.saturating_sub(idle_kib) <= 64 * 1024,
        "peak RSS {peak_kib} KiB is more than 64 MiB above idle ({idle_kib} KiB)"
    );
}
