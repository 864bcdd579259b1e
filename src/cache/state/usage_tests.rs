//! The usage the cache keeps up to date is the usage a recount of the namespace's pods
//! gives, after any sequence of pod, node and quota changes.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::{ClusterState, namespace_of};
use crate::cache::{CachedPod, PodKey, Projection, pod_key};
use crate::config::Config;
use crate::placement::MigResources;
use crate::placement::models::WantedModels;
use crate::placement::testing::node;
use crate::quota::{ChargedAt, ModelAmounts, PodCharge, charge_on, usage};
use crate::quota::{GPUQuota, NamespaceLimits};

const NAMESPACES: [&str; 3] = ["team-a", "team-b", "team-c"];
const NODES: [&str; 4] = ["n0", "n1", "n2", "n3"];
const MODELS: [&str; 2] = ["Tesla-T4", "A100"];

/// The model of the node `pod` is on, as the state knows it.
fn node_model_of<'a>(state: &'a ClusterState, pod: &CachedPod) -> Option<&'a str> {
    let node = state.node(pod.node.as_deref()?)?;
    node.model.as_deref()
}

/// Usage counted from the namespace's pods, one by one: what `ClusterState::usage`
/// computed on every call before it kept totals.
fn recount(state: &ClusterState, namespace: &str) -> ModelAmounts {
    let limits = NamespaceLimits::of(state.quotas(), namespace);
    let keys = state.by_namespace.get(namespace).into_iter().flatten();
    let pods = keys.filter_map(|key| state.pods.get(key)).map(|pod| {
        let wanted =
            WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
        let node_model = node_model_of(state, pod);
        let mig = MigResources::default();
        PodCharge {
            namespace,
            charge: ChargedAt::of(wanted)
                .label(node_model, |m| m)
                .map(|label| charge_on(&pod.request, label, &mig))
                .unwrap_or_default(),
            live: pod.charged_at(crate::quota::pending::now_second()),
        }
    });
    usage(namespace, pods)
}

/// What the namespace's bound pods hold, per model, counted one by one: what the
/// showback meters must read after any sequence of changes.
fn recount_held(state: &ClusterState, namespace: &str) -> std::collections::BTreeMap<String, u128> {
    let limits = NamespaceLimits::of(state.quotas(), namespace);
    let mut held = std::collections::BTreeMap::new();
    let keys = state.by_namespace.get(namespace).into_iter().flatten();
    let now = crate::quota::pending::now_second();
    for pod in keys.filter_map(|key| state.pods.get(key)) {
        if !(pod.bound && pod.node.is_some() && pod.charged_at(now) && !pod.gated) {
            continue;
        }
        let wanted =
            WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
        let node_model = node_model_of(state, pod);
        let pending = state.pending(&pod.request, pod.created, &limits);
        let Some(label) = ChargedAt::of(wanted).label(node_model, pending) else {
            continue;
        };
        for (model, amount) in charge_on(&pod.request, label, &MigResources::default()) {
            if !model.contains('/') && amount.0 > 0 {
                *held.entry(model).or_default() += u128::from(amount.0);
            }
        }
    }
    held
}

fn random_node(rng: &mut ChaCha8Rng) -> crate::placement::NodeGpus {
    let mut gpus = node(NODES.choose(rng).unwrap(), *[2, 4].choose(rng).unwrap(), 16);
    gpus.model = [None, Some("Tesla-T4"), Some("A100")]
        .choose(rng)
        .unwrap()
        .map(Into::into);
    gpus
}

/// A GPU pod of a random namespace: its own models (none, one, or two), whole GPUs or a
/// share, on a random node (one of them never exists) or none, maybe terminating.
fn random_pod(rng: &mut ChaCha8Rng) -> (PodKey, CachedPod) {
    let namespace = NAMESPACES.choose(rng).unwrap();
    let name = format!("p{}", rng.random_range(0..6));
    let mut annotations = serde_json::Map::new();
    match rng.random_range(0..4) {
        0 => {}
        1 => drop(annotations.insert("gpu-admission.io/gpu-type".into(), "Tesla-T4".into())),
        2 => drop(annotations.insert("gpu-admission.io/gpu-type".into(), "A100".into())),
        _ => drop(annotations.insert("gpu-admission.io/gpu-type".into(), "Tesla-T4,A100".into())),
    }
    let limits = match rng.random_range(0..3) {
        0 => json!({"nvidia.com/gpu": rng.random_range(1..3).to_string()}),
        _ => json!({"tencent.com/vcuda-core": (10 * rng.random_range(1..10)).to_string(),
            "tencent.com/vcuda-memory": "4"}),
    };
    let mut pod = json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("u{}", rng.random_range(0..2)),
            "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    });
    if rng.random_bool(0.6) {
        let node = ["n0", "n1", "n2", "n3", "gone"].choose(rng).unwrap();
        pod["spec"]["nodeName"] = json!(node);
    }
    if rng.random_bool(0.15) {
        // Being deleted: long ago with no grace period left, or with one still running,
        // or with none given (charged until gone).
        let now = crate::quota::pending::now_second();
        let (at, grace) = *[
            (now - 3600, Some(30)),
            (now - 10, Some(86_400)),
            (now + 60, Some(60)),
            (now - 3600, None),
        ]
        .choose(rng)
        .unwrap();
        let at = k8s_openapi::jiff::Timestamp::from_second(at).unwrap();
        pod["metadata"]["deletionTimestamp"] = json!(at.to_string());
        if let Some(grace) = grace {
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        }
    }
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let projection = Projection::from_config(&Config::default());
    (
        pod_key(&pod),
        CachedPod::from_pod(&pod, &projection).unwrap(),
    )
}

fn random_quota(rng: &mut ChaCha8Rng) -> GPUQuota {
    let mut hard = serde_json::Map::new();
    for model in MODELS {
        if rng.random_bool(0.6) {
            hard.insert(model.into(), json!(rng.random_range(1..20).to_string()));
        }
    }
    let default = [None, Some("Tesla-T4"), Some("A100")].choose(rng).unwrap();
    serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": format!("q{}", rng.random_range(0..2)), "namespace": NAMESPACES.choose(rng).unwrap()},
        "spec": {"hard": hard, "defaultType": default}
    }))
    .unwrap()
}

fn step(state: &mut ClusterState, rng: &mut ChaCha8Rng) -> String {
    match rng.random_range(0..100) {
        0..35 => {
            let (key, pod) = random_pod(rng);
            state.apply_pod(key.clone(), pod);
            format!("apply pod {key}")
        }
        35..50 => {
            let keys: Vec<PodKey> = state.pods.keys().cloned().collect();
            match keys.choose(rng) {
                Some(key) => {
                    state.delete_pod(key);
                    format!("delete pod {key}")
                }
                None => "no pod to delete".into(),
            }
        }
        50..53 => {
            let pods: Vec<_> = (0..rng.random_range(0..8))
                .map(|_| random_pod(rng))
                .collect();
            state.replace_pods(pods, Instant::now());
            "replace pods".into()
        }
        53..68 => {
            let gpus = random_node(rng);
            let what = format!("apply node {} {:?}", gpus.name, gpus.model);
            state.apply_node(gpus);
            what
        }
        68..75 => {
            let name = NODES.choose(rng).unwrap();
            state.delete_node(name);
            format!("delete node {name}")
        }
        75..78 => {
            let nodes = (0..rng.random_range(0..4))
                .map(|_| random_node(rng))
                .collect();
            state.replace_nodes(nodes);
            "replace nodes".into()
        }
        78..90 => {
            let quota = random_quota(rng);
            let what = format!("apply quota {:?}", quota.spec);
            state.apply_quota(quota);
            what
        }
        90..96 => {
            let quotas: Vec<GPUQuota> = state.quotas().cloned().collect();
            match quotas.choose(rng) {
                Some(quota) => {
                    state.delete_quota(quota);
                    "delete quota".into()
                }
                None => "no quota to delete".into(),
            }
        }
        _ => {
            let quotas = (0..rng.random_range(0..4))
                .map(|_| random_quota(rng))
                .collect();
            state.replace_quotas(quotas);
            "replace quotas".into()
        }
    }
}

#[test]
fn kept_usage_is_a_recount_after_every_change() {
    for seed in 0..40 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut state = ClusterState::default();
        for i in 0..400 {
            let what = step(&mut state, &mut rng);
            for namespace in NAMESPACES {
                assert_eq!(
                    state.usage(namespace),
                    recount(&state, namespace),
                    "seed {seed}, step {i} ({what}), namespace {namespace}"
                );
                assert_eq!(
                    state.tally.held(namespace),
                    recount_held(&state, namespace),
                    "showback, seed {seed}, step {i} ({what}), namespace {namespace}"
                );
                assert_eq!(
                    *state.namespace_limits(namespace),
                    NamespaceLimits::of(state.quotas(), namespace),
                    "seed {seed}, step {i} ({what})"
                );
            }
        }
    }
}

#[test]
fn a_namespaces_usage_follows_its_quota_and_its_pods_nodes() {
    let mut state = ClusterState::default();
    let mut t4 = node("n0", 4, 16);
    t4.model = Some("Tesla-T4".into());
    state.apply_node(t4);
    // A pod that accepts both models, bound to the T4 node, and one that names none.
    let pod = |name: &str, models: Option<&str>| -> Pod {
        let annotations = models.map(|m| json!({"gpu-admission.io/gpu-type": m}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team-a", "uid": name, "annotations": annotations},
            "spec": {"nodeName": "n0", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap()
    };
    let projection = Projection::from_config(&Config::default());
    for pod in [pod("both", Some("Tesla-T4,A100")), pod("untyped", None)] {
        let cached = CachedPod::from_pod(&pod, &projection).unwrap();
        state.apply_pod(pod_key(&pod), cached);
    }
    let used = |state: &ClusterState| -> Vec<(String, u64)> {
        let usage = state.usage("team-a");
        usage.into_iter().map(|(m, a)| (m, a.0)).collect()
    };
    // No quota: both are charged to their node's model.
    assert_eq!(used(&state), [("Tesla-T4".to_string(), 2000)]);
    // The node is relabelled: both move with it.
    let mut a100 = node("n0", 4, 16);
    a100.model = Some("A100".into());
    state.apply_node(a100);
    assert_eq!(used(&state), [("A100".to_string(), 2000)]);
    // A quota with a default model: the untyped pod is charged to it, wherever it runs.
    let quota: GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": "team-a"},
        "spec": {"hard": {"Tesla-T4": "4", "A100": "4"}, "defaultType": "Tesla-T4"}
    }))
    .unwrap();
    state.apply_quota(quota.clone());
    assert_eq!(
        used(&state),
        [("A100".to_string(), 1000), ("Tesla-T4".to_string(), 1000)]
    );
    // The quota leaves, then the node: nothing is charged to a node no one knows.
    state.delete_quota(&quota);
    state.delete_node("n0");
    assert_eq!(used(&state), []);
    assert_eq!(namespace_of("team-a/both"), "team-a");
}
