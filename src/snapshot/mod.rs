//! One picture of the cluster that judging and planning read (docs/design.md,
//! "Snapshots"): the cache's view of GPUs, pods and quotas; the world beyond it (every
//! pod's CPU and memory, owners, disruption budgets); and the placer as the extender
//! would have it. The command-line tools (`explain`, `defrag`) build one from a file or
//! one listing ([`Snapshot::of`], [`ClusterSource`]); the planner in
//! the cluster from the watch-fed cache and world ([`Snapshot::live`], [`LiveWorld`]),
//! listing nothing.

mod live;
mod source;
pub(crate) mod world;

use std::sync::Arc;

use crate::cache::pod::key_parts;
use crate::cache::{CacheError, CacheWriter, ClusterCache, FileObject, Projection};
use crate::config::Config;
use crate::placement::Placer;
use crate::placement::learn::LearningPlacer;

pub(crate) use live::LiveWorld;
pub(crate) use source::{ClusterSource, Read};
pub(crate) use world::DisruptionBudget;
use world::WorldError;
pub(crate) use world::{MOVABLE_ANNOTATION, World};

/// The cache, the world and the placer of one reading of the cluster.
pub(crate) struct Snapshot {
    pub(crate) cache: ClusterCache,
    pub(crate) world: World,
    pub(crate) placer: Arc<Placer>,
}

/// Why a reading of the cluster cannot be pictured.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SnapshotError {
    #[error("reading {read_from}: {error}")]
    World {
        read_from: String,
        error: WorldError,
    },
    #[error(transparent)]
    Cache(#[from] CacheError),
}

impl Snapshot {
    /// The snapshot of `objects` (read from `source`, as messages name it), with
    /// `config`'s projection and placement policy.
    pub(crate) fn of(
        objects: &[FileObject],
        source: &str,
        config: &Config,
    ) -> Result<Snapshot, SnapshotError> {
        let world = World::read(objects).map_err(|error| SnapshotError::World {
            read_from: source.to_string(),
            error,
        })?;
        let projection = Projection::from_config(config);
        let cache = CacheWriter::from_objects(objects, source, projection)?
            .cache()
            .clone();
        let placer = learned_placer(&cache, config);
        Ok(Snapshot {
            cache,
            world,
            placer,
        })
    }
}

impl Snapshot {
    /// The snapshot of the cluster as the watches keep it: the live `cache` (a plan reads
    /// it once, under one read), a copy of `world`, and the extender's `placer`; `None`
    /// until every kind of the world has listed.
    pub(crate) fn live(
        cache: &ClusterCache,
        world: &LiveWorld,
        placer: Arc<Placer>,
    ) -> Option<Snapshot> {
        Some(Snapshot {
            cache: cache.clone(),
            world: world.world()?,
            placer,
        })
    }
}

/// The placer the extender would have: the configured policy, with the request mix
/// of the pods placed as it learns it (fragmentation is measured against it).
pub(crate) fn learned_placer(cache: &ClusterCache, config: &Config) -> Arc<Placer> {
    let placement = &config.placement;
    let learning = LearningPlacer::new(placement.policy, placement.gpu_manager_compat);
    cache.read(|state| {
        // In name order: the mix snapshots as it grows, so the same cluster must give
        // the same mix (and the same plan) every time.
        let mut placed: Vec<_> = state.pods().filter(|(_, p)| p.node.is_some()).collect();
        placed.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (key, pod) in placed {
            let quota = state.namespace_quota(key_parts(key).0);
            learning.observe(&pod.request, &quota.wanted(&pod.models).models);
        }
    });
    learning.placer()
}
