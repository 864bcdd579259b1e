//! Claims in the namespace's usage: charged once however many pods share them, by
//! their allocated devices once allocated, and freed when deleted.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::ClusterState;
use super::claims::{CachedClaim, claim_key};
use crate::cache::{CachedPod, Projection, pod_key};
use crate::config::Config;
use crate::dra::slices::{ResourceSlice, gpu_devices};
use crate::dra::{Dra, ResourceClaim};
use crate::placement::quantity::Milli;
use crate::quota::GPUQuota;

fn claim(allocated: &[&str]) -> ResourceClaim {
    let results: Vec<_> = allocated
        .iter()
        .map(|d| json!({"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-1", "device": d}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "shared", "namespace": "team-a", "uid": "u1"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 2}}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

fn slice() -> ResourceSlice {
    let device = |name: &str, product: &str| json!({"name": name, "attributes": {"productName": {"string": product}}});
    serde_json::from_value(json!({
        "metadata": {"name": "node-1-gpus"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "node-1"}, "devices": [
            device("gpu-0", "NVIDIA A100-SXM4-80GB"), device("gpu-1", "NVIDIA A100-SXM4-80GB")]}
    }))
    .unwrap()
}

fn quota() -> GPUQuota {
    serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "q", "namespace": "team-a"},
        "spec": {"hard": {"A100-SXM4-80GB": "4", "Tesla-T4": "4"}, "defaultType": "Tesla-T4"}
    }))
    .unwrap()
}

/// A pod that uses the claim (no GPU resource of its own), as the cache takes it.
fn sharing_pod(name: &str) -> Option<(crate::cache::PodKey, CachedPod)> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": name},
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "shared"}],
            "containers": [{"name": "app", "resources": {"claims": [{"name": "gpus"}]}}]}
    }))
    .unwrap();
    let cached = CachedPod::from_pod(&pod, &Projection::from_config(&Config::default()));
    cached.ok().map(|cached| (pod_key(&pod), cached))
}

fn used(state: &ClusterState, model: &str) -> Option<Milli> {
    state.usage("team-a").get(model).copied()
}

#[test]
fn a_claim_is_charged_its_requests_then_its_devices_once_for_all_its_pods() {
    let dra = Dra::default();
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let key = claim_key("team-a", "shared");
    // Not allocated, naming no model: the namespace default, per device.
    state.apply_claim(
        key.clone(),
        CachedClaim::from_claim(&claim(&[]), &dra).unwrap(),
    );
    state.evaluate_claims_now();
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(2000)));
    // Allocated two A100 devices: charged by what they are.
    state.apply_slice("node-1-gpus", gpu_devices(&slice(), &dra));
    let allocated = CachedClaim::from_claim(&claim(&["gpu-0", "gpu-1"]), &dra).unwrap();
    state.apply_claim(key.clone(), allocated);
    state.evaluate_claims_now();
    assert_eq!(used(&state, "Tesla-T4"), None);
    assert_eq!(used(&state, "A100-SXM4-80GB"), Some(Milli(2000)));
    // Three pods share it: still two GPUs (the pods themselves ask for none).
    for (key, pod) in ["p1", "p2", "p3"].into_iter().filter_map(sharing_pod) {
        state.apply_pod(key, pod);
    }
    assert_eq!(used(&state, "A100-SXM4-80GB"), Some(Milli(2000)));
    state.delete_claim(&key);
    assert_eq!(state.usage("team-a"), Default::default());
}

/// An allocated claim on a device shared by capacity is charged the share its
/// allocation recorded consuming (`consumedCapacity`), as it was charged at admission;
/// one that records none, the whole device.
#[test]
fn an_allocation_of_a_shared_device_is_charged_what_it_consumed() {
    let dra = Dra::default();
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let shared: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "node-1-gpus"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "node-1"}, "devices": [{
            "name": "gpu-0", "allowMultipleAllocations": true,
            "attributes": {"productName": {"string": "NVIDIA A100-SXM4-80GB"}},
            "capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi",
                "validRange": {"min": "1Mi", "step": "1Mi"}}}}}]}
    }))
    .unwrap();
    state.apply_slice("node-1-gpus", gpu_devices(&shared, &dra));
    let allocated = |name: &str, consumed: Option<&str>| -> ResourceClaim {
        let mut result = json!({"request": "gpu", "driver": "gpu.nvidia.com",
            "pool": "node-1", "device": "gpu-0", "shareID": name});
        if let Some(memory) = consumed {
            result["consumedCapacity"] = json!({"memory": memory});
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team-a", "uid": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": [result]}}}
        }))
        .unwrap()
    };
    for (name, memory) in [("a", "20Gi"), ("b", "30Gi")] {
        let claim = CachedClaim::from_claim(&allocated(name, Some(memory)), &dra).unwrap();
        state.apply_claim(claim_key("team-a", name), claim);
    }
    state.evaluate_claims_now();
    assert_eq!(used(&state, "A100-SXM4-80GB"), Some(Milli(250 + 375)));
    let whole = CachedClaim::from_claim(&allocated("c", None), &dra).unwrap();
    state.apply_claim(claim_key("team-a", "c"), whole);
    assert_eq!(used(&state, "A100-SXM4-80GB"), Some(Milli(1625)));
    state.delete_claim(&claim_key("team-a", "a"));
    assert_eq!(used(&state, "A100-SXM4-80GB"), Some(Milli(1375)));
}

#[test]
fn a_namespace_sees_only_its_own_claims_created_since() {
    let dra = Dra::default();
    let mut state = ClusterState::default();
    // Pinned to Tesla-T4, as the mutating webhook leaves a claim.
    let pin = dra.pin_expression(&crate::dra::Pin::whole("Tesla-T4"), &[]);
    let typed = |namespace: &str| -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": namespace, "uid": namespace,
                "creationTimestamp": "2026-11-24T00:00:10Z"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": pin}}]}}]}}
        }))
        .unwrap()
    };
    // "team-a/" sorts before "team/", "team0/" after it: neighbours of the range.
    for namespace in ["team-a", "team", "team0"] {
        let claim = CachedClaim::from_claim(&typed(namespace), &dra).unwrap();
        state.apply_claim(claim_key(namespace, "c"), claim);
        state.evaluate_claims_now();
    }
    let created = CachedClaim::from_claim(&typed("team"), &dra)
        .unwrap()
        .created;
    let seen = state.seen_charges("team", created);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen.get(&(created, "Tesla-T4".to_string())),
        Some(&Milli(1000))
    );
    assert!(state.seen_charges("team", created + 1).is_empty());
}

/// Issue 18, item 6: a DeviceClass that selects the GPU driver's devices, not in the
/// config, is a GPU class: its claims are charged (and charged again once it appears).
#[test]
fn claims_of_a_gpu_device_class_not_in_the_config_are_charged() {
    let dra = Dra::default();
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "vfio", "namespace": "team-a"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "vfio.gpu.nvidia.com"}}]}}
    }))
    .unwrap();
    let key = claim_key("team-a", "vfio");
    state.apply_claim(key, CachedClaim::from_claim(&claim, &dra).unwrap());
    state.evaluate_claims_now();
    assert_eq!(
        used(&state, "Tesla-T4"),
        None,
        "an unknown class is not a GPU class"
    );
    let class = crate::dra::classes::ClassInfo {
        selectors: vec![r#"device.driver == "gpu.nvidia.com""#.into()],
        extended_resource: None,
    };
    state.apply_class("vfio.gpu.nvidia.com", class);
    state.evaluate_claims_now();
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(1000)));
    state.delete_class("vfio.gpu.nvidia.com");
    state.evaluate_claims_now();
    assert_eq!(used(&state, "Tesla-T4"), None);
    let nic = crate::dra::classes::ClassInfo {
        selectors: vec![r#"device.driver == "rdma.example.com""#.into()],
        extended_resource: None,
    };
    state.apply_class("vfio.gpu.nvidia.com", nic);
    state.evaluate_claims_now();
    assert_eq!(used(&state, "Tesla-T4"), None);
}

/// A pod asking for `nvidia.com/gpu: 1`, as the cache takes it.
fn gpu_pod(name: &str, uid: &str) -> (crate::cache::PodKey, CachedPod) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": uid,
            "annotations": {"gpu-admission.io/gpu-type": "Tesla-T4"}},
        "spec": {"containers": [{"name": "app",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    let cached = CachedPod::from_pod(&pod, &Projection::from_config(&Config::default()));
    (pod_key(&pod), cached.unwrap())
}

/// The claim kube-scheduler makes for a pod's DRA-backed extended resource (or a forgery
/// of it): annotated, owned by `owner` (name, uid).
fn extended_claim(name: &str, owner: (&str, &str), class: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": owner.0,
                "uid": owner.1, "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": class, "count": 1}}]}}
    }))
    .unwrap()
}

/// A namespace with the quota, a DeviceClass serving `nvidia.com/gpu` and one that
/// serves no extended resource.
fn extended_state() -> ClusterState {
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let class = crate::dra::classes::ClassInfo {
        selectors: vec![r#"device.driver == "gpu.nvidia.com""#.into()],
        extended_resource: Some("nvidia.com/gpu".into()),
    };
    state.apply_class("gpu.nvidia.com", class);
    state.evaluate_claims_now();
    let plain = crate::dra::classes::ClassInfo {
        selectors: vec![],
        extended_resource: None,
    };
    state.apply_class("plain.gpu.example.com", plain);
    state.evaluate_claims_now();
    state
}

fn apply_extended(state: &mut ClusterState, claim: ResourceClaim) {
    let name = claim.metadata.name.clone().unwrap();
    let cached = CachedClaim::from_claim(&claim, &Dra::default()).unwrap();
    state.apply_claim(claim_key("team-a", &name), cached);
    state.evaluate_claims_now();
}

/// Issue 18, item 9: the claim serving a pod's `nvidia.com/gpu` is the pod's own GPU,
/// charged once (by the pod); a claim that only pretends to be one is charged.
#[test]
fn a_claim_serving_a_pods_extended_resource_is_charged_to_the_pod_only() {
    let mut state = extended_state();
    // The claim arrives before its pod (a relist): charged until the pod is seen.
    apply_extended(
        &mut state,
        extended_claim("served", ("app", "u-app"), "gpu.nvidia.com"),
    );
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(1000)));
    let (key, pod) = gpu_pod("app", "u-app");
    state.apply_pod(key.clone(), pod.clone());
    assert_eq!(
        used(&state, "Tesla-T4"),
        Some(Milli(1000)),
        "the pod's GPU, once"
    );
    // Forgeries, each alone beside the pod: another uid, no such pod, a class serving no
    // extended resource, more devices than the pod's GPUs, a selector, a claim made from
    // the pod's template (its metadata is the tenant's).
    let mut more = extended_claim("more", ("app", "u-app"), "gpu.nvidia.com");
    more.spec.devices.as_mut().unwrap().requests[0]
        .exactly
        .as_mut()
        .unwrap()
        .count = Some(2);
    let mut selected = extended_claim("selected", ("app", "u-app"), "gpu.nvidia.com");
    let exact = selected.spec.devices.as_mut().unwrap().requests[0]
        .exactly
        .as_mut()
        .unwrap();
    exact.selectors = serde_json::from_value(json!([{"cel": {"expression": "true"}}])).unwrap();
    let mut templated = extended_claim("templated", ("app", "u-app"), "gpu.nvidia.com");
    let annotations = templated.metadata.annotations.as_mut().unwrap();
    annotations.insert("resource.kubernetes.io/pod-claim-name".into(), "gpu".into());
    let forgeries = [
        (
            extended_claim("other-uid", ("app", "u-other"), "gpu.nvidia.com"),
            1000,
        ),
        (
            extended_claim("no-pod", ("ghost", "u-ghost"), "gpu.nvidia.com"),
            1000,
        ),
        (
            extended_claim("plain", ("app", "u-app"), "plain.gpu.example.com"),
            1000,
        ),
        (more, 2000),
        (selected, 1000),
        (templated, 1000),
    ];
    for (forgery, charge) in forgeries {
        let name = forgery.metadata.name.clone().unwrap();
        let mut state = extended_state();
        state.apply_pod(key.clone(), pod.clone());
        apply_extended(&mut state, forgery);
        assert_eq!(
            used(&state, "Tesla-T4"),
            Some(Milli(1000 + charge)),
            "{name}"
        );
    }
}

/// A pod has one claim for its extended resources: while another claim names it too,
/// neither is the pod's own (the cache cannot tell which one the scheduler made), and
/// any number of them cannot make the namespace's use smaller than its devices.
#[test]
fn claims_naming_the_same_pod_are_all_charged_while_there_are_several() {
    let mut state = extended_state();
    let (key, pod) = gpu_pod("app", "u-app");
    state.apply_pod(key, pod);
    let claim = |name: &str| extended_claim(name, ("app", "u-app"), "gpu.nvidia.com");
    apply_extended(&mut state, claim("served"));
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(1000)), "the pod's");
    for (n, name) in ["forged-1", "forged-2", "forged-3"].into_iter().enumerate() {
        apply_extended(&mut state, claim(name));
        let claims = n as u64 + 2;
        assert_eq!(
            used(&state, "Tesla-T4"),
            Some(Milli(1000 + claims * 1000)),
            "the pod and {claims} claims"
        );
    }
    for name in ["forged-1", "forged-2", "forged-3"] {
        state.delete_claim(&claim_key("team-a", name));
    }
    assert_eq!(
        used(&state, "Tesla-T4"),
        Some(Milli(1000)),
        "the only one again"
    );
}

/// Nodes without GPU capacity whose GPUs a ResourceSlice publishes take a one-model pod
/// of that model through DRA-backed extended resources, once a DeviceClass serves one.
#[test]
fn dra_nodes_are_those_publishing_the_pods_model_without_gpu_capacity() {
    let dra = Dra::default();
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let (key, pod) = gpu_pod("app", "u-app");
    state.apply_pod(key.clone(), pod);
    let t4: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "dra-t4"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "dra-t4"}, "nodeName": "dra-t4",
            "devices": [{"name": "gpu-0", "attributes": {"productName": {"string": "Tesla T4"}}}]}
    }))
    .unwrap();
    state.apply_slice("dra-t4", gpu_devices(&t4, &dra));
    state.apply_slice("node-1-gpus", gpu_devices(&slice(), &dra));
    let names = ["dra-t4", "node-1", "elsewhere"];
    assert!(
        state.dra_nodes(&key, &names).is_empty(),
        "no class serves an extended resource"
    );
    let class = crate::dra::classes::ClassInfo {
        selectors: vec![],
        extended_resource: Some("nvidia.com/gpu".into()),
    };
    state.apply_class("gpu.nvidia.com", class);
    state.evaluate_claims_now();
    // The pod wants Tesla-T4 (its annotation); node-1 publishes A100s only.
    assert_eq!(state.dra_nodes(&key, &names), ["dra-t4"]);
}

/// Finding 21.2: the cache re-ran a claim's CEL in `apply_claim`, under its lock, every
/// time the watch brought the claim and for every claim on each DeviceClass change. A
/// claim joins with the asks its webhook evaluated off the lock and keeps them; the
/// watch bringing it again runs no CEL; a DeviceClass change leaves it charged until it
/// is evaluated again off the lock.
#[test]
fn an_admitted_claim_joins_the_cache_with_its_verdict_and_no_cel_runs_under_the_lock() {
    use crate::dra::{Catalog, ClaimAsks};
    let dra = Dra::default();
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "t4", "namespace": "team-a"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 3, "selectors": [{"cel": {"expression":
                "device.attributes[\"gpu.nvidia.com\"].productName.startsWith(\"Tesla\")"}}]}}]}}
    }))
    .unwrap();
    // The webhook's evaluation, off the lock.
    let catalog = Catalog::from_source(state.catalog_source("team-a"));
    let mut judged = CachedClaim::from_claim(&claim, &dra).unwrap();
    judged.asks = ClaimAsks::of(&claim, &catalog).unwrap();
    judged.evaluated = Some(state.classes_version());
    let key = claim_key("team-a", "t4");
    let work = crate::dra::cel::WORK.get();
    state.apply_claim(key.clone(), judged);
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(3000)));
    state.apply_claim(key.clone(), CachedClaim::from_claim(&claim, &dra).unwrap());
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(3000)));
    assert!(
        state
            .unevaluated(&mut [(key.clone(), CachedClaim::from_claim(&claim, &dra).unwrap())])
            .is_empty()
    );
    let class = crate::dra::classes::ClassInfo {
        selectors: vec![r#"device.driver == "gpu.nvidia.com""#.into()],
        extended_resource: None,
    };
    state.apply_class("vfio.gpu.nvidia.com", class);
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(3000)));
    assert_eq!(crate::dra::cel::WORK.get(), work, "no CEL under the lock");
    // Evaluated again off the lock (here on this thread), the same charge.
    let evaluated = state.unevaluated_claims().evaluate();
    assert!(crate::dra::cel::WORK.get() > work);
    state.apply_evaluated(evaluated);
    assert_eq!(used(&state, "Tesla-T4"), Some(Milli(3000)));
    assert!(state.unevaluated_claims().is_empty());
}
