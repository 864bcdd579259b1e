//! The two doors, called directly as a forger would: the webhook door lets in only
//! kube-apiserver's client certificate, and the extender door places only the pod the
//! cluster has, as the cluster has it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::support::*;

/// A pod as a forged request carries it: `name` in `namespace` with metadata.uid `uid`,
/// wanting `gpus` whole GPUs of `model`, as JSON.
fn forged_pod(namespace: &str, name: &str, uid: &str, model: &str, gpus: u32) -> serde_json::Value {
    let mut pod = serde_json::to_value(unscheduled_gpu_pod(name, Some(model), gpus)).unwrap();
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!(uid);
    pod
}

/// A CREATE AdmissionReview of `pod` (JSON), with review uid `uid`.
fn create_review(pod: &serde_json::Value, uid: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:tenant:forger"},
            "object": pod, "oldObject": null, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
    .to_string()
}

/// H. The webhook door answers only kube-apiserver: with `--client-ca`, a caller without
/// the API server's client certificate does not get past TLS. A forged AdmissionReview
/// (a valid CREATE of a 1-GPU pod in a namespace with a GPUQuota) POSTed straight to
/// `/validate` and `/mutate` without a certificate fails below HTTP, and the quota's status
/// is unchanged; the same review with the API server's certificate is judged (and
/// reserved — so the refusal above is what kept the forger out); the webhook door does not
/// serve the extender (404), nor the extender door the webhooks; creates through the API
/// server, which presents its certificate (AdmissionConfiguration), keep working.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn webhook_door_refuses_a_caller_without_the_api_servers_certificate() {
    let Some(cluster) = setup("mtls").await else {
        return;
    };
    let model = "Tesla-P4";
    cluster.label_for_webhooks().await;
    cluster
        .create_quota("default", json!({model: "2"}), Some(model))
        .await;
    // gpu-admission must have seen the quota before it judges a review, and its reconciler
    // written the first status (`used: {Tesla-P4: 0}`), so that write is not taken for
    // the forged review's.
    let before = wait_for(
        "the quota reconciler to write the first status of GPUQuota default",
        QUOTA_TIMEOUT,
        || async {
            let status = cluster.quota_status("default").await;
            status.used.contains_key(model).then_some(status)
        },
    )
    .await;
    assert!(before.pending.is_empty(), "{before:?}");
    let pod = forged_pod(&cluster.ns, "forged", "", model, 1);
    let review_uid = "e2e-forged-review";
    let review = create_review(&pod, review_uid);
    let url = server_url();

    for route in ["/validate", "/mutate"] {
        match https::post(&url, route, review.clone(), anonymous_tls()).await {
            Ok((status, body)) => panic!(
                "POST {url}{route} without a client certificate got an HTTP answer \
                 ({status}): {body}"
            ),
            Err(error) => {
                let text = https::chain(&*error);
                println!("{route} without a client certificate: {text}");
                // TLS 1.3: `CertificateRequired` on the first read; TLS 1.2 would fail the
                // handshake itself (`HandshakeFailure`). Either way an alert, no status.
                assert!(
                    text.contains("received fatal alert"),
                    "{route}: expected a TLS refusal, got: {text}"
                );
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        cluster.quota_status("default").await,
        before,
        "a review refused at TLS must not touch the GPUQuota"
    );

    let (status, body) = https::post(&url, "/validate", review.clone(), apiserver_tls())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "POST {url}/validate as kube-apiserver: {}",
                https::chain(&*e)
            )
        });
    println!("/validate with kube-apiserver's certificate: {status} {body}");
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["uid"], review_uid, "{answer}");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let status = cluster.quota_status("default").await;
    assert!(
        status
            .pending
            .iter()
            .any(|p| p.model == model && p.pods == 1)
            && status.used[model].0 == "1",
        "a review that gets through is charged to the quota, so the refusal above mattered; \
         status: {status:?}"
    );

    // Each door serves only its own routes, whoever calls.
    let filter = json!({"Pod": pod, "NodeNames": ["e2e-mtls-none"]}).to_string();
    let (status, body) = https::post(&url, "/scheduler/predicates", filter, apiserver_tls())
        .await
        .unwrap_or_else(|e| panic!("POST {url}/scheduler/predicates: {}", https::chain(&*e)));
    assert_eq!(
        status, 404,
        "the webhook door must not serve the extender: {body}"
    );
    let extender = extender_url();
    let (status, body) = https::post(&extender, "/validate", review, anonymous_tls())
        .await
        .unwrap_or_else(|e| panic!("POST {extender}/validate: {}", https::chain(&*e)));
    assert_eq!(
        status, 404,
        "the extender door must not serve the webhooks: {body}"
    );

    // The API server presents its certificate: creates through it are judged as before.
    register_webhooks(&cluster).await;
    let created = cluster
        .try_create(&unscheduled_gpu_pod("through-the-apiserver", None, 1))
        .await
        .unwrap_or_else(|e| panic!("a create through kube-apiserver must be admitted: {e}"));
    assert_eq!(
        annotations(&created)
            .get(TYPE_ANNOTATION)
            .map(String::as_str),
        Some(model),
        "the mutating webhook (called by kube-apiserver over mutual TLS) sets the model"
    );
    unregister_webhooks(&cluster).await;
}

/// I. The extender places only the pod the cluster has, as the cluster has it. Forged
/// filter calls on the extender door (which asks for no client certificate): a GPU pod
/// that does not exist, an existing pending pod under another uid, and a pod already
/// bound are refused with `Error` and nothing is written; the same pending pod with its
/// real uid is placed, and bound with its annotations by the bind verb (a bind under
/// another uid is refused; the legitimate path); node objects in the request
/// (`Nodes` form) relabelling a node and giving it 8 GPUs change nothing — the answer and
/// the next call use the cluster's node; a non-GPU system pod passes through unwritten.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn extender_places_only_the_pod_the_cluster_has() {
    let Some(cluster) = setup("forged").await else {
        return;
    };
    let model = "Tesla-P40";
    let nodes = ["e2e-forged-1", "e2e-forged-2"];
    for node in nodes {
        cluster.create_gpu_node(node, model, 2).await;
    }
    let ns = cluster.ns.clone();
    let predicate_node = "tencent.com/predicate-node";
    let error_of =
        |answer: &serde_json::Value| answer["Error"].as_str().unwrap_or_default().to_string();
    // Polls a forged call until `done` holds of its answer (gpu-admission's watch must
    // have seen what the test just created). A refused or unplaced call writes nothing,
    // so repeating it is harmless.
    async fn call_until(
        what: &str,
        args: serde_json::Value,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let last = std::sync::Mutex::new(serde_json::Value::Null);
        let (args, done, last_ref) = (&args, &done, &last);
        let found = wait_for_or_none(Duration::from_secs(20), || async move {
            let answer = extender_filter(args).await;
            let hit = done(&answer).then(|| answer.clone());
            *last_ref.lock().unwrap() = answer;
            hit
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "timed out waiting for {what}; last answer: {}",
                last.lock().unwrap()
            )
        })
    }

    // (i) A GPU pod nobody created.
    let ghost = forged_pod(
        &ns,
        "ghost",
        "6a1f1a6e-0000-4000-8000-000000000001",
        model,
        1,
    );
    let answer = extender_filter(&json!({"Pod": ghost, "NodeNames": nodes})).await;
    println!("(i) a pod that does not exist: {answer}");
    let error = error_of(&answer);
    assert!(
        error.contains(&format!("{ns}/ghost")) && error.contains("not in"),
        "a pod the cluster does not have must be refused with Error: {answer}"
    );
    assert!(
        cluster.pods().get_opt("ghost").await.unwrap().is_none(),
        "nothing may be created for a forged pod"
    );

    // (ii) An existing pending pod, under another uid.
    let pending = cluster
        .try_create(&unscheduled_gpu_pod("pending", Some(model), 1))
        .await
        .unwrap();
    let uid = pending.metadata.uid.clone().unwrap();
    let other_uid = "6a1f1a6e-0000-4000-8000-000000000002";
    let answer = call_until(
        "gpu-admission to refuse pod pending under another uid (after its watch saw the pod)",
        json!({"Pod": forged_pod(&ns, "pending", other_uid, model, 1), "NodeNames": nodes}),
        |answer| error_of(answer).contains("has uid"),
    )
    .await;
    println!("(ii) an existing pod under another uid: {answer}");
    let error = error_of(&answer);
    assert!(
        error.contains(&uid) && error.contains(other_uid),
        "the refusal names both uids: {error}"
    );
    let pod = cluster.pods().get("pending").await.unwrap();
    assert!(
        !annotations(&pod).contains_key(predicate_node),
        "a refused call must not annotate the pod: {:?}",
        annotations(&pod)
    );

    // (iii) The same pod with its real uid: the legitimate path, placed (held) and then,
    // when the scheduler calls the bind verb, bound with its annotations in one write.
    let answer = call_until(
        "pod pending to be placed (after gpu-admission's watch saw both nodes)",
        json!({"Pod": forged_pod(&ns, "pending", &uid, model, 1), "NodeNames": nodes}),
        |answer| {
            answer["NodeNames"]
                .as_array()
                .is_some_and(|n| !n.is_empty())
        },
    )
    .await;
    println!("(iii) the pod with its real uid: {answer}");
    assert_eq!(error_of(&answer), "", "{answer}");
    let placed: Vec<String> = serde_json::from_value(answer["NodeNames"].clone()).unwrap();
    assert!(
        placed.len() == 1 && nodes.contains(&placed[0].as_str()),
        "one of the candidates: {placed:?}"
    );
    let pod = cluster.pods().get("pending").await.unwrap();
    assert!(
        !annotations(&pod).contains_key(predicate_node),
        "the filter only holds its choice; the bind verb writes it: {:?}",
        annotations(&pod)
    );
    let binding = |uid: &str| json!({"PodName": "pending", "PodNamespace": ns, "PodUID": uid, "Node": placed[0]});
    let error = extender_bind(&binding(other_uid)).await;
    println!("(iii) a bind under another uid: {error}");
    assert!(error.contains("has uid"), "{error}");
    let unchanged = cluster.pods().get("pending").await.unwrap();
    assert_eq!(
        unchanged.metadata.resource_version, pod.metadata.resource_version,
        "a refused bind must write nothing"
    );
    let error = extender_bind(&binding(&uid)).await;
    assert_eq!(error, "", "the legitimate bind");
    let pod = cluster.pods().get("pending").await.unwrap();
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(placed[0].as_str())
    );
    let a = annotations(&pod);
    assert_eq!(a.get(predicate_node), Some(&placed[0]), "{a:?}");
    assert!(a.contains_key("tencent.com/predicate-gpu-idx-0"), "{a:?}");
    assert_eq!(
        a.get("tencent.com/gpu-assigned").map(String::as_str),
        Some("false"),
        "{a:?}"
    );

    // (iv) A pod already bound to a node, sent as if it were not.
    let mut bound = unscheduled_gpu_pod("bound", Some(model), 1);
    bound.spec.as_mut().unwrap().node_name = Some(nodes[1].to_string());
    let bound = cluster.try_create(&bound).await.unwrap();
    let bound_uid = bound.metadata.uid.clone().unwrap();
    let answer = call_until(
        "gpu-admission to refuse pod bound as already bound",
        json!({"Pod": forged_pod(&ns, "bound", &bound_uid, model, 1), "NodeNames": nodes}),
        |answer| error_of(answer).contains("already bound"),
    )
    .await;
    println!("(iv) a bound pod: {answer}");
    assert!(error_of(&answer).contains(nodes[1]), "{answer}");
    let after = cluster.pods().get("bound").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        bound.metadata.resource_version,
        "a bound pod must not be written: {:?}",
        annotations(&after)
    );
    assert!(!annotations(&after).contains_key(predicate_node));

    // (v) Node objects in the request are read for their names only.
    let other_model = "A100-PCIE-40GB";
    let wants = cluster
        .try_create(&unscheduled_gpu_pod("wants-a100", Some(other_model), 4))
        .await
        .unwrap();
    let wants_uid = wants.metadata.uid.clone().unwrap();
    let resources = json!({"cpu": "32", "memory": "128Gi", "pods": "110", CORE: "800",
                           MEMORY: (8 * MEMORY_PER_GPU).to_string()});
    let lie = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": nodes[0], "labels": {MODEL_LABEL: other_model}},
        "status": {"capacity": resources, "allocatable": resources,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    });
    let wants_pod = forged_pod(&ns, "wants-a100", &wants_uid, other_model, 4);
    let answer = call_until(
        "gpu-admission to judge pod wants-a100 (after its watch saw it)",
        json!({"Pod": wants_pod, "Nodes": {"metadata": {}, "items": [lie]}}),
        |answer| error_of(answer).is_empty(),
    )
    .await;
    println!("(v) a node object relabelled {other_model} with 8 GPUs: {answer}");
    let reason_for = |answer: &serde_json::Value| -> String {
        ["FailedAndUnresolvableNodes", "FailedNodes"]
            .iter()
            .find_map(|map| answer[map][nodes[0]].as_str())
            .unwrap_or_else(|| panic!("no reason for {}: {answer}", nodes[0]))
            .to_string()
    };
    let reason = reason_for(&answer);
    assert!(
        reason.contains(&format!("GPU model {model}")),
        "the reason must show the cluster's model ({model}), not the request's: {reason}"
    );
    assert_eq!(
        answer["Nodes"]["items"],
        json!([]),
        "the relabelled node must not pass: {answer}"
    );
    let answer = extender_filter(&json!({"Pod": wants_pod, "NodeNames": [nodes[0]]})).await;
    println!("(v) then by name: {answer}");
    assert_eq!(
        reason_for(&answer),
        reason,
        "the cache must still hold the cluster's node"
    );
    assert_eq!(answer["NodeNames"], json!([]), "{answer}");
    let pod = cluster.pods().get("wants-a100").await.unwrap();
    assert!(!annotations(&pod).contains_key(predicate_node));

    // (vi) A system pod without GPUs: passes through, nothing written or created.
    let system: Api<Pod> = Api::namespaced(cluster.client.clone(), "kube-system");
    if system.get_opt("coredns-x").await.unwrap().is_some() {
        println!("(vi) skipped: kube-system/coredns-x exists");
    } else {
        let versions = || async {
            let mut all = BTreeMap::new();
            for api in [system.clone(), cluster.pods()] {
                for pod in api.list(&ListParams::default()).await.unwrap().items {
                    all.insert(
                        format!(
                            "{}/{}",
                            pod.metadata.namespace.clone().unwrap_or_default(),
                            pod.metadata.name.clone().unwrap_or_default()
                        ),
                        // What a placement could write: the annotations and the spec
                        // (not the status, where the teller keeps why a pod waits).
                        serde_json::to_string(&(&pod.metadata.annotations, &pod.spec)).unwrap(),
                    );
                }
            }
            all
        };
        let before = versions().await;
        let passthrough = || {
            sum_metric(
                &admin_metrics(),
                "gpu_admission_requests_total",
                "decision=\"passthrough\"",
            )
        };
        let passed_before = passthrough();
        let coredns = json!({
            "metadata": {"name": "coredns-x", "namespace": "kube-system",
                         "uid": "6a1f1a6e-0000-4000-8000-000000000003"},
            "spec": {"containers": [{"name": "coredns", "image": "registry.invalid/coredns:e2e"}]},
        });
        let answer = extender_filter(&json!({"Pod": coredns, "NodeNames": nodes})).await;
        println!("(vi) kube-system/coredns-x without GPUs: {answer}");
        assert_eq!(error_of(&answer), "", "{answer}");
        assert_eq!(
            answer["NodeNames"],
            json!(nodes),
            "a non-GPU pod passes everywhere"
        );
        assert_eq!(passthrough(), passed_before + 1.0);
        // The same name asking for a GPU: a pod the cluster does not have.
        let mut gpu_coredns = coredns.clone();
        gpu_coredns["spec"]["containers"][0]["resources"] = json!({"limits": {CORE: "100"}});
        let answer = extender_filter(&json!({"Pod": gpu_coredns, "NodeNames": nodes})).await;
        println!("(vi) kube-system/coredns-x asking for a GPU: {answer}");
        assert!(
            error_of(&answer).contains("kube-system/coredns-x"),
            "{answer}"
        );
        assert!(
            system.get_opt("coredns-x").await.unwrap().is_none(),
            "no pod may be created"
        );
        assert_eq!(versions().await, before, "no pod may be written");
    }

    cluster.delete_nodes().await;
}
