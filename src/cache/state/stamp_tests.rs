//! Node stamps: every change to a node's GPUs gives it a new version, so placement's
//! memo never serves an evaluation of an older state.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::{ClusterState, Subject};
use crate::cache::{CachedPod, Projection, pod_key};
use crate::config::Config;
use crate::placement::testing::node;
use crate::placement::{Placer, Policy, Stamp, TaskMix, place};

fn gpu_pod(name: &str, node: Option<&str>, resources: serde_json::Value) -> (Pod, CachedPod) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": resources}}]}
    }))
    .unwrap();
    let cached = CachedPod::from_pod(&pod, &Projection::from_config(&Config::default())).unwrap();
    (pod, cached)
}

fn share(core: u32) -> serde_json::Value {
    json!({"tencent.com/vcuda-core": core.to_string(), "tencent.com/vcuda-memory": "1"})
}

fn stamp(state: &ClusterState, name: &str) -> Stamp {
    state.nodes[name].stamp
}

#[test]
fn every_change_to_a_nodes_gpus_gives_it_a_new_version() {
    let mut state = ClusterState::default();
    state.apply_node(node("a", 2, 8));
    state.apply_node(node("b", 2, 8));
    let mut seen = vec![stamp(&state, "a").version, stamp(&state, "b").version];
    let mut changed = |state: &ClusterState, name: &str, why: &str| {
        let version = stamp(state, name).version;
        assert!(!seen.contains(&version), "{why}: version {version} again");
        seen.push(version);
    };
    let b = stamp(&state, "b");

    let (pod, cached) = gpu_pod("p", Some("a"), share(30));
    state.apply_pod(pod_key(&pod), cached);
    changed(&state, "a", "a pod bound to a");
    let key = pod_key(&pod);
    state.delete_pod(&key);
    changed(&state, "a", "the pod gone");

    let (pod, offered) = gpu_pod("q", None, share(50));
    let placer = Placer::new(Policy::Binpack);
    let decision = state
        .hold(
            &pod_key(&pod),
            Subject::Offered(Box::new(offered)),
            &["a"],
            |pod, nodes| nodes.place(&placer, &pod.request, |_| Ok(())),
            Instant::now(),
        )
        .unwrap();
    changed(&state, "a", "a hold on a");
    state.rollback(&pod_key(&pod), decision.hold.unwrap());
    changed(&state, "a", "the hold rolled back");

    let mut relabelled = node("a", 2, 8);
    relabelled.model = Some("Tesla-T4".into());
    state.apply_node(relabelled);
    changed(&state, "a", "a new model label");
    state.apply_node(node("a", 4, 8));
    changed(&state, "a", "two more GPUs");
    assert_eq!(stamp(&state, "b"), b, "b did not change");

    let slot = stamp(&state, "a").slot;
    state.delete_node("a");
    state.apply_node(node("c", 2, 8));
    assert_eq!(
        stamp(&state, "c").slot,
        slot,
        "a gone node's slot is reused"
    );
    changed(&state, "c", "a new node in the old slot");
}

/// Filter call after filter call, with pods arriving and leaving in between, the memo's
/// choice is the one `place` makes from scratch.
#[test]
fn placements_with_the_memo_are_those_made_from_scratch() {
    let mut state = ClusterState::default();
    let names: Vec<String> = (0..12).map(|i| format!("n{i:02}")).collect();
    for (i, name) in names.iter().enumerate() {
        state.apply_node(node(name, if i % 3 == 0 { 4 } else { 8 }, 8));
    }
    let candidates: Vec<&str> = names.iter().map(String::as_str).collect();
    let shapes = [
        share(20),
        share(50),
        share(70),
        json!({"nvidia.com/gpu": "1"}),
        json!({"nvidia.com/gpu": "2"}),
        json!({"nvidia.com/gpu": "4"}),
    ];
    let mix = TaskMix::from_shapes(shapes.iter().enumerate().map(|(i, _)| {
        let (_, cached) = gpu_pod("m", None, shapes[i].clone());
        crate::placement::TaskShape::gpu_only(
            crate::placement::GpuShape::of_request(&cached.request).unwrap(),
        )
    }));
    let placers = [
        Placer::new(Policy::Fgd).with_mix(std::sync::Arc::new(mix)),
        Placer::new(Policy::Original),
    ];
    let mut placed = Vec::new();
    for call in 0..300usize {
        let (pod, offered) = gpu_pod(
            &format!("p{call}"),
            None,
            shapes[call * 7 % shapes.len()].clone(),
        );
        let placer = &placers[call % 2];
        state
            .hold(
                &pod_key(&pod),
                Subject::Offered(Box::new(offered)),
                &candidates,
                |pod, nodes| {
                    let expected = place(placer, &pod.request, nodes.iter().copied(), |_| Ok(()))
                        .into_versioned();
                    let got = nodes.place(placer, &pod.request, |_| Ok(()));
                    assert_eq!(got, expected, "call {call}");
                    got
                },
                Instant::now(),
            )
            .unwrap();
        if state.pod(&pod_key(&pod)).is_some() {
            placed.push(pod_key(&pod));
        }
        // Every third call, a pod leaves.
        if call % 3 == 2 && !placed.is_empty() {
            let gone = placed.swap_remove(call * 5 % placed.len());
            state.delete_pod(&gone);
        }
    }
}
