//! `gpu-admission defrag --kubeconfig` against the real control plane: ReplicaSets placed
//! by kube-scheduler and the extender so that no node has the 2 free GPUs a new pod
//! needs though the cluster has 3; the command plans the one move allowed, the
//! sidecar's dry run (`defrag.mode: DryRun`) tells the pending pod the same plan in an
//! Event, and nothing is evicted.

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::*;

const SLOT_LABEL: &str = "gpu-admission-e2e/defrag-slot";

/// The spec of a ReplicaSet or Deployment of one 1-GPU pod of `model`, labelled `app:
/// name`, opted in to moves if `movable`; `pod` adds to the pod's spec.
fn one_gpu_set(name: &str, model: &str, movable: bool, pod: Value) -> Value {
    let mut annotations = json!({TYPE_ANNOTATION: model});
    if movable {
        annotations["gpu-admission.io/movable"] = json!("true");
    }
    let mut spec = json!({
        "schedulerName": scheduler_name(),
        "containers": [{
            "name": "serve",
            "image": "registry.invalid/never-pulled:e2e",
            "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {CORE: "100"},
            },
        }],
    });
    for (key, value) in pod.as_object().into_iter().flatten() {
        spec[key] = value.clone();
    }
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": spec,
            },
        },
    })
}

/// A ReplicaSet of one 1-GPU pod of `model`, pinned to the nodes of `slot`.
fn replica_set(name: &str, model: &str, slot: &str, movable: bool) -> ReplicaSet {
    let pinned = json!({"nodeSelector": {SLOT_LABEL: slot}});
    serde_json::from_value(one_gpu_set(name, model, movable, pinned)).unwrap()
}

/// The bound pod of ReplicaSet `app`, once there is one.
async fn bound_pod_of(cluster: &Cluster, app: &str) -> Pod {
    let pods = cluster.pods();
    let selector = format!("app={app}");
    wait_for(&format!("a bound pod of {app}"), BIND_TIMEOUT, || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            list.items.into_iter().find(|p| {
                let spec = p.spec.as_ref();
                spec.and_then(|s| s.node_name.as_ref()).is_some()
            })
        }
    })
    .await
}

#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn defrag_plans_the_move_a_pending_pod_needs_and_evicts_nothing() {
    let Some(cluster) = setup("defrag").await else {
        return;
    };
    let model = "Defrag-T4";
    for slot in ["1", "2", "3"] {
        let labels = json!({MODEL_LABEL: model, SLOT_LABEL: slot});
        let name = format!("e2e-defrag-{slot}");
        cluster
            .create_node_with(&name, labels, shapes::node_resources(2))
            .await;
    }
    let sets: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    // infer-a may move; infer-b opted in but its budget allows no disruption; batch-c
    // did not opt in.
    let budget = json!({
        "metadata": {"name": "infer-b"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "infer-b"}}},
    });
    let budget: PodDisruptionBudget = serde_json::from_value(budget).unwrap();
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();
    for (name, slot, movable) in [
        ("infer-a", "1", true),
        ("infer-b", "2", true),
        ("batch-c", "3", false),
    ] {
        let set = replica_set(name, model, slot, movable);
        sets.create(&PostParams::default(), &set).await.unwrap();
    }
    let mut running = BTreeMap::new();
    for (app, node) in [
        ("infer-a", "e2e-defrag-1"),
        ("infer-b", "e2e-defrag-2"),
        ("batch-c", "e2e-defrag-3"),
    ] {
        let pod = bound_pod_of(&cluster, app).await;
        assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(node));
        assert_placement_annotations(&pod, 2);
        running.insert(app, pod.metadata.name.clone().unwrap());
    }
    cluster.create_gpu_pod("train", model, Gpu::Whole(2)).await;
    cluster.wait_failed_scheduling("train", "").await;

    let kubeconfig = std::env::var(KUBECONFIG_ENV).unwrap();
    let pod = format!("{}/train", cluster.ns);
    let out = Command::new(gpu_admission_bin())
        .args([
            "defrag",
            "--kubeconfig",
            &kubeconfig,
            "--pod",
            &pod,
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "defrag failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = &report["plans"][0];
    assert_eq!(plan["pod"], pod.as_str(), "{report}");
    assert_eq!(plan["node"], "e2e-defrag-1", "{report}");
    let moves = plan["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 1, "{report}");
    let moved = format!("{}/{}", cluster.ns, running["infer-a"]);
    assert_eq!(moves[0]["pod"], moved.as_str(), "{report}");
    assert_eq!(moves[0]["from"], "e2e-defrag-1");
    let to = moves[0]["to"].as_str().unwrap();
    assert!(["e2e-defrag-2", "e2e-defrag-3"].contains(&to), "{report}");
    assert!(
        report["kept"]["disruption_budget"].as_u64() >= Some(1),
        "{report}"
    );

    // This suite runs with `defrag.mode: DryRun`: the GPU scheduler's sidecar tells the
    // pending pod the same plan in an Event, and evicts nothing either.
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let fields = "involvedObject.name=train,reason=DefragPlan";
    let note = wait_for("a DefragPlan event on train", BIND_TIMEOUT, || async {
        let list = events
            .list(&ListParams::default().fields(fields))
            .await
            .ok()?;
        list.items.into_iter().find_map(|e| e.message)
    })
    .await;
    let expected = format!("fits on e2e-defrag-1 (GPUs 0,1) after moving {moved} (e2e-defrag-1 → ");
    assert!(note.starts_with(&expected), "{note}");
    // Both replicas run the dry run; the one holding the controller Lease plans, so the
    // pod is told once, not once per replica (a pass is every 10 s).
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let told = events.list(&ListParams::default().fields(fields)).await;
    assert_eq!(
        told.unwrap().items.len(),
        1,
        "one plan told, not one per replica"
    );

    // It never evicts: the same three pods run, and the pending pod still waits.
    for (app, name) in &running {
        let pod = cluster.pods().get(name).await.unwrap();
        assert!(
            pod.metadata.deletion_timestamp.is_none(),
            "{app} is being deleted"
        );
    }
    let train = cluster.pods().get("train").await.unwrap();
    assert!(train.spec.unwrap().node_name.is_none());

    for name in ["infer-a", "infer-b", "batch-c"] {
        let _ = sets.delete(name, &DeleteParams::default()).await;
    }
    let _ = cluster
        .pods()
        .delete("train", &DeleteParams::default())
        .await;
    cluster.delete_nodes().await;
}

/// Restart both replicas with `defrag.mode: Evict` (holds of 60 s): they carry plans out
/// until the guard is dropped, which restarts them with the suite's config.
fn evict_on_both_replicas() -> (RunConfigOnDrop, tempfile::TempDir) {
    let config = run_config().replace("mode: DryRun", "mode: Evict\n  holdSeconds: 60");
    assert!(config.contains("mode: Evict"), "{config}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu-admission.yaml");
    std::fs::write(&path, config).unwrap();
    for replica in ["a", "b"] {
        ctl_replica("stop", replica);
    }
    let restore = RunConfigOnDrop(&["a", "b"]);
    for replica in ["a", "b"] {
        start_replica_with_config(replica, &path);
    }
    (restore, dir)
}

/// The bound pod of Deployment `app` that replaced `moved`, once there is one.
async fn replacement_of(cluster: &Cluster, app: &str, moved: &Pod) -> Pod {
    let old_uid = moved.metadata.uid.clone().unwrap();
    let pods = cluster.pods();
    let selector = format!("app={app}");
    wait_for("the moved pod's replacement bound", BIND_TIMEOUT, || {
        let (pods, selector, old_uid) = (pods.clone(), selector.clone(), old_uid.clone());
        async move {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            list.items.into_iter().find(|p| {
                p.metadata.uid.as_deref() != Some(old_uid.as_str())
                    && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
            })
        }
    })
    .await
}

/// A Deployment of one 1-GPU pod of `model`, free to run on any node of it. Grace 0:
/// these nodes have no kubelet to confirm that an evicted pod's containers stopped.
fn deployment(name: &str, model: &str, movable: bool) -> Deployment {
    let grace = json!({"terminationGracePeriodSeconds": 0});
    serde_json::from_value(one_gpu_set(name, model, movable, grace)).unwrap()
}

async fn cordon(cluster: &Cluster, node: &str, cordoned: bool) {
    let patch = json!({"spec": {"unschedulable": cordoned}});
    cluster
        .nodes()
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// `defrag.mode: Evict` with the real controllers and both replicas: four Deployment
/// pods, one per node, leave 4 GPUs free but never the 2 a new pod needs on one node.
/// One opted-in pod is moved through the Eviction API, its replacement lands on the
/// planned node, the pending pod is bound on its target within 30 s; the pod under a
/// `maxUnavailable: 0` budget and the pod that did not opt in stay; one plan, not two.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn defrag_evict_moves_one_opted_in_pod_and_seats_the_pending_one() {
    let Some(cluster) = setup("evict").await else {
        return;
    };
    let model = "Evict-T4";
    let nodes: Vec<String> = (1..=4).map(|i| format!("e2e-evict-{i}")).collect();
    for name in &nodes {
        let labels = json!({MODEL_LABEL: model});
        cluster
            .create_node_with(name, labels, shapes::node_resources(2))
            .await;
        cordon(&cluster, name, true).await;
    }
    cluster.label_for_webhooks().await;
    register_webhooks(&cluster).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let budget = json!({
        "metadata": {"name": "infer-b"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "infer-b"}}},
    });
    let budget: PodDisruptionBudget = serde_json::from_value(budget).unwrap();
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();
    // One pod per node: each node is opened alone for its Deployment's pod.
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let apps = [
        ("infer-a", true),
        ("infer-b", true),
        ("batch-c", false),
        ("infer-d", true),
    ];
    let mut running = BTreeMap::new();
    for ((app, movable), node) in apps.iter().zip(&nodes) {
        cordon(&cluster, node, false).await;
        let created = deployment(app, model, *movable);
        deployments
            .create(&PostParams::default(), &created)
            .await
            .unwrap();
        let pod = bound_pod_of(&cluster, app).await;
        assert_eq!(pod.spec.as_ref().unwrap().node_name.as_ref(), Some(node));
        running.insert(*app, pod);
        cordon(&cluster, node, true).await;
    }
    for node in &nodes {
        cordon(&cluster, node, false).await;
    }

    // Both replicas carry plans out from now on.
    let restore = evict_on_both_replicas();

    cluster.create_gpu_pod("train", model, Gpu::Whole(2)).await;
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let moved_fields = "involvedObject.name=train,reason=DefragMoved";
    let note = wait_for("a DefragMoved event on train", BIND_TIMEOUT, || async {
        let list = events
            .list(&ListParams::default().fields(moved_fields))
            .await
            .ok()?;
        list.items.into_iter().find_map(|e| e.message)
    })
    .await;
    let moved_at = std::time::Instant::now();
    println!("train: {note}");

    // The plan as the mover held it on the pod: the target, and where the moved pod's
    // replacement goes.
    let train = cluster.pods().get("train").await.unwrap();
    let annotations = train.metadata.annotations.clone().unwrap_or_default();
    let hold: Value = serde_json::from_str(&annotations["gpu-admission.io/defrag-hold"]).unwrap();
    let target = hold["target"]["node"].as_str().unwrap().to_string();
    let slots = hold["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 1, "one move: {hold}");
    // The Event names the moved pod (train's own namespace); the annotation, which
    // the tenant reads too, names no pod: its slot keeps digests only.
    let moved = note
        .split_once("after moving ")
        .and_then(|(_, rest)| rest.split_once(" ("))
        .map(|(pod, _)| pod.to_string())
        .unwrap_or_else(|| panic!("the DefragMoved event names the moved pod: {note}"));
    let text = &annotations["gpu-admission.io/defrag-hold"];
    let (_, moved_name) = moved.split_once('/').unwrap();
    assert!(
        !text.contains(moved_name),
        "the hold names {moved_name}: {text}"
    );
    let destination = slots[0]["held"]["node"].as_str().unwrap().to_string();
    let (moved_app, moved_pod) = running
        .iter()
        .find(|(_, pod)| format!("{}/{}", cluster.ns, pod.metadata.name.as_ref().unwrap()) == moved)
        .map(|(app, pod)| (*app, pod.clone()))
        .unwrap_or_else(|| panic!("{moved} is none of the Deployment pods"));
    assert!(
        ["infer-a", "infer-d"].contains(&moved_app),
        "only an opted-in pod its budget lets go is moved: {moved_app}"
    );
    assert_eq!(
        moved_pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(target.as_str()),
        "the moved pod made room on the target"
    );

    let bound = cluster.wait_bound("train").await;
    let took = moved_at.elapsed();
    let on = bound.spec.as_ref().unwrap().node_name.clone().unwrap();
    println!("train bound on {on} {took:?} after the move");
    assert_eq!(on, target, "the pending pod is placed on its target");
    assert!(
        took <= std::time::Duration::from_secs(30),
        "bound {took:?} after the move"
    );

    // The replacement runs on the node the plan held for it.
    let replacement = replacement_of(&cluster, moved_app, &moved_pod).await;
    let replaced_on = replacement.spec.as_ref().unwrap().node_name.clone();
    assert_eq!(replaced_on.as_deref(), Some(destination.as_str()));

    // Two replicas, one plan: told once, one eviction, and nothing else moved.
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let told = events
        .list(&ListParams::default().fields(moved_fields))
        .await;
    assert_eq!(told.unwrap().items.len(), 1, "one plan carried out");
    let evicted: f64 = ["a", "b"]
        .iter()
        .map(|r| {
            sum_metric(
                &replica_metrics(r),
                "gpu_admission_defrag_evictions_total",
                "evicted",
            )
        })
        .sum();
    assert_eq!(evicted, 1.0, "one eviction across both replicas");
    for (app, pod) in &running {
        if *app == moved_app {
            continue;
        }
        let name = pod.metadata.name.as_ref().unwrap();
        let now = cluster.pods().get(name).await.unwrap();
        assert_eq!(now.metadata.uid, pod.metadata.uid, "{app} was not moved");
        assert!(
            now.metadata.deletion_timestamp.is_none(),
            "{app} is being deleted"
        );
    }

    drop(restore);
    for (app, _) in apps {
        let _ = deployments.delete(app, &DeleteParams::default()).await;
    }
    let _ = budgets.delete("infer-b", &DeleteParams::default()).await;
    let _ = cluster
        .pods()
        .delete("train", &DeleteParams::default())
        .await;
    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}

/// Moves that change model (docs/design.md, "Model choice"): a Deployment pod that
/// accepts two models runs on the only GPU of model A; a pod pinned to A arrives. The
/// plan moves the Deployment's pod to model B, where the quota has room: the pending
/// pod is bound on A, the replacement on B, and the charge follows the pod (the
/// quota's usage ends one GPU on each model, never two on A or none on B).
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_planned_move_takes_a_pod_to_another_model_and_its_charge_follows() {
    let Some(cluster) = setup("change").await else {
        return;
    };
    let (a, b) = ("E2E-Change-A", "E2E-Change-B");
    let (node_a, node_b) = ("e2e-change-a", "e2e-change-b");
    cluster.create_gpu_node(node_a, a, 1).await;
    cluster.create_gpu_node(node_b, b, 1).await;
    cordon(&cluster, node_b, true).await;
    cluster
        .quota_under_webhooks("default", json!({"hard": {a: "2", b: "1"}}))
        .await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let either = deployment("either", &format!("{a},{b}"), true);
    deployments
        .create(&PostParams::default(), &either)
        .await
        .unwrap();
    let running = bound_pod_of(&cluster, "either").await;
    let node = |pod: &Pod| pod.spec.as_ref().and_then(|s| s.node_name.clone());
    assert_eq!(node(&running).as_deref(), Some(node_a));
    cordon(&cluster, node_b, false).await;

    let restore = evict_on_both_replicas();

    cluster.create_gpu_pod("pinned", a, Gpu::Whole(1)).await;
    let bound = cluster.wait_bound("pinned").await;
    assert_eq!(
        node(&bound).as_deref(),
        Some(node_a),
        "the pinned pod gets A"
    );
    let replacement = replacement_of(&cluster, "either", &running).await;
    assert_eq!(node(&replacement).as_deref(), Some(node_b));

    let last = std::sync::Mutex::new(None);
    let (last_ref, cluster_ref) = (&last, &cluster);
    let settled = wait_for_or_none(QUOTA_TIMEOUT, || async move {
        let status = cluster_ref.quota_status("default").await;
        let used = |m: &str| status.used.get(m).map(|q| milli_gpus(&q.0));
        let both = (used(a), used(b));
        *last_ref.lock().unwrap() = Some(status);
        (both == (Some(1000), Some(1000))).then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "one GPU charged on each model once the moved pod's charge follows it to {b}; \
         last status: {:?}",
        last.into_inner().unwrap()
    );

    drop(restore);
    let _ = deployments.delete("either", &DeleteParams::default()).await;
    let _ = cluster
        .pods()
        .delete("pinned", &DeleteParams::default())
        .await;
    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}
