//! Dynamic Resource Allocation on the real scheduler: ResourceClaims pinned to a model,
//! allocated and charged per device; selectors evaluated; DRA-backed extended resources
//! charged once.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use serde_json::json;

use crate::support::devices::allocated;
use crate::support::*;

/// D. Dynamic Resource Allocation on the real scheduler: a fake driver's ResourceSlice
/// publishes two A100 devices and a T4 on a node. A claim that names no model gets the
/// namespace's default (A100) pinned by the mutating webhook and is allocated an A100 by
/// kube-scheduler; with `A100-SXM4-80GB: 2`, a second claim is admitted, a third refused
/// with the quota message, and deleting a claim makes room again.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn resource_claims_are_pinned_allocated_and_charged_per_device() {
    use crate::support::devices::{claim, product_selector};
    let Some(cluster) = setup("dra").await else {
        return;
    };
    let node = "e2e-dra-1";
    cluster
        .create_node_with(node, json!({MODEL_LABEL: "none"}), json!({}))
        .await;
    let class = cluster
        .create_dra(
            "DeviceClass",
            json!({"metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}]}}),
        )
        .await;
    class.unwrap_or_else(|e| panic!("creating the DeviceClass: {e}"));
    let device = |name: &str, product: &str| json!({"name": name, "attributes": {"productName": {"string": product}}});
    cluster
        .create_dra(
            "ResourceSlice",
            json!({"metadata": {"name": "e2e-dra-1-gpus"}, "spec": {
                "driver": "gpu.nvidia.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [device("gpu-0", "Tesla T4"), device("gpu-1", "NVIDIA A100-SXM4-80GB"),
                    device("gpu-2", "NVIDIA A100-SXM4-80GB")]}}),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the ResourceSlice: {e}"));
    cluster.label_for_webhooks().await;
    cluster
        .create_quota(
            "gpus",
            json!({"A100-SXM4-80GB": "2", "Tesla-T4": "1"}),
            Some("A100-SXM4-80GB"),
        )
        .await;
    let url = server_url();
    let (mutating, validating) = (Hook::claims("mutate", &url), Hook::claims("validate", &url));
    register_hooks(&cluster, vec![mutating], vec![validating]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A claim naming no model: the default is pinned, and kube-scheduler allocates it
    // an A100 for a pod that uses it.
    let pinned = cluster
        .create_dra("ResourceClaim", claim("any", "gpu.nvidia.com", 1, &[]))
        .await
        .unwrap_or_else(|e| panic!("a claim within the quota must be admitted: {e}"));
    let selectors = pinned.data["spec"]["devices"]["requests"][0]["exactly"]["selectors"].clone();
    assert_eq!(
        selectors,
        json!([{"cel": {"expression":
            "device.attributes[\"gpu.nvidia.com\"].productName in [\"NVIDIA A100-SXM4-80GB\"] && !has(device.attributes[\"gpu.nvidia.com\"].profile)"}}]),
        "the mutating webhook pins the default model with the products the slices publish, and whole GPUs"
    );
    let allocated = cluster.run_pod_on_claim("uses-any", "any").await;
    let device = allocated[0]["device"].as_str().unwrap().to_string();
    assert!(
        device == "gpu-1" || device == "gpu-2",
        "the pinned claim gets an A100, not the T4: {allocated:?}"
    );

    // The quota: 2 A100s; the second claim is admitted, the third refused.
    let a100 = product_selector("NVIDIA A100-SXM4-80GB");
    cluster
        .create_dra(
            "ResourceClaim",
            claim("second", "gpu.nvidia.com", 1, &[&a100]),
        )
        .await
        .unwrap_or_else(|e| panic!("the second A100 claim is within the quota: {e}"));
    let third = cluster
        .create_dra(
            "ResourceClaim",
            claim("third", "gpu.nvidia.com", 1, &[&a100]),
        )
        .await;
    let message = forbidden_message(third, "the third A100 claim");
    assert!(
        message.contains(&format!(
            "GPU quota exceeded in namespace \"{}\" for A100-SXM4-80GB: requested 1, used 2 of 2",
            cluster.ns
        )),
        "{message}"
    );
    cluster.wait_used("gpus", "A100-SXM4-80GB", 2000).await;
    // Deleting a claim frees its device's quota.
    cluster
        .dra("ResourceClaim")
        .delete("second", &DeleteParams::default())
        .await
        .unwrap();
    cluster.wait_used("gpus", "A100-SXM4-80GB", 1000).await;
    cluster
        .create_dra(
            "ResourceClaim",
            claim("third", "gpu.nvidia.com", 1, &[&a100]),
        )
        .await
        .unwrap_or_else(|e| panic!("after a claim was deleted, the third fits: {e}"));

    unregister_webhooks(&cluster).await;
    let _ = cluster
        .pods()
        .delete("uses-any", &DeleteParams::default())
        .await;
    cluster.delete_nodes().await;
}

/// Issue 18, items 1 and 6: a claim's selectors are evaluated, not read, and its GPU
/// requests are pinned to the model charged; a DeviceClass gpu-admission's config does
/// not list, whose selectors match the GPU driver's devices, is charged all the same.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn claim_selectors_are_pinned_to_an_allowed_model_in_a_found_gpu_class() {
    use crate::support::devices::claim;
    let Some(cluster) = setup("cel").await else {
        return;
    };
    let node = "e2e-cel-1";
    cluster
        .create_node_with(node, json!({MODEL_LABEL: "none"}), json!({}))
        .await;
    // Not in the config (which lists gpu.nvidia.com and mig.nvidia.com).
    let class = "vfio.e2e.gpu.nvidia.com";
    cluster
        .create_dra(
            "DeviceClass",
            json!({"metadata": {"name": class},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}]}}),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the DeviceClass: {e}"));
    let device = |name: &str, product: &str| json!({"name": name, "attributes": {"productName": {"string": product}}});
    cluster
        .create_dra(
            "ResourceSlice",
            json!({"metadata": {"name": "e2e-cel-1-gpus"}, "spec": {
                "driver": "gpu.nvidia.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [device("gpu-0", "Tesla T4"), device("gpu-1", "NVIDIA A100-SXM4-80GB"),
                    device("gpu-2", "NVIDIA A100-SXM4-80GB")]}}),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the ResourceSlice: {e}"));
    cluster.label_for_webhooks().await;
    cluster
        .create_quota("gpus", json!({"Tesla-T4": "1"}), Some("Tesla-T4"))
        .await;
    let url = server_url();
    let (mutating, validating) = (Hook::claims("mutate", &url), Hook::claims("validate", &url));
    register_hooks(&cluster, vec![mutating], vec![validating]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Mentions the T4, matches every GPU: charged and pinned to the namespace's T4.
    let product = r#"device.attributes["gpu.nvidia.com"].productName"#;
    let sneaky = format!(r#"{product} == "Tesla T4" || true"#);
    let pinned = cluster
        .create_dra("ResourceClaim", claim("sneaky", class, 1, &[&sneaky]))
        .await
        .unwrap_or_else(|e| panic!("a claim the default model can satisfy is admitted: {e}"));
    let selectors = pinned.data["spec"]["devices"]["requests"][0]["exactly"]["selectors"].clone();
    assert_eq!(
        selectors[1]["cel"]["expression"],
        json!(format!(
            r#"{product} in ["Tesla T4"] && !has(device.attributes["gpu.nvidia.com"].profile)"#
        )),
        "pinned to the T4 the slices publish, whole GPUs: {selectors}"
    );
    cluster.wait_used("gpus", "Tesla-T4", 1000).await;
    let allocated = cluster.run_pod_on_claim("uses-sneaky", "sneaky").await;
    assert_eq!(
        allocated[0]["device"], "gpu-0",
        "only a T4 (gpu-0 on every test node) can be allocated: {allocated:?}"
    );

    // Never names the A100, matches only A100s: charged to the A100, which the
    // namespace may not use.
    let negated = format!(r#"!({product} == "Tesla T4") && {product}.startsWith("NVIDIA")"#);
    let refused = cluster
        .create_dra("ResourceClaim", claim("negated", class, 1, &[&negated]))
        .await;
    let message = forbidden_message(refused, "a claim that can only get an A100");
    assert!(message.contains("A100-SXM4-80GB"), "{message}");

    unregister_webhooks(&cluster).await;
    let _ = cluster
        .pods()
        .delete("uses-sneaky", &DeleteParams::default())
        .await;
    let _ = cluster
        .dra("DeviceClass")
        .delete(class, &DeleteParams::default())
        .await;
    let _ = cluster
        .dra("ResourceSlice")
        .delete("e2e-cel-1-gpus", &DeleteParams::default())
        .await;
    cluster.delete_nodes().await;
}

/// Issue 18, item 9: NVIDIA's DeviceClass serves `nvidia.com/gpu` (DRA-backed extended
/// resources, beta and on by default in Kubernetes 1.36); on a node without the device
/// plugin (no GPU capacity, no model label) a pod asking for `nvidia.com/gpu` is steered,
/// bound, and charged once: by the pod, not again by the claim kube-scheduler makes.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn extended_resource_pods_on_dra_nodes_are_bound_and_charged_once() {
    let Some(cluster) = setup("extended").await else {
        return;
    };
    let node = "e2e-ext-1";
    cluster.create_node_with(node, json!({}), json!({})).await;
    let class = "ext.e2e.gpu.nvidia.com";
    cluster
        .create_dra(
            "DeviceClass",
            json!({"metadata": {"name": class}, "spec": {
                "selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}],
                "extendedResourceName": "nvidia.com/gpu"}}),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the DeviceClass: {e}"));
    let device =
        |name: &str| json!({"name": name, "attributes": {"productName": {"string": "Tesla T4"}}});
    cluster
        .create_dra(
            "ResourceSlice",
            json!({"metadata": {"name": "e2e-ext-1-gpus"}, "spec": {
                "driver": "gpu.nvidia.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [device("gpu-0"), device("gpu-1")]}}),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the ResourceSlice: {e}"));
    cluster.label_for_webhooks().await;
    cluster
        .create_quota("gpus", json!({"Tesla-T4": "1"}), Some("Tesla-T4"))
        .await;
    let url = server_url();
    let mutating = vec![Hook::new("mutate", &url), Hook::claims("mutate", &url)];
    let validating = vec![Hook::new("validate", &url), Hook::claims("validate", &url)];
    register_hooks(&cluster, mutating, validating).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "cuda", "image": "registry.invalid/never-pulled:e2e",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }))
        .unwrap()
    };
    cluster
        .try_create(&pod("on-dra"))
        .await
        .unwrap_or_else(|e| panic!("one T4 is within the quota: {e}"));
    let bound = cluster.wait_bound("on-dra").await;
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some(node)
    );
    // kube-scheduler's claim for the pod: admitted as the pod's own GPU, allocated a T4.
    let claims = cluster.dra("ResourceClaim");
    let allocated = wait_for(
        "the pod's extended-resource claim to be allocated",
        BIND_TIMEOUT,
        || {
            let claims = claims.clone();
            async move {
                let list = claims.list(&Default::default()).await.ok()?;
                let claim = list.items.into_iter().find(|c| {
                    c.metadata.annotations.as_ref().is_some_and(|a| {
                        a.get("resource.kubernetes.io/extended-resource-claim")
                            .map(String::as_str)
                            == Some("true")
                    })
                })?;
                allocated(&claim)
            }
        },
    )
    .await;
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    // Charged once: the quota's one T4 is the pod's.
    cluster.wait_used("gpus", "Tesla-T4", 1000).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.wait_used("gpus", "Tesla-T4", 1000).await;
    let second = cluster.try_create(&pod("over")).await;
    assert!(
        matches!(&second, Err(kube::Error::Api(status)) if status.code == 403),
        "a second T4 is over the quota: {second:?}"
    );

    unregister_webhooks(&cluster).await;
    let _ = cluster
        .pods()
        .delete("on-dra", &DeleteParams::default())
        .await;
    let _ = cluster
        .dra("DeviceClass")
        .delete(class, &DeleteParams::default())
        .await;
    let _ = cluster
        .dra("ResourceSlice")
        .delete("e2e-ext-1-gpus", &DeleteParams::default())
        .await;
    cluster.delete_nodes().await;
}

/// A pod that asks for its GPU through a ResourceClaimTemplate: kube-controller-manager's
/// resource-claim controller creates the pod's claim, and that claim is what the quota
/// charges (the pod itself asks for no GPU resource). With a quota of one A100, the first
/// pod's claim is charged; the second pod's claim is refused with the quota's message, so
/// that pod cannot start.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_pod_from_a_claim_template_is_charged_through_the_claim_the_controller_creates() {
    use k8s_openapi::api::core::v1::Event;
    use kube::api::{Api, ListParams};
    let Some(cluster) = setup("claim-template").await else {
        return;
    };
    cluster
        .create_dra(
            "DeviceClass",
            json!({"metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}]}}),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the DeviceClass: {e}"));
    cluster.label_for_webhooks().await;
    let model = "A100-SXM4-80GB";
    cluster
        .create_quota("gpus", json!({model: "1"}), Some(model))
        .await;
    let url = server_url();
    let (mutating, validating) = (Hook::claims("mutate", &url), Hook::claims("validate", &url));
    register_hooks(&cluster, vec![mutating], vec![validating]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let template = json!({"metadata": {"name": "one-gpu"}, "spec": {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}});
    cluster
        .create_dra("ResourceClaimTemplate", template)
        .await
        .unwrap_or_else(|e| panic!("creating the ResourceClaimTemplate: {e}"));
    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"schedulerName": NO_SCHEDULER,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [{"name": "cuda", "image": "registry.invalid/never-pulled:e2e",
                    "resources": {"claims": [{"name": "gpu"}]}}]},
        }))
        .unwrap()
    };
    cluster.try_create(&pod("first")).await.unwrap();
    let claims = cluster.dra("ResourceClaim");
    let made = wait_for(
        "the controller's claim for the first pod",
        QUOTA_TIMEOUT,
        || async {
            let list = claims.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().next()
        },
    )
    .await;
    let owner = &made.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Pod", "first"));
    let selectors = made.data["spec"]["devices"]["requests"][0]["exactly"]["selectors"].to_string();
    assert!(
        selectors.contains("productName"),
        "pinned to the default model: {selectors}"
    );
    cluster.wait_used("gpus", model, 1000).await;

    cluster.try_create(&pod("second")).await.unwrap();
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let refusal = wait_for("the second pod's claim refused", QUOTA_TIMEOUT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let message = e.message.unwrap_or_default();
            (e.involved_object.name.as_deref() == Some("second")
                && message.contains("GPU quota exceeded"))
            .then_some(message)
        })
    })
    .await;
    println!("the second pod's claim: {refusal}");
    assert!(
        refusal.contains(&format!("for {model}: requested 1, used 1 of 1")),
        "{refusal}"
    );
    let list = claims.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(list.len(), 1, "only the first pod's claim exists");
    unregister_webhooks(&cluster).await;
}

/// Issue 50: GPUs shared by capacity and partitioned into dynamic MIG, published as
/// NVIDIA's DRA driver publishes them, allocated by kube-scheduler's DRA plugin, and a
/// claim of alternatives. On a quota of 1 A100 (and two 1g.10gb slices, 1 H100):
/// - four claims of 20Gi of a shared 80Gi A100 are admitted and a fifth refused; an
///   allocation records 20Gi consumed and `used` stays exact through it and the release;
/// - two dynamic 1g.10gb placements (devices drawing on their GPU's shared counters) are
///   charged by profile, allocated, and a third refused by the profile's cap;
/// - a claim preferring a whole A100, then an H100, with the A100's room spent, is
///   admitted on the H100 and allocated the H100.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn shared_and_partitioned_gpus_are_charged_by_what_they_consume() {
    use crate::support::devices::product_selector;
    let Some(cluster) = setup("dra-share").await else {
        return;
    };
    let node = "e2e-dra-share-1";
    cluster
        .create_node_with(node, json!({MODEL_LABEL: "none"}), json!({}))
        .await;
    // NVIDIA's two classes (each clause guarded, as other scenarios' devices carry no
    // `type`: a selector that fails on a device aborts the allocation).
    let typed = |kind: &str| {
        format!(
            r#"device.driver == "gpu.nvidia.com" && has(device.attributes["gpu.nvidia.com"].type) && device.attributes["gpu.nvidia.com"].type == "{kind}""#
        )
    };
    for (class, kind) in [("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")] {
        let object = json!({"metadata": {"name": class},
            "spec": {"selectors": [{"cel": {"expression": typed(kind)}}]}});
        let created = cluster.create_dra("DeviceClass", object).await;
        created.unwrap_or_else(|e| panic!("creating DeviceClass {class}: {e}"));
    }
    publish_shared_and_partitioned(&cluster, node).await;
    cluster.label_for_webhooks().await;
    let a100 = "A100-SXM4-80GB";
    let slices = "A100-SXM4-80GB/1g.10gb";
    let h100 = "H100-80GB-HBM3";
    cluster
        .create_quota("gpus", json!({a100: "1", slices: "2", h100: "1"}), None)
        .await;
    let url = server_url();
    let (mutating, validating) = (Hook::claims("mutate", &url), Hook::claims("validate", &url));
    register_hooks(&cluster, vec![mutating], vec![validating]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Shares: 20Gi of an 80Gi A100 each.
    let product = product_selector("NVIDIA A100-SXM4-80GB");
    let share = |name: &str| {
        json!({"metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": product}}],
                "capacity": {"requests": {"memory": "20Gi"}}}}]}}})
    };
    for i in 0..4 {
        let name = format!("quarter-{i}");
        let created = cluster.create_dra("ResourceClaim", share(&name)).await;
        let created = created.unwrap_or_else(|e| panic!("{name} is within the quota: {e}"));
        let pin = created.data["spec"]["devices"]["requests"][0]["exactly"]["selectors"][1]["cel"]
            ["expression"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(pin.ends_with("&& device.allowMultipleAllocations"), "{pin}");
        cluster.wait_used("gpus", a100, 250 * (i + 1)).await;
    }
    let fifth = cluster.create_dra("ResourceClaim", share("fifth")).await;
    let message = forbidden_message(fifth, "a fifth quarter of one A100");
    assert!(
        message.contains("for A100-SXM4-80GB: requested 0.25, used 1 of 1"),
        "{message}"
    );
    let allocated = cluster
        .run_pod_on_claim("uses-quarter-0", "quarter-0")
        .await;
    assert_eq!(
        allocated[0]["consumedCapacity"]["memory"], "20Gi",
        "the allocator consumed 20Gi of a shared device: {allocated:?}"
    );
    assert!(allocated[0]["shareID"].is_string(), "{allocated:?}");
    cluster.wait_used("gpus", a100, 1000).await;
    // Released: the pod gone, its claim and one more deleted.
    let force = DeleteParams::default().grace_period(0);
    let _ = cluster.pods().delete("uses-quarter-0", &force).await;
    for name in ["quarter-0", "quarter-1"] {
        let deleted = cluster.dra("ResourceClaim").delete(name, &force).await;
        deleted.unwrap_or_else(|e| panic!("deleting {name}: {e}"));
    }
    cluster.wait_used("gpus", a100, 500).await;

    // Dynamic MIG: two 1g.10gb placements of one GPU, the profile's cap, then no more.
    let slice_claim = |name: &str, count: u32| {
        let profile = r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#;
        crate::support::devices::claim(name, "mig.nvidia.com", count, &[profile])
    };
    cluster
        .create_dra("ResourceClaim", slice_claim("two-slices", 2))
        .await
        .unwrap_or_else(|e| panic!("two 1g.10gb slices are within the quota: {e}"));
    cluster.wait_used("gpus", slices, 2000).await;
    cluster.wait_used("gpus", a100, 500 + 284).await;
    let allocated = cluster.run_pod_on_claim("uses-slices", "two-slices").await;
    let mut devices: Vec<&str> = allocated
        .iter()
        .filter_map(|r| r["device"].as_str())
        .collect();
    devices.sort();
    assert_eq!(
        devices,
        ["gpu-2-mig-1g10gb-0", "gpu-2-mig-1g10gb-1"],
        "{allocated:?}"
    );
    cluster.wait_used("gpus", slices, 2000).await;
    cluster.wait_used("gpus", a100, 784).await;
    let third = cluster
        .create_dra("ResourceClaim", slice_claim("third-slice", 1))
        .await;
    let message = forbidden_message(third, "a third 1g.10gb slice, past the cap");
    assert!(
        message.contains(&format!("for {slices}: requested 1, used 2 of 2")),
        "{message}"
    );

    // Alternatives: a whole A100 first (no room: 0.784 used of 1), then an H100.
    let alternative = |name: &str, product: &str| {
        json!({"name": name, "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": product_selector(product)}}]})
    };
    let either = json!({"metadata": {"name": "either"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "firstAvailable": [alternative("a100", "NVIDIA A100-SXM4-80GB"),
            alternative("h100", "NVIDIA H100 80GB HBM3")]}]}}});
    let created = cluster
        .create_dra("ResourceClaim", either)
        .await
        .unwrap_or_else(|e| panic!("the H100 alternative has room: {e}"));
    let first = &created.data["spec"]["devices"]["requests"][0]["firstAvailable"][0];
    assert_eq!(
        first["selectors"][1]["cel"]["expression"], "false",
        "{first}"
    );
    cluster.wait_used("gpus", h100, 1000).await;
    let allocated = cluster.run_pod_on_claim("uses-either", "either").await;
    assert_eq!(allocated[0]["device"], "gpu-3", "{allocated:?}");
    assert_eq!(allocated[0]["request"], "gpu/h100", "{allocated:?}");
    cluster.wait_used("gpus", h100, 1000).await;
    cluster.wait_used("gpus", a100, 784).await;

    unregister_webhooks(&cluster).await;
    for pod in ["uses-slices", "uses-either"] {
        let _ = cluster.pods().delete(pod, &force).await;
    }
    for kind in ["DeviceClass", "ResourceSlice"] {
        let names: &[&str] = match kind {
            "DeviceClass" => &["gpu.nvidia.com", "mig.nvidia.com"],
            _ => &[
                "e2e-dra-share-1-gpus",
                "e2e-dra-share-1-counters",
                "e2e-dra-share-1-mig",
            ],
        };
        for name in names {
            let _ = cluster
                .dra(kind)
                .delete(name, &DeleteParams::default())
                .await;
        }
    }
    cluster.delete_nodes().await;
}

/// NVIDIA's driver's slices for one node, in one pool: A100s shared by memory
/// (`allowMultipleAllocations`, its `memory` mode: the whole memory by default, 1Mi
/// steps) and an H100 in one slice; a GPU's counter set in another; that GPU and its
/// dynamic 1g.10gb placements, each drawing on the counters, in a third.
async fn publish_shared_and_partitioned(cluster: &Cluster, node: &str) {
    let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 3});
    let attributes = |product: &str, index: i64, profile: Option<&str>| {
        let mut a = json!({"productName": {"string": product},
            "type": {"string": if profile.is_some() { "mig" } else { "gpu" }},
            "uuid": {"string": format!("GPU-e2e-{index}")}, "index": {"int": index}});
        if let Some(profile) = profile {
            a["profile"] = json!({"string": profile});
        }
        a
    };
    let shared = |name: &str, index: i64| {
        json!({"name": name, "allowMultipleAllocations": true,
            "attributes": attributes("NVIDIA A100-SXM4-80GB", index, None),
            "capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi",
                "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}}}}})
    };
    let h100 = json!({"name": "gpu-3", "attributes": attributes("NVIDIA H100 80GB HBM3", 3, None),
        "capacity": {"memory": {"value": "80Gi"}}});
    let consumes = |memory: &str, slices: &[u32]| {
        let mut counters = json!({"memory": {"value": memory}});
        for s in slices {
            counters[format!("memory-slice-{s}")] = json!({"value": "1"});
        }
        json!([{"counterSet": "gpu-2-counter-set", "counters": counters}])
    };
    let placement = |i: u32| {
        json!({"name": format!("gpu-2-mig-1g10gb-{i}"),
            "attributes": attributes("NVIDIA A100-SXM4-80GB", 2, Some("1g.10gb")),
            "capacity": {"memory": {"value": "10Gi"}}, "consumesCounters": consumes("10Gi", &[i])})
    };
    let slices = [
        json!({"metadata": {"name": format!("{node}-gpus")}, "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node, "pool": pool,
            "devices": [shared("gpu-0", 0), shared("gpu-1", 1), h100]}}),
        json!({"metadata": {"name": format!("{node}-counters")}, "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node, "pool": pool,
            "sharedCounters": [{"name": "gpu-2-counter-set", "counters": {
                "memory": {"value": "80Gi"}, "memory-slice-0": {"value": "1"},
                "memory-slice-1": {"value": "1"}}}]}}),
        json!({"metadata": {"name": format!("{node}-mig")}, "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node, "pool": pool,
            "devices": [
                {"name": "gpu-2", "attributes": attributes("NVIDIA A100-SXM4-80GB", 2, None),
                    "capacity": {"memory": {"value": "80Gi"}}, "consumesCounters": consumes("80Gi", &[0, 1])},
                placement(0), placement(1)]}}),
    ];
    for slice in slices {
        let name = slice["metadata"]["name"].clone();
        let created = cluster.create_dra("ResourceSlice", slice).await;
        created.unwrap_or_else(|e| panic!("creating ResourceSlice {name}: {e}"));
    }
}
