#![allow(clippy::unwrap_used)]
use super::*;
use crate::wire::expect::{PODS, RESOURCE_CLAIMS};
use serde_json::{Value, json};

fn review(version: &str) -> Review {
    let body = json!({"apiVersion": version, "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ns", "object": {}}});
    Review::from_json(body.to_string().as_bytes()).unwrap()
}

#[test]
fn responses_echo_uid_and_version() {
    for version in VERSIONS {
        let answer = serde_json::to_value(review(version).deny("no")).unwrap();
        assert_eq!(answer["apiVersion"], version);
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(
            answer["response"]["status"],
            json!({"code": 403, "reason": "Forbidden", "message": "no"})
        );
    }
}

#[test]
fn patch_is_standard_base64_of_a_json_array() {
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/a", "value": "?>?>"}])).unwrap();
    let answer = serde_json::to_value(review("admission.k8s.io/v1").patch(&patch)).unwrap();
    let encoded = answer["response"]["patch"].as_str().unwrap();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&decoded).unwrap()[0]["path"],
        "/a"
    );
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    let empty =
        serde_json::to_value(review("admission.k8s.io/v1").patch(&json_patch::Patch(vec![])))
            .unwrap();
    assert!(empty["response"].get("patch").is_none());
}

#[test]
fn answers_are_the_bytes_a_json_value_printed() {
    let review = review("admission.k8s.io/v1beta1");
    let answer = |response: Value| {
        json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "response": response})
            .to_string()
    };
    let text = |a: Answer| serde_json::to_string(&a).unwrap();
    assert_eq!(
        text(review.allow()),
        answer(json!({"uid": "u-1", "allowed": true}))
    );
    assert_eq!(
        text(review.deny("over \"quota\"")),
        answer(json!({"uid": "u-1", "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "over \"quota\""}}))
    );
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/a", "value": 1}])).unwrap();
    assert_eq!(
        text(review.patch(&patch)),
        answer(
            json!({"uid": "u-1", "allowed": true, "patchType": "JSONPatch",
            "patch": base64::engine::general_purpose::STANDARD.encode(br#"[{"op":"add","path":"/a","value":1}]"#)})
        )
    );
}

/// `Review::decode` on `body` gives what `Review::from_json` and then `Review::pod`
/// give: the same review and pods, or the same error.
fn decodes_as_the_reference(body: &[u8]) {
    let shown = String::from_utf8_lossy(body);
    match (Review::from_json(body), Review::decode(body)) {
        (Err(reference), Err(decoded)) => assert_eq!(reference, decoded, "{shown}"),
        (Ok(reference), Ok(mut decoded)) => {
            assert_eq!(reference.api_version, decoded.api_version, "{shown}");
            let (a, b) = (&reference.request, &decoded.request);
            assert_eq!(
                (&a.uid, &a.namespace, &a.name, &a.operation, a.dry_run),
                (&b.uid, &b.namespace, &b.name, &b.operation, b.dry_run),
                "{shown}"
            );
            for old in [false, true] {
                let taken = decoded.take_pod(old).map(|pod| *pod);
                assert_eq!(reference.pod(old), taken, "{shown}");
            }
        }
        (reference, decoded) => panic!("{shown}: {reference:?} but {decoded:?}"),
    }
}

fn pod(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": "x"},
            "annotations": {"gpu-admission.io/gpu-type": "Tesla-T4"},
            "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {"f:containers": {}}}}]},
        "spec": {"schedulerName": "gpu-scheduler", "nodeName": "n1",
            "containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}],
                "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}]}}},
            "volumes": [{"name": "v", "emptyDir": {}}]},
        "status": {"phase": "Pending"}})
}

fn body(request: Value) -> Vec<u8> {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
        .to_string()
        .into_bytes()
}

#[test]
fn one_pass_decoding_gives_what_the_reference_gives() {
    let create = json!({"uid": "u", "operation": "CREATE", "namespace": "ns", "object": pod("p"), "oldObject": null, "dryRun": true});
    let update =
        json!({"uid": "u", "operation": "UPDATE", "object": pod("new"), "oldObject": pod("old")});
    let delete = json!({"uid": "u", "operation": "DELETE", "oldObject": pod("old")});
    // What kube-apiserver sends: decoded in one pass.
    for request in [&create, &update, &delete] {
        assert!(one_pass(&body(request.clone())).is_some(), "{request}");
    }
    let mut bodies: Vec<Vec<u8>> = [create.clone(), update, delete]
        .into_iter()
        .map(body)
        .collect();
    let deep = format!("{}1{}", "[".repeat(1000), "]".repeat(1000));
    let over_budget = format!("[{}]", vec!["{}"; MAX_POD_VALUES].join(","));
    let halves = format!("[{}]", vec!["0"; MAX_POD_VALUES / 2 + 1].join(","));
    let two_halves = format!(
        r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{"uid": "u", "operation": "UPDATE", "object": {{"x": {halves}}}, "oldObject": {{"x": {halves}}}}}}}"#
    );
    let texts = [
        // Keys in any case, the last one winning, null as absent.
        r#"{"APIVERSION": "admission.k8s.io/v1", "Kind": "AdmissionReview", "REQUEST": {"uid": "u", "operation": "CONNECT"}}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE", "object": {}}, "request": null}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "apiversion": "v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE", "object": {}}}"#.to_string(),
        r#"{"apiVersion": null, "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE"}}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": 3, "request": {"uid": "u", "operation": "CREATE"}}"#.to_string(),
        // Objects that are absent, null, not pods, or pods with errors.
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE"}}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE", "object": 5}}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE", "object": {"spec": 3}}}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "DELETE", "object": {"spec": 3}}}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE", "object": {}, "uid": "v"}}"#.to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE", "object": {}}}"#.to_string(),
        // Not JSON, not an object, trailing text.
        "{".to_string(),
        "[1]".to_string(),
        r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE"}} x"#.to_string(),
        // Deep nesting in a part that is skipped.
        format!(r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{"uid": "u", "operation": "CREATE", "object": {{"junk": {deep}}}}}}}"#),
        // Over one pod's budget: refused, or (two pods, each within it) decoded.
        format!(r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{"uid": "u", "operation": "CREATE", "object": {{"spec": {{"volumes": {over_budget}}}}}}}}}"#),
        two_halves.clone(),
    ];
    bodies.extend(texts.into_iter().map(String::into_bytes));
    // Not UTF-8.
    let mut latin1 = body(create);
    let at = latin1.iter().position(|&b| b == b'p').unwrap();
    latin1[at] = 0xe9;
    bodies.push(latin1);
    for body in &bodies {
        decodes_as_the_reference(body);
    }
    // Two pods, each within its budget, together over it: the reference way decodes it.
    assert!(one_pass(two_halves.as_bytes()).is_none());
    let mut decoded = Review::decode(two_halves.as_bytes()).unwrap();
    assert!(decoded.take_pod(true).is_ok());
}

#[test]
fn a_review_must_be_about_the_routes_kind_in_its_own_namespace() {
    let review = |request: Value| Review::from_json(&body(request)).unwrap();
    let pod_kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    let pods = json!({"group": "", "version": "v1", "resource": "pods"});
    let honest = json!({"uid": "u", "operation": "CREATE", "namespace": "ns",
        "kind": pod_kind, "resource": pods, "object": {}});
    assert_eq!(review(honest.clone()).expect(PODS), Ok(()));
    let claims = review(honest.clone())
        .expect(RESOURCE_CLAIMS)
        .unwrap_err()
        .to_string();
    assert_eq!(
        claims,
        r#"request.kind is "Pod" of group ""; this route judges resource.k8s.io/ResourceClaim"#
    );
    let altered = |key: &str, value: Value| {
        let mut request = honest.clone();
        request[key] = value;
        review(request).expect(PODS).unwrap_err().to_string()
    };
    assert_eq!(
        altered("operation", json!("Create")),
        r#"request.operation "Create" is not one of CREATE, UPDATE, DELETE, CONNECT"#
    );
    assert_eq!(
        altered("namespace", json!("")),
        "request.namespace is missing; pods are namespaced"
    );
    assert_eq!(
        altered(
            "kind",
            json!({"group": "apps", "version": "v1", "kind": "Pod"})
        ),
        r#"request.kind is "Pod" of group "apps"; this route judges core/Pod"#
    );
    assert_eq!(
        altered(
            "resource",
            json!({"group": "", "version": "v1", "resource": "secrets"})
        ),
        r#"request.resource is "secrets" of group ""; this route judges pods"#
    );
    assert_eq!(
        altered("resource", Value::Null),
        "request.resource is missing; this route judges pods"
    );
    let review = review(honest);
    assert_eq!(review.check_namespace("object", Some("ns")), Ok(()));
    assert_eq!(review.check_namespace("object", None), Ok(()));
    assert_eq!(review.check_namespace("object", Some("")), Ok(()));
    let forged = review
        .check_namespace("oldObject", Some("other"))
        .unwrap_err();
    assert_eq!(
        forged.to_string(),
        r#"request.oldObject.metadata.namespace "other" is not request.namespace "ns""#
    );
}

#[test]
fn undecodable_reviews_say_why() {
    let err = |body: &str| Review::from_json(body.as_bytes()).unwrap_err().to_string();
    assert!(err("{").starts_with("AdmissionReview is not valid JSON"));
    assert_eq!(err("[1]"), "AdmissionReview must be a JSON object");
    assert!(
        err(r#"{"apiVersion": "v1", "kind": "AdmissionReview"}"#)
            .contains("is not admission.k8s.io/v1")
    );
    assert_eq!(
        err(r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#),
        "AdmissionReview has no request"
    );
    assert!(err(r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}}"#)
        .contains("uid"));
}

/// Each way a review can be refused is counted under its own bounded label.
#[test]
fn refusals_are_counted_by_kind() {
    let kind = |body: &str| Review::decode(body.as_bytes()).unwrap_err().kind();
    let v1 = r#""apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview""#;
    assert_eq!(kind("{"), "malformed_json");
    assert_eq!(kind("[1]"), "wrong_type");
    assert_eq!(
        kind(r#"{"apiVersion": "v1", "kind": "AdmissionReview"}"#),
        "wrong_kind"
    );
    assert_eq!(
        kind(r#"{"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}"#),
        "wrong_kind"
    );
    assert_eq!(kind(&format!("{{{v1}}}")), "missing_field");
    assert_eq!(
        kind(&format!(
            r#"{{{v1}, "request": {{"operation": "CREATE"}}}}"#
        )),
        "missing_field"
    );
    assert_eq!(
        kind(&format!(
            r#"{{{v1}, "request": {{"uid": 1, "operation": "CREATE"}}}}"#
        )),
        "wrong_type"
    );
    let over = format!("[{}]", vec!["0"; MAX_POD_VALUES + 1].join(","));
    let over = format!(
        r#"{{{v1}, "request": {{"uid": "u", "operation": "CREATE", "object": {{"spec": {{"x": {over}}}}}}}}}"#
    );
    let mut review = Review::decode(over.as_bytes()).unwrap();
    assert_eq!(review.take_pod(false).unwrap_err().kind(), "over_limit");
    let review = |request: Value| Review::from_json(&body(request)).unwrap();
    let honest = json!({"uid": "u", "operation": "CREATE", "namespace": "ns",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "object": {}});
    let refused = |key: &str, value: Value| {
        let mut request = honest.clone();
        request[key] = value;
        DecodeError::from(review(request).expect(PODS).unwrap_err()).kind()
    };
    assert_eq!(refused("operation", json!("Create")), "bad_operation");
    assert_eq!(refused("namespace", Value::Null), "missing_field");
    assert_eq!(refused("kind", json!({"kind": "Secret"})), "wrong_kind");
    assert_eq!(
        refused("resource", json!({"resource": "secrets"})),
        "wrong_resource"
    );
    let forged = review(honest).check_namespace("object", Some("other"));
    assert_eq!(
        DecodeError::from(forged.unwrap_err()).kind(),
        "namespace_mismatch"
    );
    let delete = json!({"uid": "u", "operation": "DELETE", "namespace": "ns"});
    assert_eq!(
        review(delete).pod(true).unwrap_err().kind(),
        "missing_field"
    );
}
