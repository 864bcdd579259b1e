//! What the node's accounting and the quota ledger charge for a pod: the same amount.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::ClusterState;
use crate::cache::{CachedPod, Projection, pod_key};
use crate::config::Config;
use crate::placement::fit;
use crate::placement::testing::node;

fn cached(pod: &Pod) -> CachedPod {
    CachedPod::from_pod(pod, &Projection::from_config(&Config::default())).unwrap()
}

/// A pod on node `n` whose init container takes 4 whole GPUs and whose app takes none.
fn init_only(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": name},
        "spec": {
            "nodeName": "n",
            "initContainers": [{"name": "fetch", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
            "containers": [{"name": "app"}]
        }
    }))
    .unwrap()
}

#[test]
fn a_pods_init_container_gpus_stay_held_on_its_node() {
    let mut state = ClusterState::default();
    state.apply_node(node("n", 4, 4));
    let first = init_only("first");
    state.apply_pod(pod_key(&first), cached(&first));
    let gpus = state.node("n").unwrap();
    assert!(
        gpus.used.iter().all(|u| u.core == 100),
        "the node holds the pod's 4 GPUs: {gpus:?}"
    );
    let second = cached(&init_only("second"));
    assert!(
        fit(gpus, &second.request).is_err(),
        "two such pods cannot share a 4-GPU node"
    );
}
