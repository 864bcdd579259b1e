//! The mutation (docs/design.md), pure: steer a GPU pod to the GPU scheduler and to nodes
//! of the models (and pools) it may use. Idempotent: applied to its own output it
//! changes nothing.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSchedulingGate,
};
use serde_json::Value;

use crate::config::{Config, DEFAULT_SCHEDULER, SchedulerNamePolicy};
use crate::marks;
use crate::placement::models::ModelSource;
use crate::quota::queue::QUOTA_GATE;
use crate::quota::{ChargedAt, NamespaceLimits};

/// The fields of a pod the mutation sets, and nothing else: the annotations and, when
/// the pod has a spec, its affinity and scheduler name.
#[derive(Debug, Clone, PartialEq)]
struct Steered {
    annotations: Option<BTreeMap<String, String>>,
    spec: Option<SpecPart>,
}

#[derive(Debug, Clone, PartialEq)]
struct SpecPart {
    affinity: Option<Affinity>,
    scheduler_name: Option<String>,
    scheduling_gates: Option<Vec<PodSchedulingGate>>,
}

impl Steered {
    fn of(pod: &Pod) -> Self {
        Steered {
            annotations: pod.metadata.annotations.clone(),
            spec: pod.spec.as_ref().map(|spec| SpecPart {
                affinity: spec.affinity.clone(),
                scheduler_name: spec.scheduler_name.clone(),
                scheduling_gates: spec.scheduling_gates.clone(),
            }),
        }
    }

    fn apply(self, pod: &mut Pod) {
        pod.metadata.annotations = self.annotations;
        if let (Some(spec), Some(part)) = (pod.spec.as_mut(), self.spec) {
            spec.affinity = part.affinity;
            spec.scheduler_name = part.scheduler_name;
            spec.scheduling_gates = part.scheduling_gates;
        }
    }
}

/// The pod as it should be, or why it cannot be admitted as it is.
fn desired_pod(
    pod: &Pod,
    config: &Config,
    limits: &NamespaceLimits,
    nodes: &GpuNodes,
) -> Result<Pod, SelectorConflict> {
    let steered = steer(pod, config, limits, nodes)?;
    let mut desired = pod.clone();
    steered.apply(&mut desired);
    Ok(desired)
}

/// The JSON Patch (RFC 6902) that turns `pod` into its [`desired_pod`], or why it
/// cannot be admitted as it is. Computed typed-to-typed, so fields the typed Pod does
/// not know are never touched, and only on the fields the mutation sets: every other
/// field is the same on both sides and adds nothing to the patch, and copying,
/// serializing and comparing whole pods was most of the cost of a `/mutate`
/// (docs/benchmarks.md). The patch is the one `json_patch::diff` of the whole pods
/// gives, operation for operation.
pub(crate) fn mutation(
    pod: &Pod,
    config: &Config,
    limits: &NamespaceLimits,
    nodes: &GpuNodes,
) -> Result<Patch, SelectorConflict> {
    let after = steer(pod, config, limits, nodes)?;
    let mut patch = Patch::default();
    // In the order a diff of the whole pods lists them: by key, depth first.
    diff_annotations(
        pod.metadata.annotations.as_ref(),
        after.annotations.as_ref(),
        &mut patch,
    );
    if let (Some(before), Some(after)) = (&pod.spec, &after.spec) {
        let (b, a) = (before.affinity.as_ref(), after.affinity.as_ref());
        diff_field(["spec", "affinity"], b, a, &mut patch);
        let (b, a) = (
            before.scheduler_name.as_ref(),
            after.scheduler_name.as_ref(),
        );
        diff_field(["spec", "schedulerName"], b, a, &mut patch);
        let (b, a) = (
            before.scheduling_gates.as_ref(),
            after.scheduling_gates.as_ref(),
        );
        diff_field(["spec", "schedulingGates"], b, a, &mut patch);
    }
    debug_assert_eq!(
        Ok(&patch),
        desired_pod(pod, config, limits, nodes)
            .map(|d| diff(pod, &d))
            .as_ref(),
        "the mutation's patch is not the diff of the whole pods"
    );
    Ok(patch)
}

/// What `pod` should be, in the fields the mutation sets: steered to the GPU scheduler
/// and to nodes of the models and pools it may use.
fn steer(
    pod: &Pod,
    config: &Config,
    limits: &NamespaceLimits,
    nodes: &GpuNodes,
) -> Result<Steered, SelectorConflict> {
    let wanted = config.wanted_models(pod, limits);
    check_node_selector(pod, &config.model_label, &wanted.models, "GPU model")?;
    check_node_selector(pod, &config.pool_label, &limits.pools, "node pool")?;
    let mut steered = Steered::of(pod);
    if let Some(spec) = steered.spec.as_mut() {
        set_scheduler_name(&mut spec.scheduler_name, config);
        // The quota queue's gate is ours to set (below), never the pod's: a pod gated
        // by its author would wait for a release no quota plans.
        if let Some(gates) = spec.scheduling_gates.as_mut() {
            gates.retain(|g| g.name != QUOTA_GATE);
        }
    }
    drop_marks(&mut steered.annotations, config);
    if matches!(
        wanted.source,
        ModelSource::QuotaDefault | ModelSource::QuotaList
    ) {
        steered
            .annotations
            .get_or_insert_with(Default::default)
            .insert(config.type_annotation.clone(), wanted.models.join(","));
    }
    if let Some(spec) = steered.spec.as_mut() {
        let labels = with_mig_labels(&wanted.models, &nodes.mig_labels);
        require(&mut spec.affinity, &config.model_label, &labels);
        require(&mut spec.affinity, &config.pool_label, &limits.pools);
        if nodes.dra_unlabelled {
            allow_unlabelled(&mut spec.affinity, &config.model_label);
        }
        if let ChargedAt::Admission { model } = ChargedAt::of(&wanted.models)
            && limits.queues(model)
            && pod.spec.as_ref().is_none_or(|s| s.node_name.is_none())
        {
            gate(&mut spec.scheduling_gates);
        }
    }
    Ok(steered)
}

/// A pod that wants one model a `Queue` quota lists waits in the quota queue: it is
/// created with the gate [`QUOTA_GATE`], which only gpu-admission removes, once it has
/// charged the pod (docs/quota.md). A pod created on a node (`spec.nodeName`) cannot be
/// gated, and one that accepts several models is charged when it is placed: both are
/// judged at creation as under `Deny`.
fn gate(gates: &mut Option<Vec<PodSchedulingGate>>) {
    let gates = gates.get_or_insert_with(Vec::new);
    if !gates.iter().any(|g| g.name == QUOTA_GATE) {
        gates.push(PodSchedulingGate {
            name: QUOTA_GATE.to_string(),
        });
    }
}

/// What the cluster's GPU nodes say about steering: the single-strategy MIG labels they
/// carry, and whether GPUs may come from DRA on nodes without a model label.
#[derive(Debug, Clone, Default)]
pub(crate) struct GpuNodes {
    pub(crate) mig_labels: Vec<String>,
    /// A DeviceClass serves an extended resource (DRA-backed extended resources): its
    /// nodes may have no model label (the ResourceSlices name their GPUs' model), so a
    /// pod may also go to a node without one, where the extender admits only nodes whose
    /// published GPUs are of the pod's model.
    pub(crate) dra_unlabelled: bool,
}

/// Each node selector term that requires a model label gets a twin that requires, in
/// its stead, that the node has none (the extender checks such nodes' published GPUs).
fn allow_unlabelled(affinity: &mut Option<Affinity>, label: &str) {
    let required = affinity
        .as_mut()
        .and_then(|a| a.node_affinity.as_mut())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_mut()
        });
    let Some(required) = required else {
        return;
    };
    let mut twins = Vec::new();
    for term in &required.node_selector_terms {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        if !expressions
            .iter()
            .any(|e| e.key == label && e.operator == "In")
        {
            continue;
        }
        let mut twin = term.clone();
        for expression in twin.match_expressions.iter_mut().flatten() {
            if expression.key == label && expression.operator == "In" {
                expression.operator = "DoesNotExist".into();
                expression.values = None;
            }
        }
        if !required.node_selector_terms.contains(&twin) && !twins.contains(&twin) {
            twins.push(twin);
        }
    }
    required.node_selector_terms.extend(twins);
}

/// The node labels of `models`: each model, followed by the single-strategy MIG labels
/// of it the cluster's nodes carry (`<model>-MIG-<profile>`, `mig_labels`), so that a pod
/// wanting a model can reach its sliced GPUs (docs/devices.md).
fn with_mig_labels(models: &[String], mig_labels: &[String]) -> Vec<String> {
    let mut labels = models.to_vec();
    for label in mig_labels {
        let model = crate::placement::mig::model_of(label);
        if models.iter().any(|m| m == model) && !labels.contains(label) {
            labels.push(label.clone());
        }
    }
    labels
}

/// The marks only gpu-admission (or gpu-manager) writes are written after a pod is
/// created (`crate::marks`): on a pod being created they are forged, or stale, copied
/// from an old pod. Placement annotations would book GPUs in gpu-admission's view, and
/// gpu-manager's, that no placement chose; a plan's holds would keep GPUs from others.
fn drop_marks(annotations: &mut Option<BTreeMap<String, String>>, config: &Config) {
    if let Some(annotations) = annotations.as_mut() {
        let names = config.mark_names();
        annotations.retain(|key, _| marks::dropped_at_create_as(key, names).is_none());
    }
}

fn set_scheduler_name(scheduler_name: &mut Option<String>, config: &Config) {
    let current = scheduler_name.as_deref().unwrap_or_default();
    let replace = match config.scheduler_name_policy {
        SchedulerNamePolicy::Always => true,
        SchedulerNamePolicy::IfDefault => current.is_empty() || current == DEFAULT_SCHEDULER,
        SchedulerNamePolicy::Never => false,
    };
    if replace {
        *scheduler_name = Some(config.scheduler_name.clone());
    }
}

/// Why a pod cannot be admitted as it is (a denial, not an error of ours): its
/// nodeSelector names a GPU model or node pool the namespace may not use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the pod's nodeSelector {label}={value} conflicts with the {what} it may use ({})",
    allowed.join(", ")
)]
pub(crate) struct SelectorConflict {
    label: String,
    value: String,
    what: &'static str,
    allowed: Vec<String>,
}

/// A nodeSelector on `label` must name one of `allowed` (when anything is required).
fn check_node_selector(
    pod: &Pod,
    label: &str,
    allowed: &[String],
    what: &'static str,
) -> Result<(), SelectorConflict> {
    let selected = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|s| s.get(label));
    match selected {
        Some(value) if !allowed.is_empty() && !allowed.contains(value) => Err(SelectorConflict {
            label: label.to_string(),
            value: value.clone(),
            what,
            allowed: allowed.to_vec(),
        }),
        _ => Ok(()),
    }
}

/// Add `label In values` to every required node-selector term (a user's own terms keep
/// their meaning: they are ORed, so each must carry it), or a new term when there is none.
fn require(affinity: &mut Option<Affinity>, label: &str, values: &[String]) {
    if values.is_empty() {
        return;
    }
    let expression = NodeSelectorRequirement {
        key: label.to_string(),
        operator: "In".to_string(),
        values: Some(values.to_vec()),
    };
    let required = affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        let expressions = term.match_expressions.get_or_insert_with(Vec::new);
        // A twin for nodes without the label (`allow_unlabelled`) stays one.
        let unlabelled =
            |e: &NodeSelectorRequirement| e.key == label && e.operator == "DoesNotExist";
        if !expressions.contains(&expression) && !expressions.iter().any(unlabelled) {
            expressions.push(expression.clone());
        }
    }
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// What `json_patch::diff` of the whole pods has for their annotations (a flat map of
/// strings), without building either as JSON: new keys are added, changed ones
/// replaced, in key order, then missing ones removed.
fn diff_annotations(
    before: Option<&BTreeMap<String, String>>,
    after: Option<&BTreeMap<String, String>>,
    patch: &mut Patch,
) {
    let (Some(before), Some(after)) = (before, after) else {
        return diff_field(["metadata", "annotations"], before, after, patch);
    };
    for (key, value) in after {
        let path = || pointer(&["metadata", "annotations", key]);
        let value_now = || Value::String(value.clone());
        match before.get(key) {
            None => patch.0.push(PatchOperation::Add(AddOperation {
                path: path(),
                value: value_now(),
            })),
            Some(old) if old != value => patch.0.push(PatchOperation::Replace(ReplaceOperation {
                path: path(),
                value: value_now(),
            })),
            Some(_) => {}
        }
    }
    for key in before.keys().filter(|key| !after.contains_key(*key)) {
        patch
            .0
            .push(PatchOperation::Remove(json_patch::RemoveOperation {
                path: pointer(&["metadata", "annotations", key]),
            }));
    }
}

/// Add to `patch` what `json_patch::diff` of the whole pods has for field `at` (a
/// field of a field of the pod), without building the field as JSON when it is the
/// same on both sides, or diffing it when it is new (then it is added whole).
fn diff_field<T: serde::Serialize + PartialEq>(
    at: [&str; 2],
    before: Option<&T>,
    after: Option<&T>,
    patch: &mut Patch,
) {
    let value = |field: &T| serde_json::to_value(field).unwrap_or_default();
    match (before, after) {
        (before, after) if before == after => {}
        (None, Some(after)) => patch.0.push(PatchOperation::Add(AddOperation {
            path: pointer(&at),
            value: value(after),
        })),
        (before, after) => {
            let nested = |field: Option<&T>| {
                let inner: serde_json::Map<_, _> = field
                    .map(|f| (at[1].to_string(), value(f)))
                    .into_iter()
                    .collect();
                serde_json::json!({ at[0]: inner })
            };
            patch
                .0
                .extend(json_patch::diff(&nested(before), &nested(after)).0);
        }
    }
}

/// `json_patch::diff` of two whole pods: what [`mutation`]'s patch must equal.
fn diff(before: &Pod, after: &Pod) -> Patch {
    let before = serde_json::to_value(before).unwrap_or_default();
    let after = serde_json::to_value(after).unwrap_or_default();
    json_patch::diff(&before, &after)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    /// Pods that exercise every change `desired_pod` makes, and none.
    fn pods() -> Vec<Value> {
        let gpu = json!([{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}],
            "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}]);
        let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]}});
        vec![
            json!({"metadata": {"name": "plain"}, "spec": {"containers": gpu}}),
            json!({"metadata": {"name": "typed", "labels": {"a": "b"},
                    "annotations": {"gpu-admission.io/gpu-type": "A100", "tencent.com/predicate-node": "n1",
                        "tencent.com/predicate-gpu-idx-0": "0", "other": "kept"}},
                "spec": {"containers": gpu, "schedulerName": "default-scheduler", "affinity": affinity,
                    "initContainers": gpu, "nodeSelector": {"nvidia.com/gpu.product": "A100"}}}),
            json!({"metadata": {"name": "other-scheduler", "annotations": {}},
                "spec": {"containers": gpu, "schedulerName": "volcano", "affinity": {"podAffinity": {}}}}),
            json!({"metadata": {"name": "no-spec"}}),
            json!({"metadata": {"name": "gated"}, "spec": {"containers": gpu,
                "schedulingGates": [{"name": "example.com/mine"}]}}),
            json!({"metadata": {"name": "forged", "annotations": {"gpu-admission.io/defrag-hold": "{}",
                    "gpu-admission.io/borrowed": "T4", "gpu-admission.io/quota-released": "x"}},
                "spec": {"containers": gpu, "schedulingGates": [{"name": "gpu-admission.io/quota"}]}}),
        ]
    }

    /// Every mark a pod's author may not write (`crate::marks`) is dropped from a pod
    /// being created: its annotations, and the quota gate unless the namespace's quota
    /// queues the pod; the model annotation is the author's word.
    #[test]
    fn a_pod_is_created_without_the_marks_only_gpu_admission_writes() {
        let config = Config::default();
        let nodes = GpuNodes::default();
        let mut annotations: serde_json::Map<String, Value> =
            crate::marks::mark_keys(config.mark_names())
                .into_iter()
                .filter(|m| {
                    matches!(
                        m.place,
                        crate::marks::Place::Annotation | crate::marks::Place::AnnotationPrefix
                    )
                })
                .map(|m| {
                    (
                        format!(
                            "{}{}",
                            m.key,
                            if m.place == crate::marks::Place::AnnotationPrefix {
                                "x"
                            } else {
                                ""
                            }
                        ),
                        json!("forged"),
                    )
                })
                .collect();
        annotations.insert("gpu-admission.io/gpu-type".into(), json!("Tesla-T4"));
        annotations.insert("team".into(), json!("kept"));
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "schedulingGates": [{"name": "gpu-admission.io/quota"}, {"name": "example.com/mine"}]}}))
        .unwrap();
        let desired = desired_pod(&pod, &config, &limits(true), &nodes).unwrap();
        let kept: Vec<&String> = desired
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(kept, ["gpu-admission.io/gpu-type", "team"]);
        assert_eq!(
            gates(&desired),
            ["example.com/mine"],
            "a Deny quota: no queue gate"
        );
        let queued = desired_pod(&pod, &config, &queueing(), &nodes).unwrap();
        assert_eq!(
            gates(&queued),
            ["example.com/mine", "gpu-admission.io/quota"]
        );
    }

    fn limits(quota: bool) -> NamespaceLimits {
        match quota {
            false => NamespaceLimits::default(),
            true => NamespaceLimits {
                has_quota: true,
                default_type: Some("Tesla-T4".into()),
                models: vec!["Tesla-T4".into(), "A100".into()],
                profile_caps: Vec::new(),
                pools: vec!["pool-a".into()],
                queued_models: Vec::new(),
            },
        }
    }

    /// The namespace of `limits(true)` whose T4 quota says `onExceed: Queue`.
    fn queueing() -> NamespaceLimits {
        NamespaceLimits {
            queued_models: vec!["Tesla-T4".into()],
            ..limits(true)
        }
    }

    fn gates(pod: &Pod) -> Vec<&str> {
        let gates = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_deref());
        gates
            .unwrap_or_default()
            .iter()
            .map(|g| g.name.as_str())
            .collect()
    }

    #[test]
    fn a_pod_of_a_queued_model_is_created_behind_the_quota_gate() {
        let config = Config::default();
        let nodes = GpuNodes::default();
        let desired = |pod: Value| {
            let pod: Pod = serde_json::from_value(pod).unwrap();
            desired_pod(&pod, &config, &queueing(), &nodes).unwrap()
        };
        let gpu = json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
        // The namespace's default model (T4) is queued; its own gates are kept.
        let pod = desired(
            json!({"metadata": {"name": "p"}, "spec": {"containers": gpu,
            "schedulingGates": [{"name": "example.com/mine"}]}}),
        );
        assert_eq!(gates(&pod), ["example.com/mine", "gpu-admission.io/quota"]);
        let again = desired_pod(&pod, &config, &queueing(), &nodes).unwrap();
        assert_eq!(gates(&again), gates(&pod), "added once");
        // A100 is not queued (its quota says Deny).
        let a100 = desired(json!({"metadata": {"name": "p",
            "annotations": {"gpu-admission.io/gpu-type": "A100"}}, "spec": {"containers": gpu}}));
        assert!(gates(&a100).is_empty());
        // A pod accepting both is charged at placement, and one created on a node cannot
        // be gated: neither waits.
        let both = desired(json!({"metadata": {"name": "p",
            "annotations": {"gpu-admission.io/gpu-type": "A100,Tesla-T4"}}, "spec": {"containers": gpu}}));
        assert!(gates(&both).is_empty());
        let bound = desired(json!({"metadata": {"name": "p"},
            "spec": {"containers": gpu, "nodeName": "n1"}}));
        assert!(gates(&bound).is_empty());
    }

    #[test]
    fn the_mutations_patch_is_the_diff_of_the_whole_pods() {
        for policy in ["always", "ifDefault", "never"] {
            let config = Config::parse(&format!("schedulerNamePolicy: {policy}")).unwrap();
            for pod in pods() {
                let pod: Pod = serde_json::from_value(pod).unwrap();
                let dra = GpuNodes {
                    mig_labels: Vec::new(),
                    dra_unlabelled: true,
                };
                for (quota, limits, nodes) in [
                    (false, limits(false), GpuNodes::default()),
                    (true, limits(true), GpuNodes::default()),
                    (true, limits(true), dra.clone()),
                    (true, queueing(), GpuNodes::default()),
                ] {
                    let Ok(desired) = desired_pod(&pod, &config, &limits, &nodes) else {
                        continue;
                    };
                    let patch = mutation(&pod, &config, &limits, &nodes).unwrap();
                    assert_eq!(patch, diff(&pod, &desired), "{pod:?}");
                    assert_eq!(
                        patch.0.is_empty(),
                        pod == desired,
                        "{policy} {quota} {pod:?}"
                    );
                    let again = desired_pod(&desired, &config, &limits, &nodes);
                    assert_eq!(again.as_ref(), Ok(&desired), "idempotent: {nodes:?}");
                }
            }
        }
    }

    /// With DRA-backed extended resources, a GPU pod may also go to a node without a
    /// model label (the extender admits only those whose published GPUs are its model).
    #[test]
    fn with_dra_extended_resources_a_pod_may_go_to_nodes_without_a_model_label() {
        let config = Config::default();
        let pod: Pod = serde_json::from_value(pods()[0].clone()).unwrap();
        let nodes = GpuNodes {
            mig_labels: Vec::new(),
            dra_unlabelled: true,
        };
        let desired = desired_pod(&pod, &config, &limits(true), &nodes).unwrap();
        let affinity = serde_json::to_value(desired.spec.unwrap().affinity).unwrap();
        let terms = &affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(
            *terms,
            json!([
                {"matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]},
                    {"key": "gpu-admission.io/pool", "operator": "In", "values": ["pool-a"]}]},
                {"matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"},
                    {"key": "gpu-admission.io/pool", "operator": "In", "values": ["pool-a"]}]}
            ])
        );
    }

    #[test]
    fn a_model_reaches_the_single_strategy_mig_nodes_of_that_model() {
        let config = Config::default();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
        .unwrap();
        let mig_labels = [
            "A100-MIG-1g.5gb".to_string(),
            "A100-MIG-3g.20gb".to_string(),
            "Tesla-T4-MIG-1g.5gb".to_string(),
        ];
        let desired = desired_pod(
            &pod,
            &config,
            &limits(true),
            &GpuNodes {
                mig_labels: mig_labels.to_vec(),
                dra_unlabelled: false,
            },
        )
        .unwrap();
        let affinity = serde_json::to_value(desired.spec.unwrap().affinity).unwrap();
        let terms = &affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        // The namespace's default model is Tesla-T4: it and its slices, nothing else.
        assert_eq!(
            terms[0]["matchExpressions"][0]["values"],
            json!(["Tesla-T4", "Tesla-T4-MIG-1g.5gb"]),
            "{affinity}"
        );
    }
}
