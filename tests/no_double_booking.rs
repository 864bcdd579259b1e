//! Two placements must never hand out the same GPU capacity: filters in a row, a
//! re-filter of the same pod, and many filters at once.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;

use common::*;
use gpu_admission::cache::ClusterCache;
use serde_json::json;

/// Sum what every cached pod holds, per (node, GPU), from the recorded placements
/// (not from the cache's own counters), and check no GPU is over-committed.
fn assert_no_gpu_overcommitted(cache: &ClusterCache, keys: &[String]) -> usize {
    let mut held: HashMap<(String, u8), (u32, u32)> = HashMap::new();
    let mut placed = 0;
    cache.read(|s| {
        for key in keys {
            let Some(pod) = s.pod(key) else { continue };
            let (Some(node), Some(assignment)) = (&pod.node, &pod.assignment) else {
                continue;
            };
            placed += 1;
            let memory_per_gpu = s.node(node).unwrap().memory_per_gpu;
            for (gpu, charge) in assignment.charges(memory_per_gpu) {
                let entry = held.entry((node.to_string(), gpu as u8)).or_default();
                entry.0 += charge.core;
                entry.1 += charge.memory;
            }
        }
        for ((node, gpu), (core, memory)) in &held {
            let per_gpu = s.node(node).unwrap().memory_per_gpu;
            assert!(
                *core <= 100 && *memory <= per_gpu,
                "{node} GPU {gpu} over-committed: {core} core, {memory} memory"
            );
        }
    });
    placed
}

#[tokio::test]
async fn two_filters_in_a_row_take_different_capacity() {
    let (state, router) = app(
        &vcuda_node("n", 100, 4, "T4"),
        config_with_policy("original"),
    );
    let first = gpu_pod("default", "a", &[(60, 2)]);
    let second = gpu_pod("default", "b", &[(60, 2)]);
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&first, &["n"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!(["n"]));
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&second, &["n"]),
    )
    .await;
    assert_eq!(
        body["NodeNames"],
        json!([]),
        "the second pod must not get the same GPU: {body}"
    );
    assert_eq!(
        assert_no_gpu_overcommitted(state.cache(), &["default/a".into(), "default/b".into()]),
        1
    );
}

#[tokio::test]
async fn refiltering_a_pod_keeps_its_choice_and_never_charges_twice() {
    let cluster = format!(
        "{}{}",
        vcuda_node("n1", 100, 4, "T4"),
        vcuda_node("n2", 100, 4, "T4")
    );
    let (state, router) = app(&cluster, config_with_policy("original"));
    let pod = gpu_pod("default", "p", &[(100, 4)]);
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&pod, &["n1", "n2"]),
    )
    .await;
    let first = body["NodeNames"][0].as_str().unwrap().to_string();
    // A retry after a failed bind: same pod, same candidates -> same node, nothing more held.
    for _ in 0..3 {
        let (_, body) = post(
            &router,
            "/scheduler/predicates",
            filter_args(&pod, &["n1", "n2"]),
        )
        .await;
        assert_eq!(body["NodeNames"], json!([first]));
    }
    let other = if first == "n1" { "n2" } else { "n1" };
    // Only the other node offered: the pod moves; its old GPU is released, not leaked.
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&pod, &[other]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!([other]));
    let free_on_first = state
        .cache()
        .read(|s| s.node(&first).unwrap().free_whole_gpus());
    assert_eq!(free_on_first, 1, "the earlier choice must be released");
    // And a new whole-GPU pod can now use the first node.
    let next = gpu_pod("default", "q", &[(100, 4)]);
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&next, &["n1", "n2"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!([first]));
    assert_eq!(
        assert_no_gpu_overcommitted(state.cache(), &["default/p".into(), "default/q".into()]),
        2
    );
}

#[tokio::test]
async fn refilter_with_preexisting_annotations_does_not_double_charge() {
    let (state, router) = app(
        &vcuda_node("n", 200, 8, "T4"),
        config_with_policy("original"),
    );
    let mut pod = gpu_pod("default", "p", &[(100, 4)]);
    pod["metadata"]["annotations"] = json!({
        "tencent.com/predicate-node": "n", "tencent.com/predicate-gpu-idx-0": "1",
        "tencent.com/gpu-assigned": "false"
    });
    let (_, body) = post(&router, "/scheduler/predicates", filter_args(&pod, &["n"])).await;
    assert_eq!(body["NodeNames"], json!(["n"]));
    assert_eq!(
        state
            .cache()
            .read(|s| s.node("n").unwrap().free_whole_gpus()),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_filters_never_double_book() {
    // 4 nodes x 2 GPUs; share pods of 30 core fit 3 per GPU: at most 24 can be placed.
    let cluster: String = (0..4)
        .map(|i| vcuda_node(&format!("n{i}"), 200, 8, "T4"))
        .collect();
    let (state, router) = app(&cluster, config_with_policy("binpack"));
    let nodes = ["n0", "n1", "n2", "n3"];
    let mut tasks = Vec::new();
    for i in 0..60 {
        let router = router.clone();
        let demand = if i % 5 == 0 { (100, 4) } else { (30, 1) };
        let pod = gpu_pod("default", &format!("p{i}"), &[demand]);
        tasks.push(tokio::spawn(async move {
            let (_, body) = post(&router, "/scheduler/predicates", filter_args(&pod, &nodes)).await;
            body["NodeNames"].as_array().unwrap().len()
        }));
    }
    let mut answered_with_node = 0;
    for task in tasks {
        let passed = task.await.unwrap();
        assert!(passed <= 1, "exactly one node per GPU pod");
        answered_with_node += passed;
    }
    let keys: Vec<String> = (0..60).map(|i| format!("default/p{i}")).collect();
    let placed = assert_no_gpu_overcommitted(state.cache(), &keys);
    assert_eq!(placed, answered_with_node);
    assert!(placed < 60, "the cluster cannot hold all 60 pods");
    let total_core: u32 = state.cache().read(|s| {
        s.nodes()
            .map(|n| n.used.iter().map(|u| u.core).sum::<u32>())
            .sum()
    });
    assert!(total_core <= 800);
}
