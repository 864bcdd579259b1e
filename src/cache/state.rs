//! The cluster as placement sees it: nodes with per-GPU use, and the GPU pods that
//! account for that use. Plain synchronous data; `ClusterCache` wraps it in a lock.
//!
//! One struct, its methods split by concern: this file holds the fields and the
//! reads; `index` keeps nodes and pods (and each node's GPU use) current as objects
//! arrive and leave; `quotas` keeps quotas and the per-namespace usage they limit;
//! `holds` is the filter transaction's half in memory (which pod a call places, the
//! hold on its GPUs, expiry, rollback); `claims` the ResourceClaims and devices.

use std::collections::BTreeMap;

// foldhash, not SipHash: a filter looks up every candidate node (thousands) by name.
use foldhash::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::placement::{NodeGpus, PlacementMemo, Stamp};
use crate::quota::ModelAmounts;
use crate::quota::{GPUQuota, NamespaceLimits};

use super::pod::{CachedPod, PodKey};
use quotas::HeldQuota;

#[cfg(test)]
pub(super) use holds::HOLD_TTL;
pub(crate) use holds::{Candidates, FilterDecision, Hold, PlanError, Subject};
pub(crate) use namespace_quota::{Ledger, PlacementPrice};

/// How long a hold the watch has not confirmed survives a relist without the pod.
const UNCONFIRMED_HOLD_TTL: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct NodeEntry {
    /// `None` while pods name a node whose Node object has not arrived (or was deleted).
    gpus: Option<NodeGpus>,
    pods: Vec<PodKey>,
    /// Where placement keeps its evaluations of this node (`PlacementMemo`), and which
    /// state of `gpus` they are for: the version changes whenever they do (`recompute`,
    /// `apply_node`) and is never given to another state or node (docs/design.md,
    /// "Placement").
    stamp: Stamp,
}

#[derive(Debug, Default)]
pub struct ClusterState {
    nodes: HashMap<Arc<str>, NodeEntry>,
    /// Changed only by `put_pod` and `delete_pod`, which keep `tally` up to date.
    /// Boxed: the table keeps room for up to twice its entries, and a pod is some 250
    /// bytes against a pointer's 8 (docs/benchmarks.md, memory per cached pod).
    pods: HashMap<PodKey, Box<CachedPod>>,
    /// The pods being deleted: charged until their grace period has passed
    /// (`expire_deletions`).
    deleting: HashSet<PodKey>,
    /// Pod keys by namespace, so quota usage never scans the whole cluster.
    by_namespace: HashMap<Box<str>, HashSet<PodKey>>,
    quotas: BTreeMap<(String, String), HeldQuota>,
    /// The pods waiting in the quota queue, by namespace.
    waiting: queue::WaitingIndex,
    /// Placements held in memory only (the bind verb writes them), oldest first, so
    /// those the scheduler never bound are let go (`HOLD_TTL`).
    holds: std::collections::VecDeque<(Instant, PodKey)>,
    /// Recently created pods that left the cluster, with the charge they carried: the
    /// quota reconciler counts them as seen (`quota::pending`).
    departed: Vec<Departed>,
    /// Usage per namespace and model, kept up to date as pods, nodes and quotas change.
    tally: usage::Tally,
    /// ResourceClaims that ask for or hold GPUs, by `claims::claim_key`.
    claims: BTreeMap<PodKey, claims::CachedClaim>,
    /// The GPU devices the DRA driver publishes in ResourceSlices.
    devices: crate::dra::slices::DeviceIndex,
    /// The model labels the cluster's nodes carry, with how many nodes carry each by
    /// creation second (the nodes a pending pod is charged by, and the single-strategy
    /// MIG labels `<model>-MIG-<profile>` the mutating webhook steers to).
    model_labels: BTreeMap<Arc<str>, BTreeMap<i64, u32>>,
    /// The DeviceClasses, by name.
    classes: crate::dra::classes::DeviceClasses,
    /// Bumped whenever the DeviceClasses change: claims' asks evaluated under an older
    /// one are evaluated again, off the lock (`evaluation.rs`).
    classes_version: u64,
    /// The DeviceClasses not in the config found to be GPU classes (logged once), and
    /// the classes' version they were found under.
    found_classes: (u64, std::collections::BTreeSet<String>),
    /// How ResourceClaims and ResourceSlices name GPUs.
    dra: crate::dra::Dra,
    /// The whole-GPU resource names (empty: `nvidia.com/gpu`).
    gpu_resources: Vec<String>,
    /// The last node version given out.
    versions: u64,
    /// Slots of nodes that are gone, for the next new node; then `slots` is the next.
    free_slots: Vec<u32>,
    slots: u32,
    /// Placement's evaluations of nodes, by node slot and version.
    memo: PlacementMemo,
    /// Whose usage the quotas' views count.
    ledger: Ledger,
    /// The pods that carry a defragmentation plan's holds (`reserved`).
    plan_holders: HashSet<PodKey>,
}

/// A pod created within `PENDING_TTL` that has left, and the charge it was counted with.
#[derive(Debug)]
struct Departed {
    namespace: Box<str>,
    created: i64,
    charge: ModelAmounts,
}

impl ClusterState {
    pub fn node(&self, name: &str) -> Option<&NodeGpus> {
        self.nodes.get(name)?.gpus.as_ref()
    }

    pub fn pod(&self, key: &str) -> Option<&CachedPod> {
        self.pods.get(key).map(|pod| &**pod)
    }

    /// Every GPU pod the cache holds, in no order.
    pub(crate) fn pods(&self) -> impl Iterator<Item = (&PodKey, &CachedPod)> {
        self.pods.iter().map(|(key, pod)| (key, &**pod))
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.values().filter(|n| n.gpus.is_some()).count()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeGpus> {
        self.nodes.values().filter_map(|n| n.gpus.as_ref())
    }

    pub(crate) fn quotas(&self) -> impl Iterator<Item = &GPUQuota> {
        self.quotas.values().map(|held| &held.crd)
    }

    /// The GPUQuotas of one namespace.
    pub(crate) fn namespace_quotas<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a GPUQuota> + 'a {
        self.held_quotas(namespace).map(|held| &held.crd)
    }

    /// The GPUQuotas of one namespace, as held.
    fn held_quotas<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a HeldQuota> + 'a {
        let first = (namespace.to_string(), String::new());
        self.quotas
            .range(first..)
            .take_while(move |((ns, _), _)| ns == namespace)
            .map(|(_, held)| held)
    }

    /// What the namespace's GPUQuotas say ([`NamespaceLimits::of`] them), kept with
    /// the quotas rather than recomputed.
    pub(crate) fn namespace_limits(&self, namespace: &str) -> &NamespaceLimits {
        self.tally.limits(namespace)
    }

    /// How MIG slices are charged (`resources.mig`).
    #[cfg(test)]
    fn mig(&self) -> &crate::placement::MigResources {
        self.tally.mig()
    }

    /// The single-strategy MIG model labels the cluster's nodes carry, in order.
    pub(crate) fn mig_labels(&self) -> impl Iterator<Item = &str> {
        let labels = self.model_labels.keys().map(|l| &**l);
        labels.filter(|l| crate::placement::mig::split_product(l).1.is_some())
    }

    /// The model labels of nodes created at or before `created` (unix seconds; 0: any
    /// node), in order.
    fn labels_born_by(&self, created: i64) -> impl Iterator<Item = &str> {
        let born = move |births: &BTreeMap<i64, u32>| {
            created == 0 || births.keys().next().is_some_and(|first| *first <= created)
        };
        let labels = self.model_labels.iter();
        labels.filter(move |(_, b)| born(b)).map(|(l, _)| &**l)
    }
}

/// The model of the node `pod` is on, as far as this cache knows it.
fn node_model<'a>(nodes: &'a HashMap<Arc<str>, NodeEntry>, pod: &CachedPod) -> Option<&'a str> {
    let entry = nodes.get(pod.node.as_deref()?)?;
    entry.gpus.as_ref()?.model.as_deref()
}

/// The namespace part of a `namespace/name` pod key.
fn namespace_of(key: &str) -> &str {
    super::pod::key_parts(key).0
}

#[cfg(test)]
mod charge_tests;
#[cfg(test)]
mod claim_tests;
pub(crate) mod claims;
mod evaluation;
mod holds;
mod index;
mod namespace_quota;
#[cfg(test)]
mod pending_tests;
mod queue;
#[cfg(test)]
mod queue_tests;
mod quotas;
mod reserved;
mod showback;
#[cfg(test)]
mod stamp_tests;
mod usage;
#[cfg(test)]
mod usage_tests;
