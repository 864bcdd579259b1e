//! Model choice (docs/design.md, "Model choice"): which GPU model a pod that accepts
//! several should take, so that pods pinned to a scarce model still find room later.
//!
//! The rule is one tier in front of the policy's score. Online, from the GPU pods the
//! placer has seen, it knows what share of the GPU demand may run only on each set of
//! models (pinned demand: a pod naming `T4` alone, or `V100M16|V100M32`). Taking the
//! cluster's free GPU capacity as what is still to arrive before it is full, a model
//! set needs that share of it; a set whose free capacity is below what it needs is
//! *short*, and its models are kept for the pods that can run nowhere else: a pod that
//! accepts models outside the set goes there first. The policy (FGD) then chooses
//! among the nodes of the tier, and a pod takes a short model when nothing else fits
//! (protection orders the choice, it never refuses a pod).
//!
//! A set is short only while its free capacity is below its projected demand, so a
//! model whose pinned demand stays below its capacity is protected only if pods that
//! could go elsewhere fill it; then it is protected just enough.

use std::sync::Arc;

use super::fragment::TaskShape;
use super::node::NodeGpus;

/// At most this many pinned model sets are kept (the largest shares): each is checked
/// on every placement.
const MAX_SETS: usize = 64;

/// The share of the GPU demand seen that only a set of models can run, per set.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PinnedDemand {
    sets: Vec<PinnedSet>,
}

#[derive(Debug, Clone, PartialEq)]
struct PinnedSet {
    /// Sorted, no duplicates.
    models: Arc<[Arc<str>]>,
    /// The share (0 to 1) of all GPU demand seen whose models all lie in `models`:
    /// what must land inside the set (pods pinned to a subset count too).
    share: f64,
}

impl PinnedDemand {
    /// From shapes seen `n` times each: their GPU demand, by the models they accept.
    pub(crate) fn of_counts<'a>(counts: impl IntoIterator<Item = (&'a TaskShape, u64)>) -> Self {
        let mut total = 0.0;
        let mut own: Vec<(Arc<[Arc<str>]>, f64)> = Vec::new();
        for (shape, n) in counts {
            let demand = n as f64 * shape.gpu.gpus();
            total += demand;
            let Some(models) = &shape.models else {
                continue;
            };
            match own.iter_mut().find(|(set, _)| set == models) {
                Some((_, sum)) => *sum += demand,
                None => own.push((models.clone(), demand)),
            }
        }
        if total <= 0.0 {
            return PinnedDemand::default();
        }
        own.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        own.truncate(MAX_SETS);
        let inside =
            |inner: &[Arc<str>], outer: &[Arc<str>]| inner.iter().all(|m| outer.contains(m));
        let sets = own
            .iter()
            .map(|(models, _)| PinnedSet {
                models: models.clone(),
                share: (own.iter())
                    .filter(|(inner, _)| inside(inner, models))
                    .map(|(_, demand)| demand / total)
                    .sum(),
            })
            .collect();
        PinnedDemand { sets }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }
}

/// Which models are short now: the tier a node's model puts it in.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ModelPressure {
    short: Vec<Arc<str>>,
}

impl ModelPressure {
    /// The models `pinned` demand needs kept, given the free GPU capacity of `nodes`
    /// (the candidates: in `simulate` every node, in the extender those the scheduler
    /// offers).
    pub(crate) fn of<'a>(
        pinned: &PinnedDemand,
        nodes: impl IntoIterator<Item = &'a NodeGpus>,
    ) -> ModelPressure {
        if pinned.is_empty() {
            return ModelPressure::default();
        }
        let mut free: Vec<(&str, u64)> = Vec::new();
        let mut total = 0u64;
        for node in nodes {
            let Some(model) = node.model.as_deref() else {
                continue;
            };
            let cores = u64::from(node.total_free_core());
            total += cores;
            match free.iter_mut().find(|(m, _)| *m == model) {
                Some((_, sum)) => *sum += cores,
                None => free.push((model, cores)),
            }
        }
        let free_of = |model: &str| free.iter().find(|(m, _)| *m == model).map_or(0, |f| f.1);
        let room = |set: &PinnedSet| set.models.iter().map(|m| free_of(m)).sum::<u64>();
        let total = total as f64;
        let mut short: Vec<Arc<str>> = Vec::new();
        for set in &pinned.sets {
            if (room(set) as f64) < set.share * total {
                short.extend(set.models.iter().cloned());
            }
        }
        short.sort();
        short.dedup();
        ModelPressure { short }
    }

    /// 0 for a node whose model is not short (or has none), 1 for one kept for pinned
    /// pods: placement compares this before the policy's score.
    pub(crate) fn tier(&self, node: &NodeGpus) -> u8 {
        let short = node
            .model
            .as_deref()
            .is_some_and(|model| self.short.iter().any(|m| **m == *model));
        u8::from(short)
    }

    /// The models kept for pinned pods now.
    #[cfg(test)]
    pub(crate) fn short(&self) -> &[Arc<str>] {
        &self.short
    }
}

#[cfg(test)]
#[path = "choice_tests.rs"]
mod tests;
