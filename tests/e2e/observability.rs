//! The operator's view on a real Prometheus (docs/observability.md): it scrapes the run's
//! replicas as the chart's ServiceMonitor says and loads the chart's PrometheusRule while
//! GPU pods run, queue and borrow; every panel query of the shipped dashboard returns
//! data, every alert rule evaluates, and the alerts the scenario provokes go pending.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cohort::member_namespace;
use crate::support::prometheus::{Monitoring, Prometheus, SCRAPE_SECONDS, Target};
use crate::support::*;

const MODEL: &str = "Observe-T4";
/// Long enough for a rule evaluation after a scrape that shows the cause, with room for
/// a slow machine.
const ALERT_TIMEOUT: Duration = Duration::from_secs(60);

/// Replica `a` stands for the GPU scheduler's extender sidecar (kube-scheduler calls it),
/// replica `b` for a webhook server.
fn targets() -> Vec<Target> {
    let address = |var: &str| {
        let url = std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set"));
        url.trim_start_matches("http://").to_string()
    };
    vec![
        Target {
            address: address("GPU_ADMISSION_E2E_ADMIN_URL"),
            pod: "gpu-scheduler-a",
            component: "gpu-scheduler",
        },
        Target {
            address: address("GPU_ADMISSION_E2E_ADMIN_URL_B"),
            pod: "gpu-admission-b",
            component: "webhook",
        },
    ]
}

/// Restarts replica `b` when dropped, so a failing assertion does not leave it down.
struct StartB;

impl Drop for StartB {
    fn drop(&mut self) {
        ctl_replica("start", "b");
    }
}

#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn the_dashboard_and_the_alerts_work_on_a_real_prometheus() {
    let Some(cluster) = setup("observability").await else {
        return;
    };
    let monitoring = Monitoring::rendered();
    let scrape = monitoring.scrape_config(&targets());
    println!("scrape job derived from the ServiceMonitor: {scrape}");
    let prometheus = Prometheus::start(scrape, monitoring.rule_file()).await;
    let started = Instant::now();
    wait_for("both replicas scraped (up == 1)", ALERT_TIMEOUT, || async {
        let up = prometheus.query("up == 1").ok()?;
        (up.len() == 2).then_some(())
    })
    .await;
    cluster.create_gpu_node("observe-1", MODEL, 8).await;

    // A queue: namespace Q owns 1 GPU (onExceed: Queue); q1 runs, q2 waits.
    cluster.label_for_webhooks().await;
    let queue = member_namespace(
        &cluster,
        "queue",
        json!({"hard": {MODEL: "1"}, "onExceed": "Queue"}),
    )
    .await;
    // A cohort: the scenario's namespace B owns 1 and borrows 2 of lender L's 2.
    let cohort = "e2e-observe";
    cluster
        .create_quota_spec("default", json!({"hard": {MODEL: "1"}, "cohort": cohort}))
        .await;
    let lender = member_namespace(
        &cluster,
        "lender",
        json!({"hard": {MODEL: "2"}, "cohort": cohort}),
    )
    .await;
    keep_budget(&cluster).await;
    register_webhooks(&cluster).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let queued: Api<Pod> = Api::namespaced(cluster.client.clone(), &queue);
    for name in ["q1", "q2"] {
        queued
            .create(
                &PostParams::default(),
                &unscheduled_gpu_pod(name, Some(MODEL), 1),
            )
            .await
            .unwrap_or_else(|e| panic!("{name} joins the queue: {e}"));
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // b1 runs on the node (placed by the extender: showback, filter latency).
    cluster.create_gpu_pod("b1", MODEL, Gpu::Whole(1)).await;
    cluster.wait_bound("b1").await;
    borrow(&cluster).await;

    // While q2 waits with the node's GPUs free: the queue's two alerts.
    let queue_labels = json!({"namespace": queue, "model": MODEL});
    prometheus
        .wait_alert(
            "GpuAdmissionQuotaFullWithPodsWaiting",
            queue_labels,
            ALERT_TIMEOUT,
        )
        .await;
    prometheus
        .wait_alert(
            "GpuAdmissionGpusIdleWhilePodsWait",
            json!({"model": MODEL}),
            ALERT_TIMEOUT,
        )
        .await;

    // L takes its 2 GPUs back: b3 is evicted, b2's budget blocks, then b2 is deleted past
    // reclaim.timeoutSeconds.
    let lenders: Api<Pod> = Api::namespaced(cluster.client.clone(), &lender);
    for name in ["a1", "a2"] {
        lenders
            .create(
                &PostParams::default(),
                &unscheduled_gpu_pod(name, Some(MODEL), 1),
            )
            .await
            .unwrap_or_else(|e| panic!("{name} is within L's own quota: {e}"));
    }
    prometheus
        .wait_alert(
            "GpuAdmissionReclaimBlocked",
            json!({"reason": "blocked"}),
            ALERT_TIMEOUT,
        )
        .await;
    // L is full: three refusals, a second apart (the refusals panel's increase).
    for name in ["a3", "a4", "a5"] {
        let refused = lenders
            .create(
                &PostParams::default(),
                &unscheduled_gpu_pod(name, Some(MODEL), 1),
            )
            .await;
        forbidden_message(refused, name);
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }

    // Reviews the webhook cannot read: errors, by the webhook's own count. In two bursts
    // a few scrapes apart: the series of a new decision is born at its first scrape, and
    // only what comes after shows in rate() (errors that go on, as the alert's `for` asks).
    for burst in 0..2 {
        if burst > 0 {
            tokio::time::sleep(Duration::from_secs(3 * SCRAPE_SECONDS)).await;
        }
        for _ in 0..15 {
            let (status, _) = https::post(&server_url(), "/validate", "{".into(), apiserver_tls())
                .await
                .unwrap();
            assert!(status.is_client_error(), "a broken review: {status}");
        }
    }
    prometheus
        .wait_alert(
            "GpuAdmissionWebhookErrors",
            json!({"route": "validate"}),
            ALERT_TIMEOUT,
        )
        .await;

    // The webhook server down: that replica, and (the only one scraped) all of them.
    let restart_b = StartB;
    tokio::task::spawn_blocking(|| ctl_replica("stop", "b"))
        .await
        .unwrap();
    let webhook = json!({"app_kubernetes_io_component": "webhook"});
    prometheus
        .wait_alert("GpuAdmissionReplicaDown", webhook, ALERT_TIMEOUT)
        .await;
    // absent() keeps no labels of an expression.
    prometheus
        .wait_alert("GpuAdmissionWebhooksDown", json!({}), ALERT_TIMEOUT)
        .await;
    drop(restart_b);
    // Scraped again before q2 goes: whichever replica lets it go, its wait series is
    // there at zero first.
    wait_for("both replicas scraped again", ALERT_TIMEOUT, || async {
        let up = prometheus.query("up == 1").ok()?;
        (up.len() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2 * SCRAPE_SECONDS)).await;

    // q1 goes: q2 is let go (the queue wait histogram).
    queued.delete("q1", &DeleteParams::default()).await.unwrap();
    wait_for("q2 let go from the queue", QUOTA_TIMEOUT, || async {
        let pod = queued.get("q2").await.ok()?;
        let gates = pod.spec?.scheduling_gates.unwrap_or_default();
        gates.is_empty().then_some(())
    })
    .await;
    // A few scrapes past the last event, so each rate window has seen it.
    tokio::time::sleep(Duration::from_secs(5 * SCRAPE_SECONDS)).await;

    let window = started.elapsed().as_secs() + 1;
    let problems = dashboard_problems(&prometheus, &monitoring.dashboard, window);
    assert!(
        problems.is_empty(),
        "dashboard queries without data over the scenario's {window} s:\n{}",
        problems.join("\n")
    );
    let namespaces = prometheus
        .api(
            "/api/v1/label/namespace/values",
            &[("match[]", "gpu_admission_quota_hard_gpus".to_string())],
        )
        .unwrap();
    for namespace in [&cluster.ns, &queue, &lender] {
        assert!(
            namespaces.as_array().unwrap().contains(&json!(namespace)),
            "the dashboard's $namespace variable offers {namespace}: {namespaces}"
        );
    }
    assert_rules_healthy(&prometheus, &monitoring.alert_names());

    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}

/// PodDisruptionBudget `keep` in B: pods labelled `app: keep` may not be evicted while
/// one of them runs.
async fn keep_budget(cluster: &Cluster) {
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "keep"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "keep"}}},
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(cluster.client.clone(), &cluster.ns)
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();
}

/// B borrows L's two GPUs: b2 (running, under the budget `keep`), then b3.
async fn borrow(cluster: &Cluster) {
    for (name, labels) in [("b2", json!({"app": "keep"})), ("b3", json!({}))] {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let pod = with_labels(unscheduled_gpu_pod(name, Some(MODEL), 1), labels);
        cluster
            .try_create(&pod)
            .await
            .unwrap_or_else(|e| panic!("{name} borrows an idle GPU of the cohort: {e}"));
    }
    // The test plays the kubelet: b2 runs, so its budget allows no disruption.
    let running = json!({"status": {"phase": "Running"}});
    cluster
        .pods()
        .patch_status("b2", &PatchParams::default(), &Patch::Merge(&running))
        .await
        .unwrap();
}

/// A panel query as Grafana sends it with every variable at "All": `$namespace` and
/// `$model` match everything, `$__rate_interval` is four scrape intervals (Grafana's
/// floor), `$__range` the whole `window`.
fn as_grafana_sends(expr: &str, window: u64) -> String {
    expr.replace("$__rate_interval", &format!("{}s", 4 * SCRAPE_SECONDS))
        .replace("$__range", &format!("{window}s"))
        .replace("$namespace", ".*")
        .replace("$model", ".*")
}

/// Each panel query (by panel title) that fails or returns no finite sample over the
/// last `window` seconds.
fn dashboard_problems(prometheus: &Prometheus, dashboard: &Value, window: u64) -> Vec<String> {
    let mut problems = Vec::new();
    let panels = dashboard["panels"].as_array().expect("dashboard panels");
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        for target in panel["targets"].as_array().cloned().unwrap_or_default() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let query = as_grafana_sends(expr, window);
            match prometheus.query_range(&query, window) {
                Err(error) => problems.push(format!("{title:?}: {query}: {error}")),
                Ok(series) if !series.iter().any(has_finite_sample) => {
                    problems.push(format!(
                        "{title:?}: {query}: no data ({} series)",
                        series.len()
                    ));
                }
                Ok(_) => println!("panel {title:?}: data for {query}"),
            }
        }
    }
    problems
}

fn has_finite_sample(series: &Value) -> bool {
    let values = series["values"].as_array().cloned().unwrap_or_default();
    values.iter().any(|point| {
        let value = point[1].as_str().unwrap_or("NaN");
        value.parse::<f64>().is_ok_and(f64::is_finite)
    })
}

/// Every alert of the chart is loaded and evaluates without error.
fn assert_rules_healthy(prometheus: &Prometheus, alerts: &[String]) {
    let rules = prometheus.alerting_rules();
    for alert in alerts {
        let rule = rules.iter().find(|r| r["name"] == alert.as_str());
        let rule = rule.unwrap_or_else(|| panic!("alert {alert} is not loaded: {rules:?}"));
        assert_eq!(
            rule["health"], "ok",
            "alert {alert} does not evaluate: {}",
            rule["lastError"]
        );
    }
    assert_eq!(rules.len(), alerts.len(), "loaded: {rules:?}");
}
