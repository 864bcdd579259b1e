//! Offline mode: a multi-document YAML file of Node, Pod and GPUQuota objects (or
//! `kind: List`s of them, as `kubectl get -o yaml` prints) is the cluster.

use std::path::Path;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Deserialize;

use crate::placement::NodeGpus;
use crate::quota::GPUQuota;

use super::pod::{CachedPod, PodKey, SkipReason, pod_key};
use super::{CacheError, ClusterState, Projection};

#[derive(Default)]
pub struct Objects {
    nodes: Vec<NodeGpus>,
    pods: Vec<(PodKey, CachedPod)>,
    quotas: Vec<GPUQuota>,
}

impl Objects {
    pub fn apply(self, state: &mut ClusterState) {
        state.replace_nodes(self.nodes);
        state.replace_pods(self.pods, Instant::now());
        state.replace_quotas(self.quotas);
    }
}

pub fn load(path: &Path, projection: &Projection) -> Result<Objects, CacheError> {
    let text = std::fs::read_to_string(path).map_err(|source| CacheError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let error = |document: usize, message: String| CacheError::Document {
        path: path.display().to_string(),
        document,
        message,
    };
    let mut objects = Objects::default();
    for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(document)
            .map_err(|e| error(index + 1, e.to_string()))?;
        if value.is_null() {
            continue;
        }
        add(value, projection, &mut objects).map_err(|m| error(index + 1, m))?;
    }
    Ok(objects)
}

fn add(
    value: serde_yaml::Value,
    projection: &Projection,
    objects: &mut Objects,
) -> Result<(), String> {
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_string();
    let named = |e: serde_yaml::Error| format!("{kind}: {e}");
    match kind.as_str() {
        "List" | "NodeList" | "PodList" | "GPUQuotaList" => {
            let items = value
                .get("items")
                .and_then(|i| i.as_sequence())
                .cloned()
                .unwrap_or_default();
            for item in items {
                add(with_kind(item, &kind), projection, objects)?;
            }
        }
        "Node" => {
            let node: Node = serde_yaml::from_value(value).map_err(named)?;
            objects.nodes.push(NodeGpus::from_node(
                &node,
                &projection.names,
                &projection.labels,
            ));
        }
        "Pod" => {
            let pod: Pod = serde_yaml::from_value(value).map_err(named)?;
            match CachedPod::from_pod(&pod, projection) {
                Ok(cached) => objects.pods.push((pod_key(&pod), cached)),
                Err(SkipReason::BadRequest(e)) => {
                    return Err(format!("Pod {}: {e}", pod_key(&pod)));
                }
                Err(SkipReason::NoGpu | SkipReason::Terminal) => {}
            }
        }
        "GPUQuota" => objects
            .quotas
            .push(serde_yaml::from_value(value).map_err(named)?),
        "" => return Err("object has no kind".into()),
        other => {
            return Err(format!(
                "kind {other} is not one of Node, Pod, GPUQuota, List"
            ));
        }
    }
    Ok(())
}

/// Items of a typed list may omit their kind.
fn with_kind(mut item: serde_yaml::Value, list_kind: &str) -> serde_yaml::Value {
    if let (Some(kind), Some(map)) = (list_kind.strip_suffix("List"), item.as_mapping_mut())
        && !kind.is_empty()
        && !map.contains_key("kind")
    {
        map.insert("kind".into(), kind.into());
    }
    item
}
