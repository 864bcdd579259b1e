//! A node's GPUs and how much of each is in use.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::quantity::Milli;
use super::request::CORE_PER_GPU;
use super::{NodeLabels, ResourceNames};

/// What one GPU has handed out, in vcuda-core (100 per GPU) and vcuda-memory units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GpuUse {
    pub core: u32,
    pub memory: u32,
}

/// A node's GPUs: identity, model, pool, per-GPU memory and current use per GPU index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    pub name: Arc<str>,
    pub model: Option<Arc<str>>,
    pub pool: Option<Arc<str>>,
    /// vcuda-memory units per GPU (0 on nodes that only advertise whole GPUs).
    pub memory_per_gpu: u32,
    /// One entry per GPU index; its length is the node's GPU count.
    pub used: Vec<GpuUse>,
    /// MIG slices the node advertises per profile (mixed strategy), in profile order.
    /// Their use is kube-scheduler's to count (they are ordinary extended resources).
    pub mig_slices: Vec<(Box<str>, u32)>,
    /// `creationTimestamp`, unix seconds (0: unknown). A pending pod is charged by the
    /// nodes that existed when it was created (`quota::pending_label`).
    pub created: i64,
    /// Why no new pod may land here (cordoned, tainted `NoSchedule`/`NoExecute`, not
    /// Ready), if so. kube-scheduler never offers such a node to the extender; the
    /// free-GPU causes and the planner read it.
    pub closed: Option<&'static str>,
}

impl NodeGpus {
    pub fn gpu_count(&self) -> usize {
        self.used.len()
    }

    /// Free vcuda-core on GPU `i` (never negative, even if over-committed by others).
    pub(super) fn free_core(&self, i: usize) -> u32 {
        CORE_PER_GPU.saturating_sub(self.used[i].core)
    }

    pub(super) fn free_memory(&self, i: usize) -> u32 {
        self.memory_per_gpu.saturating_sub(self.used[i].memory)
    }

    /// Free vcuda-core summed over the node's GPUs.
    pub(crate) fn total_free_core(&self) -> u32 {
        (0..self.gpu_count()).map(|i| self.free_core(i)).sum()
    }

    pub(super) fn total_free_memory(&self) -> u32 {
        (0..self.gpu_count()).map(|i| self.free_memory(i)).sum()
    }

    /// GPUs nobody uses at all.
    pub fn free_whole_gpus(&self) -> u32 {
        self.used.iter().filter(|u| u.core == 0).count() as u32
    }

    /// Read GPU capacity, model and pool from a Node. vcuda resources win over whole-GPU
    /// ones when a node advertises both. A node with no GPU resource has zero GPUs.
    pub(crate) fn from_node(node: &Node, names: &ResourceNames, labels: &NodeLabels) -> NodeGpus {
        let name: Arc<str> = node.metadata.name.as_deref().unwrap_or_default().into();
        let label = |key: &str| -> Option<Arc<str>> {
            let value = node.metadata.labels.as_ref()?.get(key)?;
            (!value.is_empty()).then(|| value.as_str().into())
        };
        let (gpus, memory_per_gpu) = capacity(node, names);
        NodeGpus {
            name,
            model: label(&labels.model),
            pool: label(&labels.pool),
            memory_per_gpu,
            used: vec![GpuUse::default(); gpus],
            mig_slices: mig_capacity(node, names),
            created: node
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            closed: closed(node),
        }
    }

    /// Slices of `profile` the node advertises (0 if none).
    pub(super) fn mig_capacity(&self, profile: &str) -> u32 {
        let found = self.mig_slices.iter().find(|(p, _)| &**p == profile);
        found.map_or(0, |(_, count)| *count)
    }
}

/// Why `node` takes no new pods, if so: cordoned, a `NoSchedule` or `NoExecute`
/// taint, or a `Ready` condition that is not `True`.
fn closed(node: &Node) -> Option<&'static str> {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        return Some("cordoned");
    }
    let taints = spec.and_then(|s| s.taints.as_deref()).unwrap_or_default();
    if taints
        .iter()
        .any(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
    {
        return Some("tainted");
    }
    let status = node.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let ready = conditions.iter().find(|c| c.type_ == "Ready");
    ready.filter(|c| c.status != "True").map(|_| "not Ready")
}

/// MIG resources in `status.capacity` (else `allocatable`), per profile.
fn mig_capacity(node: &Node, names: &ResourceNames) -> Vec<(Box<str>, u32)> {
    let status = node.status.as_ref();
    let map = status.and_then(|s| s.capacity.as_ref().or(s.allocatable.as_ref()));
    let mut slices: Vec<(Box<str>, u32)> = map
        .into_iter()
        .flatten()
        .filter_map(|(resource, quantity)| {
            let profile = names.mig.profile_of_resource(resource)?;
            let count = Milli::parse_whole(&quantity.0).ok()?;
            let count = u32::try_from(count.min(MAX_GPUS_PER_NODE * 8)).ok()?;
            (count > 0).then(|| (profile.into(), count))
        })
        .collect();
    slices.sort();
    slices
}

/// Largest GPU count we believe a node can have; bigger numbers are bad data.
pub(crate) const MAX_GPUS_PER_NODE: u64 = 256;

/// (GPU count, vcuda-memory per GPU) from `status.capacity`, else `status.allocatable`.
fn capacity(node: &Node, names: &ResourceNames) -> (usize, u32) {
    let status = node.status.as_ref();
    let read = |resource: &str| -> u64 {
        let from = |map: Option<&std::collections::BTreeMap<_, _>>| {
            map.and_then(|m: &std::collections::BTreeMap<String, _>| m.get(resource))
                .and_then(
                    |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
                        Milli::parse_whole(&q.0).ok()
                    },
                )
        };
        from(status.and_then(|s| s.capacity.as_ref()))
            .or_else(|| from(status.and_then(|s| s.allocatable.as_ref())))
            .unwrap_or(0)
    };
    let core = read(&names.vcuda_core);
    let gpus = if core > 0 {
        core / u64::from(CORE_PER_GPU)
    } else {
        names.whole_gpu.iter().map(|n| read(n)).max().unwrap_or(0)
    };
    if gpus == 0 || gpus > MAX_GPUS_PER_NODE {
        return (0, 0);
    }
    let memory = if core > 0 {
        read(&names.vcuda_memory) / gpus
    } else {
        0
    };
    (gpus as usize, u32::try_from(memory).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn k8s_node(capacity: &[(&str, &str)], labels: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node.status = Some(NodeStatus {
            capacity: Some(
                capacity
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            ),
            ..Default::default()
        });
        node
    }

    #[test]
    fn vcuda_node_splits_memory_across_gpus() {
        let node = k8s_node(
            &[
                ("tencent.com/vcuda-core", "200"),
                ("tencent.com/vcuda-memory", "8"),
            ],
            &[("nvidia.com/gpu.product", "Tesla-T4")],
        );
        let gpus = NodeGpus::from_node(&node, &ResourceNames::default(), &NodeLabels::default());
        assert_eq!(gpus.gpu_count(), 2);
        assert_eq!(gpus.memory_per_gpu, 4);
        assert_eq!(gpus.model.as_deref(), Some("Tesla-T4"));
        assert_eq!(gpus.pool, None);
    }

    #[test]
    fn whole_gpu_node_and_node_without_gpus() {
        let names = ResourceNames::default();
        let labels = NodeLabels::default();
        let whole =
            NodeGpus::from_node(&k8s_node(&[("nvidia.com/gpu", "4")], &[]), &names, &labels);
        assert_eq!((whole.gpu_count(), whole.memory_per_gpu), (4, 0));
        let cpu = NodeGpus::from_node(&k8s_node(&[("cpu", "8")], &[]), &names, &labels);
        assert_eq!(cpu.gpu_count(), 0);
        let bogus = k8s_node(&[("tencent.com/vcuda-core", "1e9")], &[]);
        assert_eq!(NodeGpus::from_node(&bogus, &names, &labels).gpu_count(), 0);
    }

    #[test]
    fn a_node_is_closed_when_cordoned_tainted_or_not_ready() {
        let closed = |patch: serde_json::Value| {
            let mut node = serde_json::to_value(k8s_node(&[("nvidia.com/gpu", "1")], &[])).unwrap();
            json_patch::merge(&mut node, &patch);
            let node: Node = serde_json::from_value(node).unwrap();
            NodeGpus::from_node(&node, &ResourceNames::default(), &NodeLabels::default()).closed
        };
        assert_eq!(closed(serde_json::json!({})), None);
        assert_eq!(
            closed(serde_json::json!({"spec": {"unschedulable": true}})),
            Some("cordoned")
        );
        let taint =
            |effect| serde_json::json!({"spec": {"taints": [{"key": "k", "effect": effect}]}});
        assert_eq!(closed(taint("NoSchedule")), Some("tainted"));
        assert_eq!(closed(taint("NoExecute")), Some("tainted"));
        assert_eq!(closed(taint("PreferNoSchedule")), None);
        let ready = |status| serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": status}]}});
        assert_eq!(closed(ready("False")), Some("not Ready"));
        assert_eq!(closed(ready("Unknown")), Some("not Ready"));
        assert_eq!(closed(ready("True")), None);
    }
}
