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
    let line = state.waiting_line("team", CREATED_SECOND + 60, 300, 10);
    assert_eq!(line.len(), 1);
    assert_eq!((line[0].key.as_str(), line[0].priority), ("team/w", 7));
    assert_eq!(
        line[0].created, CREATED_SECOND,
        "it waits since its creation"
    );
    assert_eq!(line[0].costs.on("Tesla-T4")["Tesla-T4"], Milli(1000));
    assert_eq!(state.queued_usage("team")["Tesla-T4"], Milli(1000));
    assert_eq!(state.queued_pods("team")["Tesla-T4"], 1);
    assert_eq!(state.waiting_namespaces(), ["team"]);
    state.delete_pod(&key);
    assert!(
        state
            .waiting_line("team", CREATED_SECOND, 300, 10)
            .is_empty()
    );
    assert!(state.queued_usage("team").is_empty());
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

/// The line the cache keeps as pods come and go is the order `quota::queue` defines:
/// read whole, it is `line_up`'s sort; read in part, a prefix of it; its totals are the
/// sum of what is in it.
#[test]
fn the_kept_line_is_the_queue_order_and_its_head_a_prefix() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let projection = Projection::from_config(&Config::default());
    for round in 0..50 {
        let mut state = ClusterState::default();
        // Two models, whole GPUs and gpu-manager shares, in init and app containers;
        // pods replaced under the same name (re-keyed) and deleted while they wait.
        let mut two_models = quota();
        two_models.spec.hard.insert(
            "A100".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("4".into()),
        );
        state.apply_quota(two_models);
        for i in 0..rng.random_range(0..40) {
            let created = CREATED_SECOND + rng.random_range(0..20);
            let model = if rng.random_bool(0.5) {
                "Tesla-T4"
            } else {
                "A100"
            };
            let limits = match rng.random_range(0..3) {
                0 => json!({"nvidia.com/gpu": rng.random_range(1..3).to_string()}),
                1 => {
                    json!({"tencent.com/vcuda-core": (10 * rng.random_range(1..10)).to_string(), "tencent.com/vcuda-memory": "2"})
                }
                _ => json!({"nvidia.com/gpu": "1"}),
            };
            let init = if rng.random_bool(0.3) {
                json!([{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "2"}}}])
            } else {
                json!([])
            };
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("p{}", i % 30), "namespace": "team", "uid": format!("u{i}"),
                    "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string(),
                    "annotations": {"gpu-admission.io/gpu-type": model}},
                "spec": {"priority": rng.random_range(-1..2),
                    "schedulingGates": if rng.random_bool(0.8) { json!([{"name": "gpu-admission.io/quota"}]) } else { json!([]) },
                    "initContainers": init,
                    "containers": [{"name": "c", "resources": {"limits": limits}}]}
            }))
            .unwrap();
            state.apply_pod(
                pod_key(&pod),
                CachedPod::from_pod(&pod, &projection).unwrap(),
            );
            if rng.random_bool(0.2) {
                state.delete_pod(&format!("team/p{}", rng.random_range(0..30)));
            }
        }
        let now = CREATED_SECOND + 25;
        let max_pass_over = rng.random_range(0..30);
        let whole = state.waiting_line("team", now, max_pass_over, usize::MAX);
        let mut sorted = whole.clone();
        crate::quota::queue::line_up(&mut sorted, now, max_pass_over);
        let keys = |line: &[crate::quota::queue::Waiting]| -> Vec<String> {
            line.iter().map(|w| w.key.clone()).collect()
        };
        assert_eq!(keys(&whole), keys(&sorted), "round {round}");
        assert_eq!(whole.len(), state.waiting_count());
        let head = state.waiting_line("team", now, max_pass_over, 5);
        assert_eq!(keys(&head), keys(&whole)[..whole.len().min(5)]);
        // The kept totals are what the waiting pods would be charged, model by model.
        let mut want = crate::quota::ModelAmounts::new();
        for w in &whole {
            let model = &w.wanted.models[0];
            crate::quota::add_charge(&mut want, &w.costs.on(model));
        }
        assert_eq!(state.queued_usage("team"), want, "round {round}");
    }
}

/// Free GPUs by cause: while a pod waits in the quota queue for Tesla-T4, the usable
/// free T4 capacity is quota-blocked; another model's stays idle; once it leaves the
/// queue, idle again.
#[test]
fn usable_gpus_of_a_model_a_queued_pod_wants_are_quota_blocked() {
    use crate::placement::TaskMix;
    use crate::placement::free::FreeCause;
    use crate::placement::testing::node;

    let mut state = ClusterState::default();
    state.apply_quota(quota());
    for (name, model) in [("t4", "Tesla-T4"), ("a100", "A100")] {
        let mut gpus = node(name, 2, 16);
        gpus.model = Some(model.into());
        state.apply_node(gpus);
    }
    let (key, waiting) = pod("w", true, None);
    state.apply_pod(key.clone(), waiting);
    let count = |state: &ClusterState, model: &str, cause| {
        let free = state.free_gpus(&TaskMix::default());
        free.get(&(Some(model.into()), cause)).copied().unwrap_or(0)
    };
    assert_eq!(count(&state, "Tesla-T4", FreeCause::QuotaBlocked), 200);
    assert_eq!(count(&state, "Tesla-T4", FreeCause::Idle), 0);
    assert_eq!(count(&state, "A100", FreeCause::Idle), 200);
    state.delete_pod(&key);
    assert_eq!(count(&state, "Tesla-T4", FreeCause::QuotaBlocked), 0);
    assert_eq!(count(&state, "Tesla-T4", FreeCause::Idle), 200);
}
