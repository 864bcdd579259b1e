//! Request mixes: the fixed [`TaskMix`] (weighted shapes, GPU shapes and model names
//! interned so a measurement is one pass without hashing) and the [`RequestMix`]
//! learnt online, whose snapshots are `TaskMix`es.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::placement::choice::PinnedDemand;

use super::shape::{GpuShape, HostRoom, TaskShape};

/// At most this many distinct GPU shapes (the most common) enter a mix: scoring a node
/// costs O(GPUs × distinct GPU shapes), and the extender scores thousands per call.
/// The rare tail is not dropped otherwise: it measured better kept (docs/simulate.md).
pub(super) const MAX_GPU_SHAPES: usize = 32;

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
pub(super) struct MixEntry {
    pub(super) weight: f64,
    demand: usize,
    pub(super) host: HostRoom,
    /// Bit `i` set: `models[i]` accepted. `None`: any model.
    models: Option<u64>,
}

impl TaskMix {
    /// The mix of `shapes`, each weighted by its frequency (see [`TaskMix::from_counts`]).
    pub(crate) fn from_shapes(shapes: impl IntoIterator<Item = TaskShape>) -> TaskMix {
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
    #[cfg(test)]
    pub(super) fn shapes(&self) -> impl Iterator<Item = (GpuShape, HostRoom, f64)> + '_ {
        self.entries
            .iter()
            .map(|e| (self.demands[e.demand], e.host, e.weight))
    }

    /// The bit of `model` in the shapes' model sets; `None` if no shape names it.
    pub(super) fn model_bit(&self, model: Option<&str>) -> Option<u64> {
        let model = model?;
        let index = self.models.iter().position(|m| &**m == model)?;
        (index < 64).then(|| 1u64 << index)
    }

    /// The entries grouped by GPU demand (they are kept sorted by it), with the shape.
    pub(super) fn groups(&self) -> impl Iterator<Item = (GpuShape, &[MixEntry])> + '_ {
        self.entries
            .chunk_by(|a, b| a.demand == b.demand)
            .map(|group| (self.demands[group[0].demand], group))
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

impl MixEntry {
    pub(super) fn accepts(&self, model: Option<u64>) -> bool {
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

/// At most this many distinct task shapes are counted by a [`RequestMix`]; far more
/// than a cluster's real mix has (the openb traces have at most a few hundred, CPU,
/// memory and models included), and only [`MAX_GPU_SHAPES`] GPU shapes are scored.
pub(super) const MAX_SHAPES: usize = 1024;

/// Refresh the snapshots after this many tasks (and at every power of two before).
const REFRESH_EVERY: u64 = 64;

/// A request mix learnt online from the pods the extender sees. `observe` is cheap
/// (one short lock) and callable from many threads through `&self`; `snapshot` builds
/// the immutable [`TaskMix`] that placement reads.
#[derive(Debug, Default)]
pub(crate) struct RequestMix {
    pub(super) counts: Mutex<HashMap<TaskShape, u64>>,
    /// Tasks observed, counted or not (the refresh cadence).
    seen: AtomicU64,
}

impl RequestMix {
    pub(crate) fn new() -> RequestMix {
        RequestMix::default()
    }

    /// Count one task of a fully known shape (CPU, memory, models as well). Once
    /// [`MAX_SHAPES`] distinct shapes are known, new ones are not counted (known ones
    /// still are): whoever can send filter calls must not grow this without bound.
    ///
    /// True when the snapshots placement reads are due a refresh: a shape never seen
    /// before (a new pinned model set must count at once; at most [`MAX_SHAPES`] times),
    /// and the mix's slow drift at every power of two and every [`REFRESH_EVERY`]
    /// tasks (a snapshot is not free).
    pub(crate) fn observe_shape(&self, shape: TaskShape) -> bool {
        let mut counts = self.counts.lock();
        let full = counts.len() >= MAX_SHAPES;
        let new = match counts.get_mut(&shape) {
            Some(count) => {
                *count += 1;
                false
            }
            None if !full => {
                counts.insert(shape, 1);
                true
            }
            None => false,
        };
        let seen = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        new || seen.is_power_of_two() || seen.is_multiple_of(REFRESH_EVERY)
    }

    /// How many tasks were counted.
    #[cfg(test)]
    pub(crate) fn observed(&self) -> u64 {
        self.counts.lock().values().sum()
    }

    /// The demand seen pinned to sets of models (`placement::choice`).
    pub(crate) fn pinned(&self) -> PinnedDemand {
        let counts = self.counts.lock();
        PinnedDemand::of_counts(counts.iter().map(|(s, n)| (s, *n)))
    }

    /// The mix of the shapes seen so far (see [`TaskMix::from_counts`]).
    pub(crate) fn snapshot(&self) -> TaskMix {
        self.snapshot_where(|shape| shape.clone())
    }

    /// The mix of the shapes seen so far whatever models they accept: the extender's
    /// FGD measures against GPU shapes alone, and learns the models only for
    /// [`RequestMix::pinned`].
    pub(crate) fn snapshot_any_model(&self) -> TaskMix {
        self.snapshot_where(|shape| TaskShape {
            models: None,
            ..shape.clone()
        })
    }

    /// The mix of the shapes seen, each as `kept` keeps it (shapes it makes equal are
    /// merged by [`TaskMix::from_counts`]).
    fn snapshot_where(&self, kept: impl Fn(&TaskShape) -> TaskShape) -> TaskMix {
        let counts: Vec<(TaskShape, u64)> = (self.counts.lock().iter())
            .map(|(shape, n)| (kept(shape), *n))
            .collect();
        TaskMix::from_counts(counts)
    }
}
