//! Where free GPUs go unused (docs/quota.md, "Free GPUs by cause"): every free
//! vcuda-core of every node counted in exactly one cause, so the causes of a model sum
//! to its free capacity.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::fragment::TaskMix;
use super::node::NodeGpus;

/// Why a free GPU (or part of one) is not in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum FreeCause {
    /// On a node that takes no new pods: cordoned, tainted `NoSchedule` or
    /// `NoExecute`, not Ready.
    Unavailable,
    /// On an open node, but on GPUs where no task of the request mix that accepts the
    /// model could start.
    Fragmented,
    /// Usable, while pods that could use it wait in the quota queue.
    QuotaBlocked,
    /// Usable, and no pod waits on quota for it.
    Idle,
}

impl FreeCause {
    pub(crate) const ALL: [FreeCause; 4] = [
        FreeCause::Unavailable,
        FreeCause::Fragmented,
        FreeCause::QuotaBlocked,
        FreeCause::Idle,
    ];

    /// The metric's label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FreeCause::Unavailable => "unavailable",
            FreeCause::Fragmented => "fragmented",
            FreeCause::QuotaBlocked => "quota_blocked",
            FreeCause::Idle => "idle",
        }
    }
}

/// Free vcuda-core by node model label (`None`: nodes without one) and cause.
pub(crate) type FreeByCause = BTreeMap<(Option<Arc<str>>, FreeCause), u64>;

/// Count the free vcuda-core of `nodes` by model and cause: `mix` decides what is
/// fragmented ([`TaskMix::usable_core`]), `waited_for` which nodes' usable capacity
/// pods in the quota queue could use. Every model seen gets all four causes, zeros
/// included.
pub(crate) fn free_by_cause<'a>(
    nodes: impl IntoIterator<Item = &'a NodeGpus>,
    mix: &TaskMix,
    waited_for: impl Fn(&NodeGpus) -> bool,
) -> FreeByCause {
    let mut counts = FreeByCause::new();
    for node in nodes {
        let free = u64::from(node.total_free_core());
        let mut add = |cause, core| {
            *counts.entry((node.model.clone(), cause)).or_default() += core;
        };
        for cause in FreeCause::ALL {
            add(cause, 0);
        }
        if node.closed.is_some() {
            add(FreeCause::Unavailable, free);
            continue;
        }
        let usable = u64::from(mix.usable_core(node));
        add(FreeCause::Fragmented, free - usable);
        let cause = if waited_for(node) {
            FreeCause::QuotaBlocked
        } else {
            FreeCause::Idle
        };
        add(cause, usable);
    }
    counts
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;
    use crate::placement::fragment::{GpuShape, TaskShape};
    use crate::placement::testing::{node, with_used};

    fn t4(name: &str, gpus: usize) -> NodeGpus {
        let mut n = node(name, gpus, 100);
        n.model = Some("T4".into());
        n
    }

    fn share(core: u32) -> TaskShape {
        TaskShape::gpu_only(GpuShape::Share { core, memory: core })
    }

    fn count(counts: &FreeByCause, cause: FreeCause) -> u64 {
        counts
            .get(&(Some("T4".into()), cause))
            .copied()
            .unwrap_or(0)
    }

    #[test]
    fn each_cause_takes_its_own_free_gpus() {
        // n1: a 70-core share on GPU 0 leaves 30 free there, GPU 1 idle. The mix asks
        // for halves and whole GPUs: the 30 cores are fragmented, GPU 1 usable.
        let n1 = with_used(t4("n1", 2), 0, 70, 70);
        // n2: cordoned, two idle GPUs.
        let mut n2 = t4("n2", 2);
        n2.closed = Some("cordoned");
        let mix = TaskMix::weighted([
            (share(50), 1.0),
            (TaskShape::gpu_only(GpuShape::Whole { gpus: 1 }), 1.0),
        ]);
        let counts = free_by_cause([&n1, &n2], &mix, |_| false);
        assert_eq!(count(&counts, FreeCause::Unavailable), 200);
        assert_eq!(count(&counts, FreeCause::Fragmented), 30);
        assert_eq!(count(&counts, FreeCause::Idle), 100);
        assert_eq!(count(&counts, FreeCause::QuotaBlocked), 0);

        // A 20-core share fits in the 30 left: nothing is fragmented any more; and
        // with a pod queued on quota for T4 the usable capacity is quota-blocked.
        let mix = TaskMix::weighted([(share(20), 1.0)]);
        let counts = free_by_cause([&n1, &n2], &mix, |n| n.model.as_deref() == Some("T4"));
        assert_eq!(count(&counts, FreeCause::Fragmented), 0);
        assert_eq!(count(&counts, FreeCause::QuotaBlocked), 130);
        assert_eq!(count(&counts, FreeCause::Idle), 0);
    }

    #[test]
    fn a_whole_gpu_task_needs_as_many_idle_gpus_on_one_node() {
        // Two idle GPUs on a node, a mix of 4-GPU tasks only: none of it is usable.
        let n = with_used(t4("n", 3), 0, 100, 100);
        let mix = TaskMix::weighted([(TaskShape::gpu_only(GpuShape::Whole { gpus: 4 }), 1.0)]);
        let counts = free_by_cause([&n], &mix, |_| false);
        assert_eq!(count(&counts, FreeCause::Fragmented), 200);
        // With no pod seen yet the mix stands for one whole GPU.
        let counts = free_by_cause([&n], &TaskMix::default(), |_| false);
        assert_eq!(count(&counts, FreeCause::Idle), 200);
    }

    proptest! {
        /// Over random nodes, uses and mixes, the causes of each model sum to the free
        /// capacity of its nodes: every free core is counted once.
        #[test]
        fn the_causes_sum_to_the_free_capacity(
            nodes in prop::collection::vec(
                (0usize..3, 1usize..9, prop::collection::vec(0u32..=100, 8), any::<bool>()),
                1..12,
            ),
            shapes in prop::collection::vec((1u32..=100, 0usize..3), 0..5),
            blocked in any::<bool>(),
        ) {
            let models = ["T4", "A100", ""];
            let cluster: Vec<NodeGpus> = nodes
                .iter()
                .enumerate()
                .map(|(i, (model, gpus, used, closed))| {
                    let mut n = node(&format!("n{i}"), *gpus, 100);
                    n.model = (!models[*model].is_empty()).then(|| models[*model].into());
                    for (gpu, core) in used.iter().take(*gpus).enumerate() {
                        n = with_used(n, gpu, *core, *core);
                    }
                    n.closed = closed.then_some("cordoned");
                    n
                })
                .collect();
            let mix = TaskMix::weighted(shapes.iter().map(|(core, model)| {
                let shape = if *core == 100 {
                    TaskShape::gpu_only(GpuShape::Whole { gpus: 1 + *model as u32 })
                } else {
                    share(*core)
                };
                let model = models[*model];
                let shape = if model.is_empty() { shape } else { shape.with_models(&[model]) };
                (shape, 1.0)
            }));
            let counts = free_by_cause(&cluster, &mix, |n| blocked && n.model.is_some());
            for label in [Some("T4"), Some("A100"), None] {
                let label: Option<Arc<str>> = label.map(Into::into);
                let free: u64 = cluster
                    .iter()
                    .filter(|n| n.model == label)
                    .map(|n| u64::from(n.total_free_core()))
                    .sum();
                let counted: u64 = FreeCause::ALL
                    .iter()
                    .map(|c| counts.get(&(label.clone(), *c)).copied().unwrap_or(0))
                    .sum();
                prop_assert_eq!(counted, free);
            }
        }
    }
}
