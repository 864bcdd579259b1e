//! Single-strategy MIG (issue 18, item 3): a pod that wants a model is charged, until
//! bound, the most it can cost on the nodes of that model that existed when it was
//! created, and placement refuses a node that costs more than that plus the room.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::ClusterState;
use crate::cache::pod::created_second;
use crate::cache::{CachedPod, Projection, pod_key};
use crate::config::Config;
use crate::placement::models::WantedModels;
use crate::placement::testing::node;
use crate::placement::{Misfit, NodeGpus};
use crate::quota::Charged;
use crate::quota::eligible::{self, Eligibility};
use crate::quota::{Charge, Denial, admit};

const MODEL: &str = "A100-SXM4-40GB";
const SLICES: &str = "A100-SXM4-40GB-MIG-1g.5gb";

/// Pods of this test are created at this second (2026-11-24T00:00:00Z).
fn pod_second() -> i64 {
    created_second(&pod("x"))
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": name,
            "creationTimestamp": "2026-11-24T00:00:00Z",
            "annotations": {"gpu-admission.io/gpu-type": MODEL}},
        "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

fn gpu_node(name: &str, label: &str, created: i64) -> NodeGpus {
    let mut gpus = node(name, 7, 0);
    gpus.model = Some(label.into());
    gpus.created = created;
    gpus
}

/// A namespace allowed one A100-SXM4-40GB (and `hard` more keys), on a cluster whose
/// A100s are all cut into 1g.5gb slices.
fn sliced_cluster(hard: serde_json::Value) -> ClusterState {
    let mut state = ClusterState::default();
    state.apply_node(gpu_node("slices", SLICES, pod_second() - 3600));
    let mut hard = hard;
    hard[MODEL] = json!("1");
    state.apply_quota(
        serde_json::from_value(json!({
            "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": "q", "namespace": "team-a"},
            "spec": {"hard": hard}
        }))
        .unwrap(),
    );
    state
}

fn cached(pod: &Pod) -> CachedPod {
    CachedPod::from_pod(pod, &Projection::from_config(&Config::default())).unwrap()
}

fn wanted() -> WantedModels {
    WantedModels::one(MODEL)
}

/// Admit `pod` as the offline webhook does (admission's costs, the quotas with the
/// namespace's usage), and let it join the cluster if admitted.
fn admit_pod(state: &mut ClusterState, pod: &Pod) -> Result<Charge, Denial> {
    let cached = cached(pod);
    let quota = state.namespace_quota("team-a");
    let costs = quota.costs(&cached.request, &wanted().models, pod_second());
    let views = state.quota_views("team-a").unwrap();
    let rules = Config::default().admit_rules();
    let decision = admit("team-a", &views, &wanted(), &costs, rules)?;
    state.apply_pod(pod_key(pod), cached);
    Ok(decision)
}

/// Whether the pod `name` (pending in `state`) may go to `node`, as filter, bind and
/// Volcano's predicate ask.
fn admits(state: &ClusterState, name: &str, node: &NodeGpus) -> Result<(), Misfit> {
    let pod = state.pod(&format!("team-a/{name}")).unwrap();
    let limits = state.namespace_limits("team-a");
    let charged = state
        .namespace_quota("team-a")
        .charged(&wanted(), &pod.request, pod.created);
    let views = eligible::needs_views(&charged).then(|| state.quota_views("team-a"));
    let eligibility = Eligibility::new(limits, wanted(), charged, state.mig(), views);
    eligibility.admits(node, &pod.request)
}

#[test]
fn seven_slice_pods_fit_a_quota_of_one_sliced_gpu() {
    // The finding: each pending slice pod was charged a whole A100, so the second
    // was refused though seven slices fit the quota.
    let mut state = sliced_cluster(json!({}));
    for i in 0..7 {
        let admitted = admit_pod(&mut state, &pod(&format!("p{i}")));
        assert!(admitted.is_ok(), "pod {i}: {admitted:?}");
    }
    let used = state.usage("team-a");
    assert_eq!(used.get(MODEL).map(|m| m.0), Some(7 * 142));
    let refused = admit_pod(&mut state, &pod("p7")).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("requested 0.142, used 0.994 of 1"),
        "{refused}"
    );
}

#[test]
fn a_whole_gpu_node_of_the_model_is_charged_whole() {
    let mut state = sliced_cluster(json!({}));
    state.apply_node(gpu_node("whole", MODEL, pod_second() - 60));
    admit_pod(&mut state, &pod("p0")).unwrap();
    assert_eq!(state.usage("team-a").get(MODEL).map(|m| m.0), Some(1000));
    assert!(admit_pod(&mut state, &pod("p1")).is_err());
}

#[test]
fn a_whole_gpu_node_added_later_does_not_let_a_slice_charge_through() {
    let mut state = sliced_cluster(json!({}));
    for i in 0..7 {
        admit_pod(&mut state, &pod(&format!("p{i}"))).unwrap();
    }
    // Added after the pods were created: their charge stays a slice each...
    let whole = gpu_node("whole", MODEL, pod_second() + 60);
    state.apply_node(whole.clone());
    assert_eq!(state.usage("team-a").get(MODEL).map(|m| m.0), Some(7 * 142));
    // ...so they may take a slice, but not a whole GPU the quota has no room for.
    let slices = state.node("slices").unwrap().clone();
    assert_eq!(admits(&state, "p0", &slices), Ok(()));
    let refused = admits(&state, "p0", &whole).unwrap_err();
    assert!(refused.to_string().contains("used 0.994 of 1"), "{refused}");
}

#[test]
fn a_dearer_node_is_taken_only_with_room_for_the_difference() {
    let mut state = sliced_cluster(json!({}));
    admit_pod(&mut state, &pod("p0")).unwrap();
    let whole = gpu_node("whole", MODEL, pod_second() + 60);
    state.apply_node(whole.clone());
    // One slice used of one GPU: room for the 0.858 more a whole GPU costs, which the
    // ledger is charged at placement (what admission charged stays charged).
    assert_eq!(admits(&state, "p0", &whole), Ok(()));
    let placed = state.pod("team-a/p0").unwrap();
    let (request, created) = (&placed.request, placed.created);
    let limits = state.namespace_limits("team-a");
    let charged = state
        .namespace_quota("team-a")
        .charged(&wanted(), request, created);
    let eligibility = Eligibility::new(limits, wanted(), charged, state.mig(), None);
    let beyond = eligibility.placement_charge(MODEL, request).unwrap();
    assert_eq!(beyond.get(MODEL).map(|m| m.0), Some(858));
    assert_eq!(eligibility.placement_charge(SLICES, request), None);
    admit_pod(&mut state, &pod("p1")).unwrap();
    assert!(admits(&state, "p0", &whole).is_err());
}

#[test]
fn a_capped_profile_does_not_count_for_a_pod_that_does_not_name_it() {
    // The namespace caps 1g.5gb slices: a pod naming only the model may not take one
    // (placement refuses), so its charge is a whole GPU, as before.
    let mut state = sliced_cluster(json!({"A100-SXM4-40GB/1g.5gb": "3"}));
    admit_pod(&mut state, &pod("p0")).unwrap();
    assert_eq!(state.usage("team-a").get(MODEL).map(|m| m.0), Some(1000));
    let slices = state.node("slices").unwrap().clone();
    assert!(matches!(
        admits(&state, "p0", &slices),
        Err(Misfit::QuotaFull { .. })
    ));
}

#[test]
fn a_pod_charged_whole_reads_no_quota_at_placement() {
    let mut state = sliced_cluster(json!({}));
    state.apply_node(gpu_node("whole", MODEL, 0));
    admit_pod(&mut state, &pod("p0")).unwrap();
    let pod = state.pod("team-a/p0").unwrap();
    let charged = state
        .namespace_quota("team-a")
        .charged(&wanted(), &pod.request, pod.created);
    assert!(matches!(charged, Charged::Admitted(_)));
    assert!(!eligible::needs_views(&charged), "the filter's hot path");
}
