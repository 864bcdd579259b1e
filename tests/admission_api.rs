//! The admission webhooks through HTTP over an offline cluster: the patch the
//! apiserver would apply, quota denials as users read them, dry-run, and no
//! over-admission under concurrent creates.
#![allow(clippy::unwrap_used)]

mod common;
mod repo;

use axum::http::StatusCode;
use base64::Engine as _;
use common::*;
use serde_json::{Value, json};

fn quota_yaml(namespace: &str, hard: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: gpu-admission.io/v1alpha1\nkind: GPUQuota\nmetadata: {{name: default, namespace: {namespace}}}\n\
         spec:\n  hard: {{{hard}}}\n{extra}"
    )
}

fn review(pod: &Value, dry_run: bool) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("review-{}", pod["metadata"]["name"].as_str().unwrap_or("x")),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": pod, "oldObject": null, "dryRun": dry_run
        }
    })
    .to_string()
}

fn whole_gpu_pod(namespace: &str, name: &str, gpus: u32) -> Value {
    gpu_pod(namespace, name, &[(gpus * 100, 4 * gpus)])
}

/// Apply the response's patch to the raw pod, as the apiserver does.
fn patched(pod: &Value, answer: &Value) -> Value {
    let mut pod = pod.clone();
    if let Some(encoded) = answer["response"]["patch"].as_str() {
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
    }
    pod
}

#[tokio::test]
async fn mutation_steers_gpu_pods_and_is_idempotent() {
    let cluster = quota_yaml(
        "team-a",
        "Tesla-T4: \"4\"",
        "  pools: [public]\n  defaultType: Tesla-T4\n",
    );
    let (_, router) = app(&cluster, config_with_policy("original"));
    let pod = whole_gpu_pod("team-a", "train", 1);
    let (status, answer) = post(&router, "/mutate", review(&pod, false)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["response"]["uid"], "review-train");
    assert_eq!(answer["response"]["allowed"], true);
    let mutated = patched(&pod, &answer);
    assert_eq!(mutated["spec"]["schedulerName"], "gpu-scheduler");
    assert_eq!(
        mutated["metadata"]["annotations"]["gpu-admission.io/gpu-type"],
        "Tesla-T4"
    );
    assert_eq!(
        mutated["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]},
            {"key": "gpu-admission.io/pool", "operator": "In", "values": ["public"]}
        ]}])
    );
    assert_eq!(
        mutated["spec"]["containers"], pod["spec"]["containers"],
        "nothing else changes"
    );
    let (_, again) = post(&router, "/mutate", review(&mutated, false)).await;
    assert_eq!(again["response"]["allowed"], true);
    assert!(
        again["response"].get("patch").is_none(),
        "second mutation must be empty: {again}"
    );
}

#[tokio::test]
async fn every_user_term_keeps_its_own_expressions_and_gains_the_model() {
    let (_, router) = app("", config_with_policy("original"));
    let mut pod = whole_gpu_pod("team-b", "p", 1);
    pod["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "A100"});
    pod["spec"]["schedulerName"] = json!("default-scheduler");
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}], "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]}
    ]}}});
    let (_, answer) = post(&router, "/mutate", review(&pod, false)).await;
    let mutated = patched(&pod, &answer);
    let model = json!({"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]});
    let terms = &mutated["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(
        terms[0]["matchExpressions"],
        json!([{"key": "zone", "operator": "In", "values": ["a"]}, model])
    );
    assert_eq!(
        terms[1]["matchExpressions"],
        json!([{"key": "zone", "operator": "In", "values": ["b"]}, model])
    );
    assert_eq!(
        terms[1]["matchFields"],
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [1]["matchFields"]
    );
    assert_eq!(mutated["spec"]["schedulerName"], "gpu-scheduler");
    assert!(
        mutated["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .len()
            == 1,
        "the pod named its model: nothing recorded"
    );
}

#[tokio::test]
async fn conflicting_node_selector_is_denied_and_cpu_pods_untouched() {
    let (_, router) = app("", config_with_policy("original"));
    let mut pod = whole_gpu_pod("team-b", "p", 1);
    pod["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "A100"});
    pod["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "Tesla-T4"});
    let (_, answer) = post(&router, "/mutate", review(&pod, false)).await;
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(
        answer["response"]["status"]["message"],
        "the pod's nodeSelector nvidia.com/gpu.product=Tesla-T4 conflicts with the GPU model it may use (A100)"
    );
    let cpu = gpu_pod("team-b", "web", &[(0, 0)]);
    let (_, answer) = post(&router, "/mutate", review(&cpu, false)).await;
    assert_eq!(
        answer["response"],
        json!({"uid": "review-web", "allowed": true})
    );
}

#[tokio::test]
async fn third_pod_over_quota_is_denied_with_the_exact_message_and_dry_run_reserves_nothing() {
    let (_, router) = app(
        &quota_yaml("team-a", "Tesla-T4: \"2\"", "  defaultType: Tesla-T4\n"),
        config_with_policy("original"),
    );
    // A dry run first: evaluated, allowed, but nothing reserved.
    let (_, answer) = post(
        &router,
        "/validate",
        review(&whole_gpu_pod("team-a", "dry", 2), true),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true);
    for name in ["p1", "p2"] {
        let (_, answer) = post(
            &router,
            "/validate",
            review(&whole_gpu_pod("team-a", name, 1), false),
        )
        .await;
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
    }
    let (status, answer) = post(
        &router,
        "/validate",
        review(&whole_gpu_pod("team-a", "p3", 1), false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(
        answer["response"]["status"],
        json!({"code": 403, "reason": "Forbidden",
            "message": "GPU quota exceeded in namespace \"team-a\" for Tesla-T4: requested 1, used 2 of 2 (GPUQuota team-a/default)"})
    );
    // Another namespace without a quota is not limited.
    let (_, answer) = post(
        &router,
        "/validate",
        review(&whole_gpu_pod("team-b", "big", 8), false),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true);
}

#[tokio::test]
async fn fractions_count_against_quota() {
    let (_, router) = app(
        &quota_yaml("team-a", "Tesla-T4: \"1\"", "  defaultType: Tesla-T4\n"),
        config_with_policy("original"),
    );
    for (name, expected) in [("a", true), ("b", true), ("c", false)] {
        let pod = gpu_pod("team-a", name, &[(50, 2)]);
        let (_, answer) = post(&router, "/validate", review(&pod, false)).await;
        assert_eq!(answer["response"]["allowed"], expected, "{name}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_concurrent_creates_against_a_quota_of_ten_admit_exactly_ten() {
    let (_, router) = app(
        &quota_yaml("team-a", "Tesla-T4: \"10\"", "  defaultType: Tesla-T4\n"),
        config_with_policy("original"),
    );
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move {
                let (status, answer) = post(
                    &router,
                    "/validate",
                    review(&whole_gpu_pod("team-a", &format!("p{i}"), 1), false),
                )
                .await;
                assert_eq!(status, StatusCode::OK);
                answer["response"]["allowed"].as_bool().unwrap()
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    assert_eq!(admitted, 10);
}

#[tokio::test]
async fn reviews_echo_version_and_bad_reviews_get_400() {
    let (_, router) = app("", config_with_policy("original"));
    let pod = whole_gpu_pod("team-b", "p", 1);
    let mut v1beta1: Value = serde_json::from_str(&review(&pod, false)).unwrap();
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let (_, answer) = post(&router, "/validate", v1beta1.to_string()).await;
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(answer["response"]["uid"], "review-p");
    let mut delete: Value = serde_json::from_str(&review(&pod, false)).unwrap();
    delete["request"]["operation"] = json!("DELETE");
    let (_, answer) = post(&router, "/validate", delete.to_string()).await;
    assert_eq!(answer["response"]["allowed"], true);
    for (body, message) in [
        ("{".to_string(), "AdmissionReview is not valid JSON"),
        (
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string(),
            "has no request",
        ),
        (
            forged(&pod, |r| r["object"] = json!({"spec": 3})),
            "request.object at spec",
        ),
    ] {
        for route in ["/validate", "/mutate"] {
            let (status, answer) = post(&router, route, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{route}");
            assert!(
                answer.as_str().unwrap().contains(message),
                "{route}: {answer}"
            );
        }
    }
    let oversized = format!("{{\"pad\": \"{}\"}}", "x".repeat(4 << 20));
    for route in ["/validate", "/mutate"] {
        let (status, answer) = post(&router, route, oversized.clone()).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{route}");
        assert!(
            answer.as_str().unwrap().contains("limit of 4 MiB"),
            "{route}: {answer}"
        );
    }
}

/// A refused review is counted under the kind of its fault, a bounded word, never
/// under its text.
#[tokio::test]
async fn refused_reviews_are_counted_by_the_kind_of_their_fault() {
    let (state, router) = app("", config_with_policy("original"));
    let pod = whole_gpu_pod("team-b", "p", 1);
    let bodies = [
        ("{".to_string(), "malformed_json"),
        ("[1]".to_string(), "wrong_type"),
        (
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string(),
            "missing_field",
        ),
        (
            forged(&pod, |r| r["operation"] = json!("PATCH")),
            "bad_operation",
        ),
        (
            forged(&pod, |r| r["namespace"] = json!("team-a")),
            "namespace_mismatch",
        ),
    ];
    for (body, _) in &bodies {
        let (status, _) = post(&router, "/validate", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    let metrics = state.metrics.encode();
    for (_, kind) in bodies {
        let line =
            format!(r#"gpu_admission_requests_total{{route="validate",decision="{kind}"}} 1"#);
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }
    assert!(!metrics.contains("bad_request"), "{metrics}");
}

/// A review as the API server sends it, altered by `forge`.
fn forged(pod: &Value, forge: impl Fn(&mut Value)) -> String {
    let mut review: Value = serde_json::from_str(&review(pod, false)).unwrap();
    forge(&mut review["request"]);
    review.to_string()
}

#[tokio::test]
async fn reviews_that_do_not_add_up_are_refused_and_charge_nobody() {
    let cluster = quota_yaml("team-a", "Tesla-T4: \"1\"", "");
    let (_, router) = app(&cluster, config_with_policy("original"));
    let pod = annotated(whole_gpu_pod("team-a", "p1", 1), "Tesla-T4");
    let claim_kind = json!({"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"});
    let cases: Vec<(String, &str)> = vec![
        (
            forged(&pod, |r| r["namespace"] = json!("team-b")),
            r#"request.object.metadata.namespace "team-a" is not request.namespace "team-b""#,
        ),
        (
            forged(&pod, |r| r["namespace"] = Value::Null),
            "request.namespace is missing",
        ),
        (
            forged(&pod, |r| r["kind"] = claim_kind.clone()),
            r#"request.kind is "ResourceClaim" of group "resource.k8s.io"; this route judges core/Pod"#,
        ),
        (
            forged(&pod, |r| {
                r["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"})
            }),
            r#"request.kind is "Deployment""#,
        ),
        (
            forged(&pod, |r| r["kind"] = Value::Null),
            "request.kind is missing",
        ),
        (
            forged(&pod, |r| {
                r["resource"] = json!({"group": "", "version": "v1", "resource": "configmaps"})
            }),
            r#"request.resource is "configmaps""#,
        ),
        (
            forged(&pod, |r| r["operation"] = json!("create")),
            r#"request.operation "create" is not one of CREATE, UPDATE, DELETE, CONNECT"#,
        ),
        (
            forged(&pod, |r| r["operation"] = json!("PATCH")),
            r#"request.operation "PATCH""#,
        ),
    ];
    for (body, message) in cases {
        for route in ["/validate", "/mutate"] {
            let (status, answer) = post(&router, route, body.clone()).await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{route} {message}: {answer}"
            );
            let text = answer.as_str().unwrap();
            assert!(text.contains(message), "{route}: {text} lacks {message}");
        }
    }
    // A pod sent to the claim routes is refused the same way.
    for route in ["/validate/resourceclaims", "/mutate/resourceclaims"] {
        let (status, answer) = post(&router, route, review(&pod, false)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{route}: {answer}");
        assert!(
            answer
                .as_str()
                .unwrap()
                .contains("this route judges resource.k8s.io/ResourceClaim")
        );
    }
    // Nothing was charged: the namespace's one GPU is still free.
    assert_eq!(
        verdict(&router, review(&pod, false)).await,
        (true, String::new())
    );
    // An UPDATE whose old object is in another namespace is refused too.
    let mut elsewhere = pod.clone();
    elsewhere["metadata"]["namespace"] = json!("team-b");
    let (status, answer) = post(&router, "/validate", update_review(&elsewhere, &pod)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        answer
            .as_str()
            .unwrap()
            .contains("request.oldObject.metadata.namespace"),
        "{answer}"
    );
}

#[tokio::test]
async fn placement_annotations_change_only_by_their_writers() {
    let (_, router) = app("", config_with_policy("original"));
    let mut placed = whole_gpu_pod("team-a", "p1", 1);
    placed["metadata"]["annotations"] = json!({
        "tencent.com/predicate-node": "n1", "tencent.com/predicate-gpu-idx-0": "0",
        "tencent.com/gpu-assigned": "false", "team": "x"});
    let as_user = |body: String, user: &str| {
        let mut review: Value = serde_json::from_str(&body).unwrap();
        review["request"]["userInfo"] =
            json!({"username": user, "groups": ["system:authenticated"]});
        review.to_string()
    };
    let tenant = "system:serviceaccount:team-a:default";
    let scheduler = gpu_admission::config::DEFAULT_QUEUE_RELEASERS[0];
    let gpu_manager = "system:serviceaccount:kube-system:gpu-manager";
    // (key, new value or removed, who may write it)
    let placement = &gpu_admission::config::DEFAULT_PLACEMENT_WRITERS[..];
    let ours = &[scheduler][..];
    let edits: [(&str, Option<&str>, &[&str]); 9] = [
        (
            "tencent.com/predicate-gpu-idx-0",
            Some("0,1,2,3"),
            placement,
        ),
        // gpu-admission's own marks: a defragmentation plan's holds (the GPUs kept for
        // this pod), the cohort's borrowed and reclaim annotations.
        ("gpu-admission.io/defrag-hold", Some("{}"), ours),
        ("gpu-admission.io/borrowed", Some("Tesla-T4"), ours),
        ("gpu-admission.io/reclaim", Some("{}"), ours),
        ("tencent.com/predicate-node", Some("n2"), placement),
        ("tencent.com/predicate-gpu-idx-1", Some("4"), placement),
        ("tencent.com/predicate-anything", Some("1"), placement),
        ("tencent.com/gpu-assigned", None, placement),
        ("tencent.com/gpu-assigned", Some("true"), placement),
    ];
    for (key, value, writers) in edits {
        let mut edited = placed.clone();
        match value {
            Some(value) => edited["metadata"]["annotations"][key] = json!(value),
            None => drop(
                edited["metadata"]["annotations"]
                    .as_object_mut()
                    .unwrap()
                    .remove(key),
            ),
        }
        let (allowed, message) =
            verdict(&router, as_user(update_review(&placed, &edited), tenant)).await;
        assert!(!allowed, "{key}");
        assert!(
            message.starts_with(&format!("annotation {key} "))
                && message.ends_with(&format!(
                    "user \"{tenant}\" may not set, change or remove it"
                )),
            "{message}"
        );
        for user in [scheduler, gpu_manager] {
            let body = as_user(update_review(&placed, &edited), user);
            let (allowed, message) = verdict(&router, body).await;
            assert_eq!(allowed, writers.contains(&user), "{user} {key}: {message}");
        }
    }
    // The tenant's other annotations stay its own.
    let mut edited = placed.clone();
    edited["metadata"]["annotations"]["team"] = json!("y");
    let body = as_user(update_review(&placed, &edited), tenant);
    assert_eq!(verdict(&router, body).await, (true, String::new()));
}

fn update_review(old: &Value, new: &Value) -> String {
    let mut review: Value = serde_json::from_str(&review(new, false)).unwrap();
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = old.clone();
    review.to_string()
}

async fn verdict(router: &axum::Router, body: String) -> (bool, String) {
    verdict_at(router, "/validate", body).await
}

async fn claim_verdict(router: &axum::Router, body: String) -> (bool, String) {
    verdict_at(router, "/validate/resourceclaims", body).await
}

async fn verdict_at(router: &axum::Router, path: &str, body: String) -> (bool, String) {
    let (status, answer) = post(router, path, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let message = answer["response"]["status"]["message"].as_str();
    (
        answer["response"]["allowed"].as_bool().unwrap(),
        message.unwrap_or_default().to_string(),
    )
}

fn annotated(mut pod: Value, models: &str) -> Value {
    pod["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": models});
    pod
}

#[tokio::test]
async fn pods_created_on_a_node_are_charged_to_its_model_at_admission() {
    let cluster = quota_yaml("team-a", "Tesla-T4: \"4\", A100-SXM4-80GB: \"1\"", "")
        + &vcuda_node("a100-1", 400, 64, "A100-SXM4-80GB");
    let (_, router) = app(&cluster, config_with_policy("original"));
    let mut verdicts = Vec::new();
    for name in ["p1", "p2", "p3"] {
        let mut pod = annotated(whole_gpu_pod("team-a", name, 1), "Tesla-T4,A100-SXM4-80GB");
        pod["spec"]["nodeName"] = json!("a100-1");
        verdicts.push(verdict(&router, review(&pod, false)).await);
    }
    let full = "GPU quota exceeded in namespace \"team-a\" for A100-SXM4-80GB: requested 1, used 1 of 1 (GPUQuota team-a/default)";
    assert_eq!(
        verdicts,
        [
            (true, String::new()),
            (false, full.to_string()),
            (false, full.to_string())
        ]
    );
    let mut elsewhere = annotated(whole_gpu_pod("team-a", "p4", 1), "Tesla-T4");
    elsewhere["spec"]["nodeName"] = json!("unknown-node");
    let (allowed, message) = verdict(&router, review(&elsewhere, false)).await;
    assert!(!allowed);
    assert!(
        message.contains("\"unknown-node\" (spec.nodeName), which gpu-admission does not know"),
        "{message}"
    );
}

#[tokio::test]
async fn multi_model_pods_must_use_the_gpu_scheduler() {
    let cluster = quota_yaml("team-a", "Tesla-T4: \"4\", A100-SXM4-80GB: \"1\"", "");
    let (_, router) = app(&cluster, config_with_policy("original"));
    let pod = annotated(
        whole_gpu_pod("team-a", "either", 1),
        "Tesla-T4,A100-SXM4-80GB",
    );
    for scheduler in [json!(null), json!(""), json!("default-scheduler")] {
        let mut pod = pod.clone();
        pod["spec"]["schedulerName"] = scheduler.clone();
        let (allowed, message) = verdict(&router, review(&pod, false)).await;
        assert!(!allowed, "{scheduler}");
        assert_eq!(
            message,
            "the pod accepts several GPU models (Tesla-T4,A100-SXM4-80GB) and is scheduled by \"default-scheduler\", \
             so the GPU quota of namespace \"team-a\" cannot charge it to the model it lands on; \
             name one model in the gpu-admission.io/gpu-type annotation, or use schedulerName \"gpu-scheduler\""
        );
    }
    // As the apiserver runs them: the mutation steers it to the GPU scheduler first.
    let (_, mutation) = post(&router, "/mutate", review(&pod, false)).await;
    let (allowed, message) = verdict(&router, review(&patched(&pod, &mutation), false)).await;
    assert!(allowed, "{message}");
}

#[tokio::test]
async fn the_model_annotation_is_fixed_at_creation() {
    let cluster = quota_yaml("team-a", "Tesla-T4: \"1\", A100-SXM4-80GB: \"1\"", "");
    let (_, router) = app(&cluster, config_with_policy("original"));
    let pod = annotated(whole_gpu_pod("team-a", "p1", 1), "Tesla-T4");
    assert_eq!(
        verdict(&router, review(&pod, false)).await,
        (true, String::new())
    );
    // Moving the charge by relabelling the pod: denied.
    for models in [json!("A100-SXM4-80GB"), json!("zzz")] {
        let mut moved = pod.clone();
        moved["metadata"]["annotations"]["gpu-admission.io/gpu-type"] = models;
        assert_eq!(
            verdict(&router, update_review(&pod, &moved)).await,
            (
                false,
                "the GPU model annotation gpu-admission.io/gpu-type of a pod is fixed at creation \
                 (it decides the quota charge); delete and recreate the pod to change it"
                    .to_string()
            )
        );
    }
    let mut dropped = pod.clone();
    dropped["metadata"]["annotations"] = json!({});
    assert!(!verdict(&router, update_review(&pod, &dropped)).await.0);
    // Any other update is allowed and reserves nothing: the quota stays at 1 of 1.
    let mut labelled = pod.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    assert_eq!(
        verdict(&router, update_review(&pod, &labelled)).await,
        (true, String::new())
    );
    let second = annotated(whole_gpu_pod("team-a", "p2", 1), "Tesla-T4");
    let (allowed, message) = verdict(&router, review(&second, false)).await;
    assert!(!allowed);
    assert!(message.contains("used 1 of 1"), "{message}");
    // An UPDATE review without the old object cannot be judged.
    let mut incomplete: Value = serde_json::from_str(&update_review(&pod, &pod)).unwrap();
    incomplete["request"]["oldObject"] = Value::Null;
    let (status, answer) = post(&router, "/validate", incomplete.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        answer
            .as_str()
            .unwrap()
            .contains("UPDATE review has no request.oldObject"),
        "{answer}"
    );
    // Pods without GPUs may change it: it means nothing to them.
    let cpu = gpu_pod("team-a", "web", &[(0, 0)]);
    let relabelled = annotated(cpu.clone(), "A100-SXM4-80GB");
    assert!(verdict(&router, update_review(&cpu, &relabelled)).await.0);
}

#[tokio::test]
async fn vcuda_memory_without_vcuda_core_is_an_invalid_request() {
    let cluster = quota_yaml("team-a", "Tesla-T4: \"1\"", "  defaultType: Tesla-T4\n");
    let (_, router) = app(&cluster, config_with_policy("original"));
    let mut pod = gpu_pod("team-a", "sneaky", &[(0, 0)]);
    pod["spec"]["containers"][0]["resources"]["limits"] = json!({"tencent.com/vcuda-memory": "16"});
    assert_eq!(
        verdict(&router, review(&pod, false)).await,
        (
            false,
            "invalid GPU request: container \"c0\": asks for tencent.com/vcuda-memory without \
             tencent.com/vcuda-core; gpu-manager assigns a GPU by tencent.com/vcuda-core, so add it \
             (or drop tencent.com/vcuda-memory)"
                .to_string()
        )
    );
}

#[tokio::test]
async fn placement_annotations_on_a_pod_being_created_are_dropped() {
    let (_, router) = app("", config_with_policy("original"));
    let mut pod = whole_gpu_pod("team-b", "forged", 2);
    pod["spec"]["nodeName"] = json!("gpu-node-1");
    pod["metadata"]["annotations"] = json!({
        "tencent.com/predicate-gpu-idx-0": "6,7",
        "tencent.com/predicate-node": "gpu-node-1",
        "tencent.com/gpu-assigned": "true",
        "tencent.com/predicate-time": "1",
        "gpu-admission.io/defrag-hold": "{}",
        "team": "ml",
    });
    let (_, answer) = post(&router, "/mutate", review(&pod, false)).await;
    let mutated = patched(&pod, &answer);
    assert_eq!(
        mutated["metadata"]["annotations"],
        json!({"team": "ml"}),
        "GPUs are chosen by the extender after creation, never by the pod's author"
    );
    let (_, again) = post(&router, "/mutate", review(&mutated, false)).await;
    assert!(again["response"].get("patch").is_none(), "{again}");
}

#[tokio::test]
async fn a_multi_model_denial_reads_to_its_end_without_stray_text() {
    let cluster = quota_yaml("team-a", "Tesla-T4: \"1\", A100-SXM4-80GB: \"1\"", "");
    let (_, router) = app(&cluster, config_with_policy("original"));
    let mut by_annotation = annotated(
        whole_gpu_pod("team-a", "either", 2),
        "Tesla-T4,A100-SXM4-80GB",
    );
    by_annotation["spec"]["schedulerName"] = json!("gpu-scheduler");
    let mut by_affinity = whole_gpu_pod("team-a", "either-too", 2);
    by_affinity["spec"]["schedulerName"] = json!("gpu-scheduler");
    by_affinity["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product",
            "operator": "In", "values": ["Tesla-T4", "A100-SXM4-80GB"]}]}]}}});
    for pod in [by_annotation, by_affinity] {
        assert_eq!(
            verdict(&router, review(&pod, false)).await,
            (
                false,
                "GPU quota exceeded in namespace \"team-a\" for every model the pod accepts: \
                 requested 2; Tesla-T4: used 0 of 1; A100-SXM4-80GB: used 0 of 1"
                    .to_string()
            )
        );
    }
}

/// `onExceed: Warn`: past `hard`, the pod is admitted and charged, the answer carries
/// the denial it would have had as a warning (kubectl prints it), and the metric counts
/// it; a model no quota lists is counted as `unlisted`, never under the pod's own word.
#[tokio::test]
async fn a_warn_quota_admits_past_hard_with_a_warning_and_counts_it() {
    let (state, router) = app(
        &quota_yaml(
            "team-a",
            "Tesla-T4: \"1\"",
            "  defaultType: Tesla-T4\n  onExceed: Warn\n",
        ),
        config_with_policy("original"),
    );
    let (_, answer) = post(
        &router,
        "/validate",
        review(&whole_gpu_pod("team-a", "p1", 1), false),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(
        answer["response"].get("warnings").is_none(),
        "within hard: {answer}"
    );
    let (_, answer) = post(
        &router,
        "/validate",
        review(&whole_gpu_pod("team-a", "p2", 2), false),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["warnings"],
        json!([
            "GPU quota exceeded in namespace \"team-a\" for Tesla-T4: requested 2, used 1 of 1 (GPUQuota team-a/default) (onExceed: Warn)"
        ])
    );
    // Charged: the next pod sees 3 of 1 used.
    let mut odd = whole_gpu_pod("team-a", "p3", 1);
    odd["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "made-up-model"});
    let (_, answer) = post(&router, "/validate", review(&odd, false)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let (_, answer) = post(
        &router,
        "/validate",
        review(&whole_gpu_pod("team-a", "p4", 1), false),
    )
    .await;
    let warning = answer["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.contains("used 3 of 1"), "{warning}");
    let metrics = state.metrics.encode();
    for line in [
        r#"gpu_admission_quota_exceeded_total{namespace="team-a",model="Tesla-T4",action="warn"} 2"#,
        r#"gpu_admission_quota_exceeded_total{namespace="team-a",model="unlisted",action="warn"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
    assert!(!metrics.contains("made-up-model"), "{metrics}");
}

#[tokio::test]
async fn a_deny_quota_counts_its_refusals() {
    let (state, router) = app(
        &quota_yaml("team-a", "Tesla-T4: \"1\"", "  defaultType: Tesla-T4\n"),
        config_with_policy("original"),
    );
    let (_, answer) = post(
        &router,
        "/validate",
        review(&whole_gpu_pod("team-a", "big", 2), false),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(answer["response"].get("warnings").is_none(), "{answer}");
    let line = r#"gpu_admission_quota_exceeded_total{namespace="team-a",model="Tesla-T4",action="deny"} 1"#;
    let metrics = state.metrics.encode();
    assert!(metrics.contains(line), "{line} not in {metrics}");
}

/// The whole way of a pod under a `Warn`-only namespace on a cluster of two models: a
/// tenant naming a model no quota lists (A100, with its init container asking a GPU too)
/// is steered, admitted with a warning, and placed on a node of that model; a pod over
/// the T4 quota is placed on a T4 node (a Warn quota takes no node away).
#[tokio::test]
async fn under_warn_quotas_pods_are_steered_admitted_and_placed_on_their_model() {
    let cluster = format!(
        "{}{}{}",
        quota_yaml(
            "team-a",
            "Tesla-T4: \"1\"",
            "  defaultType: Tesla-T4\n  onExceed: Warn\n"
        ),
        vcuda_node("t4", 400, 64, "Tesla-T4"),
        vcuda_node("a100", 400, 160, "A100")
    );
    let (_, router) = app(&cluster, config_with_policy("original"));
    let mut a100 = whole_gpu_pod("team-a", "a100-pod", 1);
    a100["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": "A100"});
    a100["spec"]["initContainers"] = json!([{"name": "warm", "image": "busybox",
        "resources": {"limits": {"tencent.com/vcuda-core": "200", "tencent.com/vcuda-memory": "8"}}}]);
    let t4s = [
        whole_gpu_pod("team-a", "t4-1", 1),
        whole_gpu_pod("team-a", "t4-2", 1),
    ];
    for (pod, warned) in [(&a100, true), (&t4s[0], false), (&t4s[1], true)] {
        let (_, answer) = post(&router, "/mutate", review(pod, false)).await;
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        let mutated = patched(pod, &answer);
        let (_, answer) = post(&router, "/validate", review(&mutated, false)).await;
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        let warnings = &answer["response"]["warnings"];
        assert_eq!(
            warnings.is_array(),
            warned,
            "{}: {answer}",
            pod["metadata"]["name"]
        );
        let (_, placed) = post(
            &router,
            "/scheduler/predicates",
            filter_args(&mutated, &["t4", "a100"]),
        )
        .await;
        let model_node = if pod["metadata"]["name"] == "a100-pod" {
            "a100"
        } else {
            "t4"
        };
        assert_eq!(placed["NodeNames"], json!([model_node]), "{placed}");
    }
}

/// A ResourceClaim is charged like a pod, so under a `Warn` quota it is admitted past
/// `hard` with the same warning: the bundled cluster's team-c holds one A100 through a
/// claim, its quota allows two, and a claim for two more comes in.
#[tokio::test]
async fn a_claim_past_a_warn_quota_is_admitted_with_the_warning() {
    let read = |rel: &str| std::fs::read_to_string(repo::path(rel)).unwrap();
    let enforced = "  hard: {A100-SXM4-40GB: \"2\"}\n  defaultType: A100-SXM4-40GB\n";
    let cluster = read("examples/cluster.yaml");
    assert!(
        cluster.contains(enforced),
        "examples/cluster.yaml changed its team-c quota"
    );
    let review = read("examples/review-claim.json");
    let (_, router) = app(&cluster, config_with_policy("original"));
    let (_, answer) = post(&router, "/validate/resourceclaims", review.clone()).await;
    assert_eq!(answer["response"]["allowed"], false, "Deny first: {answer}");
    let audit = cluster.replace(enforced, &format!("{enforced}  onExceed: Warn\n"));
    let (state, router) = app(&audit, config_with_policy("original"));
    let (_, answer) = post(&router, "/validate/resourceclaims", review).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["warnings"],
        json!([
            "GPU quota exceeded in namespace \"team-c\" for A100-SXM4-40GB: requested 2, used 1 of 2 (GPUQuota team-c/default) (onExceed: Warn)"
        ])
    );
    let line = r#"gpu_admission_quota_exceeded_total{namespace="team-c",model="A100-SXM4-40GB",action="warn"} 1"#;
    assert!(state.metrics.encode().contains(line), "{line}");
}

/// `onExceed: Queue` at the doors: the mutation gates a pod of the queued model; the
/// validation charges a gated pod nothing (more pods than the quota are admitted to
/// wait), refuses one that could never fit, and refuses the queue's marks to anyone but
/// gpu-admission.
#[tokio::test]
async fn a_queue_quota_gates_pods_charges_them_nothing_and_keeps_its_marks() {
    let (state, router) = app(
        &quota_yaml(
            "team-a",
            "Tesla-T4: \"2\"",
            "  defaultType: Tesla-T4\n  onExceed: Queue\n",
        ),
        config_with_policy("original"),
    );
    let mut gated = Vec::new();
    for name in ["p1", "p2", "p3"] {
        let pod = whole_gpu_pod("team-a", name, 1);
        let (_, answer) = post(&router, "/mutate", review(&pod, false)).await;
        let pod = patched(&pod, &answer);
        assert_eq!(
            pod["spec"]["schedulingGates"],
            json!([{"name": "gpu-admission.io/quota"}]),
            "{answer}"
        );
        assert_eq!(
            verdict(&router, review(&pod, false)).await,
            (true, String::new())
        );
        gated.push(pod);
    }
    let used = state
        .cache()
        .read(|s| s.usage("team-a").get("Tesla-T4").copied());
    assert_eq!(used, None, "waiting pods are charged nothing");
    assert_eq!(state.cache().read(|s| s.waiting_count()), 3);
    // Three GPUs can never fit a quota of two: refused now, not left to wait forever.
    let big = patched(
        &whole_gpu_pod("team-a", "big", 3),
        &post(
            &router,
            "/mutate",
            review(&whole_gpu_pod("team-a", "big", 3), false),
        )
        .await
        .1,
    );
    let (allowed, message) = verdict(&router, review(&big, false)).await;
    assert!(!allowed);
    assert!(message.contains("requested 3, used 0 of 2"), "{message}");
    // The release annotation is gpu-admission's: not at creation, not by a tenant.
    let mut copied = whole_gpu_pod("team-a", "copied", 1);
    copied["metadata"]["annotations"] =
        json!({"gpu-admission.io/quota-released": "2026-11-25T10:00:00Z"});
    let (allowed, message) = verdict(&router, review(&copied, false)).await;
    assert!(!allowed);
    assert!(
        message.starts_with("annotation gpu-admission.io/quota-released says when")
            && message.contains("a pod cannot be created with it"),
        "{message}"
    );
    let as_user = |body: String, user: &str| {
        let mut review: Value = serde_json::from_str(&body).unwrap();
        review["request"]["userInfo"] = json!({"username": user});
        review.to_string()
    };
    let tenant = "system:serviceaccount:team-a:default";
    let mut ungated = gated[0].clone();
    ungated["spec"]["schedulingGates"] = json!([]);
    let (allowed, message) =
        verdict(&router, as_user(update_review(&gated[0], &ungated), tenant)).await;
    assert!(!allowed);
    assert_eq!(
        message,
        format!(
            "the scheduling gate gpu-admission.io/quota holds the pod in its namespace's GPU quota queue until it is charged and is removed only by gpu-admission (queue.releasers); user \"{tenant}\" may not remove it"
        )
    );
    let mut released = ungated.clone();
    released["metadata"]["annotations"]["gpu-admission.io/quota-released"] =
        json!("2026-11-25T10:00:00Z");
    for releaser in gpu_admission::config::DEFAULT_QUEUE_RELEASERS {
        let body = as_user(update_review(&gated[0], &released), releaser);
        assert_eq!(
            verdict(&router, body).await,
            (true, String::new()),
            "{releaser}"
        );
    }
    let mut moved = released.clone();
    moved["metadata"]["annotations"]["gpu-admission.io/quota-released"] =
        json!("2026-11-25T09:00:00Z");
    let (allowed, message) =
        verdict(&router, as_user(update_review(&released, &moved), tenant)).await;
    assert!(!allowed, "a tenant may not move its charge's second");
    assert!(
        message.contains("may not set, change or remove it"),
        "{message}"
    );
    // Other gates stay the tenant's own.
    let mut own = gated[1].clone();
    own["spec"]["schedulingGates"] =
        json!([{"name": "example.com/mine"}, {"name": "gpu-admission.io/quota"}]);
    let mut fewer = own.clone();
    fewer["spec"]["schedulingGates"] = json!([{"name": "gpu-admission.io/quota"}]);
    let body = as_user(update_review(&own, &fewer), tenant);
    assert_eq!(verdict(&router, body).await, (true, String::new()));
}

/// While a pod waits in a namespace's quota queue, that namespace's wait histogram is
/// exported at zero: the first release then shows Prometheus an increase (a series born
/// at its first observation would not, and the dashboard's wait quantiles stayed empty).
#[tokio::test]
async fn a_waiting_pod_brings_its_namespaces_wait_series_at_zero() {
    let (state, router) = app(
        &quota_yaml(
            "team-q",
            "Tesla-T4: \"1\"",
            "  defaultType: Tesla-T4\n  onExceed: Queue\n",
        ),
        config_with_policy("original"),
    );
    let wait =
        r#"gpu_admission_quota_queue_wait_seconds_count{namespace="team-q",model="Tesla-T4"} 0"#;
    let admin = gpu_admission::server::admin::admin_router(state.clone());
    assert!(
        !scrape(admin.clone()).await.contains(wait),
        "nothing waits yet"
    );
    let pod = whole_gpu_pod("team-q", "p1", 1);
    let (_, answer) = post(&router, "/mutate", review(&pod, false)).await;
    let pod = patched(&pod, &answer);
    assert_eq!(
        verdict(&router, review(&pod, false)).await,
        (true, String::new())
    );
    assert_eq!(state.cache().read(|s| s.waiting_count()), 1);
    let metrics = scrape(admin).await;
    assert!(metrics.contains(wait), "{wait} missing from:\n{metrics}");
}

/// The admin port's /metrics.
async fn scrape(admin: axum::Router) -> String {
    let request = axum::http::Request::get("/metrics")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tower::ServiceExt::oneshot(admin, request).await.unwrap();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Two namespaces in one cohort: team-b, past its own quota of 1, borrows the 2 GPUs
/// team-a leaves idle and no more; team-a, whose quota says `reclaim: Never`, then waits
/// for its own GPUs to come back (refused now), and a borrowing limit caps team-c.
#[tokio::test]
async fn a_namespace_past_its_quota_borrows_what_its_cohort_leaves_idle() {
    let cohort = |reclaim: &str| format!("  defaultType: Tesla-T4\n  cohort: research\n{reclaim}");
    let cluster = [
        quota_yaml("team-a", "Tesla-T4: \"2\"", &cohort("  reclaim: Never\n")),
        quota_yaml("team-b", "Tesla-T4: \"1\"", &cohort("")),
        quota_yaml(
            "team-c",
            "Tesla-T4: \"0\"",
            &cohort("  borrowingLimit: {Tesla-T4: \"0\"}\n"),
        ),
    ]
    .concat();
    let (state, router) = app(&cluster, config_with_policy("original"));
    for name in ["b1", "b2", "b3"] {
        let (allowed, message) =
            verdict(&router, review(&whole_gpu_pod("team-b", name, 1), false)).await;
        assert!(allowed, "{name}: {message}");
    }
    let (allowed, message) =
        verdict(&router, review(&whole_gpu_pod("team-b", "b4", 1), false)).await;
    assert!(!allowed);
    assert_eq!(
        message,
        "GPU quota exceeded in namespace \"team-b\" for Tesla-T4: requested 1, used 3 of 1 \
         (GPUQuota team-b/default); cohort research: the other members lend 0 more"
    );
    let (allowed, message) =
        verdict(&router, review(&whole_gpu_pod("team-a", "a1", 1), false)).await;
    assert!(!allowed, "team-a's GPUs are lent out");
    assert!(message.contains("its own quota is lent"), "{message}");
    let (allowed, message) =
        verdict(&router, review(&whole_gpu_pod("team-c", "c1", 1), false)).await;
    assert!(!allowed);
    assert!(message.contains("borrowing limit 0 reached"), "{message}");
    // The metrics say who borrows and who lends.
    let metrics = scrape(gpu_admission::server::admin::admin_router(state)).await;
    for line in [
        r#"gpu_admission_quota_borrowed_gpus{namespace="team-b",quota="default",model="Tesla-T4"} 2.0"#,
        r#"gpu_admission_quota_lent_gpus{namespace="team-a",quota="default",model="Tesla-T4"} 2.0"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
}

/// A ResourceClaim CREATE review, asked by `user`.
fn claim_review(claim: &Value, user: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("review-{}", claim["metadata"]["name"].as_str().unwrap_or("x")),
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "name": claim["metadata"]["name"], "namespace": claim["metadata"]["namespace"],
            "operation": "CREATE", "userInfo": {"username": user},
            "object": claim, "oldObject": null, "dryRun": false
        }
    })
    .to_string()
}

/// A namespace allowed four T4s whose pending pod `app` asks for two `nvidia.com/gpu`,
/// which NVIDIA's DeviceClass serves through DRA (DRA-backed extended resources).
fn extended_cluster() -> String {
    let quota = quota_yaml("team-a", "Tesla-T4: \"4\"", "  defaultType: Tesla-T4\n");
    format!(
        "{quota}---\napiVersion: resource.k8s.io/v1\nkind: DeviceClass\n\
         metadata: {{name: gpu.nvidia.com}}\n\
         spec:\n  selectors: [{{cel: {{expression: 'device.driver == \"gpu.nvidia.com\"'}}}}]\n  \
         extendedResourceName: nvidia.com/gpu\n\
         ---\napiVersion: v1\nkind: Pod\n\
         metadata: {{name: app, namespace: team-a, uid: u-app, annotations: {{gpu-admission.io/gpu-type: Tesla-T4}}}}\n\
         spec:\n  schedulerName: gpu-scheduler\n  containers:\n  - name: cuda\n    image: cuda\n    \
         resources: {{limits: {{nvidia.com/gpu: \"2\"}}}}\n"
    )
}

/// The claim a scheduler makes for pod `app`'s two GPUs (annotated, controlled by the
/// pod), or a tenant's copy of it.
fn extended_claim(name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "app",
                "uid": "u-app", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}]}}
    })
}

/// Finding 20.2: a tenant's copy of the claim a scheduler makes for its pod's
/// DRA-backed extended resources is pinned and charged like any claim (four of them no
/// longer leave the namespace at the pod's 2.0); the same claim created by a scheduler
/// (`schedulerUsers`) is the pod's own GPUs, free, once per pod.
#[tokio::test]
async fn an_extended_resource_claim_is_the_pods_own_only_when_a_scheduler_creates_it() {
    let used = |state: &gpu_admission::server::AppState| {
        state
            .cache()
            .read(|s| s.usage("team-a").get("Tesla-T4").copied())
            .map_or(0, |m| m.0)
    };
    let tenant = "system:serviceaccount:team-a:default";
    let (state, router) = app(&extended_cluster(), config_with_policy("original"));
    let pod_only = used(&state);
    assert_eq!(pod_only, 2000, "the pod's two GPUs");
    let forged = extended_claim("forged-1");
    let (_, answer) = post(
        &router,
        "/mutate/resourceclaims",
        claim_review(&forged, tenant),
    )
    .await;
    let pinned = patched(&forged, &answer);
    assert_ne!(pinned, forged, "a tenant's claim is pinned: {answer}");
    let (allowed, message) = claim_verdict(&router, claim_review(&forged, tenant)).await;
    assert!(!allowed, "unpinned, it is refused");
    assert!(message.contains("is not pinned"), "{message}");
    assert_eq!(
        claim_verdict(&router, claim_review(&pinned, tenant)).await,
        (true, String::new())
    );
    assert_eq!(used(&state), pod_only + 2000, "charged like any claim");
    let second = patched(&extended_claim("forged-2"), &answer);
    let (allowed, message) = claim_verdict(&router, claim_review(&second, tenant)).await;
    assert!(!allowed);
    assert!(message.contains("requested 2, used 4 of 4"), "{message}");

    for scheduler in gpu_admission::config::DEFAULT_SCHEDULER_USERS {
        let (state, router) = app(&extended_cluster(), config_with_policy("original"));
        let claim = extended_claim("app-gpu-x7k2p");
        let (_, answer) = post(
            &router,
            "/mutate/resourceclaims",
            claim_review(&claim, scheduler),
        )
        .await;
        assert_eq!(
            answer["response"]["patch"],
            Value::Null,
            "{scheduler}: {answer}"
        );
        assert_eq!(
            claim_verdict(&router, claim_review(&claim, scheduler)).await,
            (true, String::new()),
            "{scheduler}"
        );
        assert_eq!(used(&state), pod_only, "{scheduler}: the pod's GPUs, once");
        // A second claim naming the pod is not its own, whoever creates it.
        let again = extended_claim("app-gpu-q9m3z");
        let (_, answer) = post(
            &router,
            "/mutate/resourceclaims",
            claim_review(&again, scheduler),
        )
        .await;
        assert!(
            answer["response"]["patch"].is_string(),
            "{scheduler}: {answer}"
        );
        let (allowed, message) = claim_verdict(&router, claim_review(&again, scheduler)).await;
        assert!(
            !allowed && message.contains("is not pinned"),
            "{scheduler}: {message}"
        );
    }
}
