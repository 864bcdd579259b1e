//! Defragmentation (docs/design.md, "Placement"; docs/simulate.md, "Defragmentation"):
//! when a GPU pod fits on no node, the fewest **moves** of running pods (each taken
//! off its node and placed on another where it fits after the earlier moves) after
//! which it fits. Pure: the caller hands over the cluster and says which pods may
//! move; `simulate --defrag` measures it on the openb traces.
//!
//! The search (bounded by [`Limits`]): for each node the pending pod may use, its
//! *deficit* (GPU cores, GPU memory, CPU, memory it lacks there); small sets of movable
//! pods on it whose removal covers the deficit, fewest pods first (`cover`); for each
//! set, a destination for every pod in turn, the placement policy's best node of the
//! same GPU model after the earlier moves, or, with moves to spare, a **chain**: a node
//! where it fits once a few movable pods there have been moved on first (`land`). A
//! plan of `n` moves is a set of `n` pods, or a smaller set whose pods' chains take the
//! rest. Among the plans with the fewest moves: the fewest GPUs moved, then the lowest
//! fragmentation after (the policy's measure), then the target's name.
//!
//! Fitting is `Placer::assign` (`fit` under gpu-manager compatibility) and scoring is
//! `Placer::score`: the same code the extender places with.

mod cover;
mod land;

#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use super::fit::{Assignment, Misfit};
use super::fragment::HostRoom;
use super::node::NodeGpus;
use super::policy::{Candidate, Placer, place_with_host};
use super::request::GpuRequest;

/// At most this many moves per plan unless the caller says otherwise (`defrag.maxMoves`).
pub(crate) const DEFAULT_MAX_MOVES: usize = 2;

/// Node and pod evaluations one plan may spend unless the caller says otherwise: each
/// fit of a candidate set on its node, each destination scored and each set landed
/// counts one (a node passed over on a cheap test, an eighth). The time a search
/// takes on the openb cluster (1,213 nodes) is in docs/simulate.md, "Defragmentation".
pub(crate) const DEFAULT_BUDGET: u64 = 40_000;

/// The most moves a caller may ask a plan to make (`defrag --max-moves`, `simulate
/// --max-moves`; the product's `defrag.maxMoves` stops at 4).
pub(crate) const MOST_MOVES: usize = 8;

/// The largest budget a caller may give one plan: 250 times the default.
pub(crate) const LARGEST_BUDGET: u64 = 10_000_000;

/// A pod running on a node, as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resident<K> {
    /// The caller's name for the pod (`ns/name` in a cluster, an index in `simulate`).
    pub(crate) pod: K,
    pub(crate) request: GpuRequest,
    /// The CPU and memory it holds on its node.
    pub(crate) host: HostRoom,
    /// The GPUs it holds on its node.
    pub(crate) assignment: Assignment,
    pub(crate) priority: i32,
    /// The node pools it may run in (empty: any), as `models::pool_admits` reads them.
    pub(crate) pools: Arc<[String]>,
    /// GPU models other than its node's that a move may land it on: a pod that accepts
    /// several, where its quota has room (its charge follows it to the new model).
    /// Empty: a moved GPU pod stays on its model.
    pub(crate) other_models: Arc<[Arc<str>]>,
}

/// A node the planner can take pods off and put pods on: its GPUs and free CPU and
/// memory ([`Candidate`]) and the pods running there.
pub(crate) trait Ground: Candidate {
    type Pod: Clone + PartialEq + std::fmt::Debug;

    fn residents(&self) -> &[Resident<Self::Pod>];

    /// Everything a move changes, to carry a plan out ([`Plan::apply`]).
    fn parts_mut(&mut self) -> NodeParts<'_, Self::Pod>;
}

/// A node's mutable parts: its GPUs' use, its free CPU and memory if tracked, its pods.
pub(crate) struct NodeParts<'a, K> {
    pub(crate) gpus: &'a mut NodeGpus,
    pub(crate) room: Option<&'a mut HostRoom>,
    pub(crate) residents: &'a mut Vec<Resident<K>>,
}

/// A node as the planner's callers hold it: its GPUs, its free CPU and memory where
/// they are tracked, and its pods (the `defrag` command; the planner's tests).
#[derive(Debug, Clone)]
pub(crate) struct Site<K> {
    pub(crate) gpus: NodeGpus,
    pub(crate) room: Option<HostRoom>,
    pub(crate) residents: Vec<Resident<K>>,
}

impl<K> Candidate for Site<K> {
    fn gpus(&self) -> &NodeGpus {
        &self.gpus
    }
    fn room(&self) -> Option<HostRoom> {
        self.room
    }
}

impl<K: Clone + PartialEq + std::fmt::Debug> Ground for Site<K> {
    type Pod = K;

    fn residents(&self) -> &[Resident<K>] {
        &self.residents
    }

    fn parts_mut(&mut self) -> NodeParts<'_, K> {
        NodeParts {
            gpus: &mut self.gpus,
            room: self.room.as_mut(),
            residents: &mut self.residents,
        }
    }
}

/// The pending pod: what it asks and its priority (no pod of higher priority moves
/// for it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub(crate) request: &'a GpuRequest,
    pub(crate) host: HostRoom,
    pub(crate) priority: i32,
}

/// How far a plan may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) max_moves: usize,
    /// Evaluations the search may spend (see [`DEFAULT_BUDGET`]).
    pub(crate) budget: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_moves: DEFAULT_MAX_MOVES,
            budget: DEFAULT_BUDGET,
        }
    }
}

/// One running pod taken off node `from` and placed on node `to` (indices into the
/// cluster the plan was made for), on the GPUs `assignment` names there. `from` is the
/// plan's target, or a node a chain makes room on for a pod moved after this one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Move<K> {
    pub(crate) pod: K,
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) assignment: Assignment,
}

/// Moves after which the pending pod fits on `node`, on the GPUs `assignment` names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan<K> {
    pub(crate) node: usize,
    pub(crate) assignment: Assignment,
    /// In the order they must happen.
    pub(crate) moves: Vec<Move<K>>,
    /// vcuda-core of the pods moved (100 per GPU).
    pub(crate) core_moved: u64,
    /// How much the fragmentation of the nodes the plan touches grows, pending pod
    /// placed (the policy's measure, in vcuda-core; negative when it shrinks).
    pub(crate) fragmentation: f64,
}

/// Why no plan exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoPlan {
    #[error(
        "the nodes the pod may use have {free} vcuda-core free in all, it needs {need}: moves make no room"
    )]
    TooLittleFree { need: u64, free: u64 },
    #[error("no node the pod may use could take it, even with every movable pod moved off")]
    NoNode,
    #[error("no node can make room by moving at most {max_moves} movable pods")]
    TooManyMoves { max_moves: usize },
    #[error(
        "room can be made by moving at most {max_moves} pods, but the pods to move fit on no other node"
    )]
    NoDestination { max_moves: usize },
    #[error("the search budget ({budget} evaluations) ran out before a plan was found")]
    BudgetSpent { budget: u64 },
}

impl NoPlan {
    /// The reason's name, for counting reasons (`simulate --defrag`, metrics).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            NoPlan::TooLittleFree { .. } => "too_little_free",
            NoPlan::NoNode => "no_node",
            NoPlan::TooManyMoves { .. } => "too_many_moves",
            NoPlan::NoDestination { .. } => "no_destination",
            NoPlan::BudgetSpent { .. } => "budget_spent",
        }
    }
}

/// A plan no longer matches the cluster it is applied to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Stale {
    #[error("node {0} is not in the cluster")]
    NoNode(usize),
    #[error("a pod to move is no longer on node {0}")]
    PodGone(usize),
}

/// Evaluations left to spend.
#[derive(Debug)]
pub(super) struct Evaluations {
    left: u64,
    /// Nodes glanced at and passed over since the last evaluation they were charged.
    glances: u32,
}

/// A node passed over on a cheap test costs this fraction of an evaluation.
const GLANCES_PER_EVALUATION: u32 = 8;

impl Evaluations {
    fn new(limit: u64) -> Evaluations {
        Evaluations {
            left: limit,
            glances: 0,
        }
    }

    /// A node passed over on a cheap test; false when the budget is spent.
    pub(super) fn glance(&mut self) -> bool {
        self.glances += 1;
        if self.glances < GLANCES_PER_EVALUATION {
            return !self.spent();
        }
        self.glances = 0;
        self.spend()
    }

    /// Spend one evaluation; false when none is left.
    pub(super) fn spend(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }

    pub(super) fn spent(&self) -> bool {
        self.left == 0
    }
}

/// The planner: the placer that fits and scores, and how far it may go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planner<'p> {
    pub(crate) placer: &'p Placer,
    pub(crate) limits: Limits,
}

impl Planner<'_> {
    /// The plan with the fewest moves after which `ask` fits, or why there is none.
    /// `allowed` rejects nodes the pending pod may not use at all (model, pool, quota;
    /// its CPU and memory are checked here); `movable` says which pods may move (no
    /// pod of higher priority than the pending pod's ever does). A moved pod stays in
    /// its pools, and on its GPU model unless it names others (`other_models`).
    pub(crate) fn plan<C: Ground>(
        &self,
        cluster: &[C],
        ask: &Ask<'_>,
        allowed: impl Fn(&NodeGpus) -> Result<(), Misfit>,
        movable: impl Fn(&Resident<C::Pod>) -> bool,
    ) -> Result<Plan<C::Pod>, NoPlan> {
        if let Some(plan) = self.fits_now(cluster, ask, &allowed) {
            return Ok(plan);
        }
        let max_moves = self.limits.max_moves;
        if max_moves == 0 {
            return Err(NoPlan::TooManyMoves { max_moves });
        }
        let mut budget = Evaluations::new(self.limits.budget);
        let may_move = |r: &Resident<C::Pod>| r.priority <= ask.priority && movable(r);
        let (need, free) = (ask.request.core_units(), free_core(cluster, &allowed));
        if free < need && !changes_model(cluster, &may_move) {
            return Err(NoPlan::TooLittleFree { need, free });
        }
        let search = cover::Search {
            placer: self.placer,
            ask,
        };
        let mut targets = search.targets(cluster, &allowed, &may_move, &mut budget);
        if targets.is_empty() {
            return Err(self.exhausted(&budget).unwrap_or(NoPlan::NoNode));
        }
        let mut lander = land::Lander::new(self.placer, cluster, ask, &may_move, max_moves);
        let mut covered = false;
        // Covers of fewer pods than the moves allowed so far: their pods may land by
        // chains of the moves left.
        let mut smaller: Vec<cover::Cover> = Vec::new();
        for moves in 1..=max_moves {
            let covers = search.covers(cluster, &mut targets, moves, usize::MAX, &mut budget);
            covered |= !covers.is_empty();
            let tries = covers
                .iter()
                .map(|c| (c, 0))
                .chain(smaller.iter().map(|c| (c, moves - c.movers.len())))
                .collect();
            if let Some(plan) = self.best(cluster, ask, tries, &mut lander, &mut budget) {
                return Ok(plan);
            }
            smaller.extend(covers);
            if let Some(spent) = self.exhausted(&budget) {
                return Err(spent);
            }
        }
        Err(if covered {
            NoPlan::NoDestination { max_moves }
        } else {
            NoPlan::TooManyMoves { max_moves }
        })
    }

    fn exhausted(&self, budget: &Evaluations) -> Option<NoPlan> {
        budget.spent().then_some(NoPlan::BudgetSpent {
            budget: self.limits.budget,
        })
    }

    /// A plan without moves when the pod fits as the cluster is: the policy's choice.
    fn fits_now<C: Ground>(
        &self,
        cluster: &[C],
        ask: &Ask<'_>,
        allowed: &impl Fn(&NodeGpus) -> Result<(), Misfit>,
    ) -> Option<Plan<C::Pod>> {
        let outcome = place_with_host(self.placer, ask.request, &ask.host, cluster, |c| {
            allowed(c.gpus())?;
            host_admits(c.room(), &ask.host)
        });
        let (node, assignment) = outcome.chosen?;
        let mut after = cluster[node].gpus().clone();
        assignment.occupy(&mut after);
        let room = cluster[node].room();
        let mix = self.placer.mix.or_whole_gpu();
        let fragmentation = mix.fragmentation(&after, room.map(|r| r.minus(&ask.host)).as_ref())
            - mix.fragmentation(cluster[node].gpus(), room.as_ref());
        Some(Plan {
            node,
            assignment,
            moves: Vec::new(),
            core_moved: 0,
            fragmentation,
        })
    }

    /// The best plan among `tries` (covers, each with the moves its pods' chains may
    /// add: as many moves in all for every one), if any lands.
    fn best<C: Ground>(
        &self,
        cluster: &[C],
        ask: &Ask<'_>,
        mut tries: Vec<(&cover::Cover, usize)>,
        lander: &mut land::Lander<'_, C>,
        budget: &mut Evaluations,
    ) -> Option<Plan<C::Pod>> {
        tries.sort_by_key(|(c, spare)| (c.core_moved, *spare));
        let mix = self.placer.mix.or_whole_gpu();
        let mut best: Option<Plan<C::Pod>> = None;
        for (cover, spare) in tries {
            // A chain only adds GPUs moved: a cover already moving more cannot win.
            let worse = best
                .as_ref()
                .is_some_and(|b| cover.core_moved > b.core_moved);
            if worse || !budget.spend() {
                break;
            }
            let Some(plan) = lander.plan(cover, spare, ask, &mix, budget) else {
                continue;
            };
            if best.as_ref().is_none_or(|b| better(&plan, b, cluster)) {
                best = Some(plan);
            }
        }
        best
    }
}

/// Whether plan `a` beats `b`: fewer moves, then fewer GPUs moved, then less
/// fragmentation, then the target's name.
fn better<C: Ground>(a: &Plan<C::Pod>, b: &Plan<C::Pod>, cluster: &[C]) -> bool {
    let name = |p: &Plan<C::Pod>| &cluster[p.node].gpus().name;
    a.moves
        .len()
        .cmp(&b.moves.len())
        .then_with(|| a.core_moved.cmp(&b.core_moved))
        .then_with(|| a.fragmentation.total_cmp(&b.fragmentation))
        .then_with(|| name(a).cmp(name(b)))
        .is_lt()
}

/// vcuda-core free on every node of the GPU models of the nodes `allowed` lets the pod
/// use. A move keeps a GPU pod on its model, so this total never grows: a pod that
/// needs more can never fit.
fn free_core<C: Ground>(cluster: &[C], allowed: &impl Fn(&NodeGpus) -> Result<(), Misfit>) -> u64 {
    let mut models: Vec<&Option<Arc<str>>> = Vec::new();
    for gpus in cluster.iter().map(Candidate::gpus) {
        if !models.contains(&&gpus.model) && allowed(gpus).is_ok() {
            models.push(&gpus.model);
        }
    }
    let same_model = cluster.iter().map(Candidate::gpus);
    same_model
        .filter(|g| models.contains(&&g.model))
        .map(|g| u64::from(g.total_free_core()))
        .sum()
}

/// Whether a pod that may move may also change model: then moves can free GPUs of
/// the models the pending pod may use, and [`free_core`] bounds nothing.
fn changes_model<C: Ground>(cluster: &[C], may_move: &impl Fn(&Resident<C::Pod>) -> bool) -> bool {
    let residents = cluster.iter().flat_map(|c| c.residents());
    residents
        .filter(|r| !r.other_models.is_empty())
        .any(may_move)
}

/// Whether a node with free `room` (if tracked) can host `need`.
fn host_admits(room: Option<HostRoom>, need: &HostRoom) -> Result<(), Misfit> {
    let Some(room) = room else { return Ok(()) };
    let short = |resource, need, free| Misfit::HostShort {
        resource,
        need,
        free,
    };
    if need.cpu_milli > room.cpu_milli {
        return Err(short("milli-CPU", need.cpu_milli, room.cpu_milli));
    }
    if need.memory_mib > room.memory_mib {
        return Err(short("MiB memory", need.memory_mib, room.memory_mib));
    }
    Ok(())
}

impl<K: Clone + PartialEq> Plan<K> {
    /// Carry the plan out on `cluster` (the one it was made for): each move in order,
    /// then `pending` seated on the target with the plan's GPUs.
    pub(crate) fn apply<C: Ground<Pod = K>>(
        &self,
        cluster: &mut [C],
        mut pending: Resident<K>,
    ) -> Result<(), Stale> {
        for step in &self.moves {
            let from = cluster.get_mut(step.from).ok_or(Stale::NoNode(step.from))?;
            let mut moved = take(from, &step.pod).ok_or(Stale::PodGone(step.from))?;
            moved.assignment = step.assignment.clone();
            put(
                cluster.get_mut(step.to).ok_or(Stale::NoNode(step.to))?,
                moved,
            );
        }
        pending.assignment = self.assignment.clone();
        put(
            cluster.get_mut(self.node).ok_or(Stale::NoNode(self.node))?,
            pending,
        );
        Ok(())
    }
}

/// Take `pod` off `node`, giving back its GPUs, CPU and memory.
fn take<C: Ground>(node: &mut C, pod: &C::Pod) -> Option<Resident<C::Pod>> {
    let NodeParts {
        gpus,
        room,
        residents,
    } = node.parts_mut();
    let at = residents.iter().position(|r| r.pod == *pod)?;
    let resident = residents.remove(at);
    resident.assignment.vacate(gpus);
    if let Some(room) = room {
        *room = room.plus(&resident.host);
    }
    Some(resident)
}

/// Put `resident` on `node` on the GPUs its assignment names.
pub(crate) fn put<C: Ground>(node: &mut C, resident: Resident<C::Pod>) {
    let NodeParts {
        gpus,
        room,
        residents,
    } = node.parts_mut();
    resident.assignment.occupy(gpus);
    if let Some(room) = room {
        *room = room.minus(&resident.host);
    }
    residents.push(resident);
}
