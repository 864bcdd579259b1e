//! The cluster cache: one compact, lock-protected view of nodes, GPU pods, claims and
//! quotas, fed by kube watchers (API mode) or a YAML file (offline mode). Synchronous
//! state: it holds no client and writes nothing to the cluster — that is the
//! backend's (`crate::backend`), the one place that knows the run mode.

mod allocator;
#[cfg(test)]
mod hold_tests;
mod offline;
pub(crate) mod plan_hold;
#[cfg(test)]
mod plan_hold_tests;
pub(crate) mod pod;
pub(crate) mod pool;
pub(crate) mod state;
mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use crate::config::Config;
use crate::placement::{NodeLabels, ResourceNames};

#[cfg(test)]
pub(crate) use offline::parse_objects;
pub(crate) use offline::{FileObject, read_objects};
pub(crate) use pod::{AnnotationKeys, PodKey};
pub use pod::{CachedPod, pod_key};
pub use state::ClusterState;
pub(crate) use state::{
    Candidates, FilterDecision, Hold, Ledger, PlacementPrice, PlanError, Subject,
};
pub(crate) use watch::Relisting;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot read cluster file {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "cluster file {path} is larger than {}, the most a cluster file may be (it is read whole before it is parsed)",
        shown_bytes(*limit)
    )]
    TooLarge { path: String, limit: u64 },
    #[error("cluster file {path}, document {document}: {problem}")]
    Document {
        path: String,
        document: usize,
        problem: Box<offline::DocumentError>,
    },
}

/// A limit as people write it: "2 GiB", else its bytes.
fn shown_bytes(bytes: u64) -> String {
    match bytes.is_multiple_of(1 << 30) && bytes > 0 {
        true => format!("{} GiB", bytes >> 30),
        false => format!("{bytes} bytes"),
    }
}

/// What the cache needs to project objects: resource names, labels, annotation keys.
#[derive(Debug, Clone)]
pub struct Projection {
    pub(crate) names: ResourceNames,
    labels: NodeLabels,
    pub(crate) keys: AnnotationKeys,
    /// The pod annotation that names wanted GPU models.
    type_annotation: String,
    /// How ResourceClaims and ResourceSlices name GPUs.
    dra: crate::dra::Dra,
    /// `defrag.holdSeconds` when the mover runs (`defrag.mode: Evict`): a plan's holds
    /// are read only then, and only those that stand at most this long.
    pub(crate) hold_seconds: Option<u32>,
}

impl Projection {
    pub fn from_config(config: &Config) -> Self {
        Projection {
            names: config.resources.clone(),
            labels: config.node_labels(),
            keys: AnnotationKeys::new(&config.resources.annotation_prefix),
            type_annotation: config.type_annotation.clone(),
            dra: config.dra.clone(),
            hold_seconds: (config.defrag.mode == crate::config::DefragMode::Evict)
                .then_some(config.defrag.hold_seconds),
        }
    }
}

#[derive(Clone)]
pub struct ClusterCache {
    inner: Arc<Inner>,
}

struct Inner {
    /// Read through `read` (many at once), changed through `write` (one at a time).
    state: RwLock<ClusterState>,
    ready: AtomicBool,
    projection: Projection,
    /// Woken when the quotas' usage moved (a pod finished or was deleted, or was let go).
    usage_moved: Arc<tokio::sync::Notify>,
    /// Woken when anything changes while pods wait in the quota queue.
    queue_moved: Arc<tokio::sync::Notify>,
    /// Where claims' CEL selectors are evaluated, off the lock and the async workers.
    pool: pool::CelPool,
}

impl ClusterCache {
    /// A cache for the run mode its `ledger` says: `Recorded` in API mode.
    fn new(projection: Projection, ready: bool, ledger: Ledger) -> Self {
        let mut state = ClusterState::default();
        state.set_ledger(ledger);
        state.set_mig(projection.names.mig.clone());
        state.set_dra(projection.dra.clone());
        state.set_gpu_resources(projection.names.whole_gpu.clone());
        ClusterCache {
            inner: Arc::new(Inner {
                state: RwLock::new(state),
                ready: AtomicBool::new(ready),
                projection,
                usage_moved: Arc::new(tokio::sync::Notify::new()),
                queue_moved: Arc::new(tokio::sync::Notify::new()),
                pool: pool::CelPool::for_this_machine(),
            }),
        }
    }

    /// True once the cache holds a complete first list of nodes, pods and quotas.
    pub(crate) fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    fn set_ready(&self) {
        self.inner.ready.store(true, Ordering::Release);
    }

    /// Notified whenever the quotas' usage moved: the watch removed an object, or the
    /// releaser let pods go (the quota reconciler listens).
    pub(crate) fn usage_moved(&self) -> Arc<tokio::sync::Notify> {
        self.inner.usage_moved.clone()
    }

    /// Notified when the watch brings any change while pods wait in the quota queue,
    /// and when the reconciler rewrites a quota's usage (the releaser listens).
    pub(crate) fn queue_moved(&self) -> Arc<tokio::sync::Notify> {
        self.inner.queue_moved.clone()
    }

    pub fn projection(&self) -> &Projection {
        &self.inner.projection
    }

    /// Where claims' CEL selectors are evaluated (never under the lock).
    pub(crate) fn cel_pool(&self) -> &pool::CelPool {
        &self.inner.pool
    }

    /// Evaluate, in the CEL pool, the claims whose asks are not from the current
    /// DeviceClasses, and apply them; again while a DeviceClass changed meanwhile.
    async fn evaluate_claims(&self) {
        loop {
            let unevaluated = self.read(|s| s.unevaluated_claims());
            if unevaluated.is_empty() {
                return;
            }
            let job = move || unevaluated.evaluate();
            let Ok(evaluated) = self.inner.pool.run_waiting(job).await else {
                return;
            };
            self.write(|s| s.apply_evaluated(evaluated));
        }
    }

    /// The reader's door: run `f` on the state, shared with other readers. Lookups,
    /// quota pictures (`NamespaceQuota`) and copies out; never hold it across an await.
    pub fn read<R>(&self, f: impl FnOnce(&ClusterState) -> R) -> R {
        f(&self.inner.state.read())
    }

    /// The writer's door, for the cache's own feeders (the watch, a file's load) and
    /// [`CacheWriter`]: run `f` on the state, alone.
    fn write<R>(&self, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        f(&mut self.inner.state.write())
    }
}

/// The handle that changes a [`ClusterCache`], as kube-rs's reflector `Writer` beside
/// its `Store`: one is made with each cache (its constructors are here), and only its
/// holders change the cache. The backend keeps it and hands it to the few that record
/// what they decided or wrote (the extender's placement transaction and bind, the quota
/// writer, the reconciler); everything else holds the reader, `ClusterCache`, where the
/// compiler allows no change (docs/design.md, "The cache's two doors"). It reads as the
/// cache does.
#[derive(Clone)]
pub struct CacheWriter {
    cache: ClusterCache,
}

impl std::ops::Deref for CacheWriter {
    type Target = ClusterCache;

    fn deref(&self) -> &ClusterCache {
        &self.cache
    }
}

impl CacheWriter {
    /// Offline mode: the YAML file is the cluster. Ready at once.
    pub(crate) fn from_file(
        path: &std::path::Path,
        projection: Projection,
    ) -> Result<CacheWriter, CacheError> {
        let cache = ClusterCache::new(projection, true, Ledger::Counted);
        let loaded = offline::load_file(path, &cache.inner.projection)?;
        cache.write(|state| loaded.apply(state));
        allocator::return_freed_pages();
        Ok(CacheWriter { cache })
    }

    /// Offline mode over `objects` already read (from `source`: a file's path, or the
    /// API server's for `defrag --kubeconfig`). Ready at once.
    pub(crate) fn from_objects(
        objects: &[FileObject],
        source: &str,
        projection: Projection,
    ) -> Result<CacheWriter, CacheError> {
        let cache = ClusterCache::new(projection, true, Ledger::Counted);
        let loaded = offline::load(objects, source, &cache.inner.projection)?;
        cache.write(|state| loaded.apply(state));
        Ok(CacheWriter { cache })
    }

    /// An empty offline cache (tests and benchmarks fill it through [`CacheWriter::write`]).
    pub fn in_memory(projection: Projection) -> CacheWriter {
        let cache = ClusterCache::new(projection, true, Ledger::Counted);
        CacheWriter { cache }
    }

    /// API mode: returns the cache (not ready until every watch has listed once) and the
    /// future that runs the watches until `shutdown`.
    pub(crate) fn from_api(
        client: kube::Client,
        projection: Projection,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> (CacheWriter, impl std::future::Future<Output = ()>) {
        let cache = ClusterCache::new(projection, false, Ledger::Recorded);
        let run = watch::run(cache.clone(), client, shutdown);
        (CacheWriter { cache }, run)
    }

    /// The writer's door: run `f` on the state, alone. The extender holds and rolls
    /// back placements here, and the backend records what it wrote; tests and
    /// benchmarks fill an in-memory cache through it.
    pub fn write<R>(&self, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        self.cache.write(f)
    }

    /// The reader, for the parts that only read.
    pub(crate) fn cache(&self) -> &ClusterCache {
        &self.cache
    }
}
