//! The webhooks through the real API server: a GPU pod steered (scheduler, model, node
//! affinity) and one over the namespace's quota denied; the model and placement
//! annotations fixed against tenants' edits.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

/// Webhooks through the real apiserver: in a namespace with a GPUQuota of one Tesla-K80,
/// a GPU pod that names no scheduler and no model is mutated (scheduler name, model
/// annotation) and placed on a K80 node; a second one is denied with the quota message.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn webhooks_steer_a_gpu_pod_and_deny_one_over_the_namespace_quota() {
    use gpu_admission::quota::GPUQuota;
    let Some(cluster) = setup("quota").await else {
        return;
    };
    let model = "Tesla-K80";
    cluster.create_gpu_node("e2e-quota-1", model, 2).await;
    Api::<Namespace>::all(cluster.client.clone())
        .patch(
            &cluster.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"gpu-admission-e2e/webhooks": "quota"}}})),
        )
        .await
        .unwrap();
    let quota: GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": cluster.ns},
        "spec": {"hard": {model: "1"}},
    }))
    .unwrap();
    let quotas: Api<GPUQuota> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    register_webhooks(&cluster).await;
    // gpu-admission must have seen the quota before it judges pods.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let plain_pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{
                "name": "cuda",
                "image": "registry.invalid/never-pulled:e2e",
                "resources": {"limits": {CORE: "100"}},
            }]},
        }))
        .unwrap()
    };
    let created = cluster
        .pods()
        .create(&PostParams::default(), &plain_pod("first"))
        .await
        .unwrap_or_else(|e| panic!("the first pod is within quota and must be admitted: {e}"));
    assert_eq!(
        created.spec.as_ref().unwrap().scheduler_name.as_deref(),
        Some(scheduler_name().as_str()),
        "the mutating webhook must steer GPU pods to the GPU scheduler"
    );
    assert_eq!(
        annotations(&created)
            .get(TYPE_ANNOTATION)
            .map(String::as_str),
        Some(model),
        "the mutating webhook records the defaulted model"
    );
    let required = serde_json::to_value(&created.spec.as_ref().unwrap().affinity).unwrap()
        ["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .clone();
    assert_eq!(
        required,
        json!([{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [model]}]}]),
        "the mutating webhook adds a required node affinity for the model"
    );
    let pod = cluster.wait_bound("first").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("e2e-quota-1")
    );
    assert_placement_annotations(&pod, 2);

    // The admission reserved the GPU in the quota's status.
    let used = quotas
        .get("default")
        .await
        .unwrap()
        .status
        .and_then(|s| s.used.get(model).cloned());
    assert!(
        matches!(used.as_ref().map(|q| q.0.as_str()), Some("1" | "1000m")),
        "GPUQuota status.used[{model}] after one admitted pod: {used:?}"
    );

    let denied = cluster
        .pods()
        .create(&PostParams::default(), &plain_pod("second"))
        .await
        .expect_err("the second pod goes over the quota and must be denied");
    let message = denied.to_string();
    println!("second: {message}");
    assert!(
        message.contains(&format!(
            "GPU quota exceeded in namespace \"{}\" for {model}: requested 1, used 1 of 1",
            cluster.ns
        )),
        "unexpected denial: {message}"
    );

    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}

#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn the_gpu_model_and_placement_annotations_cannot_be_edited_by_tenants() {
    let Some(cluster) = setup("fixedmodel").await else {
        return;
    };
    let model = "Tesla-T4";
    cluster
        .quota_under_webhooks(
            "default",
            json!({"hard": {model: "1"}, "defaultType": model}),
        )
        .await;
    cluster
        .try_create(&unscheduled_gpu_pod("p", None, 1))
        .await
        .expect("a 1-GPU pod within the quota is admitted");
    let pod = cluster.pods().get("p").await.unwrap();
    assert_eq!(
        annotations(&pod).get(TYPE_ANNOTATION).map(String::as_str),
        Some(model),
        "the mutating webhook records the defaulted model"
    );
    cluster.wait_used("default", model, 1000).await;

    // `kubectl annotate pod p gpu-admission.io/gpu-type=zzz --overwrite`: refused, the
    // charge stays where admission put it.
    let edit =
        |value: serde_json::Value| json!({"metadata": {"annotations": {TYPE_ANNOTATION: value}}});
    for value in [json!("zzz"), serde_json::Value::Null] {
        let result = cluster
            .pods()
            .patch(
                "p",
                &PatchParams::default(),
                &Patch::Merge(edit(value.clone())),
            )
            .await;
        let message = forbidden_message(result, "changing the model annotation");
        assert!(message.contains("fixed at creation"), "{value}: {message}");
    }
    // Any other edit is not the webhook's business (and is never sent to it).
    cluster
        .pods()
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"team": "ml"}}})),
        )
        .await
        .expect("editing another annotation is allowed");
    // The placement annotations say which GPUs the pod holds (to gpu-manager and to a
    // restarted gpu-admission): a namespace admin may not write them, whatever the key.
    let tenant = cluster.namespace_admin("tenant-admin").await;
    let as_tenant: Api<Pod> = Api::namespaced(tenant, &cluster.ns);
    for (key, value) in [
        ("tencent.com/predicate-gpu-idx-0", "0,1,2,3"),
        ("tencent.com/predicate-node", "elsewhere"),
        ("tencent.com/gpu-assigned", "true"),
    ] {
        let result = as_tenant
            .patch(
                "p",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await;
        let message = forbidden_message(result, "a tenant writing a placement annotation");
        assert!(
            message.contains(&format!("annotation {key} says which GPUs the pod holds"))
                && message.contains("\"tenant-admin\" may not set, change or remove it"),
            "{key}: {message}"
        );
    }
    let stored = cluster.pods().get("p").await.unwrap();
    assert!(
        annotations(&stored)
            .keys()
            .all(|k| !k.starts_with("tencent.com/")),
        "nothing of the refused edits was stored: {:?}",
        annotations(&stored)
    );
    // The tenant's own annotations stay its own; a placement writer (this suite's
    // gpu-admission identity, listed in placementWriters) may write placement.
    as_tenant
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"team": "cv"}}})),
        )
        .await
        .expect("a tenant edits its other annotations");
    cluster
        .pods()
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"tencent.com/predicate-node": "n1"}}}),
            ),
        )
        .await
        .expect("a placement writer writes placement annotations");
    // The reconciler still charges the pod to its model, and the quota stays full.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = cluster.wait_used("default", model, 1000).await;
    println!("after the refused edits: used {:?}", status.used);
    forbidden_message(
        cluster.try_create(&unscheduled_gpu_pod("q", None, 1)).await,
        "a second pod over the 1-GPU quota",
    );
    unregister_webhooks(&cluster).await;
}
