//! Why a GPU pod waits, on the pod itself (docs/explain.md, "On the pod"): with the real
//! controllers, a quota-queued pod, a cohort-limited pod, a fragmented pod and a pod of a
//! model no node has each carry the `gpu-admission.io/Waiting` condition with their code
//! within 2 s, `kubectl describe` shows it with its Event, and the condition turns False
//! once the pod is bound. Along the way every scrape's free GPUs by cause sum to the free
//! capacity the API shows, and a namespace's GPU-seconds grow as its bound pods' GPUs
//! times the time they are bound, within 1%.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::cohort::member_namespace;
use crate::support::*;

const SLOT_LABEL: &str = "gpu-admission-e2e/waiting-slot";
const CONDITION: &str = "gpu-admission.io/Waiting";

/// A pod of the GPU scheduler wanting `gpus` whole GPUs of `model`, on the nodes of
/// `slot` when given.
fn gpu_pod(name: &str, model: &str, gpus: u32, slot: Option<&str>) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "annotations": {TYPE_ANNOTATION: model}},
        "spec": {
            "schedulerName": scheduler_name(),
            "containers": [{
                "name": "cuda",
                "image": "registry.invalid/never-pulled:e2e",
                "resources": {"limits": {CORE: (100 * gpus).to_string()}},
            }],
        },
    });
    if let Some(slot) = slot {
        pod["spec"]["nodeSelector"] = json!({SLOT_LABEL: slot});
    }
    serde_json::from_value(pod).unwrap()
}

fn waiting_condition(pod: &Pod) -> Option<PodCondition> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == CONDITION).cloned()
}

/// Free GPUs of `model` as the API shows them: its nodes' GPUs less those of the pods
/// bound or placed on them (the predicate-node annotation), in every namespace.
async fn free_from_api(cluster: &Cluster, model: &str) -> f64 {
    let nodes = cluster.nodes();
    let selector = format!("{MODEL_LABEL}={model}");
    let nodes: Vec<Node> = (nodes.list(&ListParams::default().labels(&selector)).await)
        .unwrap()
        .items;
    let core = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.map_or(0.0, |q| q.0.parse::<f64>().unwrap())
    };
    let names: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let capacity: f64 = nodes
        .iter()
        .map(|n| {
            core(
                n.status
                    .as_ref()
                    .unwrap()
                    .allocatable
                    .as_ref()
                    .unwrap()
                    .get(CORE),
            )
        })
        .sum();
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    let pods = pods.list(&ListParams::default()).await.unwrap().items;
    let used: f64 = pods
        .iter()
        .filter(|p| {
            let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let placed = annotations(p).get("tencent.com/predicate-node").cloned();
            bound.or(placed).is_some_and(|n| names.contains(&n))
        })
        .flat_map(|p| p.spec.as_ref().unwrap().containers.iter())
        .map(|c| {
            core(
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref()?.get(CORE)),
            )
        })
        .sum();
    (capacity - used) / 100.0
}

/// Scrape the admin port and check that the free GPUs of `model` by cause sum to the
/// free capacity the API shows (when the API shows the same before and after the
/// scrape); returns the scrape and when it was taken (the middle of the request). Every
/// scrape of this scenario goes through here.
async fn scrape_checked(cluster: &Cluster, model: &str) -> (String, Instant) {
    let timed = || {
        let start = Instant::now();
        let metrics = admin_metrics();
        (metrics, start + start.elapsed() / 2)
    };
    for _ in 0..5 {
        let before = free_from_api(cluster, model).await;
        let (metrics, at) = timed();
        let after = free_from_api(cluster, model).await;
        if before != after {
            continue;
        }
        let fragment = format!("model=\"{model}\"");
        let by_cause = sum_metric(&metrics, "gpu_admission_free_gpus", &fragment);
        // The cache follows the API within moments: a scrape between a change and its
        // watch event is taken again.
        if (by_cause - before).abs() < 1e-6 {
            return (metrics, at);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (metrics, at) = timed();
        let by_cause = sum_metric(&metrics, "gpu_admission_free_gpus", &fragment);
        assert!(
            (by_cause - before).abs() < 1e-6 || free_from_api(cluster, model).await != before,
            "free GPUs of {model} by cause sum to {by_cause}, the API shows {before} free"
        );
        return (metrics, at);
    }
    panic!("the cluster kept changing under five scrapes");
}

fn gpu_seconds(metrics: &str, namespace: &str) -> f64 {
    let fragment = format!("namespace=\"{namespace}\"");
    sum_metric(metrics, "gpu_admission_gpu_seconds_total", &fragment)
}

/// `GET url` on the admin port, with `token` as the bearer: the status and the body.
fn admin_get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut curl = std::process::Command::new("curl");
    curl.args(["-sS", "-w", "\n%{http_code}", url]);
    if let Some(token) = token {
        curl.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = curl.output().unwrap();
    assert!(out.status.success(), "curl {url}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_string())
}

/// `/explain` answers whom the API server says may read the pod, and nobody else: no
/// token is 401; a ServiceAccount that may get pods in the scenario's namespace has the
/// queued pod's verdict, and a 403 for team-b's pod.
async fn explain_on_the_admin_port(cluster: &Cluster, team_b: &str) {
    let admin = std::env::var("GPU_ADMISSION_E2E_ADMIN_URL").unwrap();
    let url = |pod: &str| format!("{admin}/explain?pod={pod}");
    let queued = url(&format!("{}/queued", cluster.ns));
    let (status, body) = admin_get(&queued, None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = admin_get(&queued, Some("not-a-token"));
    assert_eq!(status, 401, "{body}");

    let reader = json!([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pod-reader"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "reader-pod-reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": cluster.ns}]},
    ]);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": reader}).to_string();
    let (ok, _, err) = kubectl(&["apply", "-n", &cluster.ns, "-f", "-"], &list);
    assert!(ok, "{err}");
    let (ok, token, err) = kubectl(&["create", "token", "reader", "-n", &cluster.ns], "");
    assert!(ok, "{err}");
    let token = token.trim();
    let answer = wait_for("the reader's RBAC to take effect", BIND_TIMEOUT, || async {
        let (status, body) = admin_get(&queued, Some(token));
        (status == 200).then_some(body)
    })
    .await;
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["code"], "QuotaExceeded", "{answer}");
    assert_eq!(answer["stages"][0]["stage"], "admission", "{answer}");
    let (status, body) = admin_get(&url(&format!("{team_b}/b2")), Some(token));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("may not get pods in namespace"), "{body}");
}

#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn every_waiting_gpu_pod_says_why_and_a_bound_one_no_longer_does() {
    let Some(cluster) = setup("waiting").await else {
        return;
    };
    let model = "Waiting-T4";
    let absent = "Waiting-A100";
    for (slot, gpus) in [("1", 2), ("2", 2), ("3", 1)] {
        let labels = json!({MODEL_LABEL: model, SLOT_LABEL: slot});
        let name = format!("e2e-waiting-{slot}");
        cluster
            .create_node_with(&name, labels, shapes::node_resources(gpus))
            .await;
    }
    let spec = json!({"hard": {model: "4", absent: "1"}, "onExceed": "Queue"});
    cluster.quota_under_webhooks("default", spec).await;
    let spec = json!({"hard": {model: "1"}, "cohort": "e2e-waiting", "onExceed": "Queue"});
    let team_b = member_namespace(&cluster, "b", spec).await;
    let pods_b: Api<Pod> = Api::namespaced(cluster.client.clone(), &team_b);
    let create = |api: &Api<Pod>, pod: Pod| {
        let api = api.clone();
        async move { api.create(&PostParams::default(), &pod).await.unwrap() }
    };

    // One GPU taken on each T4 node: 2 free in all, never 2 on one node.
    create(&cluster.pods(), gpu_pod("f1", model, 1, Some("1"))).await;
    create(&cluster.pods(), gpu_pod("f2", model, 1, Some("2"))).await;
    create(&pods_b, gpu_pod("b1", model, 1, Some("3"))).await;
    for name in ["f1", "f2"] {
        let pod = cluster.wait_bound(name).await;
        assert_eq!(waiting_condition(&pod), None, "{name} never waited");
    }
    wait_for("b1 bound", BIND_TIMEOUT, || async {
        let pod = pods_b.get("b1").await.ok()?;
        pod.spec?.node_name.map(drop)
    })
    .await;
    // The ledger settled on f1 and f2 before the four pods come.
    cluster.wait_used("default", model, 2000).await;
    let (first, first_at) = scrape_checked(&cluster, model).await;

    // Four pods that wait, each for its own reason.
    let waiting = [
        (
            "frag",
            cluster.pods(),
            gpu_pod("frag", model, 2, None),
            "Fragmented",
        ),
        (
            "queued",
            cluster.pods(),
            gpu_pod("queued", model, 1, None),
            "QuotaExceeded",
        ),
        (
            "a100",
            cluster.pods(),
            gpu_pod("a100", absent, 1, None),
            "NoNodeOfModel",
        ),
        (
            "b2",
            pods_b.clone(),
            gpu_pod("b2", model, 1, None),
            "CohortLimit",
        ),
    ];
    for (name, api, pod, code) in waiting {
        create(&api, pod).await;
        let created = Instant::now();
        let condition = wait_for(&format!("{name}'s Waiting condition"), BIND_TIMEOUT, || {
            let api = api.clone();
            async move {
                let condition = waiting_condition(&api.get(name).await.ok()?)?;
                (condition.status == "True").then_some(condition)
            }
        })
        .await;
        let took = created.elapsed();
        println!("{name}: {condition:?} after {took:?}");
        assert_eq!(
            condition.reason.as_deref(),
            Some(code),
            "{name}: {condition:?}"
        );
        scrape_checked(&cluster, model).await;
    }
    let queued = cluster.pods().get("queued").await.unwrap();
    let message = waiting_condition(&queued).unwrap().message.unwrap();
    assert!(message.contains("in the quota queue"), "{message}");
    let frag = cluster.pods().get("frag").await.unwrap();
    let message = waiting_condition(&frag).unwrap().message.unwrap();
    assert!(
        message.contains("2 GPUs of Waiting-T4 are free on 2 nodes"),
        "{message}"
    );

    // `kubectl describe` answers why: the condition, and the Event with its numbers.
    let described = wait_for(
        "the QuotaExceeded event in kubectl describe",
        BIND_TIMEOUT,
        || async {
            let (ok, out, err) = kubectl(&["describe", "pod", "-n", &cluster.ns, "queued"], "");
            assert!(ok, "kubectl describe failed: {err}");
            out.contains("QuotaExceeded").then_some(out)
        },
    )
    .await;
    assert!(described.contains(CONDITION), "{described}");
    let event_line = described
        .lines()
        .find(|l| l.contains("QuotaExceeded"))
        .unwrap();
    assert!(event_line.contains("Normal"), "{event_line}");
    // Both replicas run the teller; only the one holding the controller Lease tells.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cluster.client.clone(), &cluster.ns);
    let fields = "involvedObject.name=queued,reason=QuotaExceeded";
    let told = events.list(&ListParams::default().fields(fields)).await;
    assert_eq!(
        told.unwrap().items.len(),
        1,
        "told once, not once per replica"
    );

    explain_on_the_admin_port(&cluster, &team_b).await;

    // Room for the fragmented pod: a new node with 2 free GPUs; once bound it no longer
    // waits.
    let labels = json!({MODEL_LABEL: model, SLOT_LABEL: "4"});
    cluster
        .create_node_with("e2e-waiting-4", labels, shapes::node_resources(2))
        .await;
    let frag = cluster.wait_bound("frag").await;
    assert_eq!(
        frag.spec.unwrap().node_name.as_deref(),
        Some("e2e-waiting-4")
    );
    let condition = wait_for("frag's condition set False", BIND_TIMEOUT, || async {
        let condition = waiting_condition(&cluster.pods().get("frag").await.ok()?)?;
        (condition.status == "False").then_some(condition)
    })
    .await;
    assert_eq!(condition.reason.as_deref(), Some("Placed"), "{condition:?}");
    scrape_checked(&cluster, model).await;

    // GPU-seconds: team-b has had exactly b1's 1 GPU bound all along.
    let wait = Duration::from_secs(10).saturating_sub(first_at.elapsed());
    tokio::time::sleep(wait).await;
    let (last, last_at) = scrape_checked(&cluster, model).await;
    let elapsed = (last_at - first_at).as_secs_f64();
    let grew = gpu_seconds(&last, &team_b) - gpu_seconds(&first, &team_b);
    println!("team-b: {grew:.3} GPU-seconds over {elapsed:.3} s with 1 GPU bound");
    assert!(
        (grew - elapsed).abs() <= 0.01 * elapsed,
        "team-b's GPU-seconds grew {grew:.3} over {elapsed:.3} s of 1 GPU bound"
    );
    // Once its pods are gone, team-b's meter stops (b2 first: b1's end would let it go).
    let now = DeleteParams::default().grace_period(0);
    for name in ["b2", "b1"] {
        pods_b.delete(name, &now).await.unwrap();
        wait_for(&format!("{name} gone"), BIND_TIMEOUT, || async {
            pods_b.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    let stopped = gpu_seconds(&scrape_checked(&cluster, model).await.0, &team_b);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = gpu_seconds(&scrape_checked(&cluster, model).await.0, &team_b);
    assert_eq!(stopped, still, "no GPU of team-b is bound any more");

    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}
