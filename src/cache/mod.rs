//! The cluster cache: one compact, lock-protected view of nodes, GPU pods and quotas,
//! fed by either of two sources behind the same interface — kube watchers (API mode)
//! or a YAML file (offline mode) — and the one place where placements are reserved.

mod offline;
pub mod pod;
#[cfg(test)]
mod reserve_tests;
pub mod state;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use parking_lot::Mutex;

use crate::config::Config;
use crate::placement::{NodeLabels, ResourceNames};

pub use pod::{AnnotationKeys, CachedPod, PodKey, pod_key};
pub use state::{Candidates, ClusterState, FilterDecision, Held, PlanError, Reservation, Subject};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot read cluster file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cluster file {path}, document {document}: {message}")]
    Document {
        path: String,
        document: usize,
        message: String,
    },
}

/// Recording a placement on the pod failed; the reservation is rolled back.
#[derive(Debug, thiserror::Error)]
#[error("recording the GPU choice on pod {pod} failed: {source}")]
pub struct WriteError {
    pod: String,
    source: kube::Error,
}

impl WriteError {
    /// The API server's status code, when it answered.
    pub fn api_code(&self) -> Option<u16> {
        match &self.source {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }
}

/// What the cache needs to project objects: resource names, labels, annotation keys.
#[derive(Debug, Clone)]
pub struct Projection {
    pub names: ResourceNames,
    pub labels: NodeLabels,
    pub keys: AnnotationKeys,
    /// The pod annotation that names wanted GPU models.
    pub type_annotation: String,
    /// How ResourceClaims and ResourceSlices name GPUs.
    pub dra: crate::dra::Dra,
}

impl Projection {
    pub fn from_config(config: &Config) -> Self {
        Projection {
            names: config.resources.clone(),
            labels: config.node_labels(),
            keys: AnnotationKeys::new(&config.resources.annotation_prefix),
            type_annotation: config.type_annotation.clone(),
            dra: config.dra.clone(),
        }
    }
}

/// Where placement annotations go.
#[derive(Clone)]
enum PodWriter {
    /// PATCH the pod through the API server.
    Api(kube::Client),
    /// Offline mode: the in-memory state is the cluster; nothing else to write.
    Memory,
}

#[derive(Clone)]
pub struct ClusterCache {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<ClusterState>,
    ready: AtomicBool,
    projection: Projection,
    writer: PodWriter,
    /// Woken when objects leave the cluster (a pod finished or was deleted).
    released: Arc<tokio::sync::Notify>,
    /// API mode: the GPUQuota ledger writer (offline, the cached pods are the ledger).
    ledger: Option<Arc<crate::quota::reserve::Ledger>>,
}

impl ClusterCache {
    fn new(projection: Projection, writer: PodWriter, ready: bool) -> Self {
        let ledger = match &writer {
            PodWriter::Api(client) => Some(crate::quota::reserve::Ledger::new(client.clone())),
            PodWriter::Memory => None,
        };
        let mut state = ClusterState::default();
        state.set_mig(projection.names.mig.clone());
        state.set_dra(projection.dra.clone());
        state.set_gpu_resources(projection.names.whole_gpu.clone());
        ClusterCache {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                ready: AtomicBool::new(ready),
                projection,
                writer,
                released: Arc::new(tokio::sync::Notify::new()),
                ledger,
            }),
        }
    }

    /// Offline mode: the YAML file is the cluster. Ready at once.
    pub fn from_file(path: &std::path::Path, projection: Projection) -> Result<Self, CacheError> {
        let cache = Self::new(projection, PodWriter::Memory, true);
        let objects = offline::load(path, &cache.inner.projection)?;
        cache.with_state(|state| objects.apply(state));
        Ok(cache)
    }

    /// An empty offline cache (tests and benchmarks fill it through `with_state`).
    pub fn in_memory(projection: Projection) -> Self {
        Self::new(projection, PodWriter::Memory, true)
    }

    /// API mode: returns the cache (not ready until every watch has listed once) and the
    /// future that runs the watches until `shutdown`.
    pub fn from_api(
        client: kube::Client,
        projection: Projection,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> (Self, impl std::future::Future<Output = ()>) {
        let cache = Self::new(projection, PodWriter::Api(client.clone()), false);
        let run = watch::run(cache.clone(), client, shutdown);
        (cache, run)
    }

    /// True once the cache holds a complete first list of nodes, pods and quotas.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    fn set_ready(&self) {
        self.inner.ready.store(true, Ordering::Release);
    }

    /// Notified whenever the watch removes an object (the quota reconciler listens).
    pub fn released(&self) -> Arc<tokio::sync::Notify> {
        self.inner.released.clone()
    }

    /// The API client in API mode; `None` offline.
    pub fn client(&self) -> Option<kube::Client> {
        match &self.inner.writer {
            PodWriter::Api(client) => Some(client.clone()),
            PodWriter::Memory => None,
        }
    }

    /// API mode: the GPUQuota ledger; `None` offline.
    pub fn ledger(&self) -> Option<&Arc<crate::quota::reserve::Ledger>> {
        self.inner.ledger.as_ref()
    }

    pub fn projection(&self) -> &Projection {
        &self.inner.projection
    }

    /// Run `f` with the state locked. Never hold this across an await: `f` is sync.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        f(&mut self.inner.state.lock())
    }

    /// Write the placement annotations onto the pod (one merge patch). The pod's uid
    /// rides along as a precondition: uid is immutable, so the patch fails on a pod
    /// that was deleted and created again under the same name. Offline, the
    /// reservation already is the record.
    pub async fn record(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), WriteError> {
        let PodWriter::Api(client) = &self.inner.writer else {
            return Ok(());
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let patch = serde_json::json!({"metadata": {"uid": uid, "annotations": annotations}});
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|source| WriteError {
                pod: format!("{namespace}/{name}"),
                source,
            })
    }

    /// API mode: make sure the cache holds pod `key` before a filter or bind call looks
    /// for it. kube-scheduler can see a new pod before this process's watch does; rather
    /// than refuse it (the scheduler would back off a second), read the cluster's copy.
    pub async fn ensure_pod(&self, key: &PodKey) {
        let PodWriter::Api(client) = &self.inner.writer else {
            return;
        };
        if self.with_state(|state| state.pod(key).is_some()) {
            return;
        }
        let Some((namespace, name)) = key.split_once('/') else {
            return;
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let Ok(Some(pod)) = pods.get_opt(name).await else {
            return;
        };
        let Ok(cached) = CachedPod::from_pod(&pod, &self.inner.projection) else {
            return;
        };
        self.with_state(|state| {
            if state.pod(key).is_none() {
                state.apply_pod(key.clone(), cached);
            }
        });
    }

    /// Bind the pod to `node` and write the placement annotations in one call: the
    /// binding subresource copies a Binding's annotations onto the pod as it sets
    /// `spec.nodeName`, and refuses a pod whose uid differs. So gpu-manager, which reads
    /// the annotations once the pod is on its node, always finds them. Offline, the
    /// cache is the record.
    pub async fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), WriteError> {
        let PodWriter::Api(client) = &self.inner.writer else {
            return Ok(());
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        pods.create_subresource::<_, serde_json::Value>(
            "binding",
            name,
            &Default::default(),
            &binding,
        )
        .await
        .map(drop)
        .map_err(|source| WriteError {
            pod: format!("{namespace}/{name}"),
            source,
        })
    }
}
