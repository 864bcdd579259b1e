//! Device-plugin resources counted as the node holds them: MIG slices (both of NVIDIA's
//! strategies) and the GPUs of native sidecars.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::json;

use crate::support::*;

/// M. MIG, both strategies of NVIDIA's device plugin, as node objects: a pod that wants
/// `A100-SXM4-40GB` is steered to (and bound on) a single-strategy node labelled
/// `A100-SXM4-40GB-MIG-1g.5gb` and, once bound, charged 1/7 of a GPU; on a mixed node a
/// `nvidia.com/mig-1g.10gb` slice is charged 1/7 of an A100-SXM4-80GB and one unit of
/// the profile's own cap, so a second slice over that cap is refused by name.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn mig_slices_are_steered_charged_and_capped_per_profile() {
    let Some(cluster) = setup("mig").await else {
        return;
    };
    let single = "A100-SXM4-40GB-MIG-1g.5gb";
    cluster
        .create_node_with(
            "e2e-mig-single",
            json!({MODEL_LABEL: single}),
            json!({"nvidia.com/gpu": "7"}),
        )
        .await;
    cluster
        .create_node_with(
            "e2e-mig-mixed",
            json!({MODEL_LABEL: "A100-SXM4-80GB"}),
            json!({"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-3g.40gb": "1"}),
        )
        .await;
    cluster.label_for_webhooks().await;
    cluster
        .create_quota(
            "gpus",
            json!({"A100-SXM4-40GB": "1", "A100-SXM4-80GB": "1", "A100-SXM4-80GB/1g.10gb": "1"}),
            None,
        )
        .await;
    register_webhooks(&cluster).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pod = |name: &str, model: &str, resource: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {TYPE_ANNOTATION: model}},
            "spec": {"schedulerName": scheduler_name(), "containers": [{
                "name": "cuda", "image": "registry.invalid/never-pulled:e2e",
                "resources": {"limits": {resource: "1"}}}]},
        }))
        .unwrap()
    };
    // Single strategy: steered by the model, onto its slices.
    let created = cluster
        .try_create(&pod("sliced", "A100-SXM4-40GB", "nvidia.com/gpu"))
        .await
        .unwrap_or_else(|e| panic!("a pod wanting A100-SXM4-40GB must be admitted: {e}"));
    let affinity = serde_json::to_value(&created.spec.as_ref().unwrap().affinity).unwrap();
    assert_eq!(
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"],
        json!(["A100-SXM4-40GB", single]),
        "the affinity reaches the model's single-strategy MIG nodes: {affinity}"
    );
    let bound = cluster.wait_bound("sliced").await;
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("e2e-mig-single")
    );
    // All the cluster's A100-SXM4-40GB GPUs are sliced: charged a slice (1/7, rounded
    // down) at admission already, and once bound.
    cluster.wait_used("gpus", "A100-SXM4-40GB", 142).await;
    // So seven slice pods fit the quota of one GPU (each was charged a whole GPU until
    // bound, and the second was refused), and the eighth does not.
    for i in 2..=7 {
        cluster
            .try_create(&pod(
                &format!("sliced-{i}"),
                "A100-SXM4-40GB",
                "nvidia.com/gpu",
            ))
            .await
            .unwrap_or_else(|e| panic!("slice pod {i} of 7 fits a quota of one sliced GPU: {e}"));
    }
    let refused = cluster
        .try_create(&pod("sliced-8", "A100-SXM4-40GB", "nvidia.com/gpu"))
        .await;
    let message = forbidden_message(refused, "an eighth slice of a quota of one GPU");
    assert!(
        message.contains("for A100-SXM4-40GB: requested 0.142, used 0.994 of 1"),
        "{message}"
    );

    // Mixed strategy: a 1g.10gb slice is admitted (1/7 of an A100-SXM4-80GB, and the
    // profile's cap of one), bound to the node that has the slices.
    cluster
        .try_create(&pod("slice-1", "A100-SXM4-80GB", "nvidia.com/mig-1g.10gb"))
        .await
        .unwrap_or_else(|e| panic!("the first 1g.10gb slice is within the caps: {e}"));
    let bound = cluster.wait_bound("slice-1").await;
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("e2e-mig-mixed")
    );
    let status = cluster.wait_used("gpus", "A100-SXM4-80GB", 142).await;
    assert_eq!(
        status
            .used
            .get("A100-SXM4-80GB/1g.10gb")
            .map(|q| milli_gpus(&q.0)),
        Some(1000),
        "the profile's key counts slices: {status:?}"
    );
    let refused = cluster
        .try_create(&pod("slice-2", "A100-SXM4-80GB", "nvidia.com/mig-1g.10gb"))
        .await;
    let message = forbidden_message(refused, "a second 1g.10gb slice over the profile's cap");
    assert!(
        message.contains(&format!(
            "GPU quota exceeded in namespace \"{}\" for A100-SXM4-80GB/1g.10gb: requested 1, used 1 of 1",
            cluster.ns
        )),
        "{message}"
    );
    // The 3g.40gb profile has no cap of its own: only the model's GPU quota applies.
    cluster
        .try_create(&pod(
            "big-slice",
            "A100-SXM4-80GB",
            "nvidia.com/mig-3g.40gb",
        ))
        .await
        .unwrap_or_else(|e| panic!("3/7 + 1/7 of a GPU fit the model's quota of one: {e}"));

    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}

/// Native sidecars (init containers with `restartPolicy: Always`) run beside the app
/// containers, and Kubernetes adds their requests: a pod of 2 app GPUs and a 2-GPU
/// sidecar is refused in a namespace allowed 2, charged 4 where 4 are allowed, and holds
/// 4 GPUs of its node, so a second such pod does not fit the same 4-GPU node.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn native_sidecar_gpus_are_charged_and_held_on_the_node() {
    let Some(cluster) = setup("sidecar").await else {
        return;
    };
    let model = "E2E-Sidecar";
    cluster.create_gpu_node("e2e-sidecar-1", model, 4).await;
    cluster
        .quota_under_webhooks("gpus", json!({"hard": {model: "2"}}))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pod = |name: &str| -> Pod {
        let gpus = json!({"limits": {CORE: "200"}});
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {TYPE_ANNOTATION: model}},
            "spec": {
                "schedulerName": scheduler_name(),
                "initContainers": [{"name": "sidecar", "restartPolicy": "Always",
                    "image": "registry.invalid/never-pulled:e2e", "resources": gpus}],
                "containers": [{"name": "cuda",
                    "image": "registry.invalid/never-pulled:e2e", "resources": gpus}],
            },
        }))
        .unwrap()
    };
    let refused = cluster.try_create(&pod("over")).await;
    let message = forbidden_message(refused, "2 app GPUs and a 2-GPU sidecar in a quota of 2");
    assert!(
        message.contains(&format!("for {model}: requested 4, used 0 of 2")),
        "{message}"
    );

    let mut quota = cluster.quotas().get("gpus").await.unwrap();
    quota.spec.hard.insert(
        model.into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
    );
    cluster
        .quotas()
        .replace("gpus", &PostParams::default(), &quota)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster
        .create_when_admitted(&pod("first"), Duration::from_secs(10))
        .await;
    let bound = cluster.wait_bound("first").await;
    // gpu-manager's annotation names the app container's two GPUs; the sidecar's two
    // are held in gpu-admission's accounting of the node.
    let indices = assert_placement_annotations(&bound, 4);
    assert_eq!(indices.len(), 2, "{:?}", annotations(&bound));
    cluster.wait_used("gpus", model, 4000).await;
    cluster.try_create(&pod("second")).await.unwrap();
    let message = cluster
        .wait_failed_scheduling("second", "pod needs 2 free whole GPUs, node has 0")
        .await;
    println!("the second sidecar pod stays pending: {message}");

    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}
