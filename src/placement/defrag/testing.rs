//! Small clusters for the planner's tests: nodes with a model, GPUs, CPU and memory,
//! and named pods placed on them the way gpu-manager would.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use crate::placement::fit::fit;
use crate::placement::fragment::HostRoom;
use crate::placement::request::{GpuDemand, GpuRequest};

use super::{Resident, put};

/// vcuda-memory per GPU on test nodes: a share's memory equals its cores.
pub(super) const MEMORY: u32 = 100;

/// A node of the test clusters.
pub(super) type Site = super::Site<String>;

/// A node `name` of `model` with `gpus` idle GPUs, `cpu` milli-CPU and `memory` MiB free.
pub(super) fn site(name: &str, model: &str, gpus: usize, cpu: u64, memory: u64) -> Site {
    let mut gpus = crate::placement::testing::node(name, gpus, MEMORY);
    gpus.model = Some(model.into());
    Site {
        gpus,
        room: Some(HostRoom {
            cpu_milli: cpu,
            memory_mib: memory,
        }),
        residents: Vec::new(),
    }
}

/// A share of one GPU: `core` vcuda-core and as much vcuda-memory.
pub(super) fn share(core: u32) -> GpuRequest {
    GpuRequest::one(GpuDemand::Share { core, memory: core })
}

pub(super) fn whole(gpus: u32) -> GpuRequest {
    GpuRequest::one(GpuDemand::Whole { gpus })
}

/// No GPU at all (a CPU-only pod).
pub(super) fn cpu_only() -> GpuRequest {
    GpuRequest::default()
}

pub(super) fn host(cpu: u64, memory: u64) -> HostRoom {
    HostRoom {
        cpu_milli: cpu,
        memory_mib: memory,
    }
}

impl Site {
    /// The node with pod `pod` (priority 0) running on it, on the GPUs gpu-manager
    /// would give it. Panics if it does not fit.
    pub(super) fn with(self, pod: &str, request: GpuRequest, cpu: u64) -> Site {
        self.with_priority(pod, request, cpu, 0)
    }

    pub(super) fn with_priority(
        mut self,
        pod: &str,
        request: GpuRequest,
        cpu: u64,
        priority: i32,
    ) -> Site {
        let assignment = fit(&self.gpus, &request).unwrap();
        let host = host(cpu, 0);
        assert!(self.room.unwrap().cpu_milli >= cpu, "{pod} does not fit");
        put(
            &mut self,
            Resident {
                pod: pod.to_string(),
                request,
                host,
                assignment,
                priority,
                pools: Arc::from(Vec::new()),
                other_models: Arc::from(Vec::new()),
            },
        );
        self
    }
}
