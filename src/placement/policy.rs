//! Placement policies: which feasible node (and GPUs) a pod gets.
//!
//! Every policy scores each feasible node; the lowest score wins and ties go to the
//! node name, so a choice is deterministic for a given cluster state.

use std::cmp::Ordering;
use std::sync::Arc;

use serde::Deserialize;

use super::choice::{CpuAsk, ModelPressure, PinnedDemand, cpu_per_core};
use super::fit::{Assignment, Misfit, fit};
use super::fragment::{HostRoom, TaskMix};
use super::node::NodeGpus;
use super::request::GpuRequest;

/// The placement policy (`placement.policy` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// tkestack gpu-admission's order: least free vcuda-core on the node, then least
    /// free vcuda-memory, then node name; the first node that fits.
    Original,
    /// GPU packing: share a GPU already in use, else use a node already in use, else
    /// an idle node; among equals, the least free capacity left.
    Binpack,
    /// The most free capacity left: spreads load, keeps no node full.
    Spread,
    /// Fragmentation gradient descent: the placement that least increases the
    /// fragmentation of the node's free GPU capacity under the request mix
    /// (`fragment/`); ties go to binpack's order.
    Fgd,
}

/// The policy that measures best on the openb traces (docs/simulate.md).
pub(crate) const DEFAULT_POLICY: Policy = Policy::Fgd;

impl Policy {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Policy::Original => "original",
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::Fgd => "fgd",
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy with what it needs to choose: the request mix (read by `fgd` only) and
/// whether share-mode GPUs must be the ones gpu-manager picks. Immutable and
/// `Send + Sync`: share one between threads; swap in a new one to change the mix.
#[derive(Debug, Clone)]
pub struct Placer {
    pub(crate) policy: Policy,
    /// The task shapes fragmentation is measured against.
    pub mix: Arc<TaskMix>,
    /// The GPU demand seen pinned to sets of models, learnt online whatever the
    /// policy: which models a pod that accepts several should leave alone (`choice`).
    pub(crate) pinned: Arc<PinnedDemand>,
    /// When true (the default) a share-mode container gets the GPU gpu-manager's own
    /// evaluator picks (`fit::pick_share`), which gpu-manager re-checks; only the node
    /// is chosen freely. When false, `fgd` also chooses the GPU inside the node.
    pub(super) gpu_manager_compat: bool,
}

impl Placer {
    /// `policy` with an empty mix, gpu-manager compatible.
    pub fn new(policy: Policy) -> Placer {
        Placer {
            policy,
            mix: Arc::default(),
            pinned: Arc::default(),
            gpu_manager_compat: true,
        }
    }

    pub(crate) fn with_pinned(mut self, pinned: Arc<PinnedDemand>) -> Placer {
        self.pinned = pinned;
        self
    }

    /// The models short now among `nodes` (see `choice`): the first thing placement
    /// compares. A pod without GPUs takes none of a model's capacity: no model is
    /// short for it.
    pub(crate) fn pressure<'a>(
        &self,
        request: &GpuRequest,
        nodes: impl IntoIterator<Item = &'a NodeGpus>,
    ) -> ModelPressure {
        match request.has_gpu_demand() {
            true => ModelPressure::of(&self.pinned, nodes),
            false => ModelPressure::default(),
        }
    }

    pub fn with_mix(mut self, mix: Arc<TaskMix>) -> Placer {
        self.mix = mix;
        self
    }

    pub(crate) fn with_gpu_manager_compat(mut self, compat: bool) -> Placer {
        self.gpu_manager_compat = compat;
        self
    }

    /// The GPUs this placer gives the pod on `node`, or why it can't.
    pub(super) fn assign(
        &self,
        node: &NodeGpus,
        request: &GpuRequest,
        room_after: Option<&HostRoom>,
    ) -> Result<Assignment, Misfit> {
        let assignment = fit(node, request)?;
        if self.policy == Policy::Fgd && !self.gpu_manager_compat {
            return Ok(super::fragment::least_fragmenting_fit(
                node, request, &self.mix, room_after,
            )
            .unwrap_or(assignment));
        }
        Ok(assignment)
    }

    /// Fit `request` on `node` and score the placement, the node's free CPU and memory
    /// (if tracked) going from `room` to `room` less `host`: one candidate as
    /// [`place_with_host`] weighs it.
    pub(super) fn evaluate(
        &self,
        node: &NodeGpus,
        request: &GpuRequest,
        room: Option<HostRoom>,
        host: &HostRoom,
    ) -> Result<(Assignment, [f64; 2]), Misfit> {
        let room_after = room.map(|r| r.minus(host));
        let assignment = self.assign(node, request, room_after.as_ref())?;
        let score = self.score(node, &assignment, (room.as_ref(), room_after.as_ref()));
        Ok((assignment, score))
    }

    /// Score a feasible placement; lower is better, compared first by the first number.
    pub(super) fn score(
        &self,
        node: &NodeGpus,
        assignment: &Assignment,
        rooms: (Option<&HostRoom>, Option<&HostRoom>),
    ) -> [f64; 2] {
        let before = (node.total_free_core(), node.total_free_memory());
        // fit() only returns assignments that fit, so nothing here saturates.
        let (core, memory) = assignment
            .charges(node.memory_per_gpu)
            .fold((0, 0), |(c, m), (_, u)| (c + u.core, m + u.memory));
        let free_after = pack(
            before.0.saturating_sub(core),
            before.1.saturating_sub(memory),
        );
        let binpack = f64::from(packing_tier(node, assignment)) * TIER + free_after;
        match self.policy {
            Policy::Original => [pack(before.0, before.1), 0.0],
            Policy::Binpack => [binpack, 0.0],
            Policy::Spread => [-free_after, 0.0],
            Policy::Fgd => [
                fragmentation_growth(&self.mix, node, assignment, rooms),
                binpack,
            ],
        }
    }
}

impl From<Policy> for Placer {
    fn from(policy: Policy) -> Placer {
        Placer::new(policy)
    }
}

/// Growth is compared in steps of this many vcuda-core (0.04 GPU), and binpack's order
/// decides within a step. Smaller differences are below what the mix, an estimate,
/// can tell apart, while packing's preference is real; 0.04 GPU is also about the
/// resolution of the paper's integer scores near zero. Measured in docs/simulate.md
/// (seeds 42-51, five traces): a step of 1 costs up to 0.5 points, 6 and 10 are no
/// better than 4, and a band around the best exact growth instead of fixed steps is
/// worse (0.2-0.3 points on three traces).
const GROWTH_STEP: f64 = 4.0;

/// How much the node's fragmentation grows if it takes `assignment`, in
/// [`GROWTH_STEP`]s (rounding also keeps float noise from deciding).
fn fragmentation_growth(
    mix: &TaskMix,
    node: &NodeGpus,
    assignment: &Assignment,
    (before_room, after_room): (Option<&HostRoom>, Option<&HostRoom>),
) -> f64 {
    let growth = mix.growth(
        node,
        assignment.charges(node.memory_per_gpu),
        before_room,
        after_room,
    );
    (growth / GROWTH_STEP).round()
}

/// Two counts in one exactly-representable number, ordered by the first, then the second.
fn pack(major: u32, minor: u32) -> f64 {
    f64::from(major) * 1e7 + f64::from(minor)
}
const TIER: f64 = 1e15;

/// 0: every chosen GPU is already in use (shared); 1: the node is in use; 2: idle node.
fn packing_tier(node: &NodeGpus, assignment: &Assignment) -> u8 {
    let all_shared = assignment
        .choices
        .iter()
        .flat_map(|c| &c.gpus)
        .all(|&g| node.used.get(usize::from(g)).is_some_and(|u| u.core > 0));
    if all_shared {
        0
    } else if node.used.iter().any(|u| u.core > 0) {
        1
    } else {
        2
    }
}

/// A node as placement sees it: its GPUs and, where the caller tracks them, its free
/// CPU and memory (which `fgd` counts: a task that can't get its CPU can't use the GPUs).
pub trait Candidate {
    fn gpus(&self) -> &NodeGpus;
    /// Free CPU and memory; `None` when not tracked (the extender).
    fn room(&self) -> Option<HostRoom> {
        None
    }
}

impl Candidate for NodeGpus {
    fn gpus(&self) -> &NodeGpus {
        self
    }
}

/// The result of placing one pod over a list of candidate nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The index of the chosen node in the candidate list, and its GPUs.
    pub chosen: Option<(usize, Assignment)>,
    /// Every node that could not take the pod, by index, with the reason
    /// ([`super::place_versioned`]: only when no node is chosen).
    pub(crate) misfits: Vec<(usize, Misfit)>,
}

#[cfg(test)]
impl Outcome {
    /// This outcome as [`super::place_versioned`] answers it: a chosen node, no reasons.
    pub(crate) fn into_versioned(mut self) -> Self {
        if self.chosen.is_some() {
            self.misfits.clear();
        }
        self
    }
}

/// Place `request` on the best of `nodes` under `placer`. `allowed` rejects nodes the
/// pod may not use at all (model, pool; CPU in `simulate`) before any fitting.
/// Callable concurrently: nothing here is mutated.
pub fn place<'a, C: Candidate + 'a>(
    placer: &Placer,
    request: &GpuRequest,
    nodes: impl IntoIterator<Item = &'a C>,
    allowed: impl Fn(&C) -> Result<(), Misfit>,
) -> Outcome {
    place_with_host(placer, request, &HostRoom::default(), nodes, allowed)
}

/// [`place`] for a pod that also needs `host` CPU and memory on the node it gets, which
/// `fgd` takes off the candidates' [`Candidate::room`] when it measures fragmentation.
/// Feasibility of `host` is `allowed`'s to check.
pub(crate) fn place_with_host<'a, C: Candidate + 'a>(
    placer: &Placer,
    request: &GpuRequest,
    host: &HostRoom,
    nodes: impl IntoIterator<Item = &'a C>,
    allowed: impl Fn(&C) -> Result<(), Misfit>,
) -> Outcome {
    let nodes: Vec<&C> = nodes.into_iter().collect();
    let pressure = placer.pressure(request, nodes.iter().map(|c| c.gpus()));
    let per_core = cpu_per_core(request, host);
    let mut best: Option<(usize, &NodeGpus, Assignment, Ranked)> = None;
    let mut misfits = Vec::new();
    for (index, candidate) in nodes.into_iter().enumerate() {
        let node = candidate.gpus();
        let evaluated = allowed(candidate)
            .and_then(|()| placer.evaluate(node, request, candidate.room(), host));
        let (assignment, score) = match evaluated {
            Ok(evaluated) => evaluated,
            Err(misfit) => {
                misfits.push((index, misfit));
                continue;
            }
        };
        let ask = CpuAsk::on(candidate.room(), per_core);
        let ranked = (pressure.tier(node, ask), score);
        if best
            .as_ref()
            .is_none_or(|(_, held, _, by)| better(&ranked, node, by, held))
        {
            best = Some((index, node, assignment, ranked));
        }
    }
    Outcome {
        chosen: best.map(|(index, _, assignment, _)| (index, assignment)),
        misfits,
    }
}

/// A feasible node's rank: its model's tier (`choice`), then the policy's score.
pub(super) type Ranked = (u8, [f64; 2]);

/// Whether `node` ranked `ranked` beats `held` ranked `by`: lower tier, then lower
/// score, then the node name.
pub(super) fn better(ranked: &Ranked, node: &NodeGpus, by: &Ranked, held: &NodeGpus) -> bool {
    match ranked.0.cmp(&by.0).then_with(|| compare(&ranked.1, &by.1)) {
        Ordering::Less => true,
        Ordering::Equal => node.name < held.name,
        Ordering::Greater => false,
    }
}

pub(super) fn compare(a: &[f64; 2], b: &[f64; 2]) -> Ordering {
    a[0].total_cmp(&b[0]).then_with(|| a[1].total_cmp(&b[1]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::fragment::{GpuShape, TaskShape};
    use crate::placement::request::GpuDemand;
    use crate::placement::testing::{node, with_used};

    fn one(demand: GpuDemand) -> GpuRequest {
        GpuRequest::one(demand)
    }

    fn chosen_name(policy: Policy, request: &GpuRequest, nodes: &[NodeGpus]) -> Option<String> {
        let outcome = place(&Placer::new(policy), request, nodes, |_| Ok(()));
        outcome.chosen.map(|(i, _)| nodes[i].name.to_string())
    }

    #[test]
    fn original_takes_least_free_node_that_fits_then_name() {
        let nodes = vec![
            node("b", 2, 4),
            with_used(node("c", 2, 4), 0, 90, 1),
            node("a", 2, 4),
        ];
        let share = one(GpuDemand::Share {
            core: 10,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Original, &share, &nodes).as_deref(),
            Some("c")
        );
        let big = one(GpuDemand::Share {
            core: 50,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Original, &big, &nodes).as_deref(),
            Some("c")
        );
        let two = one(GpuDemand::Whole { gpus: 2 });
        assert_eq!(
            chosen_name(Policy::Original, &two, &nodes).as_deref(),
            Some("a")
        );
    }

    #[test]
    fn binpack_prefers_shared_gpus_then_busy_nodes() {
        let nodes = vec![
            node("idle", 4, 4),
            with_used(node("busy", 4, 4), 0, 100, 4),
            with_used(node("shared", 8, 4), 3, 20, 1),
        ];
        let share = one(GpuDemand::Share {
            core: 30,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Binpack, &share, &nodes).as_deref(),
            Some("shared")
        );
        let whole = one(GpuDemand::Whole { gpus: 1 });
        assert_eq!(
            chosen_name(Policy::Binpack, &whole, &nodes).as_deref(),
            Some("busy")
        );
    }

    #[test]
    fn spread_takes_the_emptiest_node() {
        let nodes = vec![with_used(node("a", 2, 4), 0, 10, 1), node("b", 2, 4)];
        let share = one(GpuDemand::Share {
            core: 10,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Spread, &share, &nodes).as_deref(),
            Some("b")
        );
    }

    fn share(core: u32) -> GpuRequest {
        one(GpuDemand::Share { core, memory: core })
    }

    fn fgd(mix: &[(GpuShape, f64)], compat: bool) -> Placer {
        let mix = TaskMix::weighted(mix.iter().map(|&(s, w)| (TaskShape::gpu_only(s), w)));
        Placer::new(Policy::Fgd)
            .with_mix(Arc::new(mix))
            .with_gpu_manager_compat(compat)
    }

    #[test]
    fn fgd_fills_the_hole_that_would_otherwise_stay_a_fragment() {
        // Mix: half a GPU or one whole GPU, equally likely. Node a: one GPU, 50 used;
        // node b: one idle GPU. A half task on a: fragmentation 0.5 * 50 -> 0 (-25);
        // on b: 0 -> 0.5 * 50 (+25). FGD takes a; spread would take b.
        let half = GpuShape::Share {
            core: 50,
            memory: 50,
        };
        let placer = fgd(&[(half, 1.0), (GpuShape::Whole { gpus: 1 }, 1.0)], true);
        let nodes = vec![node("b", 1, 100), with_used(node("a", 1, 100), 0, 50, 50)];
        let outcome = place(&placer, &share(50), &nodes, |_| Ok(()));
        assert_eq!(outcome.chosen.map(|(i, _)| i), Some(1));
    }

    #[test]
    fn fgd_chooses_the_gpu_only_without_gpu_manager_compat() {
        // Mix: 40-core tasks. GPU0 has 70 free (one fits, 30 left over), GPU1 40 (one
        // fits, nothing left). A 30-core task: gpu-manager takes GPU1 (least free that
        // fits), leaving 10 that no 40-core task can use (fragments 30 -> 40). FGD alone
        // takes GPU0, leaving exactly 40 there (fragments 30 -> 0).
        let n = with_used(with_used(node("n", 2, 100), 0, 30, 30), 1, 60, 60);
        let mix = [(
            GpuShape::Share {
                core: 40,
                memory: 40,
            },
            1.0,
        )];
        let gpu = |compat| {
            let outcome = place(&fgd(&mix, compat), &share(30), [&n], |_| Ok(()));
            outcome.chosen.unwrap().1.choices[0].gpus.clone()
        };
        assert_eq!(gpu(true), vec![1]);
        assert_eq!(gpu(false), vec![0]);
    }

    #[test]
    fn fgd_without_a_mix_is_binpack() {
        let nodes = vec![
            node("idle", 4, 4),
            with_used(node("busy", 4, 4), 0, 100, 4),
            with_used(node("shared", 8, 4), 3, 20, 1),
        ];
        for request in [share(30), one(GpuDemand::Whole { gpus: 1 })] {
            let by = |placer: &Placer| place(placer, &request, &nodes, |_| Ok(())).chosen;
            assert_eq!(by(&fgd(&[], true)), by(&Placer::new(Policy::Binpack)));
        }
    }

    #[test]
    fn misfits_are_reported_per_node_and_no_choice_when_none_fit() {
        let nodes = vec![
            node("small", 1, 4),
            with_used(node("full", 2, 4), 0, 100, 4),
        ];
        let outcome = place(
            &Placer::new(Policy::Original),
            &one(GpuDemand::Whole { gpus: 2 }),
            &nodes,
            |_| Ok(()),
        );
        assert_eq!(outcome.chosen, None);
        assert_eq!(outcome.misfits.len(), 2);
        assert!(outcome.misfits[0].1.is_unresolvable());
        assert!(!outcome.misfits[1].1.is_unresolvable());
    }
}
