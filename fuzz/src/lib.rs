//! Shared code of the fuzz targets: the per-target checks ([`harness`], also compiled
//! by `tests/fuzz_regressions.rs`) and the structured input of `pod_annotations`.

pub mod harness;

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// Containers and annotations beyond this many add nothing but time.
const MAX_CONTAINERS: usize = 8;
const MAX_ANNOTATIONS: usize = 12;

/// An annotation key: mostly the keys the code reads, sometimes anything.
#[derive(Debug, Arbitrary)]
pub enum Key {
    GpuIdx0,
    GpuIdx1,
    /// `tencent.com/predicate-gpu-idx-<n>`.
    GpuIdx(u16),
    PredicateNode,
    GpuType,
    GpuAssigned,
    Other(String),
}

impl Key {
    fn text(&self) -> String {
        match self {
            Key::GpuIdx0 => "tencent.com/predicate-gpu-idx-0".into(),
            Key::GpuIdx1 => "tencent.com/predicate-gpu-idx-1".into(),
            Key::GpuIdx(n) => format!("tencent.com/predicate-gpu-idx-{n}"),
            Key::PredicateNode => "tencent.com/predicate-node".into(),
            Key::GpuType => "gpu-admission.io/gpu-type".into(),
            Key::GpuAssigned => "tencent.com/gpu-assigned".into(),
            Key::Other(key) => key.clone(),
        }
    }
}

/// An annotation value: GPU index lists and model lists in their real shape, or anything.
#[derive(Debug, Arbitrary)]
pub enum Value {
    /// `"0,1,3"`.
    Indices(Vec<u8>),
    /// Indices written with arbitrary separators and spacing (`" 0 ,1"`, `"0;1"`).
    IndicesWith(Vec<(u16, String)>),
    /// `"Tesla-T4, A100"`.
    Models(Vec<String>),
    Text(String),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Indices(gpus) => gpus.iter().map(u8::to_string).collect::<Vec<_>>().join(","),
            Value::IndicesWith(parts) => parts
                .iter()
                .map(|(gpu, separator)| format!("{gpu}{separator}"))
                .collect(),
            Value::Models(models) => models.join(","),
            Value::Text(text) => text.clone(),
        }
    }
}

/// A resource quantity: small whole numbers (the valid ones), or any text.
#[derive(Debug, Arbitrary)]
pub enum Amount {
    Whole(u16),
    Text(String),
}

impl Amount {
    fn quantity(&self) -> Quantity {
        match self {
            Amount::Whole(n) => Quantity(n.to_string()),
            Amount::Text(text) => Quantity(text.clone()),
        }
    }
}

#[derive(Debug, Arbitrary)]
pub struct ContainerInput {
    pub name: String,
    pub vcuda_core: Option<Amount>,
    pub vcuda_memory: Option<Amount>,
    pub nvidia_gpu: Option<Amount>,
    /// Put the amounts under `requests` instead of `limits`.
    pub as_requests: bool,
    /// An extra resource of any name (a typo'd GPU resource, say).
    pub other: Option<(String, Amount)>,
}

impl ContainerInput {
    fn container(&self) -> Container {
        let mut amounts = BTreeMap::new();
        for (name, amount) in [
            ("tencent.com/vcuda-core", &self.vcuda_core),
            ("tencent.com/vcuda-memory", &self.vcuda_memory),
            ("nvidia.com/gpu", &self.nvidia_gpu),
        ] {
            if let Some(amount) = amount {
                amounts.insert(name.to_string(), amount.quantity());
            }
        }
        if let Some((name, amount)) = &self.other {
            amounts.insert(name.clone(), amount.quantity());
        }
        let (limits, requests) = if self.as_requests {
            (None, Some(amounts))
        } else {
            (Some(amounts), None)
        };
        Container {
            name: self.name.clone(),
            resources: Some(ResourceRequirements {
                limits,
                requests,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// The `pod_annotations` target's input: a pod's annotations, GPU resources and the
/// fields placement reads next to them.
#[derive(Debug, Arbitrary)]
pub struct PodInput {
    pub annotations: Vec<(Key, Value)>,
    pub containers: Vec<ContainerInput>,
    pub init_containers: Vec<ContainerInput>,
    pub node_name: Option<String>,
    pub phase: Option<String>,
    pub terminating: bool,
    /// `spec.nodeSelector["nvidia.com/gpu.product"]`.
    pub model_selector: Option<String>,
    /// A required node-affinity expression on the model label: (operator is `In`, values).
    pub model_affinity: Option<(bool, Vec<String>)>,
}

impl PodInput {
    pub fn pod(&self) -> Pod {
        let annotations: BTreeMap<String, String> = self
            .annotations
            .iter()
            .take(MAX_ANNOTATIONS)
            .map(|(key, value)| (key.text(), value.text()))
            .collect();
        let containers = |list: &[ContainerInput]| -> Vec<Container> {
            list.iter()
                .take(MAX_CONTAINERS)
                .map(ContainerInput::container)
                .collect()
        };
        let affinity = self
            .model_affinity
            .as_ref()
            .map(|(is_in, values)| Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "nvidia.com/gpu.product".into(),
                                operator: if *is_in { "In" } else { "NotIn" }.into(),
                                values: Some(values.clone()),
                            }]),
                            ..Default::default()
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        Pod {
            metadata: ObjectMeta {
                name: Some("fuzz".into()),
                namespace: Some("fuzz".into()),
                uid: Some("00000000-0000-4000-8000-000000000000".into()),
                annotations: Some(annotations),
                deletion_timestamp: self.terminating.then(|| Time(Default::default())),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: containers(&self.containers),
                init_containers: Some(containers(&self.init_containers)),
                node_name: self.node_name.clone(),
                node_selector: self.model_selector.as_ref().map(|model| {
                    BTreeMap::from([("nvidia.com/gpu.product".to_string(), model.clone())])
                }),
                affinity,
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: self.phase.clone(),
                ..Default::default()
            }),
        }
    }
}
