//! `gpu-admission defrag --kubeconfig` against the real control plane: ReplicaSets placed
//! by kube-scheduler and the extender so that no node has the 2 free GPUs a new pod
//! needs though the cluster has 3; the command plans the one move allowed, the
//! sidecar's dry run (`defrag.mode: DryRun`) tells the pending pod the same plan in an
//! Event, and nothing is evicted.

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::support::*;

const SLOT_LABEL: &str = "gpu-admission-e2e/defrag-slot";

/// A ReplicaSet of one 1-GPU pod of `model`, pinned to the nodes of `slot`.
fn replica_set(name: &str, model: &str, slot: &str, movable: bool) -> ReplicaSet {
    let mut annotations = json!({TYPE_ANNOTATION: model});
    if movable {
        annotations["gpu-admission.io/movable"] = json!("true");
    }
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {
                    "schedulerName": scheduler_name(),
                    "nodeSelector": {SLOT_LABEL: slot},
                    "containers": [{
                        "name": "serve",
                        "image": "registry.invalid/never-pulled:e2e",
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "limits": {CORE: "100"},
                        },
                    }],
                },
            },
        },
    }))
    .unwrap()
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
