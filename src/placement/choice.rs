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
//!
//! Protection keeps GPUs for pinned pods, but a GPU is only of use to a pod that also
//! gets its CPU. A node of a short model stays open when its pinned pods would run out
//! of CPU before GPUs there (they ask more than [`PINNED_CPU_BOUND`] times the node's
//! free CPU per free GPU core) and the pod asks no more CPU per GPU core than the node
//! has: such a pod takes GPUs the pinned pods could not have used. That needs the CPU
//! the pinned demand asks, learnt only where the shapes seen carry CPU (`simulate`'s
//! trace pods; a cluster's `LearningPlacer` learns GPUs and models alone), and the
//! node's free CPU (`Candidate::room`: `simulate` and the planner track it, the filter
//! does not). Without either, the rule is the tier alone.

use std::sync::Arc;

use super::fragment::{GpuShape, HostRoom, TaskShape};
use super::node::NodeGpus;
use super::request::GpuRequest;

/// At most this many pinned model sets are kept (the largest shares): each is checked
/// on every placement.
const MAX_SETS: usize = 64;

/// How many times a node's free CPU per free GPU core the pinned demand must ask before
/// the node counts as CPU-bound for it. Above 1 so that a node whose pinned pods would
/// merely fill its CPU and GPUs together stays kept for them (docs/design.md, "Model
/// choice"; the factors tried, and why 1.25 with a pod bound of 1: docs/simulate.md).
const PINNED_CPU_BOUND: f64 = 1.25;

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
    /// The CPU milli per vcuda-core that demand asks (0 when it asks none).
    cpu_per_core: f64,
}

/// Sums of the demand pinned to one set of models.
#[derive(Default, Clone, Copy)]
struct Sums {
    /// GPUs.
    gpus: f64,
    /// CPU milli.
    cpu_milli: f64,
}

impl PinnedDemand {
    /// From shapes seen `n` times each: their GPU demand, by the models they accept.
    pub(crate) fn of_counts<'a>(counts: impl IntoIterator<Item = (&'a TaskShape, u64)>) -> Self {
        let mut total = 0.0;
        let mut own: Vec<(Arc<[Arc<str>]>, Sums)> = Vec::new();
        for (shape, n) in counts {
            let demand = n as f64 * shape.gpu.gpus();
            total += demand;
            let Some(models) = &shape.models else {
                continue;
            };
            let index = match own.iter().position(|(set, _)| set == models) {
                Some(index) => index,
                None => {
                    own.push((models.clone(), Sums::default()));
                    own.len() - 1
                }
            };
            let sums = &mut own[index].1;
            sums.gpus += demand;
            sums.cpu_milli += n as f64 * shape.host.cpu_milli as f64;
        }
        if total <= 0.0 {
            return PinnedDemand::default();
        }
        own.sort_by(|a, b| (b.1.gpus.total_cmp(&a.1.gpus)).then_with(|| a.0.cmp(&b.0)));
        own.truncate(MAX_SETS);
        let inside =
            |inner: &[Arc<str>], outer: &[Arc<str>]| inner.iter().all(|m| outer.contains(m));
        let sets = own
            .iter()
            .map(|(models, _)| {
                let within = own.iter().filter(|(inner, _)| inside(inner, models));
                let sums = within.fold(Sums::default(), |a, (_, b)| Sums {
                    gpus: a.gpus + b.gpus,
                    cpu_milli: a.cpu_milli + b.cpu_milli,
                });
                PinnedSet {
                    models: models.clone(),
                    share: sums.gpus / total,
                    cpu_per_core: per_core(sums.cpu_milli, sums.gpus),
                }
            })
            .collect();
        PinnedDemand { sets }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }
}

/// CPU milli per vcuda-core of `cpu_milli` over `gpus` GPUs; 0 without GPUs.
fn per_core(cpu_milli: f64, gpus: f64) -> f64 {
    let cores = gpus * f64::from(super::request::CORE_PER_GPU);
    if cores > 0.0 { cpu_milli / cores } else { 0.0 }
}

/// Which models are short now: the tier a node's model puts it in.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ModelPressure {
    /// Each short model, sorted, with the most CPU per vcuda-core that the pinned
    /// demand of a short set holding it asks.
    short: Vec<(Arc<str>, f64)>,
}

/// What a pod asks of a node's CPU, for [`ModelPressure::tier`]: its CPU milli per
/// vcuda-core, and the node's room (free CPU and memory) where the caller tracks it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuAsk {
    per_core: f64,
    room: HostRoom,
}

impl CpuAsk {
    /// `None` where the node's room is not tracked or the pod asks no GPU.
    pub(crate) fn on(room: Option<HostRoom>, per_core: Option<f64>) -> Option<Self> {
        Some(CpuAsk {
            per_core: per_core?,
            room: room?,
        })
    }
}

/// The CPU milli per vcuda-core a pod asking `request` and `host` takes; `None`
/// without GPUs.
pub(crate) fn cpu_per_core(request: &GpuRequest, host: &HostRoom) -> Option<f64> {
    let gpus = GpuShape::of_request(request)?.gpus();
    (gpus > 0.0).then(|| per_core(host.cpu_milli as f64, gpus))
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
        let mut short: Vec<(Arc<str>, f64)> = Vec::new();
        let short_sets = pinned
            .sets
            .iter()
            .filter(|s| (room(s) as f64) < s.share * total);
        for set in short_sets {
            for model in set.models.iter() {
                match short.iter_mut().find(|(m, _)| m == model) {
                    Some((_, cpu)) => *cpu = cpu.max(set.cpu_per_core),
                    None => short.push((model.clone(), set.cpu_per_core)),
                }
            }
        }
        short.sort_by(|a, b| a.0.cmp(&b.0));
        ModelPressure { short }
    }

    /// 0 for a node open to the pod, 1 for one kept for pinned pods: placement compares
    /// this before the policy's score. A node is kept when its model is short, unless
    /// `ask` shows its pinned pods would run out of the node's CPU before its GPUs and
    /// the pod asks no more CPU per GPU core than the node has free.
    pub(crate) fn tier(&self, node: &NodeGpus, ask: Option<CpuAsk>) -> u8 {
        let Some(model) = node.model.as_deref() else {
            return 0;
        };
        let Some(&(_, pinned)) = self.short.iter().find(|(m, _)| **m == *model) else {
            return 0;
        };
        let free_cores = f64::from(node.total_free_core());
        let open = ask.filter(|_| free_cores > 0.0).is_some_and(|ask| {
            let node_per_core = ask.room.cpu_milli as f64 / free_cores;
            pinned > PINNED_CPU_BOUND * node_per_core && ask.per_core <= node_per_core
        });
        u8::from(!open)
    }

    /// The models kept for pinned pods now.
    #[cfg(test)]
    pub(crate) fn short(&self) -> Vec<Arc<str>> {
        self.short.iter().map(|(m, _)| m.clone()).collect()
    }
}

#[cfg(test)]
#[path = "choice_tests.rs"]
mod tests;
