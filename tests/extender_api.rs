//! The extender through HTTP over an offline cluster: what the scheduler sends, what
//! it gets back, and what ends up recorded for gpu-manager.
#![allow(clippy::unwrap_used)]

mod common;

use axum::http::StatusCode;
use common::*;
use gpu_admission::cache::ClusterCache;
use gpu_admission::config::Config;
use serde_json::{Value, json};

fn tkestack_cluster() -> String {
    ["testnode0", "testnode1", "testnode2"]
        .iter()
        .map(|n| vcuda_node(n, 200, 8, "T4"))
        .collect()
}

fn annotations_of(cache: &ClusterCache, key: &str) -> (String, Vec<Vec<u8>>) {
    cache.read(|s| {
        let pod = s.pod(key).unwrap();
        let gpus = pod
            .assignment
            .as_ref()
            .unwrap()
            .choices
            .iter()
            .map(|c| c.gpus.clone())
            .collect();
        (pod.node.as_deref().unwrap().to_string(), gpus)
    })
}

/// tkestack gpu-admission's own test scenario, with the `original` policy.
#[tokio::test]
async fn original_policy_places_like_tkestack() {
    let (state, router) = app(&tkestack_cluster(), config_with_policy("original"));
    let nodes = ["testnode0", "testnode1", "testnode2"];
    let pods = [
        (
            gpu_pod("default", "pod-0", &[(10, 1), (10, 1)]),
            "testnode0",
            vec![vec![0], vec![0]],
        ),
        (
            gpu_pod("default", "pod-1", &[(100, 3), (80, 3)]),
            "testnode1",
            vec![vec![0], vec![1]],
        ),
        (
            gpu_pod("default", "pod-2", &[(200, 10), (0, 0)]),
            "testnode2",
            vec![vec![0, 1]],
        ),
        (
            gpu_pod("default", "pod-3", &[(10, 2), (0, 0)]),
            "testnode0",
            vec![vec![0]],
        ),
    ];
    for (pod, node, gpus) in pods {
        let (status, body) =
            post(&router, "/scheduler/predicates", filter_args(&pod, &nodes)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["NodeNames"], json!([node]), "{body}");
        assert_eq!(body["Error"], "");
        let key = format!("default/{}", pod["metadata"]["name"].as_str().unwrap());
        assert_eq!(
            annotations_of(state.cache(), &key),
            (node.to_string(), gpus)
        );
    }
}

#[tokio::test]
async fn rejected_nodes_carry_specific_reasons_split_by_resolvability() {
    let cluster = format!(
        "{}{}",
        vcuda_node("small", 100, 4, "T4"),
        vcuda_node("busy", 200, 8, "T4")
    );
    let (_, router) = app(&cluster, config_with_policy("original"));
    let filler = gpu_pod("default", "filler", &[(60, 1), (60, 1)]);
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&filler, &["busy"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!(["busy"]));

    let big = gpu_pod("default", "big", &[(200, 2)]);
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&big, &["small", "busy", "ghost"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!([]));
    assert_eq!(
        body["FailedAndUnresolvableNodes"]["small"],
        "pod needs 2 whole GPUs, node has 1 GPUs"
    );
    assert_eq!(
        body["FailedAndUnresolvableNodes"]["ghost"],
        "node is not in gpu-admission's cache"
    );
    assert_eq!(
        body["FailedNodes"]["busy"],
        "pod needs 2 free whole GPUs, node has 0"
    );

    let share = gpu_pod("default", "share", &[(60, 1)]);
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&share, &["busy"]),
    )
    .await;
    assert_eq!(
        body["FailedNodes"]["busy"],
        "no single GPU has 60 free vcuda-core (largest free: 40)"
    );
}

#[tokio::test]
async fn nodes_form_is_answered_with_node_objects_but_the_cluster_decides() {
    let cluster = vcuda_node("n1", 100, 4, "Tesla-T4");
    let (state, router) = app(&cluster, config_with_policy("original"));
    // The caller's node objects lie: n1 relabelled as an A100 with 8 GPUs, and a node
    // the cluster does not have.
    let lie = |name: &str| -> Value {
        json!({"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
               "status": {"capacity": {"tencent.com/vcuda-core": "800", "tencent.com/vcuda-memory": "32"}}})
    };
    let mut pod = gpu_pod("default", "p", &[(50, 1)]);
    let args = |pod: &Value| {
        json!({"Pod": pod, "Nodes": {"metadata": {}, "items": [lie("n1"), lie("ghost")]}})
            .to_string()
    };
    let (status, body) = post(&router, "/scheduler/filter", args(&pod)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["Nodes"]["items"],
        json!([lie("n1")]),
        "the object echoed unchanged"
    );
    assert_eq!(body["NodeNames"], Value::Null);
    assert_eq!(
        body["FailedAndUnresolvableNodes"],
        json!({}),
        "a placed pod's answer names no failed nodes: {body}"
    );
    pod["metadata"]["name"] = json!("wants-a100");
    pod["metadata"]["uid"] = json!("uid-a100");
    pod["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "A100"});
    let (_, body) = post(&router, "/scheduler/filter", args(&pod)).await;
    assert_eq!(body["Nodes"]["items"], json!([]), "{body}");
    assert!(
        body["FailedAndUnresolvableNodes"]["n1"]
            .as_str()
            .unwrap()
            .contains("GPU model Tesla-T4"),
        "{body}"
    );
    assert_eq!(
        body["FailedAndUnresolvableNodes"]["ghost"],
        "node is not in gpu-admission's cache"
    );
    state.cache().read(|s| {
        let n1 = s.node("n1").unwrap();
        assert_eq!((n1.model.as_deref(), n1.gpu_count()), (Some("Tesla-T4"), 1));
        assert!(s.node("ghost").is_none(), "a call never adds a node");
        assert!(
            s.pod("default/wants-a100").is_none(),
            "an unplaced pod is not kept"
        );
    });
}

#[tokio::test]
async fn non_gpu_pods_pass_unchanged() {
    let (_, router) = app(&tkestack_cluster(), config_with_policy("original"));
    let pod = gpu_pod("default", "cpu-only", &[(0, 0)]);
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&pod, &["testnode0", "x"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!(["testnode0", "x"]));
}

#[tokio::test]
async fn wanted_model_limits_nodes() {
    let cluster = format!(
        "{}{}",
        vcuda_node("t4", 100, 4, "T4"),
        vcuda_node("a100", 100, 4, "A100")
    );
    let (_, router) = app(&cluster, config_with_policy("original"));
    let mut pod = gpu_pod("default", "p", &[(100, 4)]);
    pod["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "A100"});
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&pod, &["t4", "a100"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!(["a100"]));
    assert_eq!(
        (&body["FailedNodes"], &body["FailedAndUnresolvableNodes"]),
        (&json!({}), &json!({})),
        "placed: only the chosen node is answered"
    );
    // Nothing fits: every candidate's reason is answered (the scheduler's diagnosis).
    pod["metadata"]["name"] = json!("q");
    pod["metadata"]["uid"] = json!("uid-q");
    pod["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "V100"});
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&pod, &["t4", "a100"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!([]), "{body}");
    assert_eq!(
        body["FailedAndUnresolvableNodes"]["t4"],
        "GPU model T4 is not one the pod accepts (V100)"
    );
    assert_eq!(
        body["FailedAndUnresolvableNodes"]["a100"],
        "GPU model A100 is not one the pod accepts (V100)"
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_400_or_error_and_the_server_keeps_serving() {
    let (_, router) = app(&tkestack_cluster(), config_with_policy("original"));
    let cases: Vec<(String, &str)> = vec![
        ("{not json".into(), "request is not valid JSON"),
        (r#"{"NodeNames": ["a"]}"#.into(), "request has no Pod"),
        (
            r#"{"Pod": {"spec": {"containers": 5}}, "NodeNames": []}"#.into(),
            "Pod at spec.containers",
        ),
    ];
    for (body, message) in cases {
        let (status, answer) = post(&router, "/scheduler/predicates", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(answer.as_str().unwrap().contains(message), "{answer}");
    }
    let oversized = format!(
        "{{\"Pod\": {{}}, \"NodeNames\": [\"{}\"]}}",
        "x".repeat(33 << 20)
    );
    let (status, answer) = post(&router, "/scheduler/predicates", oversized).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        answer.as_str().unwrap().contains("limit of 32 MiB"),
        "{answer}"
    );
    for (quantity, message) in [
        ("1e100", "out of range"),
        ("-3", "negative"),
        ("abc", "not a Kubernetes quantity"),
    ] {
        let mut pod = gpu_pod("default", "bad", &[(10, 1)]);
        pod["spec"]["containers"][0]["resources"]["limits"]["tencent.com/vcuda-core"] =
            json!(quantity);
        let (status, body) = post(
            &router,
            "/scheduler/predicates",
            filter_args(&pod, &["testnode0"]),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let error = body["Error"].as_str().unwrap();
        assert!(
            error.starts_with("pod default/bad: container \"c0\": tencent.com/vcuda-core"),
            "{error}"
        );
        assert!(error.contains(message), "{error}");
    }
    let pod = gpu_pod("default", "fine", &[(10, 1)]);
    let (status, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&pod, &["testnode0"]),
    )
    .await;
    assert_eq!(
        (status, &body["NodeNames"]),
        (StatusCode::OK, &json!(["testnode0"]))
    );
}

#[tokio::test]
async fn volcano_predicate_answers_feasibility_only() {
    let cluster = format!(
        "{}{}",
        vcuda_node("free", 100, 4, "T4"),
        vcuda_node("one", 100, 4, "T4")
    );
    let (state, router) = app(&cluster, config_with_policy("original"));
    let ask = |pod: &Value, node: &str| {
        json!({"task": {"Name": "t", "Pod": pod}, "node": {"Name": node}}).to_string()
    };
    let pod = gpu_pod("default", "p", &[(100, 4)]);
    let (status, body) = post(&router, "/scheduler/vpredicates", ask(&pod, "free")).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({"status": "", "code": 0}))
    );
    assert!(
        state.cache().read(|s| s.pod("default/p").is_none()),
        "vpredicates must not reserve"
    );
    let two = gpu_pod("default", "two", &[(200, 8)]);
    let (_, body) = post(&router, "/scheduler/vpredicates", ask(&two, "free")).await;
    assert_eq!(
        body,
        json!({"status": "pod needs 2 whole GPUs, node has 1 GPUs", "code": 3})
    );
    let (_, body) = post(&router, "/scheduler/vpredicates", ask(&pod, "nowhere")).await;
    assert_eq!(body["code"], 2);
    let (status, _) = post(&router, "/scheduler/vpredicates", r#"{"task": {}}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn multi_model_pods_go_only_where_the_quota_has_room() {
    let cluster = format!(
        "{}{}---\napiVersion: gpu-admission.io/v1alpha1\nkind: GPUQuota\nmetadata: {{name: default, namespace: team-a}}\n\
         spec:\n  hard: {{V100M16: \"1\", V100M32: \"1\"}}\n",
        vcuda_node("v16", 200, 8, "V100M16"),
        vcuda_node("v32", 200, 8, "V100M32"),
    );
    let (_, router) = app(&cluster, config_with_policy("original"));
    let mut first = gpu_pod("team-a", "first", &[(100, 4)]);
    first["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "V100M16"});
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&first, &["v16", "v32"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!(["v16"]));
    let mut either = gpu_pod("team-a", "either", &[(100, 4)]);
    either["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "V100M16,V100M32"});
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&either, &["v16", "v32"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!(["v32"]), "{body}");
    let mut third = gpu_pod("team-a", "third", &[(100, 4)]);
    third["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "V100M16,V100M32"});
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&third, &["v16", "v32"]),
    )
    .await;
    assert_eq!(body["NodeNames"], json!([]));
    assert_eq!(
        body["FailedNodes"]["v16"],
        "namespace GPU quota for V100M16 has no room (used 1 of 1 in GPUQuota team-a/default)"
    );
}

#[tokio::test]
async fn only_placed_pods_teach_the_request_mix_and_unplaced_ones_are_not_cached() {
    let (state, router) = app(&vcuda_node("n1", 100, 4, "T4"), config_with_policy("fgd"));
    // A thousand calls of a thousand shapes that fit nowhere: nothing learnt, nothing kept.
    for i in 0..1000u32 {
        let pod = gpu_pod("default", &format!("junk-{i}"), &[(1 + i % 99, 5 + i)]);
        let (_, body) = post(&router, "/scheduler/predicates", filter_args(&pod, &["n1"])).await;
        assert_eq!(body["NodeNames"], json!([]), "{body}");
    }
    assert_eq!(state.placer.learned_mix().len(), 0);
    assert_eq!(state.cache().read(|s| s.pod_count()), 0);
    let pod = gpu_pod("default", "real", &[(50, 2)]);
    let (_, body) = post(&router, "/scheduler/predicates", filter_args(&pod, &["n1"])).await;
    assert_eq!(body["NodeNames"], json!(["n1"]));
    assert_eq!(state.placer.learned_mix().len(), 1);
    assert_eq!(state.cache().read(|s| s.pod_count()), 1);
}

#[tokio::test]
async fn a_model_no_quota_lists_is_never_where_a_multi_model_pod_lands() {
    // team-a's quota lists only Tesla-T4. Pods annotated with T4 *and* A100 and a
    // nodeSelector for the A100 (the escape: admitted for T4, placed on the A100).
    let cluster = format!(
        "{}{}---\napiVersion: gpu-admission.io/v1alpha1\nkind: GPUQuota\nmetadata: {{name: default, namespace: team-a}}\n\
         spec:\n  hard: {{Tesla-T4: \"8\"}}\n",
        vcuda_node("t4", 400, 16, "Tesla-T4"),
        vcuda_node("a100", 800, 32, "A100-SXM4-80GB"),
    );
    let (state, router) = app(&cluster, config_with_policy("original"));
    for i in 0..6 {
        let mut pod = gpu_pod("team-a", &format!("escape-{i}"), &[(100, 4)]);
        pod["metadata"]["annotations"] =
            json!({"gpu-admission.io/gpu-type": "Tesla-T4,A100-SXM4-80GB"});
        pod["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "A100-SXM4-80GB"});
        let (_, body) = post(
            &router,
            "/scheduler/predicates",
            filter_args(&pod, &["a100"]),
        )
        .await;
        assert_eq!(body["NodeNames"], json!([]), "{body}");
        let reason = body["FailedNodes"]["a100"].as_str().unwrap_or_default();
        assert!(
            reason.contains("A100-SXM4-80GB") && reason.contains("of 0"),
            "{body}"
        );
    }
    let used = state.cache().read(|s| s.usage("team-a"));
    assert!(!used.contains_key("A100-SXM4-80GB"), "{used:?}");
    assert_eq!(
        state.cache().read(|s| s
            .node("a100")
            .unwrap()
            .used
            .iter()
            .map(|u| u.core)
            .sum::<u32>()),
        0
    );
}

/// With the bind verb (`placement.bindVerb`), offline: the filter holds its choice, the
/// bind confirms it (a retried bind is answered the same), a bind names the pod it binds
/// and may only put it where it fits, and a bind without a hold places the pod on the
/// node it names, through the same checks.
#[tokio::test]
async fn the_bind_verb_binds_the_held_placement_and_checks_what_it_is_given() {
    let cluster = format!(
        "{}{}",
        vcuda_node("big", 200, 8, "T4"),
        vcuda_node("small", 100, 4, "T4")
    );
    let config = Config::parse("placement: {policy: binpack, bindVerb: true}\n").unwrap();
    let (state, router) = app(&cluster, config);
    let bind = |pod: &str, uid: &str, node: &str| {
        json!({"PodName": pod, "PodNamespace": "default", "PodUID": uid, "Node": node}).to_string()
    };
    let pod = gpu_pod("default", "held", &[(100, 4)]);
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (_, body) = post(
        &router,
        "/scheduler/predicates",
        filter_args(&pod, &["small", "big"]),
    )
    .await;
    let node = body["NodeNames"][0].as_str().unwrap().to_string();
    let bound = |state: &gpu_admission::server::AppState| {
        state
            .cache()
            .read(|s| s.pod("default/held").map(|p| p.bound))
    };
    assert_eq!(bound(&state), Some(false), "held, not bound");

    let (status, body) = post(
        &router,
        "/scheduler/bind",
        bind("held", "another-uid", &node),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body["Error"].as_str().unwrap().contains("has uid"),
        "{body}"
    );
    assert_eq!(bound(&state), Some(false));

    for attempt in ["first", "retried"] {
        let (status, body) = post(&router, "/scheduler/bind", bind("held", &uid, &node)).await;
        assert_eq!(
            (status, body["Error"].as_str()),
            (StatusCode::OK, Some("")),
            "{attempt}: {body}"
        );
    }
    assert_eq!(bound(&state), Some(true));
    assert_eq!(annotations_of(state.cache(), "default/held").0, node);

    // A pod the filter never saw is not in the (offline) cluster: nothing to bind.
    let (_, body) = post(&router, "/scheduler/bind", bind("ghost", "u", "big")).await;
    assert!(body["Error"].as_str().unwrap().contains("not in"), "{body}");
}
