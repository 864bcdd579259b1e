//! What only gpu-admission (or gpu-manager) writes on a pod, tried by a tenant through
//! the real API server: every mark of the code's one list (`Config::mark_keys`), by
//! create, JSON patch, merge patch, strategic merge patch, server-side apply and replace
//! (and `pods/status` for conditions), each refused or dropped, nothing of it stored.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use gpu_admission::marks::{MarkKey, Place};

use crate::support::shapes::{HARNESS_WRITERS, TYPE_ANNOTATION};
use crate::support::*;

/// The marks under the suite's configuration (hack/e2e.sh: deploy/'s names).
fn marks() -> Vec<MarkKey> {
    let users = serde_json::to_string(&HARNESS_WRITERS).unwrap();
    let config = format!("placementWriters: {users}\nqueue: {{releasers: {users}}}\n");
    gpu_admission::config::Config::parse(&config)
        .unwrap()
        .mark_keys()
}

/// The annotation key a tenant tries for `mark`: under a prefix, one key of it.
fn key_of(mark: &MarkKey) -> String {
    match mark.place {
        Place::AnnotationPrefix => format!("{}node", mark.key),
        _ => mark.key.clone(),
    }
}

/// The value each write path tries.
const FORGED: &str = "forged-by-tenant";

/// One write path of the API server, for an annotation set to `value` (`None`:
/// removed) on pod `name` as it is now (`current`).
async fn write_annotation(
    pods: &Api<Pod>,
    path: &str,
    current: &Pod,
    key: &str,
    value: Option<&str>,
) -> Result<Pod, kube::Error> {
    let name = current.metadata.name.as_deref().unwrap();
    let params = PatchParams::default();
    match path {
        "json" => {
            let pointer = format!(
                "/metadata/annotations/{}",
                key.replace('~', "~0").replace('/', "~1")
            );
            let present = annotations(current).contains_key(key);
            let op = match (value, present) {
                (Some(v), true) => json!({"op": "replace", "path": pointer, "value": v}),
                (Some(v), false) => json!({"op": "add", "path": pointer, "value": v}),
                (None, _) => json!({"op": "remove", "path": pointer}),
            };
            let patch: json_patch::Patch = serde_json::from_value(json!([op])).unwrap();
            pods.patch(name, &params, &Patch::Json::<()>(patch)).await
        }
        "merge" => {
            let body = json!({"metadata": {"annotations": {key: value}}});
            pods.patch(name, &params, &Patch::Merge(body)).await
        }
        "strategic" => {
            let body = json!({"metadata": {"annotations": {key: value}}});
            pods.patch(name, &params, &Patch::Strategic(body)).await
        }
        "apply" => {
            // Server-side apply takes the field from whoever owned it (force); an
            // applier can only remove what it owns, so a removal is a change to "".
            let body = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": {key: value.unwrap_or("")}}});
            let apply = PatchParams::apply("tenant-tool").force();
            pods.patch(name, &apply, &Patch::Apply(body)).await
        }
        "replace" => {
            let mut pod = current.clone();
            let map = pod
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            match value {
                Some(v) => map.insert(key.to_string(), v.to_string()),
                None => map.remove(key),
            };
            pods.replace(name, &PostParams::default(), &pod).await
        }
        other => unreachable!("{other}"),
    }
}

const PATHS: [&str; 5] = ["json", "merge", "strategic", "apply", "replace"];

/// `result` was refused by the API server, or whatever it stored keeps `check` true.
fn refused_or_dropped(result: &Result<Pod, kube::Error>, what: &str) {
    if let Err(error) = result {
        match error {
            kube::Error::Api(status) => {
                assert!(
                    [403, 422].contains(&status.code),
                    "{what}: refused with {status:?}, not as forbidden or invalid"
                );
            }
            other => panic!("{what}: {other}"),
        }
    }
}

#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_tenant_can_write_no_mark_by_any_path() {
    let Some(cluster) = setup("marks").await else {
        return;
    };
    let model = "Marks-T4";
    cluster.label_for_webhooks().await;
    register_webhooks(&cluster).await;
    // A namespace admin as clusters grant it: the built-in `admin` role.
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tenant-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenant-admin"}]}))
    .unwrap();
    Api::namespaced(cluster.client.clone(), &cluster.ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let tenant: Api<Pod> = Api::namespaced(cluster.impersonate("tenant-admin").await, &cluster.ns);
    let marks = marks();
    assert!(marks.len() >= 9, "the list: {marks:?}");
    let mut tried = 0;

    // Create: every mark but the tenant's own word on the model is dropped from a pod
    // being created (a gate too: the queue's gate is gpu-admission's to set), and a
    // pod's status is the API server's to reset.
    for mark in &marks {
        let mut pod = json!({
            "metadata": {"name": format!("create-{tried}"), "annotations": {TYPE_ANNOTATION: model}},
            "spec": {"schedulerName": NO_SCHEDULER,
                "containers": [{"name": "cuda", "image": "registry.invalid/never:e2e",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        });
        match mark.place {
            Place::Annotation | Place::AnnotationPrefix => {
                pod["metadata"]["annotations"][key_of(mark)] = json!(FORGED);
            }
            Place::Gate => pod["spec"]["schedulingGates"] = json!([{"name": mark.key}]),
            Place::Condition => {
                pod["status"] = json!({"conditions": [{"type": mark.key, "status": "False"}]});
            }
        }
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let created = tenant.create(&PostParams::default(), &pod).await;
        tried += 1;
        let what = format!("creating a pod with {mark:?}");
        refused_or_dropped(&created, &what);
        let Ok(created) = created else { continue };
        let stored = tenant
            .get(created.metadata.name.as_deref().unwrap())
            .await
            .unwrap();
        let kept = match mark.place {
            _ if mark.tenant_sets_at_creation => continue,
            Place::Annotation | Place::AnnotationPrefix => {
                annotations(&stored).contains_key(&key_of(mark))
            }
            Place::Gate => stored
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == mark.key)),
            Place::Condition => stored
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == mark.key)),
        };
        assert!(!kept, "{what}: stored {stored:?}");
    }
    // Server-side apply creates too.
    for mark in marks
        .iter()
        .filter(|m| matches!(m.place, Place::Annotation | Place::AnnotationPrefix))
    {
        if mark.tenant_sets_at_creation {
            continue;
        }
        let name = format!("apply-{tried}");
        let body = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {key_of(mark): FORGED, TYPE_ANNOTATION: model}},
            "spec": {"schedulerName": NO_SCHEDULER,
                "containers": [{"name": "cuda", "image": "registry.invalid/never:e2e",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let apply = PatchParams::apply("tenant-tool").force();
        let created = tenant.patch(&name, &apply, &Patch::Apply(body)).await;
        tried += 1;
        let what = format!("applying a new pod with {}", key_of(mark));
        refused_or_dropped(&created, &what);
        if created.is_ok() {
            let stored = tenant.get(&name).await.unwrap();
            assert!(
                !annotations(&stored).contains_key(&key_of(mark)),
                "{what}: {:?}",
                annotations(&stored)
            );
        }
    }

    // Updates: on a pod where gpu-admission (this suite's identity, one of the
    // writers) has written every annotation mark, the tenant sets, changes and removes
    // each by every path; refused, the pod keeps what gpu-admission wrote.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "target", "annotations": {TYPE_ANNOTATION: model, "team": "x"}},
        "spec": {"schedulerName": NO_SCHEDULER,
            "containers": [{"name": "cuda", "image": "registry.invalid/never:e2e",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    cluster
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let written: serde_json::Map<String, Value> = marks
        .iter()
        .filter(|m| matches!(m.place, Place::Annotation | Place::AnnotationPrefix))
        .filter(|m| !m.tenant_sets_at_creation)
        .map(|m| (key_of(m), json!("written-by-gpu-admission")))
        .collect();
    cluster
        .pods()
        .patch(
            "target",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": written}})),
        )
        .await
        .expect("gpu-admission's identity writes its marks");
    let before = annotations(&cluster.pods().get("target").await.unwrap());
    for mark in marks
        .iter()
        .filter(|m| matches!(m.place, Place::Annotation | Place::AnnotationPrefix))
    {
        let key = key_of(mark);
        // A key under a prefix the pod does not carry yet is an addition.
        let added = format!("{}e2e-added", mark.key);
        let mut keys = vec![key.clone()];
        if mark.place == Place::AnnotationPrefix {
            keys.push(added);
        }
        for key in keys {
            for value in [Some(FORGED), None] {
                for path in PATHS {
                    let current = cluster.pods().get("target").await.unwrap();
                    let result = write_annotation(&tenant, path, &current, &key, value).await;
                    tried += 1;
                    let what = format!("{path}: {key} = {value:?}");
                    refused_or_dropped(&result, &what);
                    let now = annotations(&cluster.pods().get("target").await.unwrap());
                    assert_eq!(now.get(&key), before.get(&key), "{what}: stored");
                }
            }
        }
    }
    assert_eq!(
        annotations(&cluster.pods().get("target").await.unwrap()),
        before
    );

    // The quota queue's gate: on a pod waiting in a Queue quota that is full, the
    // tenant removes it by every path; refused, the pod still waits.
    cluster
        .create_quota_spec(
            "queue",
            json!({"hard": {model: "1"}, "defaultType": model, "onExceed": "Queue"}),
        )
        .await;
    let gate = marks.iter().find(|m| m.place == Place::Gate).unwrap();
    let waiting_pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {TYPE_ANNOTATION: model}},
            "spec": {"schedulerName": NO_SCHEDULER,
                "containers": [{"name": "cuda", "image": "registry.invalid/never:e2e",
                    "resources": {"limits": {CORE: "100"}}}]},
        }))
        .unwrap()
    };
    // The first takes the quota's one GPU (the releaser lets it go), the second waits.
    cluster
        .create_when_admitted(&waiting_pod("first"), std::time::Duration::from_secs(30))
        .await;
    wait_for(
        "first let out of the queue",
        std::time::Duration::from_secs(30),
        || async {
            let pod = cluster.pods().get("first").await.ok()?;
            let gates = pod.spec?.scheduling_gates.unwrap_or_default();
            gates.is_empty().then_some(())
        },
    )
    .await;
    cluster
        .pods()
        .create(&PostParams::default(), &waiting_pod("waits"))
        .await
        .unwrap();
    let gated = |pod: &Pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| g.iter().any(|g| g.name == gate.key))
    };
    assert!(
        gated(&cluster.pods().get("waits").await.unwrap()),
        "waits is in the queue"
    );
    for path in PATHS {
        let current = cluster.pods().get("waits").await.unwrap();
        let params = PatchParams::default();
        let result = match path {
            "json" => {
                let index = current.spec.as_ref().unwrap().scheduling_gates.as_ref().unwrap().iter().position(|g| g.name == gate.key).unwrap();
                let patch: json_patch::Patch = serde_json::from_value(json!([{"op": "remove", "path": format!("/spec/schedulingGates/{index}")}])).unwrap();
                tenant.patch("waits", &params, &Patch::Json::<()>(patch)).await
            }
            "merge" => tenant.patch("waits", &params, &Patch::Merge(json!({"spec": {"schedulingGates": []}}))).await,
            "strategic" => tenant.patch("waits", &params, &Patch::Strategic(json!({"spec": {"schedulingGates": [{"name": gate.key, "$patch": "delete"}]}}))).await,
            "apply" => {
                let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waits"}, "spec": {"schedulingGates": []}});
                tenant.patch("waits", &PatchParams::apply("tenant-tool").force(), &Patch::Apply(body)).await
            }
            _ => {
                let mut pod = current.clone();
                pod.spec.as_mut().unwrap().scheduling_gates = Some(Vec::new());
                tenant.replace("waits", &PostParams::default(), &pod).await
            }
        };
        tried += 1;
        let what = format!("{path}: removing the quota gate");
        refused_or_dropped(&result, &what);
        assert!(
            gated(&cluster.pods().get("waits").await.unwrap()),
            "{what}: the gate is gone"
        );
    }

    // Conditions live in `pods/status`, which no role a tenant is given may write.
    let condition = marks.iter().find(|m| m.place == Place::Condition).unwrap();
    let forged = json!({"status": {"conditions": [{"type": condition.key, "status": "False", "reason": "Forged"}]}});
    let params = PatchParams::default();
    let current = cluster.pods().get("target").await.unwrap();
    let mut replaced = current.clone();
    replaced.status = serde_json::from_value(forged["status"].clone()).ok();
    let patch: json_patch::Patch = serde_json::from_value(json!([{"op": "add", "path": "/status/conditions", "value": forged["status"]["conditions"]}])).unwrap();
    let results = [
        (
            "json",
            tenant
                .patch_status("target", &params, &Patch::Json::<()>(patch))
                .await,
        ),
        (
            "merge",
            tenant
                .patch_status("target", &params, &Patch::Merge(forged.clone()))
                .await,
        ),
        (
            "strategic",
            tenant
                .patch_status("target", &params, &Patch::Strategic(forged.clone()))
                .await,
        ),
        ("apply", {
            let mut body = forged.clone();
            body["apiVersion"] = json!("v1");
            body["kind"] = json!("Pod");
            body["metadata"] = json!({"name": "target"});
            tenant
                .patch_status(
                    "target",
                    &PatchParams::apply("tenant-tool").force(),
                    &Patch::Apply(body),
                )
                .await
        }),
        (
            "replace",
            tenant
                .replace_status("target", &PostParams::default(), &replaced)
                .await,
        ),
    ];
    for (path, result) in results {
        tried += 1;
        match result {
            Err(kube::Error::Api(status)) if status.code == 403 => {}
            other => panic!(
                "{path}: writing {} must be forbidden: {other:?}",
                condition.key
            ),
        }
    }
    let stored = cluster.pods().get("target").await.unwrap();
    let conditions = stored.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions.iter().all(|c| c.type_ != condition.key),
        "{conditions:?}"
    );
    println!(
        "{tried} writes of {} marks tried as a tenant: each refused or dropped",
        marks.len()
    );

    unregister_webhooks(&cluster).await;
}
