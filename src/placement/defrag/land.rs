//! Where moved pods go: each pod of a cover in turn (largest first) gets the policy's
//! best node of its own GPU model and pools, other than the node it leaves, as the
//! cluster is after the earlier moves; then the pending pod is seated on the target.
//!
//! A pod's best destinations in the cluster as given depend only on its shape, so
//! they are ranked once per shape and plan (the few best kept); during one landing
//! only the nodes it changed are scored again.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use crate::placement::fit::Assignment;
use crate::placement::fragment::{HostRoom, TaskMix};
use crate::placement::models::pool_admits;
use crate::placement::node::NodeGpus;
use crate::placement::policy::{Placer, compare};
use crate::placement::request::GpuRequest;

use super::cover::Cover;
use super::{Ask, Budget, Ground, Move, Plan, Resident, host_admits};

/// Lands the moved pods of covers on one cluster, ranking destinations once per shape.
pub(super) struct Lander<'c, C: Ground> {
    placer: &'c Placer,
    cluster: &'c [C],
    /// Destinations kept per shape: one more than the nodes a landing can have
    /// changed before its last move, so one of them is always unchanged.
    keep: usize,
    rankings: HashMap<Shape, Vec<Spot>>,
}

/// What decides where a moved pod may go and how each node scores it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Shape {
    request: GpuRequest,
    host: HostRoom,
    /// `Some(model)`: only nodes of this GPU model (a GPU pod keeps its model, and so
    /// its quota charge); `None`: any node (a pod without GPUs).
    model: Option<Option<Arc<str>>>,
    pools: Arc<[String]>,
}

/// A destination and the placement there.
#[derive(Debug, Clone)]
struct Spot {
    node: usize,
    assignment: Assignment,
    score: [f64; 2],
}

/// The nodes a landing has changed so far, as they are now: the target first.
struct Scratch {
    nodes: Vec<(usize, NodeGpus, Option<HostRoom>)>,
}

impl Scratch {
    fn has(&self, node: usize) -> bool {
        self.nodes.iter().any(|(n, _, _)| *n == node)
    }

    /// Charge `node` with a pod's GPUs and host ask, copying it in if unchanged yet.
    fn occupy<C: Ground>(
        &mut self,
        cluster: &[C],
        node: usize,
        assignment: &Assignment,
        host: &HostRoom,
    ) {
        let at = match self.nodes.iter().position(|(n, _, _)| *n == node) {
            Some(at) => at,
            None => {
                let base = &cluster[node];
                self.nodes.push((node, base.gpus().clone(), base.room()));
                self.nodes.len() - 1
            }
        };
        let (_, gpus, room) = &mut self.nodes[at];
        assignment.occupy(gpus);
        *room = room.map(|r| r.minus(host));
    }
}

impl<'c, C: Ground> Lander<'c, C> {
    pub(super) fn new(placer: &'c Placer, cluster: &'c [C], max_moves: usize) -> Self {
        Lander {
            placer,
            cluster,
            keep: max_moves + 1,
            rankings: HashMap::new(),
        }
    }

    /// The plan that moves `cover`'s pods (each to its best destination after the
    /// earlier ones) and seats the pending pod, if every pod finds a destination.
    pub(super) fn plan(
        &mut self,
        cover: &Cover,
        ask: &Ask<'_>,
        mix: &TaskMix,
        budget: &mut Budget,
    ) -> Option<Plan<C::Pod>> {
        let cluster = self.cluster;
        let source = &cluster[cover.node];
        let residents = source.residents();
        let mut target = source.gpus().clone();
        let mut room = source.room();
        for &m in &cover.movers {
            residents[m].assignment.vacate(&mut target);
            room = room.map(|r| r.plus(&residents[m].host));
        }
        let mut scratch = Scratch {
            nodes: vec![(cover.node, target, room)],
        };
        let mut order = cover.movers.clone();
        order.sort_by_key(|&m| {
            let r = &residents[m];
            let size = (r.request.core_units(), r.host.cpu_milli, r.host.memory_mib);
            (Reverse(size), m)
        });
        let model = source.gpus().model.clone();
        let mut moves = Vec::with_capacity(order.len());
        for m in order {
            let resident = &residents[m];
            let (to, assignment) = self.destination(resident, &model, &scratch, budget)?;
            scratch.occupy(cluster, to, &assignment, &resident.host);
            moves.push(Move {
                pod: resident.pod.clone(),
                from: cover.node,
                to,
                assignment,
            });
        }
        self.seat(scratch, moves, ask, mix, cover.core_moved)
    }

    /// The pending pod on the target as the moves left it, and the plan's
    /// fragmentation: the growth over every node it changed.
    fn seat(
        &self,
        mut scratch: Scratch,
        moves: Vec<Move<C::Pod>>,
        ask: &Ask<'_>,
        mix: &TaskMix,
        core_moved: u64,
    ) -> Option<Plan<C::Pod>> {
        let (node, gpus, room) = &scratch.nodes[0];
        host_admits(*room, &ask.host).ok()?;
        let room_after = room.map(|r| r.minus(&ask.host));
        let assignment = self
            .placer
            .assign(gpus, ask.request, room_after.as_ref())
            .ok()?;
        let node = *node;
        scratch.occupy(self.cluster, node, &assignment, &ask.host);
        let fragmentation: f64 = scratch
            .nodes
            .iter()
            .map(|(n, gpus, room)| {
                let base = &self.cluster[*n];
                mix.fragmentation(gpus, room.as_ref())
                    - mix.fragmentation(base.gpus(), base.room().as_ref())
            })
            .sum();
        Some(Plan {
            node,
            assignment,
            moves,
            core_moved,
            fragmentation,
        })
    }

    /// The best destination for `resident` (leaving a node of `model`) as `scratch`
    /// has the cluster: its shape's best unchanged node, or a changed one (not the
    /// target) that scores better.
    fn destination(
        &mut self,
        resident: &Resident<C::Pod>,
        model: &Option<Arc<str>>,
        scratch: &Scratch,
        budget: &mut Budget,
    ) -> Option<(usize, Assignment)> {
        let keeps_model = resident.request.has_gpu_demand() || !resident.request.mig.is_empty();
        let shape = Shape {
            request: resident.request.clone(),
            host: resident.host,
            model: keeps_model.then(|| model.clone()),
            pools: resident.pools.clone(),
        };
        if !self.rankings.contains_key(&shape) {
            let ranking = self.rank(&shape, budget);
            self.rankings.insert(shape.clone(), ranking);
        }
        let ranking = self.rankings.get(&shape)?;
        let mut best = ranking.iter().find(|s| !scratch.has(s.node)).cloned();
        for (node, gpus, room) in scratch.nodes.iter().skip(1) {
            if !admits(&shape, gpus, *room) || !budget.spend() {
                continue;
            }
            let Ok((assignment, score)) =
                self.placer
                    .evaluate(gpus, &shape.request, *room, &shape.host)
            else {
                continue;
            };
            let spot = Spot {
                node: *node,
                assignment,
                score,
            };
            if best.as_ref().is_none_or(|b| self.outranks(&spot, b)) {
                best = Some(spot);
            }
        }
        best.map(|s| (s.node, s.assignment))
    }

    /// The `keep` best nodes for `shape` in the cluster as given, best first.
    fn rank(&self, shape: &Shape, budget: &mut Budget) -> Vec<Spot> {
        let mut top: Vec<Spot> = Vec::with_capacity(self.keep + 1);
        for (node, candidate) in self.cluster.iter().enumerate() {
            let (gpus, room) = (candidate.gpus(), candidate.room());
            if !admits(shape, gpus, room) {
                if !budget.glance() {
                    break;
                }
                continue;
            }
            if !budget.spend() {
                break;
            }
            let Ok((assignment, score)) =
                self.placer
                    .evaluate(gpus, &shape.request, room, &shape.host)
            else {
                continue;
            };
            let spot = Spot {
                node,
                assignment,
                score,
            };
            let at = top.partition_point(|held| !self.outranks(&spot, held));
            if at < self.keep {
                top.insert(at, spot);
                top.truncate(self.keep);
            }
        }
        top
    }

    /// Whether `a` is the better destination: the lower score, then the node's name
    /// (as `place_with_host` chooses).
    fn outranks(&self, a: &Spot, b: &Spot) -> bool {
        let name = |s: &Spot| &self.cluster[s.node].gpus().name;
        compare(&a.score, &b.score)
            .then_with(|| name(a).cmp(name(b)))
            .is_lt()
    }
}

/// Whether a pod of `shape` may go to a node with `gpus` and free `room`: its model,
/// its pools, its CPU and memory, and as many free GPU cores in all as it needs (a
/// cheap test that spares the budget the nodes of a full cluster).
fn admits(shape: &Shape, gpus: &NodeGpus, room: Option<HostRoom>) -> bool {
    shape
        .model
        .as_ref()
        .is_none_or(|model| gpus.model == *model)
        && u64::from(gpus.total_free_core()) >= shape.request.core_units()
        && pool_admits(&shape.pools, gpus).is_ok()
        && host_admits(room, &shape.host).is_ok()
}
