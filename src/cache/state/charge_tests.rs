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

/// A bound pod with 2 app GPUs (annotated by gpu-manager's index key) and a 2-GPU
/// native sidecar, as the cache reads it back (a restart): the node holds 4 GPUs, and
/// the quota charges 4.
#[test]
fn a_bound_pods_sidecar_gpus_are_held_and_charged_when_read_back() {
    let mut state = ClusterState::default();
    state.apply_node(node("n", 4, 4));
    let two = json!({"limits": {"nvidia.com/gpu": "2"}});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "team-a", "uid": "p",
            "annotations": {"tencent.com/predicate-gpu-idx-0": "0,1",
                "tencent.com/predicate-node": "n", "tencent.com/gpu-assigned": "true",
                "gpu-admission.io/gpu-type": "Tesla-T4"}},
        "spec": {"nodeName": "n",
            "initContainers": [{"name": "side", "restartPolicy": "Always", "resources": two}],
            "containers": [{"name": "app", "resources": two}]}
    }))
    .unwrap();
    state.apply_pod(pod_key(&pod), cached(&pod));
    let gpus = state.node("n").unwrap();
    assert!(
        gpus.used.iter().all(|u| u.core == 100),
        "the node holds the app's and the sidecar's GPUs: {gpus:?}"
    );
    let used = state.usage("team-a");
    assert_eq!(used.get("Tesla-T4").map(|m| m.0), Some(4000));
}

#[test]
fn usage_counts_effective_requests_and_models_no_quota_lists() {
    let mut state = ClusterState::default();
    let quota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": "team-a"},
        "spec": {"hard": {"Tesla-T4": "4"}}
    }))
    .unwrap();
    state.apply_quota(quota);
    let pod = |name: &str, model: &str, init_gpus: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team-a", "uid": name,
                "annotations": {"gpu-admission.io/gpu-type": model}},
            "spec": {
                "initContainers": [{"name": "fetch", "resources": {"limits": {"nvidia.com/gpu": init_gpus}}}],
                "containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
        .unwrap()
    };
    // The init container's 3 GPUs count (max of init and apps), and a pod charged to a
    // model no quota lists (it got around admission) is counted, not dropped.
    for pod in [pod("train", "Tesla-T4", "3"), pod("bypass", "A100", "0")] {
        state.apply_pod(pod_key(&pod), cached(&pod));
    }
    let used = state.usage("team-a");
    assert_eq!(used.get("Tesla-T4").map(|m| m.0), Some(3000));
    assert_eq!(used.get("A100").map(|m| m.0), Some(1000));
    let views = state.quota_views("team-a").unwrap();
    assert_eq!(views[0].used.get("Tesla-T4").map(|m| m.0), Some(3000));
}

#[test]
fn quota_views_follow_the_quota_as_it_changes_and_name_one_that_cannot_be_read() {
    let quota = |hard: &str, version: &str| {
        gpu_quota(
            "team-a",
            version,
            json!({"hard": {"Tesla-T4": hard}}),
            json!(null),
        )
    };
    let mut state = ClusterState::default();
    state.apply_quota(quota("4", "1"));
    let hard = |state: &ClusterState| state.quota_views("team-a").map(|v| v[0].hard["Tesla-T4"].0);
    assert_eq!(hard(&state), Ok(4000));
    state.apply_quota(quota("2500m", "2"));
    assert_eq!(
        hard(&state),
        Ok(2500),
        "the view is the quota's newest spec"
    );
    state.apply_quota(quota("four", "3"));
    let error = state.quota_views("team-a").unwrap_err();
    assert_eq!(error.quota, "team-a/default");
    assert!(error.reason.contains("spec.hard.Tesla-T4"), "{error}");
    state.replace_quotas(vec![quota("8", "4")]);
    assert_eq!(hard(&state), Ok(8000));
}

#[test]
fn recorded_quota_views_say_what_the_newest_status_says_and_name_one_that_cannot_be_read() {
    // Two models, and a cohort whose other member (another namespace) borrows.
    let spec = json!({"hard": {"Tesla-T4": "4", "A100": "2"}, "cohort": "research"});
    let quota = |used: &str, version: &str| {
        let status = json!({"used": {"Tesla-T4": used, "A100": "2"}});
        gpu_quota("team-a", version, spec.clone(), status)
    };
    let mut state = ClusterState::default();
    let borrower = json!({"hard": {"Tesla-T4": "2"}, "cohort": "research"});
    let borrowing = json!({"used": {"Tesla-T4": "3"}});
    state.apply_quota(gpu_quota("team-b", "1", borrower, borrowing));
    let used = |state: &ClusterState| {
        let views = state.recorded_quota_views("team-a");
        views.map(|v| (v[0].hard["Tesla-T4"].0, v[0].used["Tesla-T4"].0))
    };
    state.apply_quota(quota("1", "1"));
    assert_eq!(used(&state), Ok((4000, 1000)));
    let views = state.recorded_quota_views("team-a").unwrap();
    assert_eq!(views.len(), 1, "only the namespace's own quotas");
    assert_eq!(views[0].used["A100"].0, 2000);
    let pools = &views[0].cohort.as_ref().unwrap().pools;
    let t4 = &pools["Tesla-T4"];
    // The pool: what both members lend (4 + 2 T4), and their use drawn from it (1 + 3,
    // team-b past its own 2).
    assert_eq!((t4.size, t4.drawn), (6000, 4000));
    // The ledger's own write lands: the next admission decides on it.
    state.apply_quota(quota("1500m", "2"));
    assert_eq!(used(&state), Ok((4000, 1500)));
    // A watch event older than what is held changes nothing.
    state.apply_quota(quota("0", "1"));
    assert_eq!(used(&state), Ok((4000, 1500)));
    state.apply_quota(quota("lots", "3"));
    let error = state.recorded_quota_views("team-a").unwrap_err();
    assert!(error.reason.contains("status.used.Tesla-T4"), "{error}");
}

/// A GPUQuota `default` of `namespace` at `version`, with `spec` and `status`.
fn gpu_quota(
    namespace: &str,
    version: &str,
    spec: serde_json::Value,
    status: serde_json::Value,
) -> crate::quota::GPUQuota {
    serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": namespace, "resourceVersion": version},
        "spec": spec, "status": status
    }))
    .unwrap()
}

/// A pod that wants a model and is bound on a single-strategy MIG node of it uses a
/// slice (usage); on a cluster whose GPUs of the model are all sliced it was charged a
/// slice at admission too, and its pending total counts as seen by that amount (or it
/// would wait out its TTL).
#[test]
fn a_pod_on_a_mig_slice_uses_the_slice_and_settles_what_admission_charged() {
    use crate::placement::quantity::Milli;
    let mut state = ClusterState::default();
    let mut slices = node("n", 7, 0);
    slices.model = Some("A100-SXM4-40GB-MIG-1g.5gb".into());
    state.apply_node(slices);
    state.apply_quota(
        serde_json::from_value(json!({
            "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": "q", "namespace": "team-a"},
            "spec": {"hard": {"A100-SXM4-40GB": "1"}}
        }))
        .unwrap(),
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "team-a", "uid": "p",
            "creationTimestamp": "2026-11-24T00:00:00Z",
            "annotations": {"gpu-admission.io/gpu-type": "A100-SXM4-40GB"}},
        "spec": {"nodeName": "n", "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    state.apply_pod(pod_key(&pod), cached(&pod));
    assert_eq!(
        state.usage("team-a").get("A100-SXM4-40GB"),
        Some(&Milli(142))
    );
    let created = crate::cache::pod::created_second(&pod);
    let seen = state.seen_charges("team-a", created);
    assert_eq!(
        seen.get(&(created, "A100-SXM4-40GB".to_string())),
        Some(&Milli(142))
    );
}

/// A pod of 2 Tesla-T4 GPUs on node `n`, deleted `ago` seconds before now with a grace
/// period of `grace` seconds (none: no grace period recorded).
fn deleted(name: &str, ago: i64, grace: Option<i64>) -> Pod {
    let at = crate::quota::pending::now_second() - ago;
    let at = k8s_openapi::jiff::Timestamp::from_second(at).unwrap();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": name,
            "annotations": {"gpu-admission.io/gpu-type": "Tesla-T4"},
            "deletionTimestamp": at.to_string(), "deletionGracePeriodSeconds": grace},
        "spec": {"nodeName": "n", "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    }))
    .unwrap()
}

/// A tenant deletes its running pods with a day of grace and creates new ones at once:
/// the old ones still run their containers, so they stay charged (and their GPUs held)
/// until their deletion time plus their grace period has passed, as Kubernetes'
/// ResourceQuota counts them; only then does their charge go, with no event to say so.
#[test]
fn a_pod_being_deleted_stays_charged_until_its_grace_period_has_passed() {
    let mut state = ClusterState::default();
    state.apply_node(node("n", 8, 16));
    let charged = |state: &ClusterState| state.usage("team-a").get("Tesla-T4").map(|m| m.0);
    // The API server sets the deletion time to the request's time plus the grace period.
    let long = deleted("long", -86_400, Some(86_400));
    state.apply_pod(pod_key(&long), cached(&long));
    assert_eq!(charged(&state), Some(2000), "a day of grace: still charged");
    let forever = deleted("no-grace-recorded", 3600, None);
    state.apply_pod(pod_key(&forever), cached(&forever));
    assert_eq!(
        charged(&state),
        Some(4000),
        "no grace period: charged until gone"
    );
    let over = deleted("over", 100, Some(30));
    state.apply_pod(pod_key(&over), cached(&over));
    assert_eq!(charged(&state), Some(4000), "past its grace: not charged");
    let gpus = state.node("n").unwrap();
    let held = gpus.used.iter().filter(|u| u.core == 100).count();
    assert_eq!(
        held, 6,
        "every pod still on the node holds its GPUs: {gpus:?}"
    );

    // One whose grace period runs out while it is cached: charged until the sweep after.
    let ending = deleted("ending", 0, Some(1));
    state.apply_pod(pod_key(&ending), cached(&ending));
    assert_eq!(charged(&state), Some(6000));
    let now = crate::quota::pending::now_second();
    state.expire_deletions(now);
    assert_eq!(charged(&state), Some(6000), "its grace has not passed yet");
    state.expire_deletions(now + 5);
    assert_eq!(charged(&state), Some(4000), "its grace has passed");
    state.delete_pod(&pod_key(&long));
    assert_eq!(
        charged(&state),
        Some(2000),
        "a pod that is gone is not charged"
    );
}

/// A namespace's quota picture counts usage as the cache's ledger says: the status the
/// API server holds (API mode), or the pods the cache holds (offline); the quota's
/// `used` metric says the same.
#[test]
fn the_namespace_quota_counts_usage_as_its_ledger_says() {
    let spec = json!({"hard": {"Tesla-T4": "4"}});
    let status = json!({"used": {"Tesla-T4": "3"}});
    let quota = gpu_quota("team-a", "1", spec, status);
    let mut state = ClusterState::default();
    state.apply_node(node("n", 4, 4));
    state.apply_quota(quota.clone());
    let pod = init_only("p"); // 4 GPUs on node n, which has no model label
    let mut cached = cached(&pod);
    cached.models = vec!["Tesla-T4".into()];
    state.apply_pod(pod_key(&pod), cached);
    let used = |state: &ClusterState| {
        let views = state.namespace_quota("team-a").views().unwrap();
        (
            views[0].used.get("Tesla-T4").map(|m| m.0),
            state.quota_used(&quota).get("Tesla-T4").map(|m| m.0),
        )
    };
    assert_eq!(used(&state), (Some(4000), Some(4000)), "offline: the pods");
    state.set_ledger(super::Ledger::Recorded);
    assert_eq!(
        used(&state),
        (Some(3000), Some(3000)),
        "API mode: the status"
    );
}
