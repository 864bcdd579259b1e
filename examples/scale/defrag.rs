//! The defragmentation planner's API load: the requests the GPU scheduler's sidecar
//! (replica a, holding the controller Lease, `defrag: {mode: DryRun}`) sends the API
//! server while a `Fragmented` GPU pod is pending, against the same cluster with none.
//! Counted at the API server (its audit log), not in gpu-admission.
//!
//! 1. The earlier phases' pods and GPUQuotas are deleted; then every node gets one bound
//!    1-GPU pod (`spec.nodeName` and the gpu-manager annotations the extender writes:
//!    GPU 0), so each node has 7 of its 8 GPUs free: an 8-GPU pod fits on none while the
//!    cluster has 7 × `--nodes` GPUs free.
//! 2. `--defrag-restart` restarts both replicas, replica a with `defrag.mode: DryRun` as
//!    `--sidecar-user` (the only user the audit log records) and holding the Lease.
//! 3. replica a's `/explain` must call the 8-GPU pod (a what-if manifest) `Fragmented`,
//!    or the phase fails.
//! 4. Window A, `--defrag-seconds` long: no GPU pod pending. Then the 8-GPU pod is
//!    created, `/explain` must call it `Fragmented`, the Waiting teller writes its
//!    condition on it, and window B, as long, runs with it pending.
//! 5. The audit log: replica a's requests received in each window (each once, a watch
//!    included: a watch that restarts is a new request), per minute, by verb and
//!    resource, and the time the API server took to answer those that are not watches.

use std::process::Stdio;

use k8s_openapi::jiff::Timestamp;

use super::*;

/// The namespace of the fill and of the pending pod.
const DEFRAG_NS: &str = "scale-defrag";
/// The pod that waits.
const PENDING_POD: &str = "fragmented";
/// How long replica a is left alone after its restart and the check before window A.
const SETTLE: Duration = Duration::from_secs(20);
/// The ServiceAccount whose token `/explain` is asked with.
const EXPLAINER: &str = "scale-explainer";
/// The condition the Waiting teller writes on a pending GPU pod (docs/explain.md).
const WAITING_CONDITION: &str = "gpu-admission.io/Waiting";
/// Request kinds shown per window.
const TOP: usize = 10;

pub async fn planner_load(
    args: &Args,
    client: &Client,
    start: &Instant,
    summary: &mut String,
) -> Result<()> {
    let seconds = args.defrag_seconds;
    println!(
        "\n== the defragmentation planner's API load: replica a's requests in kube-apiserver's \
         audit log, {seconds} s with no GPU pod pending, then {seconds} s with one Fragmented pod pending"
    );
    let setup = prepare(args, client, start).await?;

    say!(start, "window A: {seconds} s, no GPU pod pending");
    let none = measured_window(args, client).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), DEFRAG_NS);
    pods.create(&PostParams::default(), &pending_pod(args)?)
        .await
        .with_context(|| format!("creating pod {DEFRAG_NS}/{PENDING_POD}"))?;
    let verdict = wait_fragmented(args, &setup.token, Explained::Pod).await?;
    wait_told(&pods, start).await?;
    say!(
        start,
        "window B: {seconds} s, {DEFRAG_NS}/{PENDING_POD} pending, Fragmented"
    );
    let one = measured_window(args, client).await?;
    pods.delete(PENDING_POD, &DeleteParams::default().grace_period(0))
        .await
        .with_context(|| format!("deleting pod {DEFRAG_NS}/{PENDING_POD}"))?;
    if one.plans < 1.0 {
        bail!(
            "the planner made no plan for {DEFRAG_NS}/{PENDING_POD} in {seconds} s (replica \
             a's gpu_admission_defrag_plans_total did not move): is replica a the Lease holder? \
             (see its log)"
        );
    }

    // A request received inside a window may end a moment after it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let audit = args
        .audit_log
        .as_deref()
        .context("--audit-log is required")?;
    let requests = AuditedRequest::read(audit, &args.sidecar_user)?;
    for line in report(args, &setup, (&none, &one), &verdict, &requests) {
        println!("{line}");
        writeln!(summary, "{line}")?;
    }
    Ok(())
}

/// What [`prepare`] did.
struct Setup {
    /// How long the fill took.
    filled: Duration,
    /// The explainer's token.
    token: String,
}

/// The earlier phases cleared, the nodes filled, the replicas restarted, `/explain`
/// calling the 8-GPU pod `Fragmented`, and [`SETTLE`] waited.
async fn prepare(args: &Args, client: &Client, start: &Instant) -> Result<Setup> {
    say!(start, "deleting the earlier phases' pods and GPUQuotas");
    clear_earlier_phases(client).await?;
    say!(
        start,
        "filling the {} nodes: one bound 1-GPU pod each",
        args.nodes
    );
    let filled = fill(args, client).await?;
    say!(
        start,
        "filled in {:.1} s; restarting both replicas (replica a: defrag DryRun, as {})",
        filled.as_secs_f64(),
        args.sidecar_user
    );
    restart(args)?;
    let token = explainer_token(args)?;
    let would_be = wait_fragmented(args, &token, Explained::Manifest).await?;
    say!(
        start,
        "/explain: the 8-GPU pod would be Fragmented ({would_be}); {} s to settle",
        SETTLE.as_secs()
    );
    tokio::time::sleep(SETTLE).await;
    Ok(Setup { filled, token })
}

/// One window, `--defrag-seconds` long, and what replica a's and kube-apiserver's
/// /metrics say of it.
struct Measured {
    window: Window,
    /// The LIST responses kube-apiserver sent in it.
    listed: Listed,
    /// The plans replica a's planner made in it.
    plans: f64,
}

async fn measured_window(args: &Args, client: &Client) -> Result<Measured> {
    let (plans, listed) = (planner_plans(args)?, Listed::read(client).await?);
    let window = window(args.defrag_seconds).await;
    Ok(Measured {
        window,
        listed: Listed::read(client).await?.since(&listed),
        plans: planner_plans(args)? - plans,
    })
}

/// The summary's lines: the two windows side by side.
fn report(
    args: &Args,
    setup: &Setup,
    (none, one): (&Measured, &Measured),
    verdict: &str,
    requests: &[AuditedRequest],
) -> Vec<String> {
    let seconds = args.defrag_seconds;
    let (load_none, load_one) = (
        Load::of(requests, none.window),
        Load::of(requests, one.window),
    );
    vec![
        format!(
            "planner API load ({} nodes, each with 7 of 8 GPUs free; replica a as {}, the Lease \
             holder, defrag DryRun, pendingSeconds 5; windows of {seconds} s, A then B; counted \
             in kube-apiserver's audit log; load average at the end {}):",
            args.nodes,
            args.sidecar_user,
            load_average()
        ),
        format!(
            "  planner API load: none {:.1} req/min, one fragmented pod pending {:.1} req/min, ratio {:.2}",
            load_none.per_minute(),
            load_one.per_minute(),
            load_one.per_minute() / load_none.per_minute()
        ),
        format!(
            "  API server time answering them (watches left out): none {:.2} s/min, one pending {:.2} s/min, ratio {:.2}",
            load_none.busy_per_minute(),
            load_one.busy_per_minute(),
            load_one.busy_per_minute() / load_none.busy_per_minute()
        ),
        format!(
            "  LIST responses kube-apiserver sent (every user's, its /metrics): none {}, one pending {}",
            none.listed.describe(seconds),
            one.listed.describe(seconds)
        ),
        format!("  A (none): {}", load_none.describe()),
        format!("  B (one pending): {}", load_one.describe()),
        format!(
            "  the pod ({DEFRAG_NS}/{PENDING_POD}, 8 GPUs): Fragmented: {verdict}; plans made \
             (gpu_admission_defrag_plans_total): {:.0} in B, {:.0} in A",
            one.plans, none.plans
        ),
        format!(
            "  setup: the earlier phases' pods and GPUQuotas deleted, {} bound 1-GPU pods created in {:.1} s, both replicas restarted",
            args.nodes,
            setup.filled.as_secs_f64()
        ),
    ]
}

/// Force-deletes every pod and GPUQuota of the earlier phases' namespaces and waits
/// until the pods are gone: the windows then see no pod but the fill and the pending one,
/// and no quota ledger of theirs still settling (the reconciler's status writes).
async fn clear_earlier_phases(client: &Client) -> Result<()> {
    let namespaces = [
        THROUGHPUT_NS,
        HOOKS_NS,
        NO_HOOKS_NS,
        CORE_QUOTA_NS,
        QUEUE_NS,
        queue::LINE_NS,
    ];
    let now = DeleteParams::default().grace_period(0);
    for namespace in namespaces {
        let quotas: Api<GPUQuota> = Api::namespaced(client.clone(), namespace);
        match quotas.delete_collection(&now, &ListParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => {
                return Err(e).with_context(|| format!("deleting the GPUQuotas of {namespace}"));
            }
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        match pods.delete_collection(&now, &ListParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => continue,
            Err(e) => return Err(e).with_context(|| format!("deleting the pods of {namespace}")),
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = pods
                .list(&ListParams::default().limit(1))
                .await
                .with_context(|| format!("listing the pods of {namespace}"))?;
            if left.items.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                bail!("pods of {namespace} still there 120 s after deleting them");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// One pod bound to each node, on its GPU 0, as the extender places and binds a 1-GPU
/// pod (gpu-manager's annotations: the node, the GPU index, assigned).
async fn fill(args: &Args, client: &Client) -> Result<Duration> {
    create_namespace(client, DEFRAG_NS).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), DEFRAG_NS);
    let started = Instant::now();
    futures::stream::iter(0..args.nodes)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let node = node_name(i);
                let name = format!("fill-{i:05}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {
                        "name": name,
                        "annotations": {
                            "tencent.com/predicate-node": node,
                            "tencent.com/predicate-gpu-idx-0": "0",
                            "tencent.com/gpu-assigned": "true",
                        },
                    },
                    "spec": {
                        "nodeName": node,
                        "schedulerName": args.gpu_scheduler,
                        "containers": [{
                            "name": "main",
                            "image": IMAGE,
                            "resources": {"limits": {CORE: "100", MEMORY: MEMORY_PER_GPU.to_string()}},
                        }],
                    },
                }))?;
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_status(&e, 409) => Ok(()),
                    Err(e) => Err(e).with_context(|| format!("creating pod {DEFRAG_NS}/{name}")),
                }
            }
        })
        .buffer_unordered(args.clients)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(started.elapsed())
}

/// The pod that waits: all 8 GPUs of a node, for the GPU scheduler.
fn pending_pod(args: &Args) -> Result<Pod> {
    let limits = json!({
        CORE: (100 * GPUS_PER_NODE).to_string(),
        MEMORY: (MEMORY_PER_GPU * GPUS_PER_NODE).to_string(),
    });
    Ok(serde_json::from_value(json!({
        "metadata": {"name": PENDING_POD, "namespace": DEFRAG_NS},
        "spec": {
            "schedulerName": args.gpu_scheduler,
            "containers": [{"name": "main", "image": IMAGE, "resources": {"limits": limits}}],
        },
    }))?)
}

/// Runs `--defrag-restart`; its last line says who holds the Lease.
fn restart(args: &Args) -> Result<()> {
    let script = args
        .defrag_restart
        .as_deref()
        .context("--defrag-restart is required")?;
    let out = Command::new("bash")
        .arg(script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!("scale: {}", said.trim());
    Ok(())
}

/// `kubectl` against the admin kubeconfig, with `stdin`: its stdout.
fn kubectl(args: &Args, arguments: &[&str], stdin: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = Command::new(&args.kubectl)
        .arg("--kubeconfig")
        .arg(&args.kubeconfig)
        .args(arguments)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", args.kubectl.display()))?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            arguments.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A token of a ServiceAccount that may get and create pods in [`DEFRAG_NS`]: what
/// `/explain` asks of its callers (docs/explain.md).
fn explainer_token(args: &Args) -> Result<String> {
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": EXPLAINER}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": EXPLAINER},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": EXPLAINER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": EXPLAINER},
         "subjects": [{"kind": "ServiceAccount", "name": EXPLAINER, "namespace": DEFRAG_NS}]},
    ]});
    kubectl(
        args,
        &["apply", "-n", DEFRAG_NS, "-f", "-"],
        &objects.to_string(),
    )?;
    let token = kubectl(
        args,
        &[
            "create",
            "token",
            EXPLAINER,
            "-n",
            DEFRAG_NS,
            "--duration",
            "2h",
        ],
        "",
    )?;
    Ok(token.trim().to_string())
}

/// What `/explain` is asked about.
#[derive(Clone, Copy)]
enum Explained {
    /// The pending pod as a manifest, not created (a what-if).
    Manifest,
    /// The pending pod, created.
    Pod,
}

/// Replica a's `/explain` on the pending pod: the HTTP status and the body.
fn explain(args: &Args, token: &str, what: Explained) -> Result<(u16, String)> {
    use std::io::Write as _;
    let mut command = Command::new("curl");
    command
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"));
    let body = match what {
        Explained::Manifest => {
            command
                .args([
                    "-H",
                    "Content-Type: application/json",
                    "--data-binary",
                    "@-",
                ])
                .arg(format!("{}/explain", args.admin_url));
            serde_json::to_string(&pending_pod(args)?)?
        }
        Explained::Pod => {
            command.arg(format!(
                "{}/explain?pod={DEFRAG_NS}/{PENDING_POD}",
                args.admin_url
            ));
            String::new()
        }
    };
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running curl")?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(body.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "curl {}/explain failed: {}",
            args.admin_url,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, status) = text
        .rsplit_once('\n')
        .context("curl printed no HTTP status")?;
    Ok((status.trim().parse().unwrap_or(0), body.to_string()))
}

/// Asks `/explain` until it says `Fragmented` (its placement message is returned), for
/// at most a minute (the explainer's RBAC, replica a's cache catching up); anything else
/// then fails the phase with the last answer.
async fn wait_fragmented(args: &Args, token: &str, what: Explained) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = explain(args, token, what)?;
        if status == 200 {
            let answer: serde_json::Value = serde_json::from_str(&body)
                .with_context(|| format!("/explain answered something not JSON: {body}"))?;
            if answer["code"] == "Fragmented" {
                let stages = answer["stages"].as_array().cloned().unwrap_or_default();
                let placement = stages.iter().find(|s| s["stage"] == "placement");
                let message = placement.and_then(|s| s["message"].as_str());
                return Ok(message.unwrap_or_default().to_string());
            }
        }
        if Instant::now() >= deadline {
            let which = match what {
                Explained::Manifest => "an 8-GPU pod (a what-if manifest)",
                Explained::Pod => "the pending 8-GPU pod",
            };
            bail!(
                "the filled cluster is not fragmented for {which}: replica a's /explain \
                 answers {status}: {body}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits (up to 30 s) until the pending pod carries the Waiting teller's condition: the
/// teller's one-time writes on a new pending pod (its condition, its Event) then fall
/// before window B, every run, and B holds what a pod pending costs from then on (the
/// planner's first plan comes after `pendingSeconds`, inside B).
async fn wait_told(pods: &Api<Pod>, start: &Instant) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pod = pods
            .get(PENDING_POD)
            .await
            .with_context(|| format!("reading pod {DEFRAG_NS}/{PENDING_POD}"))?;
        let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == WAITING_CONDITION) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            say!(
                start,
                "{DEFRAG_NS}/{PENDING_POD} has no {WAITING_CONDITION} condition after 30 s: \
                 the teller's writes may fall in window B"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The plans replica a's planner has made (`gpu_admission_defrag_plans_total`, every
/// outcome).
fn planner_plans(args: &Args) -> Result<f64> {
    let text = scrape_admin(args)?;
    Ok(Samples::parse(&text).sum("gpu_admission_defrag_plans_total", &[]))
}

/// The LIST responses kube-apiserver has sent, any user's
/// (`apiserver_response_sizes{verb="LIST"}`): how many, how many bytes.
struct Listed {
    lists: f64,
    bytes: f64,
}

impl Listed {
    /// Read from kube-apiserver's /metrics (as the admin, whom the audit log leaves out).
    async fn read(client: &Client) -> Result<Listed> {
        let request = axum::http::Request::get("/metrics").body(Vec::new())?;
        let text = client
            .request_text(request)
            .await
            .context("reading kube-apiserver's /metrics")?;
        let samples = Samples::parse(&text);
        let list = [("verb", "LIST")];
        Ok(Listed {
            lists: samples.sum("apiserver_response_sizes_count", &list),
            bytes: samples.sum("apiserver_response_sizes_sum", &list),
        })
    }

    fn since(&self, before: &Listed) -> Listed {
        Listed {
            lists: self.lists - before.lists,
            bytes: self.bytes - before.bytes,
        }
    }

    /// `1.6 MB/min (14 lists)` over a window of `seconds`.
    fn describe(&self, seconds: u64) -> String {
        let per_minute = self.bytes / 1e6 * 60.0 / seconds as f64;
        format!("{per_minute:.1} MB/min ({:.0} lists)", self.lists)
    }
}

/// A stretch of wall-clock time.
#[derive(Clone, Copy)]
struct Window {
    from: Timestamp,
    to: Timestamp,
}

async fn window(seconds: u64) -> Window {
    let from = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    Window {
        from,
        to: Timestamp::now(),
    }
}

/// One request as the audit log tells it (each of its stages is an event).
struct AuditedRequest {
    received: Timestamp,
    /// `verb resource[/subresource]`, or `verb path` for a non-resource URL.
    what: String,
    watch: bool,
    /// When its response was complete (none yet for a watch still open).
    completed: Option<Timestamp>,
}

impl AuditedRequest {
    /// The requests of `user` in the audit log at `path` (JSON lines).
    fn read(path: &Path, user: &str) -> Result<Vec<AuditedRequest>> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the audit log {}", path.display()))?;
        let quoted = format!("\"{user}\"");
        let mut requests: HashMap<String, AuditedRequest> = HashMap::new();
        for line in text.lines().filter(|l| l.contains(&quoted)) {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue; // a line being written as we read
            };
            if event["user"]["username"] != user {
                continue;
            }
            let time = |field: &str| event[field].as_str().and_then(|t| t.parse().ok());
            let (Some(id), Some(received)) =
                (event["auditID"].as_str(), time("requestReceivedTimestamp"))
            else {
                continue;
            };
            let verb = event["verb"].as_str().unwrap_or("?");
            let request = requests
                .entry(id.to_string())
                .or_insert_with(|| AuditedRequest {
                    received,
                    what: format!("{verb} {}", what_of(&event)),
                    watch: verb == "watch",
                    completed: None,
                });
            if matches!(event["stage"].as_str(), Some("ResponseComplete" | "Panic")) {
                request.completed = time("stageTimestamp");
            }
        }
        Ok(requests.into_values().collect())
    }
}

/// `pods`, `pods/status`, or the path of a non-resource request.
fn what_of(event: &serde_json::Value) -> String {
    let object = &event["objectRef"];
    match object["resource"].as_str() {
        Some(resource) => match object["subresource"].as_str() {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        },
        None => {
            let uri = event["requestURI"].as_str().unwrap_or("?");
            uri.split('?').next().unwrap_or(uri).to_string()
        }
    }
}

/// The requests of one window.
struct Load {
    seconds: f64,
    requests: usize,
    /// Seconds the API server took to answer them, watches left out.
    busy: f64,
    /// Watches among them (opened, or opened again after the API server ended one).
    watches: usize,
    by_kind: BTreeMap<String, usize>,
}

impl Load {
    fn of(requests: &[AuditedRequest], window: Window) -> Load {
        let inside = requests
            .iter()
            .filter(|r| r.received >= window.from && r.received < window.to);
        let mut load = Load {
            seconds: window.to.duration_since(window.from).as_secs_f64(),
            requests: 0,
            busy: 0.0,
            watches: 0,
            by_kind: BTreeMap::new(),
        };
        for request in inside {
            load.requests += 1;
            *load.by_kind.entry(request.what.clone()).or_default() += 1;
            load.watches += usize::from(request.watch);
            if let (false, Some(done)) = (request.watch, request.completed) {
                load.busy += done.duration_since(request.received).as_secs_f64();
            }
        }
        load
    }

    fn per_minute(&self) -> f64 {
        self.requests as f64 * 60.0 / self.seconds
    }

    fn busy_per_minute(&self) -> f64 {
        self.busy * 60.0 / self.seconds
    }

    /// `130 requests in 120 s: get leases 60, update leases 60, ...`.
    fn describe(&self) -> String {
        let mut kinds: Vec<(&String, &usize)> = self.by_kind.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let mut top: Vec<String> = kinds
            .iter()
            .take(TOP)
            .map(|(what, n)| format!("{what} {n}"))
            .collect();
        let rest: usize = kinds.iter().skip(TOP).map(|(_, n)| **n).sum();
        if rest > 0 {
            top.push(format!("{rest} others"));
        }
        format!(
            "{} requests in {:.0} s ({} watches; {:.2} s answering the others): {}",
            self.requests,
            self.seconds,
            self.watches,
            self.busy,
            if top.is_empty() {
                "none".to_string()
            } else {
                top.join(", ")
            }
        )
    }
}
