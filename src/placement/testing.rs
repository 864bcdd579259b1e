//! Builders for unit tests: pods and nodes that read like the scenario they stand for.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::node::{GpuUse, NodeGpus};

/// A pod with one container per slice entry, each with those resource limits.
pub(crate) fn pod_with(containers: &[&[(&str, &str)]]) -> Pod {
    let containers = containers
        .iter()
        .enumerate()
        .map(|(i, resources)| Container {
            name: format!("c{i}"),
            resources: Some(ResourceRequirements {
                limits: Some(
                    resources
                        .iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    Pod {
        spec: Some(PodSpec {
            containers,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A node with `gpus` GPUs of `memory` vcuda-memory each, none used.
pub(crate) fn node(name: &str, gpus: usize, memory: u32) -> NodeGpus {
    NodeGpus {
        name: name.into(),
        model: None,
        pool: None,
        memory_per_gpu: memory,
        used: vec![GpuUse::default(); gpus],
        mig_slices: Vec::new(),
        created: 0,
        closed: None,
    }
}

/// The same node with GPU `index` charged `core` vcuda-core and `memory` vcuda-memory.
pub(super) fn with_used(mut node: NodeGpus, index: usize, core: u32, memory: u32) -> NodeGpus {
    node.used[index].core += core;
    node.used[index].memory += memory;
    node
}
