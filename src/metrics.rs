//! Prometheus metrics. Labels are bounded: routes, decisions and kinds, never names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    pub(crate) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub(crate) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub(crate) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub(crate) reason: &'static str,
}

/// A background controller, by its name (`Controller::NAME`: a closed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

/// A controller's passes, by how they ended (`ok`, `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    controller: &'static str,
    outcome: &'static str,
}

/// The background controllers' passes (`controllers::skeleton`): how many ended well or
/// not, when one last ended well, how long they take. Clones count into the same series.
#[derive(Clone)]
pub(crate) struct ControllerMetrics {
    passes: Family<PassLabels, Counter>,
    last_success: Family<ControllerLabels, Gauge>,
    pass_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
}

impl ControllerMetrics {
    fn new() -> Self {
        ControllerMetrics {
            passes: Family::default(),
            last_success: Family::default(),
            pass_duration: Family::new_with_constructor(pass_histogram),
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_passes",
            "Passes of the background controllers that run on this replica, by controller and outcome: ok, or error (some object it meant to act on was not acted on: an API call failed or timed out, or an object could not be read; the next pass comes sooner, with backoff)",
            self.passes.clone(),
        );
        registry.register(
            "controller_last_success_timestamp_seconds",
            "When a controller's last pass that ended ok ended (unix seconds; 0: none yet since this replica started)",
            self.last_success.clone(),
        );
        registry.register(
            "controller_pass_duration_seconds",
            "How long a controller's passes take, whatever their outcome",
            self.pass_duration.clone(),
        );
    }

    /// Every series of `controller` at zero, as it starts on this replica: a series born
    /// at its first pass shows Prometheus no increase, so a first failure would be missed.
    pub(crate) fn start(&self, controller: &'static str) {
        for outcome in ["ok", "error"] {
            let _ = self.passes.get_or_create(&PassLabels {
                controller,
                outcome,
            });
        }
        let labels = ControllerLabels { controller };
        let _ = self.last_success.get_or_create(&labels);
        let _ = self.pass_duration.get_or_create(&labels);
    }

    /// A pass of `controller` ended, after `seconds`, at `now` (unix seconds).
    pub(crate) fn pass(&self, controller: &'static str, ok: bool, seconds: f64, now: i64) {
        let outcome = if ok { "ok" } else { "error" };
        (self.passes.get_or_create(&PassLabels {
            controller,
            outcome,
        }))
        .inc();
        let labels = ControllerLabels { controller };
        self.pass_duration.get_or_create(&labels).observe(seconds);
        if ok {
            self.last_success.get_or_create(&labels).set(now);
        }
    }
}

/// Reclaim's evictions of borrowing pods, by what became of them (`evicted`, `blocked`
/// by a PodDisruptionBudget).
pub(crate) type EvictionCounter = Family<ReasonLabels, Counter>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QuotaLabels {
    pub(crate) namespace: String,
    pub(crate) quota: String,
    pub(crate) model: String,
}

/// A namespace with a GPUQuota, a model some quota of it lists (or `unlisted`), and
/// what the quota did (`deny`, `warn`): bounded by the quotas an operator writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ExceededLabels {
    pub(crate) namespace: String,
    pub(crate) model: String,
    pub(crate) action: &'static str,
}

/// A node model label (`unlabelled` for nodes without one) and why its free GPUs are
/// unused: bounded by the models of the cluster's nodes, times four causes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FreeLabels {
    pub(crate) model: String,
    pub(crate) cause: &'static str,
}

/// A namespace and a GPU model: the quota queue's waits, and GPU-seconds (showback).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceModelLabels {
    pub(crate) namespace: String,
    pub(crate) model: String,
}

/// How long pods waited in the quota queue: `gpu_admission_quota_queue_wait_seconds`.
pub(crate) type WaitHistogram = Family<NamespaceModelLabels, Histogram, fn() -> Histogram>;

type QuotaGauge = Family<QuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>;

/// GPU-seconds per namespace and model: `gpu_admission_gpu_seconds_total`.
type ShowbackCounter = Family<NamespaceModelLabels, Counter<f64, std::sync::atomic::AtomicU64>>;

type HistogramFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: HistogramFamily,
    pub(crate) cache_objects: Family<KindLabels, Gauge>,
    pub(crate) tls_reloads: Family<ResultLabels, Counter>,
    pub(crate) tls_not_after: Gauge,
    pub(crate) quota_hard: QuotaGauge,
    pub(crate) quota_used: QuotaGauge,
    pub(crate) gpu_fragmentation: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(crate) free_gpus: Family<FreeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(crate) quota_exceeded: Family<ExceededLabels, Counter>,
    pub(crate) quota_queued_gpus: QuotaGauge,
    pub(crate) quota_queued_pods: QuotaGauge,
    pub(crate) quota_queue_wait: WaitHistogram,
    pub(crate) quota_borrowed: QuotaGauge,
    pub(crate) quota_lent: QuotaGauge,
    pub(crate) reclaim_evictions: EvictionCounter,
    /// `defrag.mode` DryRun's and Evict's plans for pending GPU pods, by outcome
    /// (`planned`, `unplanned`; Evict: `aborted`, then `bound` or `expired`).
    pub(crate) defrag_plans: Family<OutcomeLabels, Counter>,
    /// `defrag.mode: Evict`'s evictions, by outcome (`evicted`, `refused`, `failed`).
    pub(crate) defrag_evictions: Family<OutcomeLabels, Counter>,
    /// `defrag.mode: Evict`: seconds from a plan's first eviction to its pending pod's
    /// binding.
    pub(crate) defrag_plan_to_bind: Histogram,
    /// The background controllers' passes.
    pub(crate) controllers: ControllerMetrics,
    gpu_seconds: ShowbackCounter,
    /// One scrape brings the counters up to the cache's meters at a time, so two
    /// scrapes never add the same seconds twice.
    showback_scrape: parking_lot::Mutex<()>,
}

/// The routes whose latency the dashboard and the alerts read: their histograms exist
/// from the start, at zero, since a series born at its first request shows Prometheus no
/// increase, and `rate()` would miss a replica's first requests.
const ROUTES: [&str; 7] = [
    "validate",
    "mutate",
    "validate_claim",
    "mutate_claim",
    "predicates",
    "vpredicates",
    "bind",
];

fn wait_histogram() -> Histogram {
    // 1 s .. ~9 h
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

fn pass_histogram() -> Histogram {
    // 1 ms .. ~2 min: a teller's pass is bounded to 100 ms of judging, a releaser's may
    // wait out a minute of retries.
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpu_admission");
        let requests = Family::<RequestLabels, Counter>::default();
        let duration: HistogramFamily = Family::new_with_constructor(latency_histogram);
        for route in ROUTES {
            let _ = duration.get_or_create(&RouteLabels { route });
        }
        let cache_objects = Family::<KindLabels, Gauge>::default();
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        let tls_not_after = Gauge::default();
        registry.register(
            "requests",
            "Requests by route and decision",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer a request, by route",
            duration.clone(),
        );
        registry.register(
            "cache_objects",
            "Objects held by the cluster cache, by kind",
            cache_objects.clone(),
        );
        registry.register(
            "tls_reloads",
            "Serving certificate reloads by result",
            tls_reloads.clone(),
        );
        registry.register(
            "tls_cert_not_after_timestamp_seconds",
            "Expiry of the serving certificate (unix seconds)",
            tls_not_after.clone(),
        );
        let quota_hard = QuotaGauge::default();
        let quota_used = QuotaGauge::default();
        registry.register(
            "quota_hard_gpus",
            "GPUQuota limit per namespace and model",
            quota_hard.clone(),
        );
        registry.register(
            "quota_used_gpus",
            "GPUQuota usage per namespace and model",
            quota_used.clone(),
        );
        let gpu_fragmentation = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "gpu_fragmentation_ratio",
            "Share of the cluster's free GPU capacity that the typical request (the mix learnt from filtered pods) could not use",
            gpu_fragmentation.clone(),
        );
        let quota_exceeded = Family::<ExceededLabels, Counter>::default();
        registry.register(
            "quota_exceeded",
            "Pods a GPUQuota had no room for, by namespace, model and what the quota did (deny, warn)",
            quota_exceeded.clone(),
        );
        let quota_queued_gpus = QuotaGauge::default();
        let quota_queued_pods = QuotaGauge::default();
        registry.register(
            "quota_queued_gpus",
            "GPUs of the pods waiting in the quota queue (onExceed: Queue), per namespace and model",
            quota_queued_gpus.clone(),
        );
        registry.register(
            "quota_queued_pods",
            "Pods waiting in the quota queue (onExceed: Queue), per namespace and model",
            quota_queued_pods.clone(),
        );
        let quota_queue_wait: WaitHistogram = Family::new_with_constructor(wait_histogram);
        registry.register(
            "quota_queue_wait_seconds",
            "How long pods waited in the quota queue before this replica let them go, per namespace and model",
            quota_queue_wait.clone(),
        );
        let quota_borrowed = QuotaGauge::default();
        let quota_lent = QuotaGauge::default();
        registry.register(
            "quota_borrowed_gpus",
            "GPUs a GPUQuota uses past its hard, lent by its cohort, per namespace and model",
            quota_borrowed.clone(),
        );
        registry.register(
            "quota_lent_gpus",
            "GPUs of a GPUQuota's hard that other members of its cohort use, per namespace and model",
            quota_lent.clone(),
        );
        let defrag_plans = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "defrag_plans",
            "Plans the defragmentation planner made for GPU pods pending past defrag.pendingSeconds, by outcome: planned, unplanned; with defrag.mode Evict also how each plan carried out ended: aborted (a move no longer stood or its eviction was refused; holds freed), bound (the pending pod was bound), expired (its holds lapsed first)",
            defrag_plans.clone(),
        );
        let defrag_evictions = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "defrag_evictions",
            "Pods evicted to carry defragmentation plans out (defrag.mode Evict), by outcome: evicted, refused (a PodDisruptionBudget, or the pod gone or changed), failed",
            defrag_evictions.clone(),
        );
        let defrag_plan_to_bind = wait_histogram();
        registry.register(
            "defrag_plan_to_bind_seconds",
            "Seconds from a defragmentation plan's holds to its pending pod's binding (defrag.mode Evict)",
            defrag_plan_to_bind.clone(),
        );
        let reclaim_evictions = EvictionCounter::default();
        // Every reason from the start, at zero: a counter born at 1 shows Prometheus no
        // increase, so the first eviction (or block) would never reach the dashboard or
        // the GpuAdmissionReclaimBlocked alert.
        for reason in ["evicted", "blocked", "deleted"] {
            let _ = reclaim_evictions.get_or_create(&ReasonLabels { reason });
        }
        registry.register(
            "reclaim_evictions",
            "Borrowing pods this replica took back for a cohort's reclaim, by reason (evicted; blocked by a PodDisruptionBudget; deleted with a capped grace period past reclaim.timeoutSeconds)",
            reclaim_evictions.clone(),
        );
        let free_gpus = Family::<FreeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "free_gpus",
            "Free GPUs (fractions count) by node model and cause: unavailable (cordoned, tainted, not Ready), fragmented (no task of the request mix could start on them), quota_blocked (usable while pods that could use them wait in the quota queue), idle; the causes sum to the free capacity",
            free_gpus.clone(),
        );
        let controllers = ControllerMetrics::new();
        controllers.register(&mut registry);
        let gpu_seconds = ShowbackCounter::default();
        registry.register(
            "gpu_seconds",
            "GPU-seconds allocated to bound pods (shares and MIG slices as fractions of a GPU), per namespace and model",
            gpu_seconds.clone(),
        );
        Metrics {
            registry,
            controllers,
            gpu_seconds,
            showback_scrape: parking_lot::Mutex::new(()),
            quota_borrowed,
            quota_lent,
            reclaim_evictions,
            defrag_plans,
            defrag_evictions,
            defrag_plan_to_bind,
            quota_queued_gpus,
            quota_queued_pods,
            quota_queue_wait,
            quota_exceeded,
            gpu_fragmentation,
            free_gpus,
            requests,
            duration,
            cache_objects,
            tls_reloads,
            tls_not_after,
            quota_hard,
            quota_used,
        }
    }
}

impl Metrics {
    pub(crate) fn observe(&self, route: &'static str, decision: &'static str, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels { route, decision })
            .inc();
        self.duration
            .get_or_create(&RouteLabels { route })
            .observe(seconds);
    }

    /// Bring `gpu_seconds_total` up to the cache's meters: `(namespace, model, seconds)`,
    /// each never less than it read before.
    pub(crate) fn set_gpu_seconds(&self, meters: Vec<(String, String, f64)>) {
        let _one_scrape = self.showback_scrape.lock();
        for (namespace, model, seconds) in meters {
            let labels = NamespaceModelLabels { namespace, model };
            let counter = self.gpu_seconds.get_or_create(&labels);
            let gained = seconds - counter.get();
            if gained > 0.0 {
                counter.inc_by(gained);
            }
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;

    use super::*;

    /// The Grafana dashboard the chart and deploy/ ship (tests/manifests.rs keeps the
    /// two equal).
    const DASHBOARD: &str = include_str!("../charts/gpu-admission/dashboards/gpu-admission.json");

    /// Every series name the exposition can hold: each family given one series, then
    /// encoded as `/metrics` encodes it, names read off its `# TYPE` lines.
    fn exported() -> BTreeSet<String> {
        let m = Metrics::default();
        m.observe("validate", "allowed", 0.001);
        let quota = QuotaLabels {
            namespace: "n".into(),
            quota: "q".into(),
            model: "m".into(),
        };
        let family = NamespaceModelLabels {
            namespace: "n".into(),
            model: "m".into(),
        };
        m.cache_objects
            .get_or_create(&KindLabels { kind: "pod" })
            .set(1);
        let result = ResultLabels { result: "ok" };
        m.tls_reloads.get_or_create(&result).inc();
        for gauge in [
            &m.quota_hard,
            &m.quota_used,
            &m.quota_queued_gpus,
            &m.quota_queued_pods,
            &m.quota_borrowed,
            &m.quota_lent,
        ] {
            gauge.get_or_create(&quota).set(1.0);
        }
        let exceeded = ExceededLabels {
            namespace: "n".into(),
            model: "m".into(),
            action: "deny",
        };
        m.quota_exceeded.get_or_create(&exceeded).inc();
        m.quota_queue_wait.get_or_create(&family).observe(1.0);
        let reason = ReasonLabels { reason: "evicted" };
        m.reclaim_evictions.get_or_create(&reason).inc();
        let outcome = OutcomeLabels { outcome: "planned" };
        m.defrag_plans.get_or_create(&outcome).inc();
        let evicted = OutcomeLabels { outcome: "evicted" };
        m.defrag_evictions.get_or_create(&evicted).inc();
        m.defrag_plan_to_bind.observe(1.0);
        let free = FreeLabels {
            model: "m".into(),
            cause: "idle",
        };
        m.free_gpus.get_or_create(&free).set(1.0);
        m.set_gpu_seconds(vec![("n".into(), "m".into(), 1.0)]);
        m.controllers.pass("reconcile", true, 0.1, 1);
        let text = m.encode();
        let mut names = BTreeSet::new();
        for line in text.lines() {
            let Some(typed) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let (name, kind) = typed.split_once(' ').unwrap();
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
        names
    }

    /// The metric names a dashboard's queries use.
    fn queried(dashboard: &serde_json::Value) -> BTreeSet<String> {
        let name = regex::Regex::new(r"gpu_admission_[a-z_]+").unwrap();
        let panels = dashboard["panels"].as_array().unwrap();
        let targets = panels.iter().flat_map(|p| p["targets"].as_array().unwrap());
        let mut exprs: Vec<String> = targets
            .map(|t| t["expr"].as_str().unwrap().to_string())
            .collect();
        let variables = dashboard["templating"]["list"].as_array().unwrap();
        exprs.extend(
            variables
                .iter()
                .filter_map(|v| v["definition"].as_str().map(str::to_string)),
        );
        let names = exprs
            .iter()
            .flat_map(|e| name.find_iter(e).map(|m| m.as_str().to_string()));
        names.collect()
    }

    #[test]
    fn the_dashboard_queries_only_metrics_the_binary_exports() {
        let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
        let queried = queried(&dashboard);
        let exported = exported();
        let missing: Vec<&String> = queried.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "not exported: {missing:?}; exported: {exported:?}"
        );
        // The panels the dashboard promises, by what they query.
        for needed in [
            "gpu_admission_quota_used_gpus",
            "gpu_admission_quota_queued_gpus",
            "gpu_admission_quota_borrowed_gpus",
            "gpu_admission_quota_lent_gpus",
            "gpu_admission_free_gpus",
            "gpu_admission_gpu_fragmentation_ratio",
            "gpu_admission_request_duration_seconds_bucket",
            "gpu_admission_gpu_seconds_total",
        ] {
            assert!(queried.contains(needed), "no panel queries {needed}");
        }
    }

    /// Series Prometheus must see at zero before their first event, or `rate()` and
    /// `increase()` miss that event: the routes' latency and every reclaim reason.
    #[test]
    fn a_fresh_registry_exports_route_latencies_and_reclaim_reasons_at_zero() {
        let text = Metrics::default().encode();
        for route in ["validate", "mutate", "predicates", "vpredicates", "bind"] {
            let count =
                format!("gpu_admission_request_duration_seconds_count{{route=\"{route}\"}} 0");
            assert!(text.contains(&count), "no {count:?} in:\n{text}");
        }
        for reason in ["evicted", "blocked", "deleted"] {
            let zero = format!("gpu_admission_reclaim_evictions_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&zero), "no {zero:?} in:\n{text}");
        }
    }

    #[test]
    fn a_name_the_binary_does_not_export_is_caught() {
        let dashboard = serde_json::json!({
            "panels": [{"targets": [{"expr": "rate(gpu_admission_requests_total[5m]) + gpu_admission_no_such_gpus"}]}],
            "templating": {"list": []},
        });
        let missing: Vec<String> = queried(&dashboard)
            .difference(&exported())
            .cloned()
            .collect();
        assert_eq!(missing, ["gpu_admission_no_such_gpus"]);
    }
}
