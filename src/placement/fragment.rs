//! Fragmentation of free GPU capacity, after Weng et al., "Beware of Fragmentation"
//! (USENIX ATC '23), and the request mix it is measured against.
//!
//! A node's *fragmentation* under a mix of task shapes is the expected amount of its
//! free GPU capacity (in vcuda-core, 100 = one GPU) that a task drawn from the mix
//! could not use:
//! - a share task (`core`, `memory` on one GPU) cannot use a GPU whose free cores or
//!   free memory are below its demand, so those GPUs' free cores are fragments; on a
//!   GPU where `n` such tasks fit, the cores left after `n` of them are fragments too
//!   (30-core tasks strand 10 cores of an idle GPU). The paper counts only the first
//!   case; the leftover is our addition (docs/simulate.md measures it);
//! - a task of `k` whole GPUs cannot use partly used GPUs; if fewer than `k` GPUs are
//!   wholly free it cannot use the node at all, and every free core is a fragment;
//! - a task whose CPU or memory the node cannot host now, or that can never run on
//!   the node (another GPU model, more GPUs than the node has, more memory than one
//!   of its GPUs), cannot use any of its GPUs: every free core is a fragment.
//!
//! Counting the never-runnable shapes, as the paper does, is deliberate: it makes
//! a pod prefer capacity that fewer shapes can use, keeping the versatile capacity
//! for the shapes that need it (measured: +0.14 points on the default trace against
//! leaving them out, docs/simulate.md).
//!
//! Each shape weighs its frequency among the tasks (the paper's popularity) divided by
//! the square root of its size in GPUs, every shape seen is kept (up to
//! [`MAX_GPU_SHAPES`] GPU shapes), and shapes carry GPU, CPU and models but not memory.
//! Each of these was measured against its alternatives (plain frequency, weights by GPU
//! demand, the paper's 95% cut, memory in the shape) on the openb traces;
//! docs/simulate.md has the screen.
//!
//! FGD places a pod where the fragmentation grows least (see `policy.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::fit::{Assignment, GpuChoice, fit_held, pick_whole};
use super::node::{GpuUse, NodeGpus};
use super::request::{CORE_PER_GPU, GpuDemand, GpuRequest};

/// Non-GPU resources: what a task needs, or what a node has left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostRoom {
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

impl HostRoom {
    /// Whether a task needing `need` fits in this room.
    pub fn holds(&self, need: &HostRoom) -> bool {
        self.cpu_milli >= need.cpu_milli && self.memory_mib >= need.memory_mib
    }

    /// The room left after `need` is taken (never negative).
    pub fn minus(&self, need: &HostRoom) -> HostRoom {
        HostRoom {
            cpu_milli: self.cpu_milli.saturating_sub(need.cpu_milli),
            memory_mib: self.memory_mib.saturating_sub(need.memory_mib),
        }
    }
}

/// The GPU part of a task shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuShape {
    /// A share of one GPU: vcuda-core below 100 and vcuda-memory units.
    Share { core: u32, memory: u32 },
    /// This many wholly free GPUs on one node.
    Whole { gpus: u32 },
}

impl GpuShape {
    /// The shape's size in GPUs (0.5 for half a GPU).
    pub fn gpus(self) -> f64 {
        match self {
            GpuShape::Share { core, .. } => f64::from(core) / f64::from(CORE_PER_GPU),
            GpuShape::Whole { gpus } => f64::from(gpus),
        }
    }

    /// The shape of a pod's request: its whole GPUs (app containers and native
    /// sidecars, which run beside them) if it has any, else its largest share. `None`
    /// for a request without such containers. Pods with several GPU containers are
    /// rare; their dominant container stands for them.
    pub fn of_request(request: &GpuRequest) -> Option<GpuShape> {
        let sidecars = request.sidecars.iter().copied();
        let demands = || {
            request
                .containers
                .iter()
                .map(|c| c.demand)
                .chain(sidecars.clone())
        };
        let whole: u32 = demands()
            .map(|d| match d {
                GpuDemand::Whole { gpus } => gpus,
                GpuDemand::Share { .. } => 0,
            })
            .fold(0, u32::saturating_add);
        if whole > 0 {
            return Some(GpuShape::Whole { gpus: whole });
        }
        demands()
            .filter_map(|demand| match demand {
                GpuDemand::Share { core, memory } => Some((core, memory)),
                GpuDemand::Whole { .. } => None,
            })
            .max()
            .map(|(core, memory)| GpuShape::Share { core, memory })
    }
}

/// One kind of task: its GPU shape, the CPU and memory it needs and, if it is
/// constrained, the GPU models it accepts (sorted, no duplicates).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskShape {
    pub gpu: GpuShape,
    pub host: HostRoom,
    pub models: Option<Arc<[Arc<str>]>>,
}

impl TaskShape {
    /// A shape with only a GPU part: any model, no CPU or memory counted.
    pub fn gpu_only(gpu: GpuShape) -> TaskShape {
        TaskShape {
            gpu,
            host: HostRoom::default(),
            models: None,
        }
    }

    /// A shape accepting only `models` (empty means any model).
    pub fn with_models(mut self, models: &[impl AsRef<str>]) -> TaskShape {
        let mut list: Vec<Arc<str>> = models.iter().map(|m| Arc::from(m.as_ref())).collect();
        list.sort();
        list.dedup();
        self.models = (!list.is_empty()).then(|| list.into());
        self
    }
}

/// At most this many distinct GPU shapes (the most common) enter a mix: scoring a node
/// costs O(GPUs × distinct GPU shapes), and the extender scores thousands per call.
/// The rare tail is not dropped otherwise: it measured better kept (docs/simulate.md).
pub const MAX_GPU_SHAPES: usize = 32;

/// A fixed request mix: task shapes with frequencies summing to 1 (or no shapes at
/// all, under which every node's fragmentation is 0). Immutable, so `place()` can read
/// it from many threads; a learning [`RequestMix`] hands out fresh snapshots.
#[derive(Debug, Clone, Default)]
pub struct TaskMix {
    /// Distinct GPU shapes; `entries` point into it and are grouped by it.
    demands: Vec<GpuShape>,
    /// Sorted by `demand`, so one pass over a node handles each GPU shape once.
    entries: Vec<MixEntry>,
    /// Interned model names; `MixEntry::models` is a bit set over them.
    models: Vec<Arc<str>>,
}

#[derive(Debug, Clone)]
struct MixEntry {
    weight: f64,
    demand: usize,
    host: HostRoom,
    /// Bit `i` set: `models[i]` accepted. `None`: any model.
    models: Option<u64>,
}

impl TaskMix {
    /// The mix of `shapes`, each weighted by its frequency (see [`TaskMix::from_counts`]).
    pub fn from_shapes(shapes: impl IntoIterator<Item = TaskShape>) -> TaskMix {
        let mut counts: HashMap<TaskShape, u64> = HashMap::new();
        for shape in shapes {
            *counts.entry(shape).or_default() += 1;
        }
        TaskMix::from_counts(counts.into_iter().collect())
    }

    /// The mix of exactly these shapes with these (positive) weights, normalised (no
    /// weighting by size here: the caller's weights are taken as they are).
    pub fn weighted(shapes: impl IntoIterator<Item = (TaskShape, f64)>) -> TaskMix {
        let kept: Vec<(TaskShape, f64)> = shapes.into_iter().filter(|(_, w)| *w > 0.0).collect();
        TaskMix::build(kept)
    }

    /// Shapes weighted by how often they were seen (the paper's popularity) over the
    /// square root of their size in GPUs (see [`size_discount`]), most common first
    /// (ties in a fixed order); shapes whose GPU part is not among the
    /// [`MAX_GPU_SHAPES`] most common are left out. Memory is dropped from the shapes
    /// (as in the paper's typical-task key): it splits alike tasks into many rare shapes
    /// and rarely strands GPUs; CPU does, and stays.
    fn from_counts(counts: Vec<(TaskShape, u64)>) -> TaskMix {
        let mut merged: HashMap<TaskShape, u64> = HashMap::new();
        for (mut shape, n) in counts {
            shape.host.memory_mib = 0;
            *merged.entry(shape).or_default() += n;
        }
        let mut counts: Vec<_> = merged.into_iter().collect();
        counts.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| a.0.gpu.cmp(&b.0.gpu))
                .then_with(|| a.0.host.cmp(&b.0.host))
                .then_with(|| a.0.models.cmp(&b.0.models))
        });
        let mut gpu_shapes: Vec<GpuShape> = Vec::new();
        let mut kept = Vec::new();
        for (shape, n) in counts {
            if !gpu_shapes.contains(&shape.gpu) {
                if gpu_shapes.len() == MAX_GPU_SHAPES {
                    continue;
                }
                gpu_shapes.push(shape.gpu);
            }
            let weight = n as f64 * size_discount(shape.gpu);
            kept.push((shape, weight));
        }
        TaskMix::build(kept)
    }

    fn build(kept: Vec<(TaskShape, f64)>) -> TaskMix {
        let total: f64 = kept.iter().map(|(_, w)| w).sum();
        let mut mix = TaskMix::default();
        for (shape, weight) in kept {
            let demand = intern(&mut mix.demands, shape.gpu);
            let models = shape.models.as_ref().map(|list| {
                list.iter()
                    .map(|m| intern(&mut mix.models, m.clone()))
                    .filter(|&i| i < 64)
                    .fold(0u64, |bits, i| bits | 1 << i)
            });
            mix.entries.push(MixEntry {
                weight: weight / total,
                demand,
                host: shape.host,
                models,
            });
        }
        mix.entries.sort_by_key(|e| e.demand);
        mix
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of task shapes in the mix.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The shapes and their weights (for reports).
    pub fn shapes(&self) -> impl Iterator<Item = (GpuShape, HostRoom, f64)> + '_ {
        self.entries
            .iter()
            .map(|e| (self.demands[e.demand], e.host, e.weight))
    }

    /// The bit of `model` in the shapes' model sets; `None` if no shape names it.
    fn model_bit(&self, model: Option<&str>) -> Option<u64> {
        let model = model?;
        let index = self.models.iter().position(|m| &**m == model)?;
        (index < 64).then(|| 1u64 << index)
    }

    /// The expected free vcuda-core of `gpus` a task drawn from the mix could not use.
    /// `room` is the node's free CPU and memory, if tracked (the extender does not).
    ///
    /// Cost: O(shapes + GPUs × distinct GPU shapes), no allocation.
    pub fn fragmentation(&self, gpus: &NodeGpus, room: Option<&HostRoom>) -> f64 {
        self.fragmentation_of(gpus, &gpus.used, room)
    }

    /// The share (0..=1) of the free GPU capacity of `nodes` that a task drawn from
    /// the mix could not use; 0 when nothing is free. An empty mix (no pod seen yet)
    /// stands for one whole GPU: then free capacity on partly used GPUs is fragmented.
    pub fn cluster_fragmentation<'a>(&self, nodes: impl IntoIterator<Item = &'a NodeGpus>) -> f64 {
        let whole;
        let mix = if self.is_empty() {
            whole = TaskMix::weighted([(TaskShape::gpu_only(GpuShape::Whole { gpus: 1 }), 1.0)]);
            &whole
        } else {
            self
        };
        let (fragmented, free) = nodes.into_iter().fold((0.0, 0u64), |(f, free), node| {
            (
                f + mix.fragmentation(node, None),
                free + u64::from(node.total_free_core()),
            )
        });
        if free == 0 {
            0.0
        } else {
            fragmented / free as f64
        }
    }

    /// The entries grouped by GPU demand (they are kept sorted by it), with the shape.
    fn groups(&self) -> impl Iterator<Item = (GpuShape, &[MixEntry])> + '_ {
        self.entries
            .chunk_by(|a, b| a.demand == b.demand)
            .map(|group| (self.demands[group[0].demand], group))
    }

    /// [`TaskMix::fragmentation`] of `node` as if its GPUs were in use as `used` says
    /// (same length): lets a caller try a placement without cloning the node.
    pub fn fragmentation_of(
        &self,
        node: &NodeGpus,
        used: &[GpuUse],
        room: Option<&HostRoom>,
    ) -> f64 {
        let state = GpuState::of(used, node.memory_per_gpu);
        let model = self.model_bit(node.model.as_deref());
        let mut unusable = 0.0;
        let mut fragments = 0.0;
        for (shape, entries) in self.groups() {
            let mut runnable = 0.0;
            for entry in entries {
                let runs = state.may_ever_run(shape)
                    && entry.accepts(model)
                    && room.is_none_or(|r| r.holds(&entry.host));
                if runs {
                    runnable += entry.weight;
                } else {
                    unusable += entry.weight;
                }
            }
            if runnable > 0.0 {
                fragments += runnable * f64::from(state.fragment(used, shape));
            }
        }
        fragments + unusable * f64::from(state.free_core)
    }
}

impl TaskMix {
    /// How much `node`'s fragmentation grows when `charges` (GPU index, use added) are
    /// placed on it and its free CPU and memory go from `before` to `after`: exactly
    /// `fragmentation` after minus `fragmentation` before, but computed from the GPUs
    /// the charges touch, so its cost does not grow with GPUs × GPU shapes. Each shape's
    /// change is an integer number of cores, so placements that change every shape
    /// alike get bitwise equal growths.
    ///
    /// Cost: O(GPUs + shapes × touched GPUs), no allocation for up to 16 touched GPUs.
    pub fn growth(
        &self,
        node: &NodeGpus,
        charges: impl IntoIterator<Item = (usize, GpuUse)>,
        before: Option<&HostRoom>,
        after: Option<&HostRoom>,
    ) -> f64 {
        let mut touched = [Touched::default(); TOUCHED];
        let mut count = 0;
        for (gpu, add) in charges {
            let Some(&was) = node.used.get(gpu) else {
                continue;
            };
            let slot = match touched[..count].iter().position(|t| t.gpu == gpu) {
                Some(slot) => slot,
                None if count < TOUCHED => {
                    touched[count] = Touched {
                        gpu,
                        before: was,
                        after: was,
                    };
                    count += 1;
                    count - 1
                }
                None => return self.growth_by_copy(node, &touched[..count], before, after),
            };
            touched[slot].after.core += add.core;
            touched[slot].after.memory += add.memory;
        }
        let touched = &touched[..count];
        let state = GpuState::of(&node.used, node.memory_per_gpu);
        let state_after = state.with(touched);
        let model = self.model_bit(node.model.as_deref());
        let free = i64::from(state.free_core);
        let free_after = i64::from(state_after.free_core);
        let mut growth = 0.0;
        for (shape, entries) in self.groups() {
            let ever = state.may_ever_run(shape);
            // The shape's fragments before, and their change; computed when needed.
            let mut change: Option<i64> = None;
            let mut fragments: Option<i64> = None;
            for entry in entries {
                let usable = ever && entry.accepts(model);
                let runs = usable && before.is_none_or(|r| r.holds(&entry.host));
                let runs_after = usable && after.is_none_or(|r| r.holds(&entry.host));
                let delta = match (runs, runs_after) {
                    (false, false) => free_after - free,
                    (true, true) => {
                        *change.get_or_insert_with(|| state.change(&state_after, touched, shape))
                    }
                    (true, false) => {
                        free_after
                            - *fragments
                                .get_or_insert_with(|| state.fragment(&node.used, shape) as i64)
                    }
                    (false, true) => {
                        let was = *fragments
                            .get_or_insert_with(|| state.fragment(&node.used, shape) as i64);
                        let change = *change
                            .get_or_insert_with(|| state.change(&state_after, touched, shape));
                        was + change - free
                    }
                };
                growth += entry.weight * delta as f64;
            }
        }
        growth
    }

    /// [`TaskMix::growth`] the plain way, for charges touching very many GPUs.
    fn growth_by_copy(
        &self,
        node: &NodeGpus,
        touched: &[Touched],
        before: Option<&HostRoom>,
        after: Option<&HostRoom>,
    ) -> f64 {
        let mut used = node.used.clone();
        for t in touched {
            used[t.gpu] = t.after;
        }
        self.fragmentation_of(node, &used, after) - self.fragmentation_of(node, &node.used, before)
    }
}

/// What a shape's frequency is multiplied by in the mix: 1 / sqrt(its size in GPUs).
///
/// A shape's fragment is counted in cores, and a large shape finds much more of a
/// node unusable than a small one (an 8-GPU task: the whole node once one GPU is
/// shared), so with plain frequencies the rare multi-GPU shapes steer most placements.
/// Weighting by GPU demand instead (size^1) makes that worse; dividing by the size
/// (size^-1) lets the many small shares decide alone. The exponent -1/2 between the
/// two was chosen on the default openb trace only (-1, -1/2, 0, 1/2, 1 measured) and
/// then held on the four other traces (docs/simulate.md).
fn size_discount(shape: GpuShape) -> f64 {
    1.0 / shape.gpus().sqrt()
}

/// Most GPUs one placement is expected to touch; more take a slower path.
const TOUCHED: usize = 16;

/// One GPU a placement charges: its use before and after.
#[derive(Debug, Clone, Copy, Default)]
struct Touched {
    gpu: usize,
    before: GpuUse,
    after: GpuUse,
}

impl MixEntry {
    fn accepts(&self, model: Option<u64>) -> bool {
        match (self.models, model) {
            (None, _) => true,
            (Some(set), Some(bit)) => set & bit != 0,
            (Some(_), None) => false,
        }
    }
}

fn intern<T: PartialEq>(list: &mut Vec<T>, item: T) -> usize {
    match list.iter().position(|x| *x == item) {
        Some(i) => i,
        None => {
            list.push(item);
            list.len() - 1
        }
    }
}

/// Node-wide GPU totals read once per fragmentation measurement.
struct GpuState {
    gpu_count: u32,
    free_core: u32,
    /// Free cores on GPUs somebody uses (what a whole-GPU task cannot take).
    partial_free_core: u32,
    whole_free: u32,
    memory_per_gpu: u32,
}

impl GpuState {
    fn of(used: &[GpuUse], memory_per_gpu: u32) -> GpuState {
        let mut state = GpuState {
            gpu_count: used.len() as u32,
            free_core: 0,
            partial_free_core: 0,
            whole_free: 0,
            memory_per_gpu,
        };
        for gpu in used {
            let free = CORE_PER_GPU.saturating_sub(gpu.core);
            state.free_core += free;
            if gpu.core == 0 {
                state.whole_free += 1;
            } else {
                state.partial_free_core += free;
            }
        }
        state
    }

    /// The totals once `touched` GPUs are in their `after` use.
    fn with(&self, touched: &[Touched]) -> GpuState {
        let mut state = GpuState { ..*self };
        for t in touched {
            for (use_, sign) in [(t.before, -1i64), (t.after, 1)] {
                let free = i64::from(CORE_PER_GPU.saturating_sub(use_.core)) * sign;
                state.free_core = (i64::from(state.free_core) + free) as u32;
                if use_.core == 0 {
                    state.whole_free = (i64::from(state.whole_free) + sign) as u32;
                } else {
                    state.partial_free_core = (i64::from(state.partial_free_core) + free) as u32;
                }
            }
        }
        state
    }

    /// The change of [`GpuState::fragment`] from this state to `after`, which differs
    /// only in the `touched` GPUs.
    fn change(&self, after: &GpuState, touched: &[Touched], shape: GpuShape) -> i64 {
        match shape {
            GpuShape::Share { core, memory } => touched
                .iter()
                .map(|t| {
                    i64::from(self.share_fragment(t.after, core, memory))
                        - i64::from(self.share_fragment(t.before, core, memory))
                })
                .sum(),
            GpuShape::Whole { gpus } => {
                i64::from(after.whole_fragment(gpus)) - i64::from(self.whole_fragment(gpus))
            }
        }
    }

    /// Free cores of one GPU that tasks of a share of `core` and `memory` cannot use,
    /// however many of them come: all its free cores if not one fits (the paper's
    /// measure), else what is left over once as many as fit are placed.
    fn share_fragment(&self, gpu: GpuUse, core: u32, memory: u32) -> u32 {
        let core = core.max(1);
        let free = CORE_PER_GPU.saturating_sub(gpu.core);
        let free_memory = self.memory_per_gpu.saturating_sub(gpu.memory);
        let by_core = free / core;
        let fit = match free_memory.checked_div(memory) {
            Some(by_memory) => by_core.min(by_memory),
            None => by_core,
        };
        free - fit * core
    }

    /// Free cores a task of `need` whole GPUs cannot use.
    fn whole_fragment(&self, need: u32) -> u32 {
        if need <= self.whole_free {
            self.partial_free_core
        } else {
            self.free_core
        }
    }

    /// Whether some state of this node could host the shape at all (GPU count, memory
    /// per GPU).
    fn may_ever_run(&self, shape: GpuShape) -> bool {
        match shape {
            GpuShape::Share { memory, .. } => self.gpu_count > 0 && memory <= self.memory_per_gpu,
            GpuShape::Whole { gpus } => gpus <= self.gpu_count,
        }
    }

    /// Free cores this GPU shape cannot use on the node.
    fn fragment(&self, used: &[GpuUse], shape: GpuShape) -> u32 {
        match shape {
            GpuShape::Share { core, memory } => used
                .iter()
                .map(|&u| self.share_fragment(u, core, memory))
                .sum(),
            GpuShape::Whole { gpus } => self.whole_fragment(gpus),
        }
    }
}

/// Fit `request` on `node` choosing, for each share container, the GPU whose use
/// leaves the node least fragmented under `mix` (ties: gpu-manager's own order);
/// whole GPUs as gpu-manager takes them (any wholly free GPU is as good as another).
/// `None` if some container finds no GPU. Not gpu-manager compatible: see `Placer`.
pub fn least_fragmenting_fit(
    node: &NodeGpus,
    request: &GpuRequest,
    mix: &TaskMix,
    room_after: Option<&HostRoom>,
) -> Option<Assignment> {
    let mut scratch = node.clone();
    let mut assignment = Assignment::default();
    for container in &request.containers {
        let gpus = match container.demand {
            GpuDemand::Share { core, memory } => {
                vec![least_fragmenting_gpu(
                    &scratch, core, memory, mix, room_after,
                )?]
            }
            GpuDemand::Whole { gpus } => pick_whole(&scratch, gpus).ok()?,
        };
        let choice = Assignment {
            choices: vec![GpuChoice {
                container: container.container,
                demand: container.demand,
                gpus,
            }],
            held: Vec::new(),
        };
        choice.charge(&mut scratch);
        assignment.choices.extend(choice.choices);
    }
    assignment.held = fit_held(&scratch, request).ok()?;
    Some(assignment)
}

fn least_fragmenting_gpu(
    node: &NodeGpus,
    core: u32,
    memory: u32,
    mix: &TaskMix,
    room_after: Option<&HostRoom>,
) -> Option<u8> {
    // The room is the same whichever GPU is chosen, so the growth with `room_after`
    // on both sides orders the GPUs as the fragmentation after would.
    (0..node.gpu_count())
        .filter(|&i| node.free_core(i) >= core && node.free_memory(i) >= memory)
        .map(|i| {
            let charge = GpuUse { core, memory };
            let growth = mix.growth(node, [(i, charge)], room_after, room_after);
            let fragments = (growth * 1e6).round() as i64;
            ((fragments, node.free_core(i), node.free_memory(i), i), i)
        })
        .min()
        .and_then(|(_, i)| u8::try_from(i).ok())
}

/// At most this many distinct task shapes are counted by a [`RequestMix`]; far more
/// than a cluster's real mix has (the openb traces have at most a few hundred, CPU,
/// memory and models included), and only [`MAX_GPU_SHAPES`] GPU shapes are scored.
pub const MAX_SHAPES: usize = 1024;

/// A request mix learnt online from the pods the extender sees. `observe` is cheap
/// (one short lock) and callable from many threads through `&self`; `snapshot` builds
/// the immutable [`TaskMix`] that placement reads.
#[derive(Debug, Default)]
pub struct RequestMix {
    counts: Mutex<HashMap<TaskShape, u64>>,
}

impl RequestMix {
    pub fn new() -> RequestMix {
        RequestMix::default()
    }

    /// Count one pod's request (GPU shape only). Requests without GPU containers are
    /// ignored: their placement changes no GPU's usability.
    pub fn observe(&self, request: &GpuRequest) {
        if let Some(gpu) = GpuShape::of_request(request) {
            self.observe_shape(TaskShape::gpu_only(gpu));
        }
    }

    /// Count one task of a fully known shape (CPU, memory, models as well). Once
    /// [`MAX_SHAPES`] distinct shapes are known, new ones are not counted (known ones
    /// still are): whoever can send filter calls must not grow this without bound.
    pub fn observe_shape(&self, shape: TaskShape) {
        let mut counts = self.counts.lock();
        let full = counts.len() >= MAX_SHAPES;
        match counts.get_mut(&shape) {
            Some(count) => *count += 1,
            None if !full => {
                counts.insert(shape, 1);
            }
            None => {}
        }
    }

    /// How many tasks were observed.
    pub fn observed(&self) -> u64 {
        self.counts.lock().values().sum()
    }

    /// The mix of the shapes seen so far (see [`TaskMix::from_counts`]).
    pub fn snapshot(&self) -> TaskMix {
        let counts: Vec<(TaskShape, u64)> = self
            .counts
            .lock()
            .iter()
            .map(|(shape, n)| (shape.clone(), *n))
            .collect();
        TaskMix::from_counts(counts)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::testing::{node, with_used};

    const HALF: GpuShape = GpuShape::Share {
        core: 50,
        memory: 50,
    };
    const ONE: GpuShape = GpuShape::Whole { gpus: 1 };

    fn mix(shapes: &[(GpuShape, f64)]) -> TaskMix {
        TaskMix::weighted(shapes.iter().map(|&(s, w)| (TaskShape::gpu_only(s), w)))
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    #[test]
    fn cluster_fragmentation_is_the_unusable_share_of_free_capacity() {
        // 60 cores free on a shared GPU, 3 idle GPUs (300), a full node (nothing free).
        let shared = with_used(node("a", 4, 100), 0, 40, 40);
        let full = with_used(with_used(node("b", 2, 100), 0, 100, 100), 1, 100, 100);
        let nodes = [shared, full];
        // A half-GPU task can use 50 of the 60 (and all of the idle GPUs); a whole-GPU
        // task none of the 60: (0.5 * 10 + 0.5 * 60) of 360.
        let half_and_whole = mix(&[(HALF, 0.5), (ONE, 0.5)]);
        close(half_and_whole.cluster_fragmentation(&nodes), 35.0 / 360.0);
        // Nothing seen yet: the typical request is one whole GPU, so all 60 are lost.
        close(
            TaskMix::default().cluster_fragmentation(&nodes),
            60.0 / 360.0,
        );
        // Nothing free at all: no fragmentation.
        close(half_and_whole.cluster_fragmentation(&nodes[1..]), 0.0);
    }

    #[test]
    fn one_gpu_thirty_percent_used_half_share_and_whole_mix() {
        // One GPU, 30 cores used: 70 free. Half-GPU task (50%): one fits, 20 are left
        // over. One-GPU task (50%): the GPU is not wholly free, so all 70 are fragments.
        // Expected: 0.5 * 20 + 0.5 * 70 = 45.
        let n = with_used(node("n", 1, 100), 0, 30, 30);
        close(
            mix(&[(HALF, 0.5), (ONE, 0.5)]).fragmentation(&n, None),
            45.0,
        );
        // At 60 used: 40 free < 50, so the half task can't use it either: 40.
        let n = with_used(node("n", 1, 100), 0, 60, 60);
        close(
            mix(&[(HALF, 0.5), (ONE, 0.5)]).fragmentation(&n, None),
            40.0,
        );
    }

    #[test]
    fn multi_gpu_task_counts_whole_node_when_too_few_free_gpus() {
        // 4 GPUs: GPU0 80 used (20 free), GPU1 fully used, GPU2-3 free. Total free 220.
        // 2-GPU task (weight 1/4): two wholly free GPUs, fragment = the partial 20.
        // 4-GPU task (weight 1/4): only 2 free GPUs, fragment = all 220.
        // Quarter share (25 cores, weight 1/2): GPU0's 20 < 25, fragment = 20.
        // Expected: 0.25 * 20 + 0.25 * 220 + 0.5 * 20 = 70.
        let n = with_used(with_used(node("n", 4, 100), 0, 80, 80), 1, 100, 100);
        let quarter = GpuShape::Share {
            core: 25,
            memory: 25,
        };
        let m = mix(&[
            (GpuShape::Whole { gpus: 2 }, 1.0),
            (GpuShape::Whole { gpus: 4 }, 1.0),
            (quarter, 2.0),
        ]);
        close(m.fragmentation(&n, None), 70.0);
    }

    #[test]
    fn share_tasks_strand_what_is_left_after_as_many_as_fit() {
        let thirty = mix(&[(
            GpuShape::Share {
                core: 30,
                memory: 30,
            },
            1.0,
        )]);
        // Idle GPU: three fit, 10 left over.
        close(thirty.fragmentation(&node("n", 1, 100), None), 10.0);
        // 20 used: 80 free, two fit, 20 left over.
        close(
            thirty.fragmentation(&with_used(node("n", 1, 100), 0, 20, 20), None),
            20.0,
        );
        // 10 cores but 70 memory used: memory lets one task in of the three the 90
        // free cores would hold, so 60 cores are left over.
        close(
            thirty.fragmentation(&with_used(node("n", 1, 100), 0, 10, 70), None),
            60.0,
        );
        // 90 used: 10 free, none fits, all 10.
        close(
            thirty.fragmentation(&with_used(node("n", 1, 100), 0, 90, 90), None),
            10.0,
        );
    }

    #[test]
    fn memory_short_gpu_is_a_fragment_for_share_tasks() {
        // 10 cores used but 60 of 100 memory: 90 cores free, 40 memory free. A half task
        // needs 50 memory, so all 90 free cores are fragments.
        let n = with_used(node("n", 1, 100), 0, 10, 60);
        close(mix(&[(HALF, 1.0)]).fragmentation(&n, None), 90.0);
    }

    #[test]
    fn host_room_and_models_decide_which_shapes_count() {
        // Node: 2 free GPUs (200 cores), model T4, 4 CPUs left.
        let mut n = node("n", 2, 100);
        n.model = Some("T4".into());
        let room = HostRoom {
            cpu_milli: 4000,
            memory_mib: 1 << 20,
        };
        let cpu_heavy = TaskShape {
            gpu: ONE,
            host: HostRoom {
                cpu_milli: 8000,
                memory_mib: 0,
            },
            models: None,
        };
        let v100_only = TaskShape::gpu_only(HALF).with_models(&["V100"]);
        let t4_half = TaskShape::gpu_only(HALF).with_models(&["T4", "V100"]);
        let m = TaskMix::weighted([(cpu_heavy, 1.0), (v100_only, 2.0), (t4_half, 1.0)]);
        // cpu_heavy (1/4) can't get its CPU: all 200 free cores are fragments = 50.
        // v100_only (1/2) can never run on a T4: all 200 too = 100. t4_half (1/4): 0.
        close(m.fragmentation(&n, Some(&room)), 150.0);
        // Without CPU tracking, the CPU-heavy task fits: only the V100 task's 100.
        close(m.fragmentation(&n, None), 100.0);
    }

    #[test]
    fn shapes_bigger_than_the_node_count_all_free_capacity() {
        let n = with_used(node("n", 2, 100), 0, 30, 30);
        // 170 free. An 8-GPU task can never run on 2 GPUs: 170. A one-GPU task can use
        // GPU1 but not GPU0's 70. Expected: 0.5 * 170 + 0.5 * 70 = 120.
        let m = mix(&[(GpuShape::Whole { gpus: 8 }, 1.0), (ONE, 1.0)]);
        close(m.fragmentation(&n, None), 120.0);
    }

    #[test]
    fn mix_weighs_shapes_by_frequency_over_root_size_without_memory() {
        let with_memory = |memory_mib| TaskShape {
            gpu: HALF,
            host: HostRoom {
                cpu_milli: 4000,
                memory_mib,
            },
            models: None,
        };
        let mut shapes = vec![TaskShape::gpu_only(ONE); 90];
        // Two memory sizes of the same half-GPU task are one shape: 6 of 100.
        shapes.extend(vec![with_memory(1024); 3]);
        shapes.extend(vec![with_memory(2048); 3]);
        // The rare tail is kept.
        shapes.extend(vec![TaskShape::gpu_only(GpuShape::Whole { gpus: 8 }); 4]);
        let m = TaskMix::from_shapes(shapes);
        let kept: Vec<_> = m.shapes().collect();
        assert_eq!(kept.len(), 3);
        let weight = |gpu| kept.iter().find(|(g, _, _)| *g == gpu).unwrap();
        // Frequency / sqrt(GPUs): 90 / 1, 6 / sqrt(0.5), 4 / sqrt(8), i.e. 90, 8.485
        // and 1.414 of 99.899: the 8-GPU shape weighs 1.4%, not its 4% of the pods.
        let total = 90.0 + 6.0 * 2f64.sqrt() + 4.0 / 8f64.sqrt();
        close(weight(ONE).2, 90.0 / total);
        close(
            weight(GpuShape::Whole { gpus: 8 }).2,
            4.0 / 8f64.sqrt() / total,
        );
        assert!((weight(GpuShape::Whole { gpus: 8 }).2 - 0.01416).abs() < 1e-5);
        let half = weight(HALF);
        close(half.2, 6.0 * 2f64.sqrt() / total);
        assert_eq!((half.1.cpu_milli, half.1.memory_mib), (4000, 0));
    }

    #[test]
    fn mix_keeps_at_most_the_most_common_gpu_shapes() {
        let mut shapes = Vec::new();
        for core in 1..=(MAX_GPU_SHAPES as u32 + 5) {
            let share = GpuShape::Share { core, memory: core };
            // core 1 is the rarest: seen once; higher cores more often.
            shapes.extend(vec![TaskShape::gpu_only(share); core as usize]);
        }
        let m = TaskMix::from_shapes(shapes);
        assert_eq!(m.len(), MAX_GPU_SHAPES);
        assert!(
            m.shapes()
                .all(|(g, _, _)| matches!(g, GpuShape::Share { core, .. } if core > 5))
        );
    }

    #[test]
    fn growth_equals_fragmentation_after_minus_before() {
        // Every charge of every share and whole shape on nodes in many states, with
        // rooms that make the CPU-heavy shape flip between runnable and not.
        let heavy = TaskShape {
            gpu: GpuShape::Whole { gpus: 2 },
            host: HostRoom {
                cpu_milli: 4000,
                memory_mib: 0,
            },
            models: None,
        };
        let quarter = GpuShape::Share {
            core: 25,
            memory: 40,
        };
        let m = TaskMix::weighted([
            (TaskShape::gpu_only(HALF), 3.0),
            (TaskShape::gpu_only(quarter), 2.0),
            (TaskShape::gpu_only(ONE), 5.0),
            (TaskShape::gpu_only(GpuShape::Whole { gpus: 4 }), 1.0),
            (TaskShape::gpu_only(GpuShape::Whole { gpus: 8 }), 1.0),
            (heavy, 2.0),
        ]);
        let room = |cpu| HostRoom {
            cpu_milli: cpu,
            memory_mib: 1 << 20,
        };
        let rooms = [
            (None, None),
            (Some(room(8000)), Some(room(6000))),
            (Some(room(5000)), Some(room(3000))),
            (Some(room(3000)), Some(room(3000))),
        ];
        let states: [&[(u32, u32)]; 4] = [
            &[(0, 0), (0, 0), (0, 0), (0, 0)],
            &[(30, 30), (100, 100), (0, 0), (60, 90)],
            &[(50, 50), (75, 20), (10, 80), (0, 0)],
            &[(100, 100), (100, 100), (90, 90), (0, 0)],
        ];
        for used in states {
            let mut n = node("n", used.len(), 100);
            for (i, &(core, memory)) in used.iter().enumerate() {
                n = with_used(n, i, core, memory);
            }
            for (gpu, add) in (0..n.gpu_count()).flat_map(|i| {
                [(10, 10), (25, 40), (50, 50), (100, 100)].map(|(c, mem)| {
                    (
                        i,
                        GpuUse {
                            core: c,
                            memory: mem,
                        },
                    )
                })
            }) {
                for (before, after) in rooms {
                    let mut charged = n.clone();
                    charged.used[gpu].core += add.core;
                    charged.used[gpu].memory += add.memory;
                    let expected = m.fragmentation(&charged, after.as_ref())
                        - m.fragmentation(&n, before.as_ref());
                    close(
                        m.growth(&n, [(gpu, add)], before.as_ref(), after.as_ref()),
                        expected,
                    );
                }
            }
            // Two GPUs at once, one of them twice.
            let add = GpuUse {
                core: 20,
                memory: 20,
            };
            let mut charged = n.clone();
            for gpu in [0, 3, 0] {
                charged.used[gpu].core += add.core;
                charged.used[gpu].memory += add.memory;
            }
            let expected = m.fragmentation(&charged, None) - m.fragmentation(&n, None);
            close(
                m.growth(&n, [(0, add), (3, add), (0, add)], None, None),
                expected,
            );
        }
    }

    #[test]
    fn request_mix_learns_from_requests_across_threads() {
        let learnt = RequestMix::new();
        let whole = GpuRequest::one(GpuDemand::Whole { gpus: 1 });
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10 {
                        learnt.observe(&whole);
                    }
                });
            }
        });
        learnt.observe(&GpuRequest::default());
        assert_eq!(learnt.observed(), 40);
        let m = learnt.snapshot();
        assert_eq!(m.len(), 1);
        close(
            m.fragmentation(&with_used(node("n", 1, 4), 0, 10, 1), None),
            90.0,
        );
    }

    #[test]
    fn request_mix_keeps_a_bounded_number_of_shapes() {
        let learnt = RequestMix::new();
        let shape = |cpu_milli| TaskShape {
            host: HostRoom {
                cpu_milli,
                memory_mib: 0,
            },
            ..TaskShape::gpu_only(ONE)
        };
        // Forged filter calls, each a new shape: only the first MAX_SHAPES are kept.
        for cpu in 0..(MAX_SHAPES as u64 + 500) {
            learnt.observe_shape(shape(cpu));
        }
        assert_eq!(learnt.counts.lock().len(), MAX_SHAPES);
        assert_eq!(learnt.observed(), MAX_SHAPES as u64);
        // A known shape keeps counting once the mix is full; an unseen one does not.
        learnt.observe_shape(shape(0));
        learnt.observe_shape(shape(u64::MAX));
        assert_eq!(learnt.counts.lock()[&shape(0)], 2);
        assert!(!learnt.counts.lock().contains_key(&shape(u64::MAX)));
    }
}
