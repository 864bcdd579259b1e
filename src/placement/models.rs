//! Which GPU models (and pools) a pod may use (docs/design.md).

use k8s_openapi::api::core::v1::Pod;

use super::fit::Misfit;
use super::node::NodeGpus;

/// Where the pod's wanted models came from; the webhooks report and record this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelSource {
    Annotation,
    NodeSelector,
    NodeAffinity,
    QuotaDefault,
    QuotaList,
    /// No model constraint at all: any GPU will do.
    Untyped,
}

/// The models a pod accepts, first match wins. Quota-derived sources are the
/// caller's to supply (`quota_default`, `quota_models`) since quotas live in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedModels {
    pub(crate) models: Vec<String>,
    pub(crate) source: ModelSource,
}

impl WantedModels {
    /// Exactly `model`, as if the pod named it: a charge fixed to one model (a node's
    /// model at placement, a claim's pinned model).
    pub(crate) fn one(model: impl Into<String>) -> Self {
        WantedModels {
            models: vec![model.into()],
            source: ModelSource::Annotation,
        }
    }

    pub fn of_pod(
        pod: &Pod,
        type_annotation: &str,
        model_label: &str,
        quota_default: Option<&str>,
        quota_models: &[String],
    ) -> WantedModels {
        let own = from_annotation(pod, type_annotation)
            .map(|m| (m, ModelSource::Annotation))
            .or_else(|| {
                from_node_selector(pod, model_label).map(|m| (m, ModelSource::NodeSelector))
            })
            .or_else(|| from_affinity(pod, model_label).map(|m| (m, ModelSource::NodeAffinity)));
        match own {
            Some((models, source)) => WantedModels { models, source },
            None => Self::from_quota(quota_default, quota_models),
        }
    }

    /// The models of a pod whose own choice (`own`, from [`WantedModels::of_pod`] without
    /// quota) is already known, e.g. the cache's copy of it: the same rule, in one place.
    pub(crate) fn of_own(
        own: &[String],
        quota_default: Option<&str>,
        quota_models: &[String],
    ) -> Self {
        if own.is_empty() {
            Self::from_quota(quota_default, quota_models)
        } else {
            WantedModels {
                models: own.to_vec(),
                source: ModelSource::Annotation,
            }
        }
    }

    /// [`WantedModels::of_own`]'s models without copying them (usage counting walks
    /// every pod of a namespace).
    pub(crate) fn resolve<'a>(
        own: &'a [String],
        quota_default: Option<&'a String>,
        quota_models: &'a [String],
    ) -> &'a [String] {
        match (own, quota_default) {
            ([], Some(default)) => std::slice::from_ref(default),
            ([], None) => quota_models,
            (own, _) => own,
        }
    }

    fn from_quota(quota_default: Option<&str>, quota_models: &[String]) -> Self {
        let (models, source) = match (quota_default, quota_models) {
            (Some(default), _) => (vec![default.to_string()], ModelSource::QuotaDefault),
            (None, []) => (Vec::new(), ModelSource::Untyped),
            (None, listed) => (listed.to_vec(), ModelSource::QuotaList),
        };
        WantedModels { models, source }
    }

    /// Whether a node of this model is acceptable: its label is wanted, or it is a
    /// single-strategy MIG node (`<model>-MIG-<profile>`) of a wanted model.
    pub(crate) fn admits(&self, node: &NodeGpus) -> Result<(), Misfit> {
        if self.models.is_empty() {
            return Ok(());
        }
        match node.model.as_deref() {
            Some(label) if self.accepts_label(label) => Ok(()),
            _ => Err(Misfit::ModelNotWanted {
                model: node.model.clone(),
                wanted: self.models.as_slice().into(),
            }),
        }
    }
}

impl WantedModels {
    /// Whether a node labelled `label` is acceptable (see [`WantedModels::admits`]).
    /// (Asked of every candidate node: prefix comparisons, no search of the label.)
    fn accepts_label(&self, label: &str) -> bool {
        self.models
            .iter()
            .any(|m| match label.strip_prefix(m.as_str()) {
                Some("") => true,
                Some(rest) => rest
                    .strip_prefix(super::mig::SINGLE_INFIX)
                    .is_some_and(|profile| !profile.is_empty()),
                None => false,
            })
    }
}

/// Node pools a namespace may use; empty means any.
pub(crate) fn pool_admits(pools: &[String], node: &NodeGpus) -> Result<(), Misfit> {
    if pools.is_empty() {
        return Ok(());
    }
    match node.pool.as_deref() {
        Some(pool) if pools.iter().any(|p| p == pool) => Ok(()),
        _ => Err(Misfit::PoolNotAllowed {
            pool: node.pool.clone(),
            allowed: pools.into(),
        }),
    }
}

fn split_list(text: &str) -> Option<Vec<String>> {
    let models: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    (!models.is_empty()).then_some(models)
}

fn from_annotation(pod: &Pod, key: &str) -> Option<Vec<String>> {
    split_list(pod.metadata.annotations.as_ref()?.get(key)?)
}

fn from_node_selector(pod: &Pod, label: &str) -> Option<Vec<String>> {
    let value = pod.spec.as_ref()?.node_selector.as_ref()?.get(label)?;
    Some(vec![value.clone()])
}

/// The first `In` expression on the model label in a required node-selector term.
fn from_affinity(pod: &Pod, label: &str) -> Option<Vec<String>> {
    let required = pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?;
    required
        .node_selector_terms
        .iter()
        .flat_map(|term| term.match_expressions.iter().flatten())
        .find(|e| e.key == label && e.operator == "In")
        .and_then(|e| e.values.clone())
        .filter(|values| !values.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::testing::node;

    const ANNOTATION: &str = "gpu-admission.io/gpu-type";
    const LABEL: &str = "nvidia.com/gpu.product";

    fn pod_from(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn annotation_wins_then_selector_then_affinity_then_quota() {
        let annotated = pod_from(serde_json::json!({
            "metadata": {"annotations": {ANNOTATION: "V100M16, V100M32"}},
            "spec": {"containers": [], "nodeSelector": {LABEL: "T4"}}
        }));
        let wanted = WantedModels::of_pod(&annotated, ANNOTATION, LABEL, None, &[]);
        assert_eq!(wanted.models, ["V100M16", "V100M32"]);
        assert_eq!(wanted.source, ModelSource::Annotation);

        let selected = pod_from(
            serde_json::json!({"spec": {"containers": [], "nodeSelector": {LABEL: "T4"}}}),
        );
        let wanted = WantedModels::of_pod(&selected, ANNOTATION, LABEL, Some("A100"), &[]);
        assert_eq!(
            (wanted.models, wanted.source),
            (vec!["T4".to_string()], ModelSource::NodeSelector)
        );

        let affine = pod_from(
            serde_json::json!({"spec": {"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": LABEL, "operator": "In", "values": ["A10", "T4"]}]}
            ]}}}}}),
        );
        let wanted = WantedModels::of_pod(&affine, ANNOTATION, LABEL, None, &[]);
        assert_eq!(
            (wanted.models, wanted.source),
            (
                vec!["A10".to_string(), "T4".to_string()],
                ModelSource::NodeAffinity
            )
        );

        let plain = pod_from(serde_json::json!({"spec": {"containers": []}}));
        let listed = vec!["T4".to_string(), "A10".to_string()];
        assert_eq!(
            WantedModels::of_pod(&plain, ANNOTATION, LABEL, Some("T4"), &listed).source,
            ModelSource::QuotaDefault
        );
        assert_eq!(
            WantedModels::of_pod(&plain, ANNOTATION, LABEL, None, &listed).models,
            listed
        );
        assert_eq!(
            WantedModels::of_pod(&plain, ANNOTATION, LABEL, None, &[]).source,
            ModelSource::Untyped
        );
    }

    #[test]
    fn admits_only_wanted_models_and_pools() {
        let mut t4 = node("n", 1, 4);
        t4.model = Some("T4".into());
        t4.pool = Some("public".into());
        let wanted = WantedModels::one("V100");
        assert_eq!(
            wanted.admits(&t4).unwrap_err().to_string(),
            "GPU model T4 is not one the pod accepts (V100)"
        );
        let any = WantedModels {
            models: vec![],
            source: ModelSource::Untyped,
        };
        assert!(any.admits(&t4).is_ok());
        assert!(pool_admits(&["public".into()], &t4).is_ok());
        assert!(pool_admits(&["private".into()], &t4).is_err());
        assert!(pool_admits(&[], &t4).is_ok());
    }
}
