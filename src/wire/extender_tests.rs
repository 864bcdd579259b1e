#![allow(clippy::unwrap_used)]
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;

use super::*;
use crate::wire::filter_result::{ExtenderFilterResult, NodeReasons};

#[test]
fn accepts_any_letter_case_and_both_forms() {
    let args = ExtenderArgs::from_json(
        br#"{"pod": {"metadata": {"name": "p"}}, "nodenames": ["a", "b"], "Nodes": null}"#,
    )
    .unwrap();
    assert_eq!(args.node_names.unwrap(), ["a", "b"]);
    assert!(args.nodes.is_none());
    let args = ExtenderArgs::from_json(
        br#"{"Pod": {}, "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "n1"}}]}, "NodeNames": null}"#,
    )
    .unwrap();
    assert_eq!(args.nodes.as_ref().unwrap()[0].name, "n1");
    assert_eq!(args.candidate_names(), ["n1"]);
}

#[test]
fn lists_are_bounded_while_decoding() {
    let names = vec!["\"n\""; MAX_NODES + 1].join(",");
    let body = format!(r#"{{"Pod": {{}}, "NodeNames": [{names}]}}"#);
    let err = ExtenderArgs::from_json(body.as_bytes()).unwrap_err();
    assert_eq!(err.kind(), "over_limit");
    let err = err.to_string();
    assert!(
        err.contains(&format!("more than {MAX_NODES} elements")),
        "{err}"
    );
    let items = vec!["{}"; MAX_NODES + 1].join(",");
    let body = format!(r#"{{"Pod": {{}}, "Nodes": {{"items": [{items}]}}}}"#);
    let err = ExtenderArgs::from_json(body.as_bytes()).unwrap_err();
    assert_eq!(err.kind(), "over_limit");
    let err = err.to_string();
    assert!(err.starts_with("Nodes.items"), "{err}");
}

#[test]
fn node_objects_are_echoed_unchanged() {
    let args = ExtenderArgs::from_json(
        br#"{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "n1"}, "status": {"x": 1}}]}}"#,
    )
    .unwrap();
    let result = ExtenderFilterResult {
        nodes: args.echo(|_| true),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&result).unwrap()["Nodes"],
        serde_json::json!({"metadata": {}, "items": [{"metadata": {"name": "n1"}, "status": {"x": 1}}]})
    );
}

/// Request bodies in many spellings: the one-pass decoder reads what the part by
/// part decoder reads (the names, and each node object's exact text).
#[test]
fn one_pass_reads_what_part_by_part_reads() {
    let bodies = [
        r#"{"Pod": {}, "NodeNames": ["a", "b"]}"#,
        r#"{"pod": null, "Pod": {"metadata": {}}, "nodenames": null, "NODES": {"items": null}}"#,
        r#"{"Nodes": {"kind": "NodeList", "metadata": {"resourceVersion": "1"}, "ITEMS": [
            {"metadata": {"name": "plain"}},
            {"kind": "Node", "apiVersion": "v1", "metadata": {"uid": "u", "labels": {"k": "}\"{"}, "name": "later"}},
            { "Metadata" : { "Name" : "spaced" } , "spec" : {} },
            {"metadata": null, "metadata": {"name": "second metadata"}},
            {"metadata": {"name": null, "name": "second name"}},
            {"status": {"images": [{"names": ["x"]}]}, "metadata": {"name": "metadata last"}},
            {"metadata": {"na\u006de": "escaped key", "x": 1}},
            {"metadata": {"name": "escaped \"name\" \u00e9"}},
            {"metadata": {}}, {}
        ]}, "Pod": {}, "junk": [1, {"Nodes": 2}]}"#,
        r#"{"Pod": {}, "Nodes": {"items": []}, "NodeNames": ["n"]}"#,
        "{\"Pod\":{},\"Nodes\":{\"items\":[\n  {\n    \"metadata\": {\"name\": \"pretty\"}\n  }\n]}}",
    ];
    for body in bodies {
        let fast: Parts = serde_json::from_str(body).unwrap();
        let slow = Parts::by_part(body).unwrap();
        assert_eq!(
            fast.pod.map(RawValue::get),
            slow.pod.map(RawValue::get),
            "{body}"
        );
        assert_eq!(fast.names, slow.names, "{body}");
        let texts = |parts: &Parts| -> Option<Vec<(Option<String>, String)>> {
            let nodes = parts.nodes.as_ref()?;
            Some(
                nodes
                    .iter()
                    .map(|(n, raw)| (n.clone(), raw.get().to_string()))
                    .collect(),
            )
        };
        assert_eq!(texts(&fast), texts(&slow), "{body}");
    }
    let args = ExtenderArgs::from_json(bodies[2].as_bytes()).unwrap();
    assert_eq!(
        args.candidate_names(),
        [
            "plain",
            "later",
            "spaced",
            "second metadata",
            "second name",
            "metadata last",
            "escaped key",
            "escaped \"name\" \u{e9}",
            "",
            ""
        ]
    );
}

#[test]
fn answers_carry_the_requests_node_objects_byte_for_byte() {
    let pretty =
        "{\n  \"metadata\": {\"name\": \"n2\"},\n  \"status\": {\"a\": [1, 2.50, \"\\u00e9\"]}\n}";
    let body = format!(
        r#"{{"Pod": {{}}, "Nodes": {{"items": [{{"metadata": {{"name": "n1"}}}}, {pretty}]}}}}"#
    );
    let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
    let mut result = ExtenderFilterResult {
        nodes: args.echo(|n| n.name == "n2"),
        ..Default::default()
    };
    result.failed_nodes.insert("n1", "no room");
    assert_eq!(
        result.nodes.as_ref().unwrap().texts().collect::<Vec<_>>(),
        [pretty]
    );
    let response = result.clone().into_response();
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    let answer =
        futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 20)).unwrap();
    let answer = std::str::from_utf8(&answer).unwrap();
    assert!(answer.contains(pretty), "{answer}");
    let answered: serde_json::Value = serde_json::from_str(answer).unwrap();
    assert_eq!(answered, serde_json::to_value(&result).unwrap());
    // Every node passing: the request's array goes back as it is, in one piece.
    let all = ExtenderFilterResult {
        nodes: args.echo(|_| true),
        ..Default::default()
    };
    let answer = futures::executor::block_on(axum::body::to_bytes(
        all.clone().into_response().into_body(),
        1 << 20,
    ))
    .unwrap();
    let items = &body[body.find('[').unwrap()..body.rfind(']').unwrap() + 1];
    assert!(std::str::from_utf8(&answer).unwrap().contains(items));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&answer).unwrap(),
        serde_json::to_value(&all).unwrap()
    );
    let names_only = ExtenderFilterResult {
        node_names: Some(vec!["n1".into()]),
        ..Default::default()
    };
    let answer = futures::executor::block_on(axum::body::to_bytes(
        names_only.clone().into_response().into_body(),
        1 << 20,
    ))
    .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&answer).unwrap(),
        serde_json::to_value(&names_only).unwrap()
    );
}

#[test]
fn errors_name_the_part_that_is_wrong() {
    let err = |body: &str| {
        ExtenderArgs::from_json(body.as_bytes())
            .unwrap_err()
            .to_string()
    };
    assert!(err("{").starts_with("request is not valid JSON"));
    assert_eq!(err(r#"{"NodeNames": []}"#), "request has no Pod");
    assert_eq!(
        err(r#"{"Pod": {}}"#),
        "request has neither NodeNames nor Nodes"
    );
    let bad = err(r#"{"Pod": {"spec": {"containers": 5}}, "NodeNames": []}"#);
    assert!(
        bad.starts_with("Pod at spec.containers: invalid type"),
        "{bad}"
    );
    assert!(err(r#"{"Pod": {}, "NodeNames": "a"}"#).starts_with("NodeNames: invalid type"));
    assert_eq!(
        err(r#"{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}, []]}}"#),
        "Nodes.items[1] must be a JSON object"
    );
    assert!(
        err(r#"{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 5}}]}}"#)
            .starts_with("Nodes.items[0].metadata.name: invalid type"),
    );
    assert_eq!(
        err(r#"{"Pod": {}, "Nodes": []}"#),
        "Nodes must be a NodeList object"
    );
    assert!(
        err(r#"{"Pod": {}, "Nodes": {"items": [{]}}"#).starts_with("request is not valid JSON")
    );
}

#[test]
fn result_uses_exact_go_field_names() {
    let result = ExtenderFilterResult {
        node_names: Some(vec!["n1".into()]),
        ..Default::default()
    };
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"Nodes": null, "NodeNames": ["n1"], "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": ""})
    );
}

#[test]
fn reasons_are_a_json_object_of_node_to_text() {
    let shared: Arc<str> = Arc::from("no GPU has room");
    let mut reasons = NodeReasons::default();
    reasons.insert("n1", shared.clone());
    reasons.insert("n2", shared);
    reasons.insert("n3", "node has no GPUs");
    assert_eq!(reasons.get("n3"), Some("node has no GPUs"));
    assert_eq!(
        serde_json::to_value(&reasons).unwrap(),
        serde_json::json!({"n1": "no GPU has room", "n2": "no GPU has room", "n3": "node has no GPUs"})
    );
}

/// Each way a filter request can be wrong is counted under its own bounded label.
#[test]
fn errors_are_counted_by_kind() {
    let kind = |body: &[u8]| ExtenderArgs::from_json(body).unwrap_err().kind();
    let cases: [(&[u8], &str); 8] = [
        (b"{", "malformed_json"),
        (b"\xff", "malformed_json"),
        (br#"{"NodeNames": []}"#, "missing_field"),
        (br#"{"Pod": {}}"#, "missing_field"),
        (br#"{"Pod": {}, "Nodes": []}"#, "wrong_type"),
        (br#"{"Pod": {}, "NodeNames": "a"}"#, "wrong_type"),
        (
            br#"{"Pod": {"spec": {"nodeName": 1}}, "NodeNames": []}"#,
            "wrong_type",
        ),
        (
            br#"{"Pod": {"metadata": {"creationTimestamp": "yesterday"}}, "NodeNames": []}"#,
            "invalid_value",
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(kind(body), expected, "{}", String::from_utf8_lossy(body));
    }
}
