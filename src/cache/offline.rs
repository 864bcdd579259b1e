//! Offline mode: a multi-document YAML file of Node, Pod, GPUQuota, ResourceClaim,
//! ResourceSlice and DeviceClass objects (or `kind: List`s of them, as `kubectl get -o
//! yaml` prints) is the cluster; claims are charged as in API mode. The file may also
//! hold what the `defrag` command reads (PodDisruptionBudgets and the controllers pods
//! name as owners), which the cache skips.

use std::path::Path;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Deserialize;

use crate::dra::ResourceClaim;
use crate::dra::classes::{ClassInfo, DeviceClass};
use crate::dra::slices::{ResourceSlice, SliceDevices, gpu_devices};
use crate::placement::NodeGpus;
use crate::quota::GPUQuota;

use super::pod::{CachedPod, PodKey, SkipReason, pod_key};
use super::state::claims::{CachedClaim, claim_key};
use super::{CacheError, ClusterState, Projection};

#[derive(Default)]
pub(super) struct Objects {
    nodes: Vec<NodeGpus>,
    pods: Vec<(PodKey, CachedPod)>,
    quotas: Vec<GPUQuota>,
    classes: Vec<(String, ClassInfo)>,
    slices: Vec<(String, SliceDevices)>,
    claims: Vec<(PodKey, CachedClaim)>,
}

impl Objects {
    /// Claims last: their model is decided with the quotas, classes and devices known.
    /// Their selectors are evaluated here, with the state borrowed: loading comes
    /// before anything else reads the cache.
    pub(super) fn apply(self, state: &mut ClusterState) {
        state.replace_nodes(self.nodes);
        state.replace_pods(self.pods, Instant::now());
        state.replace_quotas(self.quotas);
        state.replace_classes(self.classes.into_iter().collect());
        state.replace_slices(self.slices);
        state.replace_claims(self.claims);
        state.evaluate_claims_now();
    }
}

/// One object of a cluster file, with the number (from 1) of the YAML document it
/// came from: the unit the cache and the `defrag` command read.
#[derive(Debug, Clone)]
pub(crate) struct FileObject {
    pub(crate) document: usize,
    pub(crate) value: serde_yaml::Value,
}

/// The objects of the cluster file at `path`, `kind: List`s unrolled.
pub(crate) fn read_objects(path: &Path) -> Result<Vec<FileObject>, CacheError> {
    parse_objects(&read_text(path)?, &path.display().to_string())
}

/// The objects of a cluster file's `text` (read from `source`).
pub(crate) fn parse_objects(text: &str, source: &str) -> Result<Vec<FileObject>, CacheError> {
    let mut objects = Vec::new();
    each_object(text, source, |object| {
        objects.push(object);
        Ok(())
    })?;
    Ok(objects)
}

/// Project the cluster file at `path` for the cache one object at a time, each parsed,
/// projected and dropped before the next: the parsed form of a whole file is many times
/// its size (gigabytes for 40,000 pods as `kubectl get -o yaml` prints them), and the
/// allocator keeps much of what such a peak freed (docs/benchmarks.md, "Memory per
/// cached pod").
pub(super) fn load_file(path: &Path, projection: &Projection) -> Result<Objects, CacheError> {
    let source = path.display().to_string();
    let mut loaded = Objects::default();
    each_object(&read_text(path)?, &source, |object| {
        add_object(object, &source, projection, &mut loaded)
    })?;
    Ok(loaded)
}

fn read_text(path: &Path) -> Result<String, CacheError> {
    std::fs::read_to_string(path).map_err(|source| CacheError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Call `each` with the objects of a cluster file's `text` (read from `source`) in
/// order, `kind: List`s unrolled, one YAML document parsed at a time.
fn each_object(
    text: &str,
    source: &str,
    mut each: impl FnMut(FileObject) -> Result<(), CacheError>,
) -> Result<(), CacheError> {
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(document).map_err(|e| CacheError::Document {
            path: source.to_string(),
            document: index + 1,
            problem: Box::new(DocumentError::Yaml(e)),
        })?;
        let mut objects = Vec::new();
        unroll(value, index + 1, &mut objects);
        objects.into_iter().try_for_each(&mut each)?;
    }
    Ok(())
}

/// Add `value` to `objects`, the items of a list one by one (an item of a typed list
/// may omit its kind).
fn unroll(value: serde_yaml::Value, document: usize, objects: &mut Vec<FileObject>) {
    if value.is_null() {
        return;
    }
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    if !kind.ends_with("List") {
        objects.push(FileObject { document, value });
        return;
    }
    let kind = kind.to_string();
    let items = value.get("items").and_then(|i| i.as_sequence()).cloned();
    for item in items.unwrap_or_default() {
        unroll(with_kind(item, &kind), document, objects);
    }
}

/// Project `objects` (read from `source`, a file's path) for the cache.
pub(super) fn load(
    objects: &[FileObject],
    source: &str,
    projection: &Projection,
) -> Result<Objects, CacheError> {
    let mut loaded = Objects::default();
    for object in objects {
        add_object(object.clone(), source, projection, &mut loaded)?;
    }
    Ok(loaded)
}

/// Add `object` (of the file at `source`) to `loaded`, or name the document it is
/// wrong in.
fn add_object(
    object: FileObject,
    source: &str,
    projection: &Projection,
    loaded: &mut Objects,
) -> Result<(), CacheError> {
    add(object.value, projection, loaded).map_err(|problem| CacheError::Document {
        path: source.to_string(),
        document: object.document,
        problem: Box::new(problem),
    })
}

/// What is wrong with one YAML document of the cluster file.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error(transparent)]
    Yaml(serde_yaml::Error),
    #[error("{kind}: {source}")]
    Object {
        kind: String,
        source: serde_yaml::Error,
    },
    #[error("Pod {pod}: {source}")]
    Pod {
        pod: String,
        source: crate::placement::request::RequestError,
    },
    #[error("object has no kind")]
    NoKind,
    #[error(
        "kind {0} is not one of Node, Pod, GPUQuota, ResourceClaim, ResourceSlice, DeviceClass, PodDisruptionBudget, ReplicaSet, StatefulSet, Job, Deployment, List"
    )]
    UnknownKind(String),
}

/// Kinds a cluster file may hold for the `defrag` command, which the cache skips.
const IGNORED_KINDS: [&str; 5] = [
    "PodDisruptionBudget",
    "ReplicaSet",
    "StatefulSet",
    "Job",
    "Deployment",
];

fn add(
    value: serde_yaml::Value,
    projection: &Projection,
    objects: &mut Objects,
) -> Result<(), DocumentError> {
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_string();
    let named = |source: serde_yaml::Error| DocumentError::Object {
        kind: kind.clone(),
        source,
    };
    match kind.as_str() {
        // What `defrag` reads (PodDisruptionBudgets, the controllers pods name as
        // owners): no part of the cache.
        kind if IGNORED_KINDS.contains(&kind) => {}
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
                Err(SkipReason::BadRequest(source)) => {
                    let pod = pod_key(&pod).to_string();
                    return Err(DocumentError::Pod { pod, source });
                }
                Err(SkipReason::NoGpu | SkipReason::Terminal) => {}
            }
        }
        "GPUQuota" => objects
            .quotas
            .push(serde_yaml::from_value(value).map_err(named)?),
        "ResourceClaim" => {
            let claim: ResourceClaim = serde_yaml::from_value(value).map_err(named)?;
            let meta = &claim.metadata;
            let namespace = meta.namespace.as_deref().unwrap_or("default");
            let key = claim_key(namespace, meta.name.as_deref().unwrap_or_default());
            objects
                .claims
                .extend(CachedClaim::from_claim(&claim, &projection.dra).map(|c| (key, c)));
        }
        "ResourceSlice" => {
            let slice: ResourceSlice = serde_yaml::from_value(value).map_err(named)?;
            let name = slice.metadata.name.clone().unwrap_or_default();
            objects
                .slices
                .push((name, gpu_devices(&slice, &projection.dra)));
        }
        "DeviceClass" => {
            let class: DeviceClass = serde_yaml::from_value(value).map_err(named)?;
            let name = class.metadata.name.clone().unwrap_or_default();
            objects.classes.push((name, ClassInfo::of(&class)));
        }
        "" => return Err(DocumentError::NoKind),
        other => return Err(DocumentError::UnknownKind(other.to_string())),
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
