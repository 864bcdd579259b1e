//! The mutation (docs/design.md), pure: steer a GPU pod to the GPU scheduler and to nodes
//! of the models (and pools) it may use. Idempotent: applied to its own output it
//! changes nothing.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
};

use crate::cache::AnnotationKeys;
use crate::config::{Config, DEFAULT_SCHEDULER, SchedulerNamePolicy};
use crate::placement::models::ModelSource;
use crate::quota::NamespaceLimits;

/// The pod as it should be, or why it cannot be admitted as it is.
pub fn desired_pod(pod: &Pod, config: &Config, limits: &NamespaceLimits) -> Result<Pod, String> {
    let wanted = limits.wanted_models(pod, config);
    check_node_selector(pod, &config.model_label, &wanted.models, "GPU model")?;
    check_node_selector(pod, &config.pool_label, &limits.pools, "node pool")?;
    let mut desired = pod.clone();
    set_scheduler_name(&mut desired, config);
    drop_placement_annotations(&mut desired, config);
    if matches!(
        wanted.source,
        ModelSource::QuotaDefault | ModelSource::QuotaList
    ) {
        desired
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(config.type_annotation.clone(), wanted.models.join(","));
    }
    require(&mut desired, &config.model_label, &wanted.models);
    require(&mut desired, &config.pool_label, &limits.pools);
    Ok(desired)
}

/// A pod is placed after it is created, by the extender: placement annotations on a pod
/// being created are forged (or stale, copied from an old pod) and would book GPUs in
/// gpu-admission's view, and gpu-manager's, that no placement chose.
fn drop_placement_annotations(pod: &mut Pod, config: &Config) {
    let keys = AnnotationKeys::new(&config.resources.annotation_prefix);
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|key, _| !keys.is_placement(key));
    }
}

fn set_scheduler_name(pod: &mut Pod, config: &Config) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let current = spec.scheduler_name.as_deref().unwrap_or_default();
    let replace = match config.scheduler_name_policy {
        SchedulerNamePolicy::Always => true,
        SchedulerNamePolicy::IfDefault => current.is_empty() || current == DEFAULT_SCHEDULER,
        SchedulerNamePolicy::Never => false,
    };
    if replace {
        spec.scheduler_name = Some(config.scheduler_name.clone());
    }
}

/// A nodeSelector on `label` must name one of `allowed` (when anything is required).
fn check_node_selector(
    pod: &Pod,
    label: &str,
    allowed: &[String],
    what: &str,
) -> Result<(), String> {
    let selected = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|s| s.get(label));
    match selected {
        Some(value) if !allowed.is_empty() && !allowed.contains(value) => Err(format!(
            "the pod's nodeSelector {label}={value} conflicts with the {what} it may use ({})",
            allowed.join(", ")
        )),
        _ => Ok(()),
    }
}

/// Add `label In values` to every required node-selector term (a user's own terms keep
/// their meaning: they are ORed, so each must carry it), or a new term when there is none.
fn require(pod: &mut Pod, label: &str, values: &[String]) {
    if values.is_empty() {
        return;
    }
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let expression = NodeSelectorRequirement {
        key: label.to_string(),
        operator: "In".to_string(),
        values: Some(values.to_vec()),
    };
    let required = spec
        .affinity
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
        if !expressions.contains(&expression) {
            expressions.push(expression.clone());
        }
    }
}

/// The JSON Patch that turns `before` into `after`, computed typed-to-typed so fields
/// the typed Pod does not know are never touched.
pub fn patch_for(before: &Pod, after: &Pod) -> json_patch::Patch {
    let before = serde_json::to_value(before).unwrap_or_default();
    let after = serde_json::to_value(after).unwrap_or_default();
    json_patch::diff(&before, &after)
}
