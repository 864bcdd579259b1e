//! The pure core: GPU requests, per-node GPU state, fitting and placement policies,
//! model resolution and quota arithmetic. No HTTP, no API calls, no async: the
//! extender, the webhooks and `simulate` all call these functions.

pub(crate) mod choice;
pub(crate) mod defrag;
pub mod fit;
pub(crate) mod fragment;
pub(crate) mod free;
pub(crate) mod learn;
mod memo;
pub(crate) mod mig;
pub mod models;
pub mod node;
pub(crate) mod policy;
pub mod quantity;
pub(crate) mod request;

#[cfg(test)]
pub(crate) mod testing;

pub use fit::fit;
pub(crate) use fit::{Assignment, GpuChoice, Misfit};
pub use fragment::{GpuShape, HostRoom, TaskMix, TaskShape};
pub(crate) use memo::{PlacementMemo, Stamp, place_versioned};
pub(crate) use mig::MigResources;
pub use node::{GpuUse, NodeGpus};
pub(crate) use policy::{Candidate, DEFAULT_POLICY, place_with_host};
pub use policy::{Outcome, Placer, Policy, place};
#[cfg(test)]
pub(crate) use request::ContainerGpu;
pub use request::{GpuDemand, GpuRequest};
pub(crate) use request::{MigDemand, RequestError};

use serde::Deserialize;

/// Names of the GPU resources (configurable: `resources` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ResourceNames {
    pub(crate) vcuda_core: String,
    pub(crate) vcuda_memory: String,
    /// Prefix of the gpu-manager annotations (`<prefix>/predicate-node`, ...).
    pub(crate) annotation_prefix: String,
    pub(crate) whole_gpu: Vec<String>,
    /// MIG slices: the mixed strategy's resource prefix and the slice table.
    pub mig: MigResources,
}

impl Default for ResourceNames {
    fn default() -> Self {
        ResourceNames {
            vcuda_core: "tencent.com/vcuda-core".into(),
            vcuda_memory: "tencent.com/vcuda-memory".into(),
            annotation_prefix: "tencent.com".into(),
            whole_gpu: vec!["nvidia.com/gpu".into()],
            mig: MigResources::default(),
        }
    }
}

impl ResourceNames {
    /// Every resource name that makes a pod a GPU pod, MIG resources aside
    /// ([`ResourceNames::is_gpu`] says for any name).
    fn all(&self) -> impl Iterator<Item = &str> {
        [self.vcuda_core.as_str(), self.vcuda_memory.as_str()]
            .into_iter()
            .chain(self.whole_gpu.iter().map(String::as_str))
    }

    /// Whether `resource` makes a pod a GPU pod.
    fn is_gpu(&self, resource: &str) -> bool {
        self.all().any(|name| name == resource) || self.mig.profile_of_resource(resource).is_some()
    }
}

/// The node labels that carry a node's GPU model and pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeLabels {
    pub(crate) model: String,
    pub(crate) pool: String,
}

impl Default for NodeLabels {
    fn default() -> Self {
        NodeLabels {
            model: "nvidia.com/gpu.product".into(),
            pool: "gpu-admission.io/pool".into(),
        }
    }
}
