//! Every manifest under deploy/ parses, names itself, and the webhook registrations
//! carry what the apiserver and the API server needs; the install keeps its doors apart (the
//! webhook Service reaches only the webhooks, nothing reaches an extender from outside
//! its pod), only the identity that places pods may patch or bind them, and keys are mounted only
//! where they are used. (A real API server dry-run is the e2e suite's job; this catches
//! typos and regressions before that.)
#![allow(clippy::unwrap_used)]

mod repo;
#[path = "e2e/support/shapes.rs"]
#[allow(dead_code)]
mod shapes;

use std::collections::{BTreeMap, BTreeSet};
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

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map_or(&[], Vec::as_slice)
}

fn strings(v: &Value) -> Vec<&str> {
    seq(v).iter().filter_map(Value::as_str).collect()
}

fn all_of_kind<'a>(docs: &'a [(PathBuf, Value)], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .map(|(_, d)| d)
        .filter(|d| str_at(d, &["kind"]) == Some(kind))
        .collect()
}

fn object<'a>(docs: &'a [(PathBuf, Value)], kind: &str, name: &str) -> &'a Value {
    all_of_kind(docs, kind)
        .into_iter()
        .find(|d| str_at(d, &["metadata", "name"]) == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/"))
}

fn pod_spec<'a>(docs: &'a [(PathBuf, Value)], deployment: &str) -> &'a Value {
    &object(docs, "Deployment", deployment)["spec"]["template"]["spec"]
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    seq(&pod["containers"])
        .iter()
        .find(|c| str_at(c, &["name"]) == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// A container's `--flag=value` argument.
fn arg<'a>(container: &'a Value, flag: &str) -> Option<&'a str> {
    strings(&container["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))
}

/// Does a `matchLabels`-style selector (or a Service's `selector`) select these labels?
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_mapping().unwrap();
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The Deployments' pod templates: (Deployment name, pod labels, pod spec).
fn pod_templates(docs: &[(PathBuf, Value)]) -> Vec<(&str, &Value, &Value)> {
    all_of_kind(docs, "Deployment")
        .into_iter()
        .map(|d| {
            (
                str_at(d, &["metadata", "name"]).unwrap(),
                &d["spec"]["template"]["metadata"]["labels"],
                &d["spec"]["template"]["spec"],
            )
        })
        .collect()
}

/// The container port a Service's `targetPort` means in a pod (a number, or a port name).
fn target_port(pod: &Value, target: &Value) -> Option<u64> {
    if let Some(number) = target.as_u64() {
        return Some(number);
    }
    let name = target.as_str()?;
    seq(&pod["containers"])
        .iter()
        .flat_map(|c| seq(&c["ports"]))
        .find(|p| str_at(p, &["name"]) == Some(name))
        .and_then(|p| p["containerPort"].as_u64())
}

/// The configured GPU-model annotation (`typeAnnotation` of gpu-admission-config).
fn type_annotation(docs: &[(PathBuf, Value)]) -> String {
    let config = object(docs, "ConfigMap", "gpu-admission-config");
    let text = str_at(config, &["data", "config.yaml"]).unwrap();
    let config: Value = serde_yaml::from_str(text).unwrap();
    str_at(&config, &["typeAnnotation"]).unwrap().to_string()
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
        assert_eq!(
            webhooks.len(),
            2,
            "{kind}: one for pods, one for ResourceClaims"
        );
        claim_hook_is_registered(kind, path, &webhooks[1]);
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
        assert_eq!(
            str_at(&hook["matchConditions"][0], &["name"]),
            Some("requests-gpu")
        );
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
        for field in ["limits", "requests"] {
            assert!(
                expression.contains(&format!(
                    "c.resources.{field}.exists(k, k.startsWith('nvidia.com/mig-'))"
                )),
                "{kind}: matchConditions miss MIG resources in {field}"
            );
        }
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

/// The ResourceClaim webhook of a configuration: the claim route, claim CREATEs only,
/// and every claim that asks for devices (GPU DeviceClasses are found at run time, so
/// the condition cannot list them).
fn claim_hook_is_registered(kind: &str, path: &str, hook: &Value) {
    let claims = format!("{path}/resourceclaims");
    assert_eq!(
        str_at(hook, &["clientConfig", "service", "path"]),
        Some(claims.as_str()),
        "{kind}"
    );
    let rule = &hook["rules"][0];
    assert_eq!(strings(&rule["apiGroups"]), ["resource.k8s.io"], "{kind}");
    assert_eq!(strings(&rule["resources"]), ["resourceclaims"], "{kind}");
    assert_eq!(strings(&rule["operations"]), ["CREATE"], "{kind}");
    let expression = str_at(&hook["matchConditions"][0], &["expression"]).unwrap();
    assert_eq!(
        expression,
        "has(object.spec.devices) && has(object.spec.devices.requests) && size(object.spec.devices.requests) > 0",
        "{kind}"
    );
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
    // The sidecar's extender door, on loopback; 3456 is its (unused) webhook door.
    assert_eq!(
        str_at(extender, &["urlPrefix"]),
        Some("https://127.0.0.1:3458/scheduler")
    );
    let sidecar = container(pod_spec(&docs, "gpu-scheduler"), "gpu-admission");
    assert_eq!(arg(sidecar, "--extender-address"), Some("127.0.0.1:3458"));
    assert_eq!(arg(sidecar, "--address"), Some("127.0.0.1:3456"));
    assert_eq!(
        str_at(extender, &["tlsConfig", "serverName"]),
        Some("gpu-admission.gpu-admission.svc")
    );
    assert_eq!(
        str_at(extender, &["tlsConfig", "caFile"]),
        Some("/etc/gpu-admission/tls/ca.crt")
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
    assert_eq!(
        plugin["arguments"]["extender.ignorable"].as_bool(),
        Some(false),
        "vc-scheduler takes extender.ignorable as a YAML bool only (it logs a string and ignores it)"
    );
}

#[test]
fn the_validating_webhook_sees_changes_of_marks_and_the_mutating_one_only_creates() {
    let docs = documents();
    let annotation = type_annotation(&docs);
    let validating =
        &object(&docs, "ValidatingWebhookConfiguration", "gpu-admission")["webhooks"][0];
    assert_eq!(
        strings(&validating["rules"][0]["operations"]),
        ["CREATE", "UPDATE"],
        "the server refuses an UPDATE that changes the GPU-model annotation; it must be sent"
    );
    let conditions: BTreeMap<&str, &str> = seq(&validating["matchConditions"])
        .iter()
        .map(|c| {
            (
                str_at(c, &["name"]).unwrap(),
                str_at(c, &["expression"]).unwrap(),
            )
        })
        .collect();
    assert!(conditions.contains_key("requests-gpu"));
    let change = conditions
        .get("create-or-guarded-change")
        .expect("UPDATEs are filtered to changes of what only gpu-admission writes");
    assert!(change.starts_with("request.operation == 'CREATE' || "));
    assert!(
        change.contains(&format!("'{annotation}' in object.metadata.annotations")),
        "the condition compares the {annotation} annotation: {change}"
    );
    // The writers the condition lets through are the config's, and the expression is
    // the one the list of marks makes for that config (the e2e suite runs it, with its
    // writers, on a real API server).
    let text = str_at(
        &object(&docs, "ConfigMap", "gpu-admission-config")["data"],
        &["config.yaml"],
    )
    .unwrap();
    let config: Value = serde_yaml::from_str(text).unwrap();
    let writers: Vec<&str> = config["placementWriters"]
        .as_sequence()
        .expect("deploy/20-config.yaml lists placementWriters")
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(
        writers,
        [
            "system:serviceaccount:gpu-admission:gpu-scheduler",
            "system:serviceaccount:kube-system:gpu-manager"
        ]
    );
    let releasers: Vec<&str> = config["queue"]["releasers"]
        .as_sequence()
        .expect("deploy/20-config.yaml lists queue.releasers")
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(
        releasers,
        ["system:serviceaccount:gpu-admission:gpu-scheduler"]
    );
    // The schedulers whose extended-resource claims are a pod's own: the binary's
    // default, kube-scheduler and the GPU scheduler that 50-gpu-scheduler.yaml runs.
    let schedulers: Vec<&str> = config["schedulerUsers"]
        .as_sequence()
        .expect("deploy/20-config.yaml lists schedulerUsers")
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(schedulers, gpu_admission::config::DEFAULT_SCHEDULER_USERS);
    let parsed = gpu_admission::config::Config::parse(text).unwrap();
    assert_eq!(*change, parsed.guarded_change_condition());

    let mutating = &object(&docs, "MutatingWebhookConfiguration", "gpu-admission")["webhooks"][0];
    assert_eq!(strings(&mutating["rules"][0]["operations"]), ["CREATE"]);
}

#[test]
fn no_service_reaches_an_extender_and_the_webhook_service_serves_only_webhooks() {
    let docs = documents();
    let pods = pod_templates(&docs);
    for service in all_of_kind(&docs, "Service") {
        let name = str_at(service, &["metadata", "name"]).unwrap();
        let selector = &service["spec"]["selector"];
        let selected: Vec<_> = pods
            .iter()
            .filter(|(_, labels, _)| selects(selector, labels))
            .collect();
        assert!(!selected.is_empty(), "Service {name} selects no pods");
        for port in seq(&service["spec"]["ports"]) {
            for (deployment, _, pod) in &selected {
                let target = target_port(pod, &port["targetPort"]).unwrap_or_else(|| {
                    panic!(
                        "Service {name}: {deployment} has no port {:?}",
                        port["targetPort"]
                    )
                });
                assert_ne!(
                    target, 3458,
                    "Service {name} reaches the extender of {deployment}"
                );
                if *deployment == "gpu-scheduler" {
                    assert_eq!(
                        target, 3457,
                        "Service {name} reaches more than the GPU scheduler's metrics"
                    );
                }
            }
        }
    }

    // The webhook Service: 443 -> the webhook door (3456), nothing else (metrics are on
    // gpu-admission-metrics).
    let webhook = object(&docs, "Service", "gpu-admission");
    let ports = seq(&webhook["spec"]["ports"]);
    assert_eq!(
        ports.len(),
        1,
        "the webhook Service has one port: {ports:?}"
    );
    assert_eq!(ports[0]["port"].as_u64(), Some(443));
    let pod = pod_spec(&docs, "gpu-admission");
    assert_eq!(target_port(pod, &ports[0]["targetPort"]), Some(3456));
    // The webhook servers leave their extender door on its loopback default.
    let server = container(pod, "gpu-admission");
    assert!(
        arg(server, "--extender-address").is_none_or(|a| a.starts_with("127.0.0.1:")),
        "the webhook servers' extender listener must stay on loopback"
    );
}

#[test]
fn the_metrics_service_covers_the_webhook_servers_and_the_scheduler_sidecar() {
    let docs = documents();
    let metrics = object(&docs, "Service", "gpu-admission-metrics");
    let ports = seq(&metrics["spec"]["ports"]);
    assert_eq!(ports.len(), 1);
    assert_eq!(str_at(&ports[0], &["name"]), Some("metrics"));
    assert_eq!(ports[0]["port"].as_u64(), Some(3457));
    let selected: BTreeSet<&str> = pod_templates(&docs)
        .into_iter()
        .filter(|(_, labels, _)| selects(&metrics["spec"]["selector"], labels))
        .map(|(name, _, pod)| {
            assert_eq!(target_port(pod, &ports[0]["targetPort"]), Some(3457));
            name
        })
        .collect();
    assert_eq!(selected, BTreeSet::from(["gpu-admission", "gpu-scheduler"]));
}

/// Does a (Cluster)Role rule let its holder change pods: patch them, or bind them (a
/// Binding sets spec.nodeName and copies its annotations onto the pod)?
fn writes_pods(rule: &Value) -> bool {
    let groups = strings(&rule["apiGroups"]);
    let resources = strings(&rule["resources"]);
    let verbs = strings(&rule["verbs"]);
    let core = groups.iter().any(|g| g.is_empty() || *g == "*");
    let patches = resources.iter().any(|r| *r == "pods" || *r == "*")
        && verbs.iter().any(|v| ["patch", "update", "*"].contains(v));
    let binds = resources
        .iter()
        .any(|r| ["pods/binding", "pods/*", "*"].contains(r))
        && verbs.iter().any(|v| ["create", "*"].contains(v));
    core && (patches || binds)
}

#[test]
fn only_the_scheduler_identity_may_write_pods() {
    let docs = documents();
    let mut roles: BTreeMap<(&str, &str), &Value> = BTreeMap::new();
    for kind in ["ClusterRole", "Role"] {
        for role in all_of_kind(&docs, kind) {
            roles.insert((kind, str_at(role, &["metadata", "name"]).unwrap()), role);
        }
    }
    // Roles the install binds but does not define: Kubernetes' own, none writes pods
    // (system:auth-delegator creates TokenReviews and SubjectAccessReviews: /explain).
    let builtin = [
        "system:kube-scheduler",
        "system:volume-scheduler",
        "extension-apiserver-authentication-reader",
        "system:auth-delegator",
    ];
    let mut pod_writers: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut quota_writers: BTreeSet<&str> = BTreeSet::new();
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for binding in all_of_kind(&docs, kind) {
            let role_kind = str_at(binding, &["roleRef", "kind"]).unwrap();
            let role_name = str_at(binding, &["roleRef", "name"]).unwrap();
            let Some(role) = roles.get(&(role_kind, role_name)) else {
                assert!(
                    builtin.contains(&role_name),
                    "{kind} {:?} binds {role_kind} {role_name}, neither defined here nor a known built-in",
                    binding["metadata"]["name"]
                );
                continue;
            };
            for subject in seq(&binding["subjects"]) {
                assert_eq!(str_at(subject, &["kind"]), Some("ServiceAccount"));
                let account = str_at(subject, &["name"]).unwrap();
                for rule in seq(&role["rules"]) {
                    if writes_pods(rule) {
                        pod_writers.insert((account, role_name));
                    }
                    if strings(&rule["resources"]).contains(&"gpuquotas/status")
                        && strings(&rule["verbs"]).contains(&"update")
                    {
                        quota_writers.insert(account);
                    }
                }
            }
        }
    }
    assert_eq!(
        pod_writers,
        BTreeSet::from([("gpu-scheduler", "gpu-admission-extender")]),
        "only the GPU scheduler's sidecar places pods, so only its identity may patch or bind them"
    );
    // Both keep what they need: reservations (webhooks) and multi-model charges (sidecar).
    assert_eq!(
        quota_writers,
        BTreeSet::from(["gpu-admission", "gpu-scheduler"])
    );
}

#[test]
fn keys_are_mounted_only_into_the_gpu_admission_containers() {
    let docs = documents();
    for (deployment, _, pod) in pod_templates(&docs) {
        let volumes: BTreeMap<&str, &Value> = seq(&pod["volumes"])
            .iter()
            .map(|v| (str_at(v, &["name"]).unwrap(), v))
            .collect();
        for c in seq(&pod["containers"]) {
            let name = str_at(c, &["name"]).unwrap();
            for mount in seq(&c["volumeMounts"]) {
                let volume = volumes[str_at(mount, &["name"]).unwrap()];
                let Some(secret) = volume.get("secret") else {
                    continue;
                };
                // A Secret volume without items holds every key, tls.key included.
                let keys = seq(&secret["items"])
                    .iter()
                    .map(|i| str_at(i, &["key"]).unwrap())
                    .collect::<Vec<_>>();
                let has_key = keys.is_empty() || keys.contains(&"tls.key");
                assert!(
                    !has_key || name == "gpu-admission",
                    "{deployment}/{name} mounts a private key (volume {:?})",
                    volume["name"]
                );
            }
        }
    }
    // The kube-scheduler verifies the extender: the CA, nothing else.
    let pod = pod_spec(&docs, "gpu-scheduler");
    let secrets: Vec<&Value> = seq(&container(pod, "kube-scheduler")["volumeMounts"])
        .iter()
        .filter_map(|m| {
            seq(&pod["volumes"])
                .iter()
                .find(|v| v["name"] == m["name"])
                .and_then(|v| v.get("secret"))
        })
        .collect();
    assert_eq!(secrets.len(), 1);
    assert_eq!(
        secrets[0]["items"],
        serde_yaml::from_str::<Value>("[{key: ca.crt, path: ca.crt}]").unwrap()
    );
}

#[test]
fn both_deployments_run_at_a_priority_class_defined_here() {
    let docs = documents();
    for deployment in ["gpu-admission", "gpu-scheduler"] {
        let class = str_at(pod_spec(&docs, deployment), &["priorityClassName"])
            .unwrap_or_else(|| panic!("{deployment} has no priorityClassName"));
        let class = object(&docs, "PriorityClass", class);
        assert_eq!(class["globalDefault"].as_bool(), Some(false));
        let value = class["value"].as_i64().unwrap();
        assert!(
            (1..1_000_000_000).contains(&value),
            "a user-defined class above 0 and below 1000000000, not {value}"
        );
    }
}

#[test]
fn network_policies_open_only_the_ports_that_must_be_reachable() {
    let docs = documents();
    let policies = all_of_kind(&docs, "NetworkPolicy");
    for policy in &policies {
        assert_eq!(
            strings(&policy["spec"]["policyTypes"]),
            ["Ingress"],
            "egress stays open (the API server's address differs per cluster)"
        );
    }
    for (deployment, labels, _) in pod_templates(&docs) {
        let applying: Vec<&&Value> = policies
            .iter()
            .filter(|p| selects(&p["spec"]["podSelector"]["matchLabels"], labels))
            .collect();
        assert!(
            !applying.is_empty(),
            "no NetworkPolicy selects {deployment}"
        );
        let (mut anywhere, mut monitoring) = (BTreeSet::new(), BTreeSet::new());
        for rule in applying.iter().flat_map(|p| seq(&p["spec"]["ingress"])) {
            let ports = seq(&rule["ports"])
                .iter()
                .map(|p| p["port"].as_u64().unwrap());
            match rule.get("from") {
                None => anywhere.extend(ports),
                Some(from) => {
                    // Only the monitoring namespace: no pod selector, no IP block.
                    let peers = seq(from);
                    assert_eq!(peers.len(), 1, "{deployment}: {rule:?}");
                    let namespace = &peers[0]["namespaceSelector"]["matchLabels"];
                    assert_eq!(
                        str_at(namespace, &["kubernetes.io/metadata.name"]),
                        Some("monitoring"),
                        "{deployment}: {rule:?}"
                    );
                    assert_eq!(peers[0].as_mapping().map(|m| m.len()), Some(1));
                    monitoring.extend(ports);
                }
            }
        }
        // From anywhere only the webhook door: the API server's address cannot be
        // predicted. Probes and metrics only from the monitoring namespace (the
        // kubelet's probes come from the pod's node, which policies do not apply to):
        // any pod that reaches them can flood them.
        let (expected_anywhere, expected_monitoring) = match deployment {
            "gpu-admission" => (BTreeSet::from([3456]), BTreeSet::from([3457])),
            "gpu-scheduler" => (BTreeSet::new(), BTreeSet::from([3457, 10259])),
            other => panic!("unexpected Deployment {other}"),
        };
        assert_eq!(
            anywhere, expected_anywhere,
            "{deployment}: ports open to anyone"
        );
        assert_eq!(
            monitoring, expected_monitoring,
            "{deployment}: ports open to the monitoring namespace"
        );
    }
    // The certificate Job's pods, too, accept nothing.
    let job =
        &object(&docs, "Job", "gpu-admission-certs")["spec"]["template"]["metadata"]["labels"];
    assert!(policies.iter().any(|p| {
        selects(&p["spec"]["podSelector"]["matchLabels"], job) && p["spec"].get("ingress").is_none()
    }));
}

/// deploy/grafana's dashboard ConfigMap carries the chart's dashboard JSON, unchanged,
/// under the label Grafana's dashboard sidecar looks for.
#[test]
fn the_dashboard_config_map_is_the_charts_dashboard() {
    let docs = documents();
    let map = object(&docs, "ConfigMap", "gpu-admission-dashboard");
    assert_eq!(
        str_at(map, &["metadata", "labels", "grafana_dashboard"]),
        Some("1")
    );
    let shipped = str_at(map, &["data", "gpu-admission.json"]).unwrap();
    let shipped: serde_json::Value = serde_json::from_str(shipped).unwrap();
    let chart = std::fs::read_to_string(repo::path(
        "charts/gpu-admission/dashboards/gpu-admission.json",
    ))
    .unwrap();
    let chart: serde_json::Value = serde_json::from_str(&chart).unwrap();
    assert_eq!(shipped, chart);
    assert_eq!(shipped["uid"], "gpu-admission");
}
