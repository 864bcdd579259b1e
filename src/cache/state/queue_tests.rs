//! The usage rule and the quota queue: a waiting pod is charged nothing, a released
//! one from the second its release annotation names.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::ClusterState;
use crate::cache::{CachedPod, Projection, pod_key};
use crate::config::Config;
use crate::placement::quantity::Milli;
use crate::quota::GPUQuota;

const CREATED: &str = "2026-11-25T10:00:00Z";
const CREATED_SECOND: i64 = 1_795_600_800;

fn quota() -> GPUQuota {
    serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "gpus", "namespace": "team"},
        "spec": {"hard": {"Tesla-T4": "2"}, "onExceed": "Queue"}
    }))
    .unwrap()
}

/// A one-GPU T4 pod; `gated`: waiting in the quota queue; `released`: the release
/// annotation's value.
fn pod(name: &str, gated: bool, released: Option<&str>) -> (crate::cache::PodKey, CachedPod) {
    let mut annotations = json!({"gpu-admission.io/gpu-type": "Tesla-T4"});
    if let Some(second) = released {
        annotations["gpu-admission.io/quota-released"] = json!(second);
    }
    let gates = if gated {
        json!([{"name": "example.com/other"}, {"name": "gpu-admission.io/quota"}])
    } else {
        json!([{"name": "example.com/other"}])
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team", "uid": name,
            "creationTimestamp": CREATED, "annotations": annotations},
        "spec": {"priority": 7, "schedulingGates": gates, "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    let projection = Projection::from_config(&Config::default());
    (
        pod_key(&pod),
        CachedPod::from_pod(&pod, &projection).unwrap(),
    )
}

fn used(state: &ClusterState) -> Option<Milli> {
    state.usage("team").get("Tesla-T4").copied()
}

#[test]
fn a_waiting_pod_is_charged_nothing_and_listed_with_its_cost() {
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let (key, waiting) = pod("w", true, None);
    assert!(waiting.gated && waiting.priority == 7);
    state.apply_pod(key.clone(), waiting);
    assert_eq!(used(&state), None, "a gated pod is not usage");
    assert!(
        state.seen_charges("team", 0).is_empty(),
        "nor does it settle a pending charge"
    );
    let line = state.waiting("team", CREATED_SECOND + 60);
    assert_eq!(line.len(), 1);
    assert_eq!((line[0].key.as_str(), line[0].priority), ("team/w", 7));
    assert_eq!(
        line[0].created, CREATED_SECOND,
        "it waits since its creation"
    );
    assert_eq!(line[0].costs.on("Tesla-T4")["Tesla-T4"], Milli(1000));
    assert_eq!(
        state.queued_usage("team", CREATED_SECOND)["Tesla-T4"],
        Milli(1000)
    );
    assert_eq!(state.waiting_namespaces(), ["team"]);
    state.delete_pod(&key);
    assert!(state.waiting("team", CREATED_SECOND).is_empty());
    assert_eq!(state.waiting_count(), 0, "a deleted pod frees its place");
}

#[test]
fn a_released_pod_counts_in_the_second_of_its_release() {
    let mut state = ClusterState::default();
    state.apply_quota(quota());
    let (key, waiting) = pod("w", true, None);
    state.apply_pod(key.clone(), waiting);
    // Let go ten minutes after it was created: the gate is gone, the annotation names
    // the second its charge went to.
    let (_, released) = pod("w", false, Some("2026-11-25T10:10:00Z"));
    assert!(!released.gated);
    state.apply_pod(key, released);
    assert_eq!(used(&state), Some(Milli(1000)));
    assert_eq!(state.waiting_count(), 0);
    let seen = state.seen_charges("team", 0);
    assert_eq!(
        seen.get(&(CREATED_SECOND + 600, "Tesla-T4".to_string())),
        Some(&Milli(1000)),
        "seen in its release second: {seen:?}"
    );
    assert!(!seen.contains_key(&(CREATED_SECOND, "Tesla-T4".to_string())));
}
