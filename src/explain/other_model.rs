//! The `other_model` counterfactual: the models a stopped pod does not ask for whose
//! quota has room and whose open nodes would take it now. Its cost is bounded by
//! construction, however many models the cluster has (docs/explain.md, "What a
//! judgment costs"):
//!
//! - the open nodes are grouped by model in one pass, and each model is fitted on its
//!   own nodes only, so every open node is tried at most once;
//! - only models the namespace's quotas may admit are candidates (with an enforcing
//!   quota, the models some quota lists), and at most [`SEARCH_MODELS`] of them are
//!   priced and fitted: models pods pinned to them are not short of first (the
//!   placer's model choice, `placement::choice`), then those with the most free GPU;
//! - at most [`SEARCH_FITS`](super::effort::SEARCH_FITS) node fits in all.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::placement::NodeGpus;
use crate::placement::choice::ModelPressure;
use crate::placement::mig::model_of;
use crate::placement::models::WantedModels;
use crate::quota::{QuotaView, admit};

use super::effort::{Abandoned, Effort};
use super::judge::{Judge, Judged, fits_message};
use super::verdict::Counterfactual;

/// Models the search prices and fits at most, in one judgment.
pub(crate) const SEARCH_MODELS: usize = 64;

impl Judge<'_> {
    /// Models the pod does not want whose quota and nodes would take it now.
    pub(crate) fn other_models(
        &self,
        subject: &Judged<'_>,
    ) -> Result<Vec<Counterfactual>, Abandoned> {
        let quota = self.state.namespace_quota(subject.namespace());
        let Ok(views) = quota.views() else {
            return Ok(Vec::new());
        };
        let own = quota.wanted(&subject.pod.models);
        let mut by_model: BTreeMap<&str, Vec<&NodeGpus>> = BTreeMap::new();
        for node in self.open_nodes().filter(|n| own.admits(n).is_err()) {
            if let Some(model) = node.model.as_deref() {
                by_model.entry(model).or_default().push(node);
            }
        }
        let pressure = (self.placer).pressure(&subject.pod.request, self.open_nodes());
        let mut found = Vec::new();
        for (label, nodes) in candidates(by_model, &views, &pressure) {
            self.effort.check()?;
            if self.effort.search_left() == 0 {
                break;
            }
            let wanted = WantedModels::one(label);
            let costs = quota.costs(&subject.pod.request, &wanted.models, self.now);
            let admitted = admit(subject.namespace(), &views, &wanted, &costs, self.rules);
            if admitted.is_err() {
                continue;
            }
            let outcome = self.fit_on(subject, wanted, &nodes, Effort::search_fit);
            self.effort.check()?;
            if let Some(placed) = fits_message(&outcome, &nodes) {
                let message = format!(
                    "fits now as model {label}: {placed} (set the gpu-admission.io/gpu-type annotation)"
                );
                found.push(Counterfactual {
                    kind: "other_model",
                    message,
                });
            }
        }
        Ok(found)
    }
}

/// The models worth trying, each with its open nodes: those the quotas `views` may
/// admit a pod on (an enforcing quota refuses a model none lists), models that are not
/// short (`pressure`, as placement ranks them) first, then the most free GPU, then by
/// name; at most [`SEARCH_MODELS`].
fn candidates<'n>(
    by_model: BTreeMap<&'n str, Vec<&'n NodeGpus>>,
    views: &[QuotaView],
    pressure: &ModelPressure,
) -> Vec<(&'n str, Vec<&'n NodeGpus>)> {
    let enforced = views.iter().any(QuotaView::enforces);
    let listed = |label: &str| {
        let model = model_of(label);
        views.iter().any(|v| v.hard.contains_key(model))
    };
    let mut models: Vec<(&str, Vec<&NodeGpus>)> = by_model
        .into_iter()
        .filter(|(label, _)| !enforced || listed(label))
        .collect();
    let free = |nodes: &[&NodeGpus]| -> u64 {
        let each = nodes.iter().map(|n| u64::from(n.total_free_core()));
        each.sum()
    };
    let tier = |nodes: &[&NodeGpus]| nodes.first().map_or(0, |n| pressure.tier(n, None));
    models.sort_by_cached_key(|(label, nodes)| (tier(nodes), Reverse(free(nodes)), *label));
    models.truncate(SEARCH_MODELS);
    models
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::choice::PinnedDemand;
    use crate::placement::testing::node;
    use crate::placement::{GpuShape, TaskShape};

    /// Of two models that would both take the pod, the one pods pinned to it are short
    /// of is told last, though it has more GPUs free.
    #[test]
    fn a_short_model_is_told_after_one_that_is_not() {
        let of_model = |name: &str, model: &str, gpus| {
            let mut n = node(name, gpus, 100);
            n.model = Some(model.into());
            n
        };
        let (scarce, plenty) = (of_model("s", "Scarce", 4), of_model("p", "Plenty", 2));
        let pinned = TaskShape::gpu_only(GpuShape::Whole { gpus: 1 }).with_models(&["Scarce"]);
        let pinned = PinnedDemand::of_counts([(&pinned, 1)]);
        let by_model = || BTreeMap::from([("Scarce", vec![&scarce]), ("Plenty", vec![&plenty])]);
        let order = |pressure: &ModelPressure| -> Vec<&str> {
            let found = candidates(by_model(), &[], pressure);
            found.into_iter().map(|(label, _)| label).collect()
        };
        assert_eq!(order(&ModelPressure::default()), ["Scarce", "Plenty"]);
        let pressure = ModelPressure::of(&pinned, [&scarce, &plenty]);
        assert_eq!(order(&pressure), ["Plenty", "Scarce"]);
    }
}
