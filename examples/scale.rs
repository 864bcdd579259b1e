//! The driver of `hack/scale.sh`: gpu-admission at cluster scale on a real control plane
//! (etcd, kube-apiserver, one kube-scheduler with a `gpu-scheduler` profile — gpu-admission
//! as its extender — and a plain `default-scheduler` profile, two gpu-admission replicas).
//! hack/scale.sh starts all of that and runs this with the addresses; run by hand:
//!
//! ```sh
//! cargo run --release --example scale -- --kubeconfig admin.kubeconfig \
//!   --scheduler-metrics https://127.0.0.1:PORT/metrics --client-cert admin.crt \
//!   --client-key admin.key --admin-url http://127.0.0.1:PORT \
//!   --webhook-url https://127.0.0.1:PORT --ca-file ca.crt --kubectl kubectl
//! ```
//!
//! 1. creates `--nodes` fake GPU nodes (API objects, Ready, 8 GPUs each: `nvidia.com/gpu`
//!    and gpu-manager's `tencent.com/vcuda-*`), half of one model and half of another,
//!    from `--clients` parallel clients;
//! 2. throughput, side by side, order A B B A (plain, gpu, gpu, plain): each phase creates
//!    `--pods` pods from `--clients` parallel creators and times the first create to the
//!    last pod bound (a watch), then force-deletes them and waits until they are gone;
//!    around each phase it reads kube-scheduler's /metrics and gpu-admission's, for the
//!    scheduler's own attempt latency per profile and the extender's request duration;
//! 3. pod-create latency with and without the webhooks: registers gpu-admission's
//!    `/mutate` and `/validate` (replica a, mutual TLS) for one namespace with a GPUQuota,
//!    then `--creates` sequential creates there, alternating with the same pod in a
//!    namespace the webhooks do not select, one with a core ResourceQuota, and one whose
//!    GPUQuota says `onExceed: Queue` (created gated, charged when let go);
//! 4. the quota queue (`examples/scale/queue.rs`): `--queue` pods waiting behind a full
//!    `Queue` quota, and the time from room appearing to the next pod let go;
//! 5. the defragmentation planner's API load (`examples/scale/defrag.rs`): replica a's
//!    requests per minute, counted in kube-apiserver's audit log, with no GPU pod pending
//!    and with one `Fragmented` pod pending (`--defrag-seconds` each);
//! 6. prints a summary block (or writes it to `--summary-file`, for hack/scale.sh to print).
//!
//! Progress goes to stderr, results to stdout.

#[path = "../tests/e2e/support/shapes.rs"]
mod shapes;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use gpu_admission::quota::GPUQuota;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config};
use parking_lot::Mutex;
use serde_json::json;

use shapes::{CORE, MEMORY, MEMORY_PER_GPU, MODEL_LABEL, TYPE_ANNOTATION, WEBHOOK_LABEL};

const MODELS: [&str; 2] = ["Tesla-V100-SXM2-32GB", "Tesla-T4"];
const GPUS_PER_NODE: u32 = 8;
const WHOLE_GPU: &str = "nvidia.com/gpu";
const NODE_LABEL: &str = "gpu-admission-scale/node";
const PHASE_LABEL: &str = "gpu-admission-scale/phase";
const THROUGHPUT_NS: &str = "scale-throughput";
const HOOKS_NS: &str = "scale-quota";
const NO_HOOKS_NS: &str = "scale-nohooks";
/// Without webhooks, but with a core ResourceQuota: the platform's own exact quota, whose
/// admission plugin also writes a quota status on every create (the floor to compare with).
const CORE_QUOTA_NS: &str = "scale-corequota";
/// With the webhooks and a GPUQuota that says `onExceed: Queue`: pods are created gated,
/// charged nothing, and charged by the releaser when it lets them go.
const QUEUE_NS: &str = "scale-queue";
/// The value of [`WEBHOOK_LABEL`] the benchmark's webhooks select.
const WEBHOOK_SELECTOR: &str = "scale";
const WEBHOOK_CONFIG: &str = "gpu-admission-scale";
/// A scheduler nobody runs (the webhook probe pods stay unbound).
const NO_SCHEDULER: &str = "scale-nobody";
const IMAGE: &str = "registry.invalid/never-pulled:scale";

#[derive(Parser, Debug)]
#[command(about = "gpu-admission at cluster scale (the driver of hack/scale.sh)")]
struct Args {
    /// Admin kubeconfig of the cluster.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Fake GPU nodes to create (half of each of two models).
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Pods per profile per throughput phase (0 skips the throughput part).
    #[arg(long, default_value_t = 500)]
    pods: usize,
    /// Parallel creators (nodes, throughput pods, deletes).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Sequential creates per side for the create-latency part (0 skips it).
    #[arg(long, default_value_t = 1000)]
    creates: usize,
    /// Pods waiting in the quota queue while releases are timed (0 skips that part).
    #[arg(long, default_value_t = 1000)]
    queue: usize,
    /// Releases timed, one at a time, with the queue behind them.
    #[arg(long, default_value_t = 100)]
    releases: usize,
    /// Seconds of each window of the planner's API load (0 skips that part).
    #[arg(long, default_value_t = 0)]
    defrag_seconds: u64,
    /// The script that restarts both replicas for the planner's phase, replica a with
    /// `defrag.mode: DryRun` as `--sidecar-user` (hack/scale.sh writes it).
    #[arg(long)]
    defrag_restart: Option<PathBuf>,
    /// kube-apiserver's audit log (JSON lines) holding `--sidecar-user`'s requests.
    #[arg(long)]
    audit_log: Option<PathBuf>,
    /// The user replica a runs as in the planner's phase.
    #[arg(long, default_value = "scale-sidecar")]
    sidecar_user: String,
    /// kube-scheduler's /metrics URL (its secure port).
    #[arg(long)]
    scheduler_metrics: String,
    /// Client certificate (PEM) for kube-scheduler's /metrics: the admin's.
    #[arg(long)]
    client_cert: PathBuf,
    /// Its key.
    #[arg(long)]
    client_key: PathBuf,
    /// Admin URL (http) of gpu-admission replica a, the extender (its /metrics).
    #[arg(long)]
    admin_url: String,
    /// https URL of the webhook door (`/mutate`, `/validate`) the webhooks call.
    #[arg(long)]
    webhook_url: String,
    /// gpu-admission's serving CA (the webhooks' caBundle).
    #[arg(long)]
    ca_file: PathBuf,
    /// kubectl, for the size of `kubectl get gq -o json`.
    #[arg(long, default_value = "kubectl")]
    kubectl: PathBuf,
    /// The scheduler profile that calls gpu-admission as its extender.
    #[arg(long, default_value = "gpu-scheduler")]
    gpu_scheduler: String,
    /// The plain scheduler profile.
    #[arg(long, default_value = "default-scheduler")]
    plain_scheduler: String,
    /// Also write the summary block to this file.
    #[arg(long)]
    summary_file: Option<PathBuf>,
}

/// Progress, to stderr with the time since start.
macro_rules! say {
    ($start:expr, $($arg:tt)*) => {
        eprintln!("scale [{:.0}s]: {}", $start.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

// After `say!`, which it uses.
#[path = "scale/queue.rs"]
mod queue;

#[path = "scale/defrag.rs"]
mod defrag;

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.clients == 0 {
        bail!("--clients must be at least 1");
    }
    if args.nodes < 2 {
        bail!("--nodes must be at least 2 (one per model)");
    }
    if args.defrag_seconds > 0 && (args.defrag_restart.is_none() || args.audit_log.is_none()) {
        bail!("--defrag-seconds needs --defrag-restart and --audit-log");
    }
    if (1..20).contains(&args.defrag_seconds) {
        bail!(
            "--defrag-seconds must be 0 or at least 20: the pending pod is planned for after \
             pendingSeconds (5) and the planner's next pass (every 10 s)"
        );
    }
    let start = Instant::now();
    let client = connect(&args.kubeconfig).await?;
    let mut summary = String::new();

    for ns in [
        THROUGHPUT_NS,
        HOOKS_NS,
        NO_HOOKS_NS,
        CORE_QUOTA_NS,
        QUEUE_NS,
    ] {
        create_namespace(&client, ns).await?;
    }

    say!(
        start,
        "creating {} GPU nodes with {} clients",
        args.nodes,
        args.clients
    );
    let took = create_nodes(&client, args.nodes, args.clients).await?;
    let line = format!(
        "nodes: {} created in {:.1} s ({:.0} nodes/s; {} x {GPUS_PER_NODE} GPUs, models {} / {})",
        args.nodes,
        took.as_secs_f64(),
        args.nodes as f64 / took.as_secs_f64(),
        args.nodes,
        MODELS[0],
        MODELS[1]
    );
    println!("{line}");
    writeln!(summary, "{line}")?;
    // kube-scheduler and gpu-admission learn the nodes from their watches.
    wait_scheduler_nodes(&args, args.nodes, &start).await?;

    if args.pods > 0 {
        throughput(&args, &client, &start, &mut summary).await?;
    }
    if args.creates > 0 {
        create_latency(&args, &client, &start, &mut summary).await?;
    }
    if args.queue > 0 && args.releases > 0 {
        queue::release_latency(&args, &client, &start, &mut summary).await?;
    }
    if args.defrag_seconds > 0 {
        defrag::planner_load(&args, &client, &start, &mut summary).await?;
    }

    match &args.summary_file {
        Some(path) => std::fs::write(path, &summary)
            .with_context(|| format!("writing the summary to {}", path.display()))?,
        None => println!("\n== summary\n{summary}"),
    }
    say!(start, "done");
    Ok(())
}

async fn connect(path: &Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("bad kubeconfig {}", path.display()))?;
    let client = Client::try_from(config).context("cannot build a kube client")?;
    client
        .apiserver_version()
        .await
        .with_context(|| format!("the API server of {} does not answer", path.display()))?;
    Ok(client)
}

fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating namespace {name}")),
    }
}

// ------------------------------------------------------------------------------- nodes

fn node_name(i: usize) -> String {
    format!("scale-node-{i:05}")
}

/// Creates the nodes with their Ready status in one request each (a kubelet registers the
/// same way); lifts a `not-ready` taint should the TaintNodesByCondition admission plugin
/// be on (hack/scale.sh turns it off: there is no node lifecycle controller to lift it).
async fn create_nodes(client: &Client, count: usize, clients: usize) -> Result<Duration> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut resources = shapes::node_resources(GPUS_PER_NODE);
    resources[WHOLE_GPU] = json!(GPUS_PER_NODE.to_string());
    let status = shapes::ready_node_status(&resources, "hack/scale.sh node (no kubelet)");
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let nodes = nodes.clone();
            let status = status.clone();
            async move {
                let name = node_name(i);
                let node: Node = serde_json::from_value(json!({
                    "metadata": {
                        "name": name,
                        "labels": {MODEL_LABEL: MODELS[i % 2], NODE_LABEL: "true"},
                    },
                    "status": status,
                }))?;
                let created = match nodes.create(&PostParams::default(), &node).await {
                    Ok(created) => created,
                    Err(e) if is_status(&e, 409) => nodes
                        .get(&name)
                        .await
                        .with_context(|| format!("reading node {name}"))?,
                    Err(e) => return Err(e).with_context(|| format!("creating node {name}")),
                };
                let tainted = created
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| !t.is_empty());
                if tainted {
                    nodes
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"spec": {"taints": null}})),
                        )
                        .await
                        .with_context(|| format!("removing the taints of node {name}"))?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(clients)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(started.elapsed())
}

/// Waits until kube-scheduler's cache holds `count` nodes (`scheduler_cache_size`).
async fn wait_scheduler_nodes(args: &Args, count: usize, start: &Instant) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = scrape_scheduler(args)?;
        let nodes = Samples::parse(&text).sum("scheduler_cache_size", &[("type", "nodes")]);
        if nodes as usize >= count {
            say!(start, "kube-scheduler's cache holds {nodes} nodes");
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("kube-scheduler's cache holds {nodes} nodes, not {count}, after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// ------------------------------------------------------------------------------- metrics

fn curl(url: &str, identity: Option<(&Path, &Path)>) -> Result<String> {
    let mut command = Command::new("curl");
    command.args(["-fsS", "--max-time", "30"]);
    if let Some((cert, key)) = identity {
        // kube-scheduler serves a self-signed certificate of its own (--cert-dir).
        command
            .arg("-k")
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key);
    }
    let out = command
        .arg(url)
        .output()
        .with_context(|| format!("running curl {url}"))?;
    if !out.status.success() {
        bail!(
            "curl {url} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{url} answered non-UTF-8"))
}

fn scrape_scheduler(args: &Args) -> Result<String> {
    curl(
        &args.scheduler_metrics,
        Some((&args.client_cert, &args.client_key)),
    )
}

fn scrape_admin(args: &Args) -> Result<String> {
    curl(&format!("{}/metrics", args.admin_url), None)
}

/// One sample of the Prometheus text format.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

struct Samples(Vec<Sample>);

impl Samples {
    /// Parses the text exposition format; lines it cannot read are skipped.
    fn parse(text: &str) -> Samples {
        Samples(text.lines().filter_map(parse_sample).collect())
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        filter: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && filter
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|l| l == v))
        })
    }

    /// The sum of the samples of `name` whose labels include `filter`.
    fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.matching(name, filter).map(|s| s.value).sum()
    }

    /// Histogram `name` (its `_bucket`, `_sum`, `_count`) summed over the series whose
    /// labels include `filter`.
    fn histogram(&self, name: &str, filter: &[(&str, &str)]) -> Histogram {
        let mut buckets: BTreeMap<Le, f64> = BTreeMap::new();
        let bucket = format!("{name}_bucket");
        for s in self.matching(&bucket, filter) {
            let Some(le) = s.labels.get("le").and_then(|le| Le::parse(le)) else {
                continue;
            };
            *buckets.entry(le).or_default() += s.value;
        }
        Histogram {
            buckets: buckets.into_iter().collect(),
            sum: self.sum(&format!("{name}_sum"), filter),
            count: self.sum(&format!("{name}_count"), filter),
        }
    }

    /// `label` values of the series of `name`, with their summed values.
    fn by_label(&self, name: &str, filter: &[(&str, &str)], label: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.matching(name, filter) {
            let key = s.labels.get(label).cloned().unwrap_or_default();
            *out.entry(key).or_default() += s.value;
        }
        out
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, rest) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (&line[..close + 1], &line[close + 1..])
        }
        None => line.split_once(' ')?,
    };
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, body)) => (name, parse_labels(body.strip_suffix('}')?)?),
        None => (series, BTreeMap::new()),
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"` (values with `\"`, `\\`, `\n` escapes).
fn parse_labels(body: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        }
        labels.insert(key.trim().to_string(), value);
    }
}

/// A bucket's upper bound, ordered (`+Inf` last).
#[derive(Clone, Copy, Debug)]
struct Le(f64);

impl PartialEq for Le {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Le {}

impl PartialOrd for Le {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Le {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Le {
    fn parse(text: &str) -> Option<Le> {
        match text {
            "+Inf" | "Inf" => Some(Le(f64::INFINITY)),
            _ => text.parse().ok().map(Le),
        }
    }
}

/// A cumulative histogram (or the difference of two readings of one).
#[derive(Clone, Debug, Default)]
struct Histogram {
    /// (upper bound, cumulative count), ascending.
    buckets: Vec<(Le, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    /// `self - before`: what was observed between the two readings.
    fn since(&self, before: &Histogram) -> Histogram {
        let old: HashMap<u64, f64> = before
            .buckets
            .iter()
            .map(|(le, c)| (le.0.to_bits(), *c))
            .collect();
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| (*le, c - old.get(&le.0.to_bits()).copied().unwrap_or(0.0)))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    fn add(&mut self, other: &Histogram) {
        if self.buckets.is_empty() {
            self.buckets = other.buckets.clone();
        } else {
            for ((_, mine), (_, theirs)) in self.buckets.iter_mut().zip(&other.buckets) {
                *mine += theirs;
            }
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    fn mean_ms(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count * 1000.0)
    }

    /// The q-quantile in milliseconds, interpolated linearly inside its bucket (as
    /// Prometheus' histogram_quantile), as text: `~3.2 ms`; `>204.8 ms` when it falls in
    /// the `+Inf` bucket (beyond the largest finite bound).
    fn quantile(&self, q: f64) -> Option<String> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for (le, cumulative) in &self.buckets {
            if *cumulative >= rank {
                if le.0.is_infinite() {
                    return Some(format!(">{:.1} ms", lower * 1000.0));
                }
                let inside = cumulative - below;
                let fraction = if inside > 0.0 {
                    (rank - below) / inside
                } else {
                    1.0
                };
                return Some(format!(
                    "~{:.1} ms",
                    (lower + (le.0 - lower) * fraction) * 1000.0
                ));
            }
            lower = le.0;
            below = *cumulative;
        }
        None
    }

    /// `mean 4.1 ms, p50 ~3.2 ms, p99 ~12.0 ms (500)`.
    fn describe(&self) -> String {
        match (self.mean_ms(), self.quantile(0.5), self.quantile(0.99)) {
            (Some(mean), Some(p50), Some(p99)) => format!(
                "mean {mean:.1} ms, p50 {p50}, p99 {p99} ({:.0})",
                self.count
            ),
            (Some(mean), _, _) => format!("mean {mean:.1} ms ({:.0})", self.count),
            _ => "no observations".to_string(),
        }
    }
}

/// What the two /metrics say about one phase (differences of readings around it).
#[derive(Clone, Debug, Default)]
struct SchedulerStats {
    /// scheduler_scheduling_attempt_duration_seconds{profile, result="scheduled"}.
    attempt: Histogram,
    /// scheduler_schedule_attempts_total{profile} by result.
    attempts: BTreeMap<String, f64>,
    /// scheduler_scheduling_algorithm_duration_seconds (no profile label; phases run one
    /// at a time, so a phase's difference is its profile's): filter (plugins, then the
    /// extender) and score.
    algorithm: Histogram,
    /// scheduler_framework_extension_point_duration_seconds{profile}: Filter (the
    /// plugins only, not the extender) and Bind.
    filter_plugins: Histogram,
    bind: Histogram,
    /// gpu_admission_request_duration_seconds{route="predicates"} on replica a.
    extender: Histogram,
    /// gpu_admission_requests_total{route="predicates"} by decision.
    extender_decisions: BTreeMap<String, f64>,
}

impl SchedulerStats {
    fn between(
        profile: &str,
        (sched_before, admin_before): &(Samples, Samples),
        (sched_after, admin_after): &(Samples, Samples),
    ) -> SchedulerStats {
        let h = |s: &Samples, name: &str, filter: &[(&str, &str)]| s.histogram(name, filter);
        let diff = |name: &str, filter: &[(&str, &str)]| {
            h(sched_after, name, filter).since(&h(sched_before, name, filter))
        };
        let counts = |before: &Samples, after: &Samples, name, filter: &[(&str, &str)], label| {
            let mut counts = after.by_label(name, filter, label);
            for (key, n) in before.by_label(name, filter, label) {
                *counts.entry(key).or_default() -= n;
            }
            counts.retain(|_, n| *n != 0.0);
            counts
        };
        let attempts = counts(
            sched_before,
            sched_after,
            "scheduler_schedule_attempts_total",
            &[("profile", profile)],
            "result",
        );
        let extender_filter = [("route", "predicates")];
        let extender_decisions = counts(
            admin_before,
            admin_after,
            "gpu_admission_requests_total",
            &extender_filter,
            "decision",
        );
        SchedulerStats {
            attempt: diff(
                "scheduler_scheduling_attempt_duration_seconds",
                &[("profile", profile), ("result", "scheduled")],
            ),
            attempts,
            algorithm: diff("scheduler_scheduling_algorithm_duration_seconds", &[]),
            filter_plugins: diff(
                "scheduler_framework_extension_point_duration_seconds",
                &[("profile", profile), ("extension_point", "Filter")],
            ),
            bind: diff(
                "scheduler_framework_extension_point_duration_seconds",
                &[("profile", profile), ("extension_point", "Bind")],
            ),
            extender: h(
                admin_after,
                "gpu_admission_request_duration_seconds",
                &extender_filter,
            )
            .since(&h(
                admin_before,
                "gpu_admission_request_duration_seconds",
                &extender_filter,
            )),
            extender_decisions,
        }
    }

    fn add(&mut self, other: &SchedulerStats) {
        self.attempt.add(&other.attempt);
        for (result, n) in &other.attempts {
            *self.attempts.entry(result.clone()).or_default() += n;
        }
        self.algorithm.add(&other.algorithm);
        self.filter_plugins.add(&other.filter_plugins);
        self.bind.add(&other.bind);
        self.extender.add(&other.extender);
        for (decision, n) in &other.extender_decisions {
            *self.extender_decisions.entry(decision.clone()).or_default() += n;
        }
    }

    fn lines(&self, indent: &str) -> String {
        let attempts = counts(&self.attempts);
        let mut out = format!(
            "{indent}scheduling attempt (scheduled; algorithm + bind): {}\n\
             {indent}attempts: {}\n\
             {indent}scheduling algorithm (filter incl. extender + score): {}\n\
             {indent}Filter extension point (plugins, not the extender): {}\n\
             {indent}Bind extension point: {}\n",
            self.attempt.describe(),
            attempts,
            self.algorithm.describe(),
            self.filter_plugins.describe(),
            self.bind.describe(),
        );
        if self.extender.count > 0.0 {
            let _ = writeln!(
                out,
                "{indent}gpu-admission /scheduler/predicates (inside the server): {}; answers: {}",
                self.extender.describe(),
                counts(&self.extender_decisions)
            );
        }
        out
    }
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), `?` where unreadable.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "?".to_string())
}

/// `a 3, b 1` (or `none`).
fn counts(counts: &BTreeMap<String, f64>) -> String {
    if counts.is_empty() {
        return "none".to_string();
    }
    counts
        .iter()
        .map(|(key, n)| format!("{key} {n:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn read_metrics(args: &Args) -> Result<(Samples, Samples)> {
    Ok((
        Samples::parse(&scrape_scheduler(args)?),
        Samples::parse(&scrape_admin(args)?),
    ))
}

// ------------------------------------------------------------------------------- throughput

#[derive(Clone, Copy, Debug, PartialEq)]
enum Profile {
    Plain,
    Gpu,
}

impl Profile {
    fn label(self) -> &'static str {
        match self {
            Profile::Plain => "plain",
            Profile::Gpu => "gpu",
        }
    }

    fn scheduler(self, args: &Args) -> &str {
        match self {
            Profile::Plain => &args.plain_scheduler,
            Profile::Gpu => &args.gpu_scheduler,
        }
    }

    /// Plain: `nvidia.com/gpu: 1`, fit by kube-scheduler itself. GPU: one GPU in
    /// gpu-manager resources, which only the extender understands.
    fn pod(self, args: &Args, name: &str, phase: usize) -> Result<Pod> {
        let limits = match self {
            Profile::Plain => json!({WHOLE_GPU: "1"}),
            Profile::Gpu => json!({CORE: "100", MEMORY: MEMORY_PER_GPU.to_string()}),
        };
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {PHASE_LABEL: phase.to_string()}},
            "spec": {
                "schedulerName": self.scheduler(args),
                "containers": [{
                    "name": "main",
                    "image": IMAGE,
                    "resources": {"limits": limits},
                }],
            },
        }))?)
    }
}

struct PhaseResult {
    profile: Profile,
    pods_per_second: f64,
    stats: SchedulerStats,
}

async fn throughput(
    args: &Args,
    client: &Client,
    start: &Instant,
    summary: &mut String,
) -> Result<()> {
    let order = [Profile::Plain, Profile::Gpu, Profile::Gpu, Profile::Plain];
    println!(
        "\n== throughput: {} pods per phase, {} parallel creators, order plain gpu gpu plain",
        args.pods, args.clients
    );
    let mut results = Vec::new();
    for (i, profile) in order.into_iter().enumerate() {
        let phase = i + 1;
        say!(
            start,
            "phase {phase} ({}): creating {} pods",
            profile.label(),
            args.pods
        );
        let load = load_average();
        let before = read_metrics(args)?;
        let run = run_phase(args, client, profile, phase).await?;
        let after = read_metrics(args)?;
        let stats = SchedulerStats::between(profile.scheduler(args), &before, &after);
        let rate = args.pods as f64 / run.all_bound.as_secs_f64();
        println!(
            "phase {phase} {:<5} {:>7.1} pods/s: {} pods created in {:.2} s, all bound after {:.2} s; \
             create->bound p50 {:.0} ms, p99 {:.0} ms; load average before {load}",
            profile.label(),
            rate,
            args.pods,
            run.created.as_secs_f64(),
            run.all_bound.as_secs_f64(),
            run.latency_p50_ms,
            run.latency_p99_ms,
        );
        print!("{}", stats.lines("    "));
        say!(start, "phase {phase}: deleting the pods");
        let deleted = delete_phase(args, client, phase).await?;
        say!(
            start,
            "phase {phase}: pods gone after {:.1} s",
            deleted.as_secs_f64()
        );
        results.push(PhaseResult {
            profile,
            pods_per_second: rate,
            stats,
        });
    }

    let per_profile = |profile: Profile| {
        let runs: Vec<&PhaseResult> = results.iter().filter(|r| r.profile == profile).collect();
        let rates: Vec<f64> = runs.iter().map(|r| r.pods_per_second).collect();
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let mut stats = SchedulerStats::default();
        for run in &runs {
            stats.add(&run.stats);
        }
        (mean, rates, stats)
    };
    let (plain_mean, plain_rates, plain_stats) = per_profile(Profile::Plain);
    let (gpu_mean, gpu_rates, gpu_stats) = per_profile(Profile::Gpu);
    let rates = |r: &[f64]| {
        r.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    writeln!(
        summary,
        "throughput ({} pods per phase, {} creators, order A B B A; load average at the end {}):",
        args.pods,
        args.clients,
        load_average()
    )?;
    writeln!(
        summary,
        "  plain ({}): mean {plain_mean:.1} pods/s (phases 1, 4: {})",
        args.plain_scheduler,
        rates(&plain_rates)
    )?;
    writeln!(
        summary,
        "  gpu   ({}): mean {gpu_mean:.1} pods/s (phases 2, 3: {})",
        args.gpu_scheduler,
        rates(&gpu_rates)
    )?;
    writeln!(summary, "  ratio gpu/plain: {:.2}", gpu_mean / plain_mean)?;
    writeln!(summary, "  kube-scheduler, plain profile (phases 1+4):")?;
    summary.push_str(&plain_stats.lines("    "));
    writeln!(summary, "  kube-scheduler, gpu profile (phases 2+3):")?;
    summary.push_str(&gpu_stats.lines("    "));
    Ok(())
}

struct PhaseRun {
    created: Duration,
    all_bound: Duration,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
}

async fn run_phase(
    args: &Args,
    client: &Client,
    profile: Profile,
    phase: usize,
) -> Result<PhaseRun> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), THROUGHPUT_NS);
    let selector = format!("{PHASE_LABEL}={phase}");
    let wanted = args.pods;

    // The watch first (its initial list done), so no binding goes unseen.
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    let watch_api = pods.clone();
    let watch_selector = selector.clone();
    let watch = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let mut bound: HashMap<String, Instant> = HashMap::new();
        let stream = watcher::watcher(
            watch_api,
            watcher::Config::default().labels(&watch_selector),
        )
        .default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.try_next().await? {
            let pod = match event {
                Event::InitDone => {
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Event::Apply(pod) | Event::InitApply(pod) => pod,
                Event::Init | Event::Delete(_) => continue,
            };
            let is_bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
            if let (true, Some(name)) = (is_bound, pod.metadata.name) {
                bound.entry(name).or_insert_with(Instant::now);
                if bound.len() >= wanted {
                    return Ok(bound);
                }
            }
        }
        Err(anyhow!("the pod watch ended"))
    });
    listed_rx
        .await
        .map_err(|_| anyhow!("the pod watch of phase {phase} failed before its first list"))?;

    let started = Instant::now();
    let create_started: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    futures::stream::iter(0..wanted)
        .map(|i| {
            let pods = pods.clone();
            let create_started = create_started.clone();
            async move {
                let name = format!("{}-{phase}-{i:05}", profile.label());
                let pod = profile.pod(args, &name, phase)?;
                create_started.lock().insert(name.clone(), Instant::now());
                pods.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating pod {THROUGHPUT_NS}/{name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.clients)
        .try_collect::<Vec<()>>()
        .await?;
    let created = started.elapsed();

    let patience = Duration::from_secs(120).max(Duration::from_secs_f64(wanted as f64 / 2.0));
    let bound = match tokio::time::timeout(patience, watch).await {
        Ok(joined) => joined.context("the pod watch task")??,
        Err(_) => {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .context("listing the phase's pods")?;
            let bound = list
                .items
                .iter()
                .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
                .count();
            bail!(
                "phase {phase} ({}): only {bound} of {wanted} pods bound after {patience:?} \
                 (see the kube-scheduler and gpu-admission logs)",
                profile.label()
            );
        }
    };
    let last = bound.values().max().copied().unwrap_or(started);
    let all_bound = last.duration_since(started);
    let create_started = create_started.lock();
    let mut latencies: Vec<Duration> = bound
        .iter()
        .filter_map(|(name, at)| Some(at.saturating_duration_since(*create_started.get(name)?)))
        .collect();
    latencies.sort_unstable();
    Ok(PhaseRun {
        created,
        all_bound,
        latency_p50_ms: percentile_ms(&latencies, 50.0),
        latency_p99_ms: percentile_ms(&latencies, 99.0),
    })
}

/// Force-deletes the phase's pods (grace period 0: bound pods would otherwise wait for a
/// kubelet that does not exist) and waits until the API has none left.
async fn delete_phase(args: &Args, client: &Client, phase: usize) -> Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), THROUGHPUT_NS);
    let selector = format!("{PHASE_LABEL}={phase}");
    let started = Instant::now();
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .context("listing the phase's pods")?;
    let names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let now = DeleteParams::default().grace_period(0);
    futures::stream::iter(names)
        .map(|name| {
            let pods = pods.clone();
            let now = now.clone();
            async move {
                match pods.delete(&name, &now).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_status(&e, 404) => Ok(()),
                    Err(e) => {
                        Err(e).with_context(|| format!("deleting pod {THROUGHPUT_NS}/{name}"))
                    }
                }
            }
        })
        .buffer_unordered(args.clients)
        .try_collect::<Vec<()>>()
        .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = pods
            .list(&ListParams::default().labels(&selector).limit(1))
            .await
            .context("listing the phase's pods")?;
        if left.items.is_empty() {
            return Ok(started.elapsed());
        }
        if Instant::now() >= deadline {
            bail!("phase {phase}: pods still there 120 s after deleting them");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// p-th percentile (0..=100, nearest rank) of sorted `samples`, in milliseconds (NaN
/// when there are none).
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

// ------------------------------------------------------------------------------- create latency

async fn create_latency(
    args: &Args,
    client: &Client,
    start: &Instant,
    summary: &mut String,
) -> Result<()> {
    println!(
        "\n== pod-create latency: {} sequential creates with webhooks (Deny, Queue), alternating with the same pod without (no quota, core ResourceQuota)",
        args.creates
    );
    // 100,000 GPUs of each model: the creates measure the path, never a refusal.
    for (namespace, on_exceed) in [(HOOKS_NS, "Deny"), (QUEUE_NS, "Queue")] {
        let spec = json!({"hard": {MODELS[0]: "100000", MODELS[1]: "100000"},
                          "defaultType": MODELS[0], "onExceed": on_exceed});
        quota_namespace(client, namespace, spec).await?;
    }
    let quotas: Api<GPUQuota> = Api::namespaced(client.clone(), HOOKS_NS);
    register_webhooks(args, client).await?;
    wait_webhooks_effective(client, start).await?;

    core_resource_quota(client).await?;
    let hooks: Api<Pod> = Api::namespaced(client.clone(), HOOKS_NS);
    let plain: Api<Pod> = Api::namespaced(client.clone(), NO_HOOKS_NS);
    let core: Api<Pod> = Api::namespaced(client.clone(), CORE_QUOTA_NS);
    let queued: Api<Pod> = Api::namespaced(client.clone(), QUEUE_NS);
    let mut core_quota = Vec::new();
    let mut queue_quota = Vec::new();
    let before = read_metrics(args)?;
    let (mut with_hooks, mut without) = (Vec::new(), Vec::new());
    say!(
        start,
        "creating {} pods in each of {HOOKS_NS}, {NO_HOOKS_NS}, {CORE_QUOTA_NS} and {QUEUE_NS}",
        args.creates
    );
    // The ledger as the creates pile up: the GPUQuota read every 10 creates (its entries:
    // pending totals, or per-pod reservations before them;
    // size of the object as JSON); each create is filed under the last reading.
    let mut ledger_at = Vec::with_capacity(args.creates);
    let (mut reading, mut readings) = ((0, 0), Vec::new());
    for i in 0..args.creates {
        if i % 10 == 0 {
            let quota = quotas
                .get("default")
                .await
                .with_context(|| format!("reading GPUQuota {HOOKS_NS}/default"))?;
            let reservations = quota
                .status
                .as_ref()
                .map_or(0, |s| s.pending.len() + s.reservations.len());
            reading = (reservations, serde_json::to_vec(&quota)?.len());
            readings.push(reading);
        }
        ledger_at.push(reading.0);
        let name = format!("lat-{i:05}");
        let pod = Profile::Gpu.pod(args, &name, 0)?;
        // The four sides in turn, the first one moving by one each round.
        let sides = [
            (&hooks, HOOKS_NS, &mut with_hooks),
            (&plain, NO_HOOKS_NS, &mut without),
            (&core, CORE_QUOTA_NS, &mut core_quota),
            (&queued, QUEUE_NS, &mut queue_quota),
        ];
        let mut sides: Vec<_> = sides.into_iter().collect();
        sides.rotate_left(i % 4);
        for (api, namespace, samples) in sides {
            let t = Instant::now();
            api.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("creating pod {namespace}/{name}"))?;
            samples.push(t.elapsed());
        }
        if (i + 1) % 250 == 0 {
            say!(start, "{} creates each", i + 1);
        }
    }
    let after = read_metrics(args)?;
    let quota_now = quota_ledger(args, &quotas).await?;
    say!(
        start,
        "waiting up to 30 s for the GPUQuota's reservations to settle"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut quota_settled = quota_ledger(args, &quotas).await?;
    while quota_settled.reservations > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        quota_settled = quota_ledger(args, &quotas).await?;
    }

    let head = args.creates.min(100);
    let first: Vec<Duration> = sorted(&with_hooks[..head]);
    let last: Vec<Duration> = sorted(&with_hooks[args.creates - head..]);
    let with_sorted = sorted(&with_hooks);
    let without_sorted = sorted(&without);
    let core_sorted = sorted(&core_quota);
    let queue_sorted = sorted(&queue_quota);
    let p = |s: &[Duration], q: f64| percentile_ms(s, q);
    let route = |samples: &(Samples, Samples), route: &str| {
        samples.1.histogram(
            "gpu_admission_request_duration_seconds",
            &[("route", route)],
        )
    };
    let mutate = route(&after, "mutate").since(&route(&before, "mutate"));
    let validate = route(&after, "validate").since(&route(&before, "validate"));
    let lines = [
        format!(
            "pod-create latency ({} sequential creates each, 1-GPU {} pods):",
            args.creates, args.gpu_scheduler
        ),
        format!(
            "  with webhooks (mutate + validate with quota reservation): p50 {:.1} ms, p99 {:.1} ms",
            p(&with_sorted, 50.0),
            p(&with_sorted, 99.0)
        ),
        format!(
            "  without webhooks: p50 {:.1} ms, p99 {:.1} ms",
            p(&without_sorted, 50.0),
            p(&without_sorted, 99.0)
        ),
        format!(
            "  without webhooks, in a namespace with a core ResourceQuota: p50 {:.1} ms, p99 {:.1} ms",
            p(&core_sorted, 50.0),
            p(&core_sorted, 99.0)
        ),
        format!(
            "  with webhooks, in a namespace whose GPUQuota says onExceed: Queue (created gated, no quota write): p50 {:.1} ms, p99 {:.1} ms",
            p(&queue_sorted, 50.0),
            p(&queue_sorted, 99.0)
        ),
        format!(
            "  ratio of p50s to without webhooks: Deny {:.2} (+{:.1} ms), Queue {:.2} (+{:.1} ms), core ResourceQuota {:.2}",
            p(&with_sorted, 50.0) / p(&without_sorted, 50.0),
            p(&with_sorted, 50.0) - p(&without_sorted, 50.0),
            p(&queue_sorted, 50.0) / p(&without_sorted, 50.0),
            p(&queue_sorted, 50.0) - p(&without_sorted, 50.0),
            p(&core_sorted, 50.0) / p(&without_sorted, 50.0)
        ),
        format!(
            "  with webhooks, p50 of the first {head} creates {:.1} ms, of the last {head} {:.1} ms",
            p(&first, 50.0),
            p(&last, 50.0)
        ),
        format!(
            "  GPUQuota during the creates (read every 10): reservations mean {:.0}, max {}; object max {} bytes",
            readings.iter().map(|r| r.0).sum::<usize>() as f64 / readings.len().max(1) as f64,
            readings.iter().map(|r| r.0).max().unwrap_or(0),
            readings.iter().map(|r| r.1).max().unwrap_or(0),
        ),
        format!(
            "  with webhooks, p50 by reservations in the ledger at the time: {}",
            by_ledger(&with_hooks, &ledger_at)
        ),
        format!("  inside gpu-admission: /mutate {}", mutate.describe()),
        format!("  inside gpu-admission: /validate {}", validate.describe()),
        format!(
            "  GPUQuota right after the creates: {}",
            quota_now.describe()
        ),
        format!("  GPUQuota once settled: {}", quota_settled.describe()),
    ];
    for line in lines {
        println!("{line}");
        writeln!(summary, "{line}")?;
    }
    Ok(())
}

/// Label `namespace` for the webhooks and give it the GPUQuota `default` with `spec`
/// (kept if it exists).
async fn quota_namespace(client: &Client, namespace: &str, spec: serde_json::Value) -> Result<()> {
    Api::<Namespace>::all(client.clone())
        .patch(
            namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {WEBHOOK_LABEL: WEBHOOK_SELECTOR}}})),
        )
        .await
        .with_context(|| format!("labelling namespace {namespace}"))?;
    let quotas: Api<GPUQuota> = Api::namespaced(client.clone(), namespace);
    let quota: GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": spec,
    }))?;
    match quotas.create(&PostParams::default(), &quota).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(e).context(format!("creating GPUQuota {namespace}/default")),
    }
}

/// A ResourceQuota on the pod count in [`CORE_QUOTA_NS`], with the status the quota
/// controller would write (no controller-manager runs here), so its admission plugin
/// checks and writes it on every create.
async fn core_resource_quota(client: &Client) -> Result<()> {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), CORE_QUOTA_NS);
    let quota: ResourceQuota = serde_json::from_value(
        json!({"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "1000000"}}}),
    )?;
    let mut quota = api
        .create(&PostParams::default(), &quota)
        .await
        .with_context(|| format!("creating ResourceQuota {CORE_QUOTA_NS}/pods"))?;
    quota.status = Some(serde_json::from_value(
        json!({"hard": {"pods": "1000000"}, "used": {"pods": "0"}}),
    )?);
    api.replace_status("pods", &PostParams::default(), &quota)
        .await
        .with_context(|| format!("writing the status of ResourceQuota {CORE_QUOTA_NS}/pods"))?;
    Ok(())
}

/// p50 of `samples` grouped by the reservations the ledger held (`ledger_at`, same order):
/// `<25: 30.1 ms (400), 25-99: ...`.
fn by_ledger(samples: &[Duration], ledger_at: &[usize]) -> String {
    let groups: [(&str, std::ops::Range<usize>); 4] = [
        ("<25", 0..25),
        ("25-99", 25..100),
        ("100-199", 100..200),
        (">=200", 200..usize::MAX),
    ];
    groups
        .iter()
        .filter_map(|(label, range)| {
            let group: Vec<Duration> = samples
                .iter()
                .zip(ledger_at)
                .filter(|(_, at)| range.contains(at))
                .map(|(d, _)| *d)
                .collect();
            (!group.is_empty()).then(|| {
                format!(
                    "{label}: {:.1} ms ({})",
                    percentile_ms(&sorted(&group), 50.0),
                    group.len()
                )
            })
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn sorted(samples: &[Duration]) -> Vec<Duration> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted
}

/// gpu-admission's `/mutate` and `/validate` as the apiserver's webhooks for pods in the
/// namespaces labelled [`WEBHOOK_LABEL`]`=`[`WEBHOOK_SELECTOR`], as the e2e suite and
/// deploy/ register them (shapes::webhook).
async fn register_webhooks(args: &Args, client: &Client) -> Result<()> {
    use base64::Engine as _;
    let ca = std::fs::read(&args.ca_file)
        .with_context(|| format!("reading gpu-admission's CA {}", args.ca_file.display()))?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let url = args.webhook_url.trim_end_matches('/');
    let hook = |path: &str, validating: bool| {
        shapes::webhook(
            &format!("{path}.gpu-admission.io"),
            &format!("{url}/{path}"),
            &ca_bundle,
            validating,
            WEBHOOK_SELECTOR,
            None,
        )
    };
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": WEBHOOK_CONFIG},
        "webhooks": [hook("mutate", false)],
    }))?;
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": WEBHOOK_CONFIG},
        "webhooks": [hook("validate", true)],
    }))?;
    let mutating_api = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let validating_api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let _ = mutating_api
        .delete(WEBHOOK_CONFIG, &DeleteParams::default())
        .await;
    let _ = validating_api
        .delete(WEBHOOK_CONFIG, &DeleteParams::default())
        .await;
    mutating_api
        .create(&PostParams::default(), &mutating)
        .await
        .context("registering the mutating webhook")?;
    validating_api
        .create(&PostParams::default(), &validating)
        .await
        .context("registering the validating webhook")?;
    Ok(())
}

/// The apiserver picks webhook configurations up from its informer, and gpu-admission the
/// GPUQuota from its watch: probes (1-GPU pods for a scheduler nobody runs; they stay, so
/// the reconciler settles their reservations as it does the others') until one comes back
/// with the model the mutating webhook defaults.
async fn wait_webhooks_effective(client: &Client, start: &Instant) -> Result<()> {
    let hooks: Api<Pod> = Api::namespaced(client.clone(), HOOKS_NS);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let name = format!("probe-{attempt}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "schedulerName": NO_SCHEDULER,
                "containers": [{"name": "main", "image": IMAGE,
                                "resources": {"limits": {CORE: "100"}}}],
            },
        }))?;
        let created = hooks.create(&PostParams::default(), &pod).await;
        let model = match &created {
            Ok(pod) => pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TYPE_ANNOTATION))
                .cloned(),
            Err(_) => None,
        };
        if model.as_deref() == Some(MODELS[0]) {
            say!(start, "the webhooks are in effect (probe {attempt})");
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the webhooks are not in effect 60 s after registering them: the last probe \
                 pod came back {:?}",
                created.map(|p| p.metadata.annotations)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

struct QuotaLedger {
    reservations: usize,
    used: BTreeMap<String, String>,
    kubectl_json_bytes: usize,
}

impl QuotaLedger {
    fn describe(&self) -> String {
        format!(
            "{} ledger entries (pending totals, per-pod reservations), used {:?}, `kubectl get gq -o json` {} bytes",
            self.reservations, self.used, self.kubectl_json_bytes
        )
    }
}

async fn quota_ledger(args: &Args, quotas: &Api<GPUQuota>) -> Result<QuotaLedger> {
    let quota = quotas
        .get("default")
        .await
        .with_context(|| format!("reading GPUQuota {HOOKS_NS}/default"))?;
    let status = quota.status.unwrap_or_default();
    let out = Command::new(&args.kubectl)
        .arg("--kubeconfig")
        .arg(&args.kubeconfig)
        .args(["get", "gq", "-n", HOOKS_NS, "-o", "json"])
        .output()
        .with_context(|| format!("running {}", args.kubectl.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl get gq failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(QuotaLedger {
        reservations: status.pending.len() + status.reservations.len(),
        used: status
            .used
            .into_iter()
            .map(|(model, q)| (model, q.0))
            .collect(),
        kubectl_json_bytes: out.stdout.len(),
    })
}
