//! Measuring fragmentation: how much of a node's free GPU capacity a task drawn from a
//! [`TaskMix`] could not use, and how much a placement grows it.

use std::borrow::Cow;

use crate::placement::node::{GpuUse, NodeGpus};
use crate::placement::request::CORE_PER_GPU;

use super::mix::TaskMix;
use super::shape::{GpuShape, HostRoom, TaskShape};

impl TaskMix {
    /// This mix, or while it is empty (no pod seen yet) one whole GPU: what the
    /// cluster's fragmentation, the free-GPU causes and the defragmentation planner
    /// measure against.
    pub(crate) fn or_whole_gpu(&self) -> Cow<'_, TaskMix> {
        if self.is_empty() {
            let whole = TaskShape::gpu_only(GpuShape::Whole { gpus: 1 });
            Cow::Owned(TaskMix::weighted([(whole, 1.0)]))
        } else {
            Cow::Borrowed(self)
        }
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
    pub(crate) fn cluster_fragmentation<'a>(
        &self,
        nodes: impl IntoIterator<Item = &'a NodeGpus>,
    ) -> f64 {
        let mix = self.or_whole_gpu();
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
    /// Of `node`'s free vcuda-core, what some task of the mix that accepts the node's
    /// model could start on now: a GPU's whole free capacity when one such task fits on
    /// it, none of it otherwise. An empty mix stands for one whole GPU, as in
    /// [`TaskMix::cluster_fragmentation`]. CPU and memory are not weighed (the extender
    /// does not track them). The free-GPU causes (`placement::free`) count the rest as
    /// fragmented.
    pub(crate) fn usable_core(&self, node: &NodeGpus) -> u32 {
        let mix = self.or_whole_gpu();
        let state = GpuState::of(&node.used, node.memory_per_gpu);
        let model = mix.model_bit(node.model.as_deref());
        let accepted = || {
            let groups = mix.groups();
            groups.filter(move |(_, entries)| entries.iter().any(|e| e.accepts(model)))
        };
        let usable = |gpu: &GpuUse| accepted().any(|(shape, _)| state.starts_on(*gpu, shape));
        node.used
            .iter()
            .filter(|gpu| usable(gpu))
            .map(|gpu| CORE_PER_GPU.saturating_sub(gpu.core))
            .sum()
    }

    /// How much `node`'s fragmentation grows when `charges` (GPU index, use added) are
    /// placed on it and its free CPU and memory go from `before` to `after`: exactly
    /// `fragmentation` after minus `fragmentation` before, but computed from the GPUs
    /// the charges touch, so its cost does not grow with GPUs × GPU shapes. Each shape's
    /// change is an integer number of cores, so placements that change every shape
    /// alike get bitwise equal growths.
    ///
    /// Cost: O(GPUs + shapes × touched GPUs), no allocation for up to 16 touched GPUs.
    pub(crate) fn growth(
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

/// Most GPUs one placement is expected to touch; more take a slower path.
const TOUCHED: usize = 16;

/// One GPU a placement charges: its use before and after.
#[derive(Debug, Clone, Copy, Default)]
struct Touched {
    gpu: usize,
    before: GpuUse,
    after: GpuUse,
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

    /// Whether one task of `shape` could start on `gpu` now (a whole-GPU task: on this
    /// GPU and others wholly free).
    fn starts_on(&self, gpu: GpuUse, shape: GpuShape) -> bool {
        match shape {
            GpuShape::Share { core, memory } => {
                let free = CORE_PER_GPU.saturating_sub(gpu.core);
                free > 0 && self.share_fragment(gpu, core, memory) < free
            }
            GpuShape::Whole { gpus } => gpu.core == 0 && gpus <= self.whole_free,
        }
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
