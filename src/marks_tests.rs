#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::config::Config;

const TENANT: &str = "tenant-admin";

/// The `gpu-admission.io/` keys a tenant writes and gpu-admission only reads: the
/// tenant's word, not ours, so not marks.
const TENANT_KEYS: [&str; 2] = [
    // The opt-in of a running pod to defragmentation moves.
    "gpu-admission.io/movable",
    // The node pool label (on Nodes, written by the cluster admin).
    "gpu-admission.io/pool",
];
const SCHEDULER: &str = "system:serviceaccount:gpu-admission:gpu-scheduler";
const GPU_MANAGER: &str = "system:serviceaccount:kube-system:gpu-manager";

fn names() -> MarkNames<'static> {
    MarkNames {
        annotation_prefix: "tencent.com",
        type_annotation: "gpu-admission.io/gpu-type",
    }
}

fn users() -> (Vec<String>, Vec<String>) {
    (
        vec![SCHEDULER.to_string(), GPU_MANAGER.to_string()],
        vec![SCHEDULER.to_string()],
    )
}

/// One key of each mark that has annotation keys, and keys beside them that are not
/// marks (near misses included).
const KEYS: [&str; 12] = [
    "gpu-admission.io/gpu-type",
    "tencent.com/predicate-gpu-idx-0",
    "tencent.com/predicate-node",
    "tencent.com/gpu-assigned",
    PLAN_HOLD_ANNOTATION,
    RELEASED_ANNOTATION,
    BORROWED_ANNOTATION,
    RECLAIM_ANNOTATION,
    "gpu-admission.io/movable",
    "tencent.com/predicate",
    "gpu-admission.io/defrag-holds",
    "example.com/team",
];

fn pod_marks<'a>(annotations: &'a BTreeMap<String, String>, gates: &'a [&'a str]) -> PodMarks<'a> {
    PodMarks {
        annotations: Some(annotations),
        gates,
    }
}

fn change(
    old: (&BTreeMap<String, String>, &[&str]),
    new: (&BTreeMap<String, String>, &[&str]),
    user: &str,
) -> Option<Change> {
    let (placement, gpu_admission) = users();
    let writers = Writers {
        placement: &placement,
        gpu_admission: &gpu_admission,
    };
    first_change(
        pod_marks(old.0, old.1),
        pod_marks(new.0, new.1),
        names(),
        writers,
        user,
        true,
    )
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_tenant_may_not_set_change_or_remove_any_mark_and_each_writer_only_its_own() {
    let none = annotations(&[]);
    for key in &KEYS[..8] {
        let set = annotations(&[(key, "x")]);
        let other = annotations(&[(key, "y")]);
        for (old, new) in [(&none, &set), (&set, &other), (&set, &none)] {
            let refused = change((old, &[]), (new, &[]), TENANT).unwrap();
            assert_eq!(refused.key, *key);
            let text = refused.mark.refusal(key, TENANT);
            assert!(
                text.contains(key) && text.contains(TENANT) || text.contains("fixed at creation"),
                "{text}"
            );
        }
        let mark = MARKS
            .iter()
            .find(|m| m.is_annotation(key, names()))
            .unwrap();
        // Each writer writes its own marks, and none of another writer's.
        for (user, writer) in [
            (GPU_MANAGER, Writer::Placement),
            (SCHEDULER, Writer::GpuAdmission),
        ] {
            let judged = change((&none, &[]), (&set, &[]), user);
            let may =
                mark.writer == writer || (user == SCHEDULER && mark.writer == Writer::Placement);
            assert_eq!(judged.is_none(), may, "{user} writing {key}");
        }
    }
    // The quota gate: removed only by gpu-admission.
    let gate = [QUOTA_GATE];
    let refused = change((&none, &gate), (&none, &[]), TENANT).unwrap();
    assert_eq!(refused.key, QUOTA_GATE);
    assert!(
        refused
            .mark
            .refusal(QUOTA_GATE, TENANT)
            .contains("may not remove it")
    );
    assert!(change((&none, &gate), (&none, &[]), GPU_MANAGER).is_some());
    assert!(change((&none, &gate), (&none, &[]), SCHEDULER).is_none());
    // Keys that are not marks are anyone's.
    for key in &KEYS[8..] {
        let set = annotations(&[(key, "x")]);
        assert_eq!(change((&none, &[]), (&set, &[]), TENANT), None, "{key}");
    }
    // The model annotation is fixed only for a pod that asks for GPUs.
    let typed = annotations(&[("gpu-admission.io/gpu-type", "T4")]);
    let (placement, gpu_admission) = users();
    let writers = Writers {
        placement: &placement,
        gpu_admission: &gpu_admission,
    };
    let judged = first_change(
        pod_marks(&none, &[]),
        pod_marks(&typed, &[]),
        names(),
        writers,
        SCHEDULER,
        false,
    );
    assert_eq!(judged, None);
}

#[test]
fn what_the_mutating_webhook_drops_is_every_annotation_mark_but_the_model() {
    let all: BTreeMap<String, String> = KEYS.iter().map(|k| (k.to_string(), "x".into())).collect();
    let dropped: Vec<&String> = dropped_at_create(&all, names()).map(|(k, _)| k).collect();
    let mut expected: Vec<&str> = KEYS[1..8].to_vec();
    expected.sort();
    assert_eq!(dropped, expected);
}

/// A serde_json value as CEL sees it.
fn cel_value(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Number(n) => n.as_i64().unwrap_or_default().into(),
        Value::String(s) => s.as_str().into(),
        Value::Array(items) => items.iter().map(cel_value).collect::<Vec<_>>().into(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (k.clone(), cel_value(v)))
            .collect::<HashMap<String, cel::Value>>()
            .into(),
    }
}

fn pod_json(annotations: &BTreeMap<String, String>, gates: &[&str]) -> Value {
    let mut pod = json!({"metadata": {}, "spec": {}});
    if !annotations.is_empty() {
        pod["metadata"]["annotations"] = json!(annotations);
    }
    if !gates.is_empty() {
        let gates: Vec<Value> = gates.iter().map(|g| json!({"name": g})).collect();
        pod["spec"]["schedulingGates"] = json!(gates);
    }
    pod
}

/// The condition evaluated as the API server would, on an UPDATE by `user`.
fn sent(program: &cel::Program, old: &Value, new: &Value, user: &str) -> bool {
    let mut context = cel::Context::default();
    context.add_variable_from_value("object", cel_value(new));
    context.add_variable_from_value("oldObject", cel_value(old));
    let request = json!({"operation": "UPDATE", "userInfo": {"username": user}});
    context.add_variable_from_value("request", cel_value(&request));
    match program.execute(&context) {
        Ok(cel::Value::Bool(sent)) => sent,
        other => panic!("the condition must evaluate to a bool, got {other:?}"),
    }
}

fn annotation_set() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(
        proptest::sample::select(KEYS.to_vec()).prop_map(String::from),
        proptest::sample::select(vec!["", "a", "b"]).prop_map(String::from),
        0..5,
    )
}

fn gate_set() -> impl Strategy<Value = Vec<&'static str>> {
    proptest::sample::subsequence(vec![QUOTA_GATE, "example.com/mine"], 0..=2)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The API server sends the webhook exactly the updates the webhook refuses (and
    /// nothing more): the generated CEL and `first_change` are one rule.
    #[test]
    fn the_update_condition_sends_exactly_the_updates_that_change_a_mark_their_user_may_not_write(
        old in annotation_set(),
        new in annotation_set(),
        old_gates in gate_set(),
        new_gates in gate_set(),
        user in proptest::sample::select(vec![TENANT, SCHEDULER, GPU_MANAGER]),
    ) {
        let (placement, gpu_admission) = users();
        let writers = Writers { placement: &placement, gpu_admission: &gpu_admission };
        let condition = update_condition(names(), Spelled::Users(writers));
        let program = cel::Program::compile(&condition).unwrap();
        let judged = change((&old, &old_gates), (&new, &new_gates), user);
        let sent = sent(&program, &pod_json(&old, &old_gates), &pod_json(&new, &new_gates), user);
        prop_assert_eq!(sent, judged.is_some(), "old {:?} {:?}, new {:?} {:?}, user {}", old, old_gates, new, new_gates, user);
    }
}

#[test]
fn a_create_is_always_sent() {
    let (placement, gpu_admission) = users();
    let writers = Writers {
        placement: &placement,
        gpu_admission: &gpu_admission,
    };
    let program =
        cel::Program::compile(&update_condition(names(), Spelled::Users(writers))).unwrap();
    let mut context = cel::Context::default();
    let pod = pod_json(&BTreeMap::new(), &[]);
    context.add_variable_from_value("object", cel_value(&pod));
    context.add_variable_from_value("oldObject", cel::Value::Null);
    let request = json!({"operation": "CREATE", "userInfo": {"username": TENANT}});
    context.add_variable_from_value("request", cel_value(&request));
    assert_eq!(program.execute(&context), Ok(cel::Value::Bool(true)));
}

fn repo(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml_documents(path: &str) -> Vec<serde_yaml::Value> {
    use serde::Deserialize;
    let text = repo(path);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|d| !d.is_null())
        .collect()
}

/// The configuration deploy/ ships.
fn deploy_config() -> Config {
    let docs = yaml_documents("deploy/20-config.yaml");
    let text = docs[0]["data"]["config.yaml"].as_str().unwrap();
    Config::parse(text).unwrap()
}

fn shipped_condition(config: &Config) -> String {
    let writers = Writers {
        placement: &config.placement_writers,
        gpu_admission: &config.queue.releasers,
    };
    let names = MarkNames {
        annotation_prefix: &config.resources.annotation_prefix,
        type_annotation: &config.type_annotation,
    };
    update_condition(names, Spelled::Users(writers))
}

#[test]
fn deploy_registers_the_update_condition_the_list_makes() {
    let config = deploy_config();
    let expected = shipped_condition(&config);
    let docs = yaml_documents("deploy/40-webhook-configurations.yaml");
    let validating = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .unwrap();
    let pods = validating["webhooks"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "validate.gpu-admission.io")
        .unwrap();
    let shipped = pods["matchConditions"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "create-or-guarded-change")
        .and_then(|c| c["expression"].as_str())
        .expect("the validating webhook has the create-or-guarded-change condition");
    assert_eq!(
        shipped, expected,
        "deploy/40-webhook-configurations.yaml's create-or-guarded-change is not the one MARKS makes; it must be:\n{expected}"
    );
}

/// The chart's condition is this file with its placeholders replaced by the chart's
/// values (`gpu-admission.guardedChangeExpression`); hack/check-chart.sh holds its
/// default rendering to deploy/. `GPU_ADMISSION_BLESS=1 cargo test marks` writes it.
#[test]
fn the_chart_ships_the_update_condition_the_list_makes() {
    let names = MarkNames {
        annotation_prefix: "__ANNOTATION_PREFIX__",
        type_annotation: "__TYPE_ANNOTATION__",
    };
    let expected = update_condition(names, Spelled::Placeholders) + "\n";
    let path = "charts/gpu-admission/files/guarded-change.cel";
    if std::env::var_os("GPU_ADMISSION_BLESS").is_some() {
        std::fs::write(Path::new(env!("CARGO_MANIFEST_DIR")).join(path), &expected).unwrap();
    }
    assert_eq!(
        repo(path),
        expected,
        "{path} is stale: run GPU_ADMISSION_BLESS=1 cargo test marks"
    );
}

/// Whether `rule` grants `verb` on `resource` of the core group.
fn grants(rule: &serde_yaml::Value, resource: &str, verb: &str) -> bool {
    let has = |field: &str, want: &str| {
        rule[field].as_sequence().is_some_and(|s| {
            s.iter()
                .any(|v| v.as_str() == Some(want) || v.as_str() == Some("*"))
        })
    };
    has("apiGroups", "") && has("resources", resource) && has("verbs", verb)
}

/// The rules of the ClusterRoles and Roles bound to `user` (a ServiceAccount) in `docs`.
fn rules_of<'d>(docs: &'d [serde_yaml::Value], user: &str) -> Vec<&'d serde_yaml::Value> {
    let Some(rest) = user.strip_prefix("system:serviceaccount:") else {
        return Vec::new();
    };
    let (namespace, name) = rest.split_once(':').unwrap();
    let bound_roles: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .filter(|d| {
            d["subjects"].as_sequence().is_some_and(|s| {
                s.iter().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == name
                        && s["namespace"] == namespace
                })
            })
        })
        .filter_map(|d| d["roleRef"]["name"].as_str())
        .collect();
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .filter(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| bound_roles.contains(&n))
        })
        .flat_map(|d| d["rules"].as_sequence().into_iter().flatten())
        .collect()
}

/// The RBAC deploy/ ships (the chart renders the same, hack/check-chart.sh) lets every
/// writer of a mark write it, and nobody it ships to others: the webhook servers'
/// identity writes no pod, and no role aggregated to tenants grants any write on pods.
#[test]
fn the_shipped_rbac_lets_each_marks_writers_write_it_and_nobody_else() {
    let config = deploy_config();
    let docs = yaml_documents("deploy/10-rbac.yaml");
    for mark in &MARKS {
        let users: &[String] = match mark.writer {
            Writer::Nobody => continue,
            Writer::Placement => &config.placement_writers,
            Writer::GpuAdmission => &config.queue.releasers,
        };
        let resource = match mark.field {
            Field::Condition(_) => "pods/status",
            _ => "pods",
        };
        let ours: Vec<&String> = users
            .iter()
            .filter(|u| u.starts_with("system:serviceaccount:gpu-admission:"))
            .collect();
        assert!(
            !ours.is_empty(),
            "{mark:?}: no writer of ours in the config"
        );
        for user in ours {
            let rules = rules_of(&docs, user);
            assert!(
                rules.iter().any(|r| grants(r, resource, "patch")),
                "{user} writes {mark:?} but deploy/10-rbac.yaml gives it no patch on {resource}"
            );
        }
    }
    let webhooks = rules_of(&docs, "system:serviceaccount:gpu-admission:gpu-admission");
    assert!(!webhooks.is_empty(), "the webhook servers' roles are found");
    for resource in ["pods", "pods/status"] {
        for verb in ["patch", "update", "create"] {
            assert!(
                !webhooks.iter().any(|r| grants(r, resource, verb)),
                "the webhook servers may {verb} {resource}"
            );
        }
    }
    let aggregated = docs.iter().filter(|d| {
        d["metadata"]["labels"].as_mapping().is_some_and(|l| {
            l.keys().any(|k| {
                k.as_str()
                    .is_some_and(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-"))
            })
        })
    });
    for role in aggregated {
        for rule in role["rules"].as_sequence().into_iter().flatten() {
            for resource in ["pods", "pods/status"] {
                for verb in ["patch", "update", "create"] {
                    assert!(
                        !grants(rule, resource, verb),
                        "a tenant role may {verb} {resource}"
                    );
                }
            }
        }
    }
}

/// Every `gpu-admission.io/` key the code names is classified: a mark of the list, a
/// key the tenant writes ([`TENANT_KEYS`]), the default model annotation, or the API
/// group of the GPUQuota. A new mark written without joining the list fails here.
#[test]
fn every_gpu_admission_key_the_code_names_is_classified() {
    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    // Tests name keys of their own (near misses among them).
    files.retain(|f| {
        let name = f.file_name().unwrap().to_string_lossy();
        !(name.ends_with("_tests.rs") || name == "tests.rs")
    });
    let marked: Vec<String> = MARKS
        .iter()
        .filter_map(|m| match m.field {
            Field::Annotation(Name::Fixed(k)) | Field::AnnotationPrefix(Name::Fixed(k)) => {
                Some(k.to_string())
            }
            Field::Gate(k) | Field::Condition(k) => Some(k.to_string()),
            _ => None,
        })
        .collect();
    let known = |key: &str| {
        marked.iter().any(|m| m == key)
            || TENANT_KEYS.contains(&key)
            || key == Config::default().type_annotation
            || key == "gpu-admission.io/v1alpha1"
    };
    let mut unknown = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices("\"gpu-admission.io/") {
            let key: String = text[at + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "-_./".contains(*c))
                .collect();
            if !known(&key) {
                unknown.push(format!("{}: {key}", file.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "keys not in MARKS nor TENANT_KEYS: {unknown:#?}"
    );
}
