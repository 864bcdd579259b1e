//! Every manifest under deploy/ parses, names itself, and the webhook registrations
//! carry what the apiserver and DESIGN §6 need. (A real API server dry-run is the e2e
//! suite's job; this catches typos before that.)
#![allow(clippy::unwrap_used)]

mod repo;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::Value;

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
}

fn documents() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    yaml_files(Path::new(&repo::path("deploy")), &mut files);
    files.sort();
    let mut docs = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value =
                Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if !value.is_null() {
                docs.push((path.clone(), value));
            }
        }
    }
    docs
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

#[test]
fn every_document_has_api_version_kind_and_name() {
    let docs = documents();
    assert!(
        docs.len() > 20,
        "only {} documents under deploy/",
        docs.len()
    );
    for (path, doc) in &docs {
        for field in [&["apiVersion"][..], &["kind"], &["metadata", "name"]] {
            assert!(
                str_at(doc, field).is_some_and(|s| !s.is_empty()),
                "{}: a document without {}",
                path.display(),
                field.join(".")
            );
        }
    }
}

#[test]
fn webhook_configurations_have_the_required_fields() {
    let docs = documents();
    for (kind, name, path) in [
        (
            "ValidatingWebhookConfiguration",
            "validate.gpu-admission.io",
            "/validate",
        ),
        (
            "MutatingWebhookConfiguration",
            "mutate.gpu-admission.io",
            "/mutate",
        ),
    ] {
        let config = docs
            .iter()
            .map(|(_, d)| d)
            .find(|d| str_at(d, &["kind"]) == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} in deploy/"));
        assert_eq!(str_at(config, &["metadata", "name"]), Some("gpu-admission"));
        let webhooks = config["webhooks"].as_sequence().unwrap();
        assert_eq!(webhooks.len(), 1, "{kind}");
        let hook = &webhooks[0];
        assert_eq!(str_at(hook, &["name"]), Some(name));
        assert_eq!(
            str_at(hook, &["clientConfig", "service", "path"]),
            Some(path)
        );
        assert_eq!(
            str_at(hook, &["clientConfig", "service", "name"]),
            Some("gpu-admission")
        );
        assert!(
            hook["clientConfig"].get("caBundle").is_none(),
            "{kind}: caBundle is set by `certs --install`; re-applying must not clear it"
        );
        assert_eq!(str_at(hook, &["sideEffects"]), Some("NoneOnDryRun"));
        assert_eq!(str_at(hook, &["failurePolicy"]), Some("Fail"));
        assert_eq!(hook["timeoutSeconds"].as_u64(), Some(5));
        assert_eq!(
            hook["admissionReviewVersions"],
            serde_yaml::from_str::<Value>("[v1]").unwrap()
        );
        let rule = &hook["rules"][0];
        assert_eq!(rule["resources"][0].as_str(), Some("pods"));
        assert_eq!(rule["operations"][0].as_str(), Some("CREATE"));
        let expression = str_at(&hook["matchConditions"][0], &["expression"]).unwrap();
        for resource in [
            "tencent.com/vcuda-core",
            "tencent.com/vcuda-memory",
            "nvidia.com/gpu",
        ] {
            for field in ["limits", "requests"] {
                assert!(
                    expression.contains(&format!("'{resource}' in c.resources.{field}")),
                    "{kind}: matchConditions miss {resource} in {field}"
                );
            }
        }
        assert!(expression.contains("has(object.spec.initContainers)"));
        let selector = &hook["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(
            str_at(selector, &["key"]),
            Some("kubernetes.io/metadata.name")
        );
        assert_eq!(str_at(selector, &["operator"]), Some("NotIn"));
        let excluded: Vec<&str> = selector["values"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(excluded.contains(&"kube-system") && excluded.contains(&"gpu-admission"));
    }
}

#[test]
fn the_config_map_is_a_valid_gpu_admission_config() {
    let docs = documents();
    let config = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| str_at(d, &["metadata", "name"]) == Some("gpu-admission-config"))
        .unwrap();
    let text = str_at(config, &["data", "config.yaml"]).unwrap();
    gpu_admission::config::Config::parse(text).unwrap();
}

#[test]
fn the_scheduler_extender_points_at_the_sidecar() {
    let docs = documents();
    let config = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| str_at(d, &["metadata", "name"]) == Some("gpu-scheduler-config"))
        .unwrap();
    let scheduler: Value =
        serde_yaml::from_str(str_at(config, &["data", "config.yaml"]).unwrap()).unwrap();
    assert_eq!(
        str_at(&scheduler, &["apiVersion"]),
        Some("kubescheduler.config.k8s.io/v1")
    );
    let extender = &scheduler["extenders"][0];
    assert_eq!(
        str_at(extender, &["urlPrefix"]),
        Some("https://127.0.0.1:3456/scheduler")
    );
    assert_eq!(str_at(extender, &["filterVerb"]), Some("predicates"));
    assert_eq!(extender["nodeCacheCapable"].as_bool(), Some(true));
    assert_eq!(extender["ignorable"].as_bool(), Some(false));
    assert_eq!(extender["managedResources"].as_sequence().unwrap().len(), 3);

    let volcano: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo::path("deploy/volcano/volcano-scheduler.conf")).unwrap(),
    )
    .unwrap();
    let plugin = volcano["tiers"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|tier| tier["plugins"].as_sequence().unwrap())
        .find(|p| str_at(p, &["name"]) == Some("extender"))
        .unwrap();
    assert_eq!(
        str_at(&plugin["arguments"], &["extender.predicateVerb"]),
        Some("vpredicates")
    );
}
