//! The shapes tasks come in: a GPU part (a share of one GPU, or whole GPUs), the CPU
//! and memory a task needs (or a node has left), and the GPU models it accepts.

use std::sync::Arc;

use crate::placement::request::{CORE_PER_GPU, GpuDemand, GpuRequest};

/// Non-GPU resources: what a task needs, or what a node has left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostRoom {
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

impl HostRoom {
    /// Whether a task needing `need` fits in this room.
    pub(super) fn holds(&self, need: &HostRoom) -> bool {
        self.cpu_milli >= need.cpu_milli && self.memory_mib >= need.memory_mib
    }

    /// The room left after `need` is taken (never negative).
    pub(crate) fn minus(&self, need: &HostRoom) -> HostRoom {
        HostRoom {
            cpu_milli: self.cpu_milli.saturating_sub(need.cpu_milli),
            memory_mib: self.memory_mib.saturating_sub(need.memory_mib),
        }
    }

    /// The room after `freed` is given back.
    pub(crate) fn plus(&self, freed: &HostRoom) -> HostRoom {
        HostRoom {
            cpu_milli: self.cpu_milli.saturating_add(freed.cpu_milli),
            memory_mib: self.memory_mib.saturating_add(freed.memory_mib),
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
    pub(crate) fn gpus(self) -> f64 {
        match self {
            GpuShape::Share { core, .. } => f64::from(core) / f64::from(CORE_PER_GPU),
            GpuShape::Whole { gpus } => f64::from(gpus),
        }
    }

    /// The shape of a pod's request: its whole GPUs (app containers and native
    /// sidecars, which run beside them) if it has any, else its largest share. `None`
    /// for a request without such containers. Pods with several GPU containers are
    /// rare; their dominant container stands for them.
    pub(crate) fn of_request(request: &GpuRequest) -> Option<GpuShape> {
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
    pub(crate) gpu: GpuShape,
    pub host: HostRoom,
    pub(crate) models: Option<Arc<[Arc<str>]>>,
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
