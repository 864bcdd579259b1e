//! Where moved pods go: each pod of a cover in turn (largest first) gets the best node
//! of its own GPU model and pools (or another model it accepts), other than the node it
//! leaves, as the cluster is after the earlier moves, ranked as placement ranks: model
//! choice's tier (as the cluster is when the plan starts), then the policy's score;
//! then the pending pod is seated on the target.
//!
//! A pod that fits on no node may still land by a **chain**, when the plan has moves
//! to spare: a node of its model where it fits once a few movable pods there are gone
//! (an *opening*), those pods landed first (each the same way, on fewer spare moves).
//! The moves come out in the order they must happen: the pods a chain moves off a node
//! before the pod that takes their place.
//!
//! A pod's best destinations in the cluster as given depend only on its shape, so
//! they are ranked once per shape and plan (the few best kept), and so are its
//! openings; during one landing only the nodes it changed are scored again, and an
//! opening is used only on a node the landing has not changed.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use crate::placement::choice::{CpuAsk, ModelPressure, cpu_per_core};
use crate::placement::fit::{Assignment, Misfit};
use crate::placement::fragment::{HostRoom, TaskMix};
use crate::placement::models::pool_admits;
use crate::placement::node::NodeGpus;
use crate::placement::policy::{Placer, Ranked, better};
use crate::placement::request::GpuRequest;

use super::cover::{Cover, Search, gpu_room};
use super::{Ask, Evaluations, Ground, Move, Plan, Resident, host_admits};

/// Openings kept per shape: enough to get past those a landing has changed.
const OPENINGS: usize = 12;

/// Lands the moved pods of covers on one cluster, ranking destinations once per shape.
pub(super) struct Lander<'c, C: Ground> {
    placer: &'c Placer,
    cluster: &'c [C],
    /// The models short as the plan starts (`choice`): a GPU pod moved off its node
    /// goes to one only when nothing else takes it, as at placement.
    pressure: ModelPressure,
    /// Which pods may move (the pending pod's priority and the caller's predicate).
    may_move: &'c dyn Fn(&Resident<C::Pod>) -> bool,
    /// The pending pod's priority: a chain moves no pod above it either.
    priority: i32,
    /// Destinations kept per shape: more than the nodes a landing can have changed
    /// before its last move, so one of them is always unchanged.
    keep: usize,
    /// Moves a chain may add (the plan's limit less one: the pod the chain is for).
    chain_moves: usize,
    rankings: HashMap<Shape, Vec<Spot>>,
    openings: HashMap<Shape, Arc<[Cover]>>,
}

/// What decides where a moved pod may go and how each node scores it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Shape {
    request: GpuRequest,
    host: HostRoom,
    /// `Some(models)`: only nodes of these GPU models (a GPU pod's own, and those its
    /// charge may follow it to); `None`: any node (a pod without GPUs).
    models: Option<Arc<[Option<Arc<str>>]>>,
    pools: Arc<[String]>,
}

impl Shape {
    fn of<K>(resident: &Resident<K>, model: &Option<Arc<str>>) -> Shape {
        let keeps_model = resident.request.has_gpu_demand() || !resident.request.mig.is_empty();
        let models = || {
            let others = resident.other_models.iter().map(|m| Some(m.clone()));
            let mut models: Vec<Option<Arc<str>>> =
                std::iter::once(model.clone()).chain(others).collect();
            models.sort();
            models.dedup();
            models.into()
        };
        Shape {
            request: resident.request.clone(),
            host: resident.host,
            models: keeps_model.then(models),
            pools: resident.pools.clone(),
        }
    }

    /// Whether a node of model `model` may take a pod of this shape.
    fn admits_model(&self, model: &Option<Arc<str>>) -> bool {
        (self.models.as_ref()).is_none_or(|models| models.contains(model))
    }
}

/// A destination and the placement there.
#[derive(Debug, Clone)]
struct Spot {
    node: usize,
    assignment: Assignment,
    ranked: Ranked,
}

/// The nodes a landing has changed so far, as they are now: the target first.
#[derive(Clone)]
struct Scratch {
    nodes: Vec<(usize, NodeGpus, Option<HostRoom>)>,
}

impl Scratch {
    fn has(&self, node: usize) -> bool {
        self.nodes.iter().any(|(n, _, _)| *n == node)
    }

    /// `node` as it is now, copied in if unchanged yet.
    fn entry<C: Ground>(
        &mut self,
        cluster: &[C],
        node: usize,
    ) -> &mut (usize, NodeGpus, Option<HostRoom>) {
        let at = match self.nodes.iter().position(|(n, _, _)| *n == node) {
            Some(at) => at,
            None => {
                let base = &cluster[node];
                self.nodes.push((node, base.gpus().clone(), base.room()));
                self.nodes.len() - 1
            }
        };
        &mut self.nodes[at]
    }

    /// Charge `node` with a pod's GPUs and host ask.
    fn occupy<C: Ground>(
        &mut self,
        cluster: &[C],
        node: usize,
        assignment: &Assignment,
        host: &HostRoom,
    ) {
        let (_, gpus, room) = self.entry(cluster, node);
        assignment.occupy(gpus);
        *room = room.map(|r| r.minus(host));
    }

    /// Give back on `node` what a pod leaving it held.
    fn vacate<C: Ground>(&mut self, cluster: &[C], node: usize, resident: &Resident<C::Pod>) {
        let (_, gpus, room) = self.entry(cluster, node);
        resident.assignment.vacate(gpus);
        *room = room.map(|r| r.plus(&resident.host));
    }
}

/// A landing under way: the cluster as the moves so far left it, the moves, and how
/// many more a chain may add.
#[derive(Clone)]
struct Landing<K> {
    scratch: Scratch,
    moves: Vec<Move<K>>,
    core_moved: u64,
    spare: usize,
}

impl<'c, C: Ground> Lander<'c, C> {
    pub(super) fn new(
        placer: &'c Placer,
        cluster: &'c [C],
        ask: &Ask<'_>,
        may_move: &'c dyn Fn(&Resident<C::Pod>) -> bool,
        max_moves: usize,
    ) -> Self {
        Lander {
            placer,
            cluster,
            pressure: placer.pressure(ask.request, cluster.iter().map(|c| c.gpus())),
            may_move,
            priority: ask.priority,
            keep: 2 * max_moves + 2,
            chain_moves: max_moves.saturating_sub(1),
            rankings: HashMap::new(),
            openings: HashMap::new(),
        }
    }

    /// The plan that moves `cover`'s pods (each to its best destination after the
    /// earlier ones, or by a chain of at most `spare` moves in all) and seats the
    /// pending pod, if every pod finds a destination.
    pub(super) fn plan(
        &mut self,
        cover: &Cover,
        spare: usize,
        ask: &Ask<'_>,
        mix: &TaskMix,
        budget: &mut Evaluations,
    ) -> Option<Plan<C::Pod>> {
        let cluster = self.cluster;
        let source = &cluster[cover.node];
        let residents = source.residents();
        let mut landing = Landing {
            scratch: Scratch {
                nodes: vec![(cover.node, source.gpus().clone(), source.room())],
            },
            moves: Vec::with_capacity(cover.movers.len() + spare),
            core_moved: 0,
            spare,
        };
        let model = source.gpus().model.clone();
        for m in largest_first(residents, &cover.movers) {
            self.land(&residents[m], cover.node, &model, &mut landing, budget)?;
        }
        self.seat(landing, ask, mix)
    }

    /// Land `resident`, leaving node `from` (of `model`, in the landing already): on
    /// its best destination, else by a chain. It leaves `from` when its own move
    /// happens, after the chain's, so a chain's pods never use the room it leaves.
    fn land(
        &mut self,
        resident: &Resident<C::Pod>,
        from: usize,
        model: &Option<Arc<str>>,
        landing: &mut Landing<C::Pod>,
        budget: &mut Evaluations,
    ) -> Option<()> {
        let shape = Shape::of(resident, model);
        let spot = self.destination(&shape, from, &landing.scratch, budget);
        let (to, assignment) = match spot {
            Some(spot) => spot,
            None => self.chain(&shape, landing, budget)?,
        };
        landing.scratch.vacate(self.cluster, from, resident);
        landing
            .scratch
            .occupy(self.cluster, to, &assignment, &resident.host);
        landing.core_moved += resident.request.core_units();
        landing.moves.push(Move {
            pod: resident.pod.clone(),
            from,
            to,
            assignment,
        });
        Some(())
    }

    /// A node a pod of `shape` fits on once the pods of one of its openings there have
    /// been landed (their moves added to `landing`), and the pod's GPUs there.
    fn chain(
        &mut self,
        shape: &Shape,
        landing: &mut Landing<C::Pod>,
        budget: &mut Evaluations,
    ) -> Option<(usize, Assignment)> {
        if landing.spare == 0 {
            return None;
        }
        let openings = self.openings_for(shape, budget);
        for opening in openings.iter() {
            if opening.movers.len() > landing.spare || landing.scratch.has(opening.node) {
                continue;
            }
            if !budget.spend() {
                return None;
            }
            let before = landing.clone();
            landing.spare -= opening.movers.len();
            if let Some(assignment) = self.open(shape, opening, landing, budget) {
                return Some((opening.node, assignment));
            }
            *landing = before;
        }
        None
    }

    /// Land the pods of `opening` (off a node the landing has not changed), then fit
    /// `shape` on the node they left.
    fn open(
        &mut self,
        shape: &Shape,
        opening: &Cover,
        landing: &mut Landing<C::Pod>,
        budget: &mut Evaluations,
    ) -> Option<Assignment> {
        let cluster = self.cluster;
        let node = opening.node;
        let residents = cluster[node].residents();
        // In the landing from now on: no other chain opens it.
        landing.scratch.entry(cluster, node);
        let model = cluster[node].gpus().model.clone();
        for m in largest_first(residents, &opening.movers) {
            self.land(&residents[m], node, &model, landing, budget)?;
        }
        let (_, gpus, room) = landing.scratch.entry(cluster, node);
        host_admits(*room, &shape.host).ok()?;
        let room_after = room.map(|r| r.minus(&shape.host));
        self.placer
            .assign(gpus, &shape.request, room_after.as_ref())
            .ok()
    }

    /// The openings for `shape` in the cluster as given (found once per shape): nodes
    /// of its model and pools where it fits once at most `chain_moves` movable pods are
    /// gone, fewest pods first, then the fewest GPUs.
    fn openings_for(&mut self, shape: &Shape, budget: &mut Evaluations) -> Arc<[Cover]> {
        if let Some(known) = self.openings.get(shape) {
            return known.clone();
        }
        let ask = Ask {
            request: &shape.request,
            host: shape.host,
            priority: self.priority,
        };
        let search = Search {
            placer: self.placer,
            ask: &ask,
        };
        let allowed = |gpus: &NodeGpus| {
            if !shape.admits_model(&gpus.model) {
                return Err(Misfit::NotCached);
            }
            pool_admits(&shape.pools, gpus)
        };
        let may_move = |r: &Resident<C::Pod>| r.priority <= self.priority && (self.may_move)(r);
        let mut targets = search.targets(self.cluster, &allowed, &may_move, budget);
        let mut found = Vec::new();
        for size in 1..=self.chain_moves {
            let left = OPENINGS.saturating_sub(found.len());
            if left == 0 || budget.spent() {
                break;
            }
            let mut covers = search.covers(self.cluster, &mut targets, size, left, budget);
            covers.sort_by_key(|c| (c.core_moved, c.node));
            found.extend(covers);
        }
        let found: Arc<[Cover]> = found.into();
        self.openings.insert(shape.clone(), found.clone());
        found
    }

    /// The pending pod on the target as the moves left it, and the plan's
    /// fragmentation: the growth over every node it changed.
    fn seat(&self, landing: Landing<C::Pod>, ask: &Ask<'_>, mix: &TaskMix) -> Option<Plan<C::Pod>> {
        let Landing {
            mut scratch,
            moves,
            core_moved,
            ..
        } = landing;
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

    /// The best destination for a pod of `shape` leaving node `from`, as `scratch` has
    /// the cluster: its shape's best unchanged node, or a changed one (not the target,
    /// not `from`) that scores better.
    fn destination(
        &mut self,
        shape: &Shape,
        from: usize,
        scratch: &Scratch,
        budget: &mut Evaluations,
    ) -> Option<(usize, Assignment)> {
        if !self.rankings.contains_key(shape) {
            let ranking = self.rank(shape, budget);
            self.rankings.insert(shape.clone(), ranking);
        }
        let ranking = self.rankings.get(shape)?;
        let mut best = ranking.iter().find(|s| !scratch.has(s.node)).cloned();
        let per_core = cpu_per_core(&shape.request, &shape.host);
        for (node, gpus, room) in scratch.nodes.iter().skip(1) {
            if *node == from || !admits(shape, gpus, *room) || !budget.spend() {
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
                ranked: (self.tier(per_core, gpus, *room), score),
            };
            if best.as_ref().is_none_or(|b| self.outranks(&spot, b)) {
                best = Some(spot);
            }
        }
        best.map(|s| (s.node, s.assignment))
    }

    /// The `keep` best nodes for `shape` in the cluster as given, best first.
    fn rank(&self, shape: &Shape, budget: &mut Evaluations) -> Vec<Spot> {
        let mut top: Vec<Spot> = Vec::with_capacity(self.keep + 1);
        let per_core = cpu_per_core(&shape.request, &shape.host);
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
                ranked: (self.tier(per_core, gpus, room), score),
            };
            let at = top.partition_point(|held| !self.outranks(&spot, held));
            if at < self.keep {
                top.insert(at, spot);
                top.truncate(self.keep);
            }
        }
        top
    }

    /// Model choice's tier of `gpus` for a pod asking `per_core` CPU per GPU core
    /// (`cpu_per_core`: `None`, a pod without GPUs, takes no model's capacity).
    fn tier(&self, per_core: Option<f64>, gpus: &NodeGpus, room: Option<HostRoom>) -> u8 {
        match per_core {
            Some(_) => self.pressure.tier(gpus, CpuAsk::on(room, per_core)),
            None => 0,
        }
    }

    /// Whether `a` is the better destination: the lower tier, then the lower score,
    /// then the node's name (as `place_with_host` chooses).
    fn outranks(&self, a: &Spot, b: &Spot) -> bool {
        let gpus = |s: &Spot| self.cluster[s.node].gpus();
        better(&a.ranked, gpus(a), &b.ranked, gpus(b))
    }
}

/// `movers` (indices among `residents`) largest first: GPU cores, CPU, memory.
fn largest_first<K>(residents: &[Resident<K>], movers: &[usize]) -> Vec<usize> {
    let mut order = movers.to_vec();
    order.sort_by_key(|&m| {
        let r = &residents[m];
        let size = (r.request.core_units(), r.host.cpu_milli, r.host.memory_mib);
        (Reverse(size), m)
    });
    order
}

/// Whether a pod of `shape` may go to a node with `gpus` and free `room`: its model,
/// its pools, its CPU and memory, and the GPU room it needs by the cover search's
/// lower bounds (one GPU with a share's cores and memory free, as many idle GPUs as
/// whole ones, else as many free GPU cores in all): a cheap test that spares the
/// budget the nodes of a full cluster.
fn admits(shape: &Shape, gpus: &NodeGpus, room: Option<HostRoom>) -> bool {
    host_admits(room, &shape.host).is_ok()
        && shape.admits_model(&gpus.model)
        && gpu_room(gpus, &shape.request)
        && pool_admits(&shape.pools, gpus).is_ok()
}
