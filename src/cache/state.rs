//! The cluster as placement sees it: nodes with per-GPU use, and the GPU pods that
//! account for that use. Plain synchronous data; `ClusterCache` wraps it in a lock.

use std::collections::BTreeMap;

// foldhash, not SipHash: a filter looks up every candidate node (thousands) by name.
use foldhash::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::placement::fit::fit_held;
use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;
use crate::placement::{
    Assignment, GpuRequest, Misfit, NodeGpus, Outcome, PlacementMemo, Placer, Stamp, fit,
    place_versioned,
};
use crate::quota::ledger::{
    ModelAmounts, QuotaView, add_charge, admitted_model, charge_on, excess, reported_usage,
};
use crate::quota::{GPUQuota, NamespaceLimits};

use super::pod::{CachedPod, PodKey};

/// How long a reservation the watch has not confirmed survives a relist without the pod.
const RESERVATION_TTL: Duration = Duration::from_secs(120);

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
    /// Changed only by `put_pod` and `delete_pod`, which keep `ledger` up to date.
    /// Boxed: the table keeps room for up to twice its entries, and a pod is some 250
    /// bytes against a pointer's 8 (docs/benchmarks.md, memory per cached pod).
    pods: HashMap<PodKey, Box<CachedPod>>,
    /// Pod keys by namespace, so quota usage never scans the whole cluster.
    by_namespace: HashMap<Box<str>, HashSet<PodKey>>,
    quotas: BTreeMap<(String, String), GPUQuota>,
    /// Placements held in memory only (the bind verb writes them), oldest first, so
    /// those the scheduler never bound are let go (`HOLD_TTL`).
    holds: std::collections::VecDeque<(Instant, PodKey)>,
    /// Recently created pods that left the cluster, with the charge they carried: the
    /// quota reconciler counts them as seen (`quota::pending`).
    departed: Vec<Departed>,
    /// Usage per namespace and model, kept up to date as pods, nodes and quotas change.
    ledger: usage::Ledger,
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
}

/// How long a placement the filter holds in memory waits for the scheduler's bind call.
/// Letting go early is safe (bind places again on the node it is given, or refuses);
/// holding on keeps GPUs idle for a pod the scheduler gave up on.
pub const HOLD_TTL: Duration = Duration::from_secs(30);

/// A pod created within `PENDING_TTL` that has left, and the charge it was counted with.
#[derive(Debug)]
struct Departed {
    namespace: Box<str>,
    created: i64,
    charge: ModelAmounts,
}

/// A placement the filter made: the node, its GPUs, and what to restore if recording
/// the choice on the pod fails.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub node: Arc<str>,
    pub assignment: Assignment,
    /// True when the pod already held this placement (a re-filter): nothing to write.
    pub kept: bool,
    previous: Option<CachedPod>,
}

/// What one filter call decided: the reservation, if any, and every candidate that
/// could not take the pod, by name.
#[derive(Debug)]
pub struct FilterDecision {
    pub reservation: Option<Reservation>,
    pub misfits: Vec<(Arc<str>, Misfit)>,
}

impl FilterDecision {
    fn none(misfits: Vec<(Arc<str>, Misfit)>) -> Self {
        FilterDecision {
            reservation: None,
            misfits,
        }
    }
}

/// What the cache held for a pod before a filter call took it as its subject.
#[derive(Debug)]
pub struct Held(Option<CachedPod>);

/// Which pod a filter call places.
#[derive(Debug)]
// One per filter call, moved into the cache at once: the size of the offered pod costs
// nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Subject {
    /// A pod the cluster has, named by the request (API mode). The cache's copy is the
    /// truth; the request's copy is not read.
    Known { uid: Box<str> },
    /// A pod the caller offers (offline mode: the file is the cluster).
    /// Boxed: a pod is ten times the size of a uid.
    Offered(Box<CachedPod>),
}

/// Why a filter call cannot place the pod it names at all (answered as the
/// extender's `Error`, so the scheduler retries the pod later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "pod {pod} is not in gpu-admission's view of the cluster (not created, or not seen yet)"
    )]
    NotInCluster { pod: String },
    #[error("pod {pod} has uid {cluster} in the cluster, not {request}")]
    OtherUid {
        pod: String,
        cluster: String,
        request: String,
    },
    #[error("pod {pod} is already bound to node {node}")]
    AlreadyBound { pod: String, node: String },
}

impl ClusterState {
    pub fn node(&self, name: &str) -> Option<&NodeGpus> {
        self.nodes.get(name)?.gpus.as_ref()
    }

    pub fn pod(&self, key: &str) -> Option<&CachedPod> {
        self.pods.get(key).map(|pod| &**pod)
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.values().filter(|n| n.gpus.is_some()).count()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeGpus> {
        self.nodes.values().filter_map(|n| n.gpus.as_ref())
    }

    pub fn quotas(&self) -> impl Iterator<Item = &GPUQuota> {
        self.quotas.values()
    }

    /// The GPUQuotas of one namespace.
    pub fn namespace_quotas<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a GPUQuota> + 'a {
        let first = (namespace.to_string(), String::new());
        self.quotas
            .range(first..)
            .take_while(move |((ns, _), _)| ns == namespace)
            .map(|(_, quota)| quota)
    }

    /// What the namespace's GPUQuotas say ([`NamespaceLimits::of`] them), kept with
    /// the quotas rather than recomputed.
    pub fn namespace_limits(&self, namespace: &str) -> &NamespaceLimits {
        self.ledger.limits(namespace)
    }

    /// How MIG slices are charged (`resources.mig`).
    pub fn mig(&self) -> &crate::placement::MigResources {
        self.ledger.mig()
    }

    /// The single-strategy MIG model labels the cluster's nodes carry, in order.
    pub fn mig_labels(&self) -> impl Iterator<Item = &str> {
        let labels = self.model_labels.keys().map(|l| &**l);
        labels.filter(|l| crate::placement::mig::split_product(l).1.is_some())
    }

    /// The model labels of nodes created at or before `created` (unix seconds; 0: any
    /// node), in order.
    pub fn labels_born_by(&self, created: i64) -> impl Iterator<Item = &str> {
        let born = move |births: &BTreeMap<i64, u32>| {
            created == 0 || births.keys().next().is_some_and(|first| *first <= created)
        };
        let labels = self.model_labels.iter();
        labels.filter(move |(_, b)| born(b)).map(|(l, _)| &**l)
    }

    /// What a pod that wants only `model` is charged before it is bound: its cost on
    /// the dearest label of that model among the nodes that existed when it was created
    /// (`quota::ledger::pending_label`; a node added later does not lower it, and
    /// placement refuses a node that costs more than this plus the namespace's room).
    pub fn pending_label<'a>(
        &'a self,
        request: &crate::placement::GpuRequest,
        model: &'a str,
        created: i64,
        limits: &NamespaceLimits,
    ) -> &'a str {
        let labels = self.labels_born_by(created);
        crate::quota::ledger::pending_label(request, model, labels, limits, self.ledger.mig())
    }

    /// What a pod created at `created` (unix seconds) costs on each model it wants, as
    /// admission charges it: a pod that wants one model, by its
    /// [`pending_label`](Self::pending_label); one that accepts several is charged at
    /// placement, on its node's label.
    pub fn admission_costs(
        &self,
        request: &crate::placement::GpuRequest,
        wanted: &[String],
        created: i64,
        limits: &NamespaceLimits,
    ) -> crate::quota::ledger::Costs {
        let mig = self.ledger.mig();
        match wanted {
            [only] => {
                let label = self.pending_label(request, only, created, limits);
                let charge = charge_on(request, label, mig);
                crate::quota::ledger::Costs::single(only.clone(), charge)
            }
            _ => crate::quota::ledger::Costs::of(request, wanted, mig),
        }
    }

    /// Count (`add`) or uncount a node's model label, by the node's creation second.
    fn count_label(&mut self, label: Option<Arc<str>>, created: i64, add: bool) {
        let Some(label) = label else {
            return;
        };
        let births = self.model_labels.entry(label.clone()).or_default();
        let count = births.entry(created).or_default();
        match add {
            true => *count += 1,
            false => *count = count.saturating_sub(1),
        }
        if *count == 0 {
            births.remove(&created);
        }
        if births.is_empty() {
            self.model_labels.remove(&label);
        }
    }

    // === nodes ===

    pub fn apply_node(&mut self, gpus: NodeGpus) {
        let name = gpus.name.clone();
        let old = self.node(&name).map(|old| (old.model.clone(), old.created));
        let model_changed = old
            .as_ref()
            .is_none_or(|(model, created)| *model != gpus.model || *created != gpus.created);
        if model_changed {
            if let Some((model, created)) = old {
                self.count_label(model, created, false);
            }
            self.count_label(gpus.model.clone(), gpus.created, true);
        }
        self.versions += 1;
        let version = self.versions;
        let entry = self.entry(name.clone());
        let same_shape = entry.gpus.as_ref().is_some_and(|old| {
            old.gpu_count() == gpus.gpu_count() && old.memory_per_gpu == gpus.memory_per_gpu
        });
        match (&mut entry.gpus, same_shape) {
            (Some(old), true) => {
                old.created = gpus.created;
                old.model = gpus.model;
                old.pool = gpus.pool;
                old.mig_slices = gpus.mig_slices;
                entry.stamp.version = version;
            }
            _ => {
                entry.gpus = Some(gpus);
                self.recompute(&name);
            }
        }
        if model_changed {
            self.recharge_node(&name);
        }
    }

    pub fn delete_node(&mut self, name: &str) {
        if let Some((model, created)) = self.node(name).map(|n| (n.model.clone(), n.created)) {
            self.count_label(model, created, false);
        }
        if let Some(entry) = self.nodes.get_mut(name) {
            entry.gpus = None;
        }
        self.recharge_node(name);
        self.drop_empty(name);
    }

    /// Replace all nodes with a complete list (a relist).
    pub fn replace_nodes(&mut self, nodes: Vec<NodeGpus>) {
        let names: Vec<Arc<str>> = self.nodes.keys().cloned().collect();
        let fresh: std::collections::HashSet<Arc<str>> =
            nodes.iter().map(|n| n.name.clone()).collect();
        for name in names.iter().filter(|n| !fresh.contains(*n)) {
            self.delete_node(name);
        }
        for node in nodes {
            self.apply_node(node);
        }
    }

    // === pods ===

    /// Insert or update a pod as the cluster shows it. A pod object that does not yet
    /// show our reservation (the annotation patch is still on its way) keeps it.
    ///
    /// Once a pod is bound with its GPUs known, they stay what they were: gpu-manager
    /// has acted on them, and the pod's owner can still edit its annotations, which
    /// must not move (or free) GPUs in this view.
    pub fn apply_pod(&mut self, key: PodKey, mut pod: CachedPod) {
        let arrives = !self.pods.contains_key(&key);
        if let Some(old) = self.pods.get(&key) {
            let same_pod = old.uid == pod.uid || old.uid.is_empty() || pod.uid.is_empty();
            // The scheduler wrote a new "not scheduled" condition: it gave the pod up, and
            // a placement held for its bind goes with it.
            let given_up = pod.unscheduled != 0 && pod.unscheduled != old.unscheduled;
            if old.reserved.is_some() && pod.node.is_none() && same_pod && !given_up {
                pod.node = old.node.clone();
                pod.assignment = old.assignment.clone();
                pod.reserved = old.reserved;
                pod.bound = old.bound;
            }
            let settled = old.bound && old.assignment.is_some() && old.uid == pod.uid;
            if settled && pod.node == old.node {
                pod.assignment = old.assignment.clone();
            }
        }
        self.put_pod(key.clone(), pod);
        if arrives && !self.claims.is_empty() {
            // A claim that serves this pod's extended resources is charged to the pod.
            self.recharge_extended(namespace_of(&key));
        }
    }

    pub fn delete_pod(&mut self, key: &str) {
        let namespace = namespace_of(key);
        self.remember_departure(namespace, key);
        let Some(old) = self.pods.remove(key) else {
            return;
        };
        self.ledger.discharge(key, namespace);
        if let Some(keys) = self.by_namespace.get_mut(namespace) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_namespace.remove(namespace);
            }
        }
        if let Some(node) = old.node {
            self.unlink(&node, key);
        }
    }

    /// Replace all pods with a complete list (a relist). Recent reservations of pods the
    /// list does not hold yet survive; older ones belonged to pods that are gone.
    pub fn replace_pods(&mut self, pods: Vec<(PodKey, CachedPod)>, now: Instant) {
        let listed: std::collections::HashSet<PodKey> =
            pods.iter().map(|(k, _)| k.clone()).collect();
        let stale: Vec<PodKey> = self
            .pods
            .iter()
            .filter(|(key, pod)| {
                !listed.contains(*key)
                    && pod
                        .reserved
                        .is_none_or(|at| now.duration_since(at) >= RESERVATION_TTL)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            self.delete_pod(&key);
        }
        for (key, pod) in pods {
            self.apply_pod(key, pod);
        }
    }

    fn put_pod(&mut self, key: PodKey, mut pod: CachedPod) {
        // The node's own name, shared by its pods, rather than a copy per pod.
        if let Some((name, _)) = pod
            .node
            .as_deref()
            .and_then(|n| self.nodes.get_key_value(n))
        {
            pod.node = Some(name.clone());
        }
        let old_node = self.pods.get(&key).and_then(|p| p.node.clone());
        let new_node = pod.node.clone();
        if self.pods.insert(key.clone(), Box::new(pod)).is_none() {
            let namespace = namespace_of(&key);
            self.by_namespace
                .entry(namespace.into())
                .or_default()
                .insert(key.clone());
        }
        if let Some(old) = old_node.as_ref().filter(|o| Some(*o) != new_node.as_ref()) {
            self.unlink(old, &key);
        }
        self.recharge(&key);
        if let Some(node) = new_node {
            let entry = self.entry(node.clone());
            if !entry.pods.contains(&key) {
                entry.pods.push(key);
            }
            self.recompute(&node);
        }
    }

    /// Bring the ledger's charge of pod `key` up to date.
    fn recharge(&mut self, key: &PodKey) {
        let pod = self.pods.get(key);
        let model = pod.and_then(|p| self.charge_label(namespace_of(key), p));
        let pod = self.pods.get(key).map(|pod| &**pod);
        self.ledger
            .recharge(key, namespace_of(key), pod, model.as_deref());
    }

    /// The node label `pod` is charged by now: its node's, else, for a pod that wants
    /// one model, the [`pending_label`](Self::pending_label) it was admitted by.
    fn charge_label(&self, namespace: &str, pod: &CachedPod) -> Option<String> {
        if let Some(model) = node_model(&self.nodes, pod) {
            return Some(model.to_string());
        }
        let limits = self.namespace_limits(namespace);
        let wanted =
            WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
        match wanted {
            [only] => Some(
                self.pending_label(&pod.request, only, pod.created, limits)
                    .to_string(),
            ),
            _ => None,
        }
    }

    /// Recharge the pods on node `name` (its model changed, or it left).
    fn recharge_node(&mut self, name: &str) {
        let Some(entry) = self.nodes.get(name) else {
            return;
        };
        let keys: Vec<PodKey> = entry.pods.to_vec();
        for key in &keys {
            self.recharge(key);
        }
    }

    /// Recharge the pods of `namespace` after its quotas changed.
    fn recharge_namespace(&mut self, namespace: &str) {
        let limits = NamespaceLimits::of(self.namespace_quotas(namespace), namespace);
        self.ledger.set_limits(namespace, limits);
        let keys: Vec<PodKey> = self
            .by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for key in &keys {
            self.recharge(key);
        }
        let claims: Vec<PodKey> = self
            .namespace_claims(namespace)
            .map(|(k, _)| k.clone())
            .collect();
        for key in claims {
            self.recharge_claim(&key);
        }
    }

    fn unlink(&mut self, node: &str, key: &str) {
        if let Some(entry) = self.nodes.get_mut(node) {
            entry.pods.retain(|k| &**k != key);
        }
        self.recompute(node);
        self.drop_empty(node);
    }

    fn drop_empty(&mut self, node: &str) {
        if self
            .nodes
            .get(node)
            .is_some_and(|e| e.gpus.is_none() && e.pods.is_empty())
            && let Some(entry) = self.nodes.remove(node)
        {
            self.free_slots.push(entry.stamp.slot);
        }
    }

    /// The node's entry, created with a slot of its own if new.
    fn entry(&mut self, name: Arc<str>) -> &mut NodeEntry {
        let (free, slots) = (&mut self.free_slots, &mut self.slots);
        self.nodes.entry(name).or_insert_with(|| {
            let slot = free.pop().unwrap_or_else(|| {
                *slots += 1;
                *slots - 1
            });
            NodeEntry {
                gpus: None,
                pods: Vec::new(),
                stamp: Stamp { slot, version: 0 },
            }
        })
    }

    /// Recount a node's GPU use from its pods. Pods whose annotations name GPUs are
    /// charged there; pods without (or with indices the node lacks) are charged where
    /// gpu-manager would put them, so capacity is never silently handed out twice.
    /// What a pod holds for its init containers has no annotation: unless our own
    /// reservation placed it, it is placed on the node as it is, after the annotated
    /// pods, so the node holds each pod's whole effective request.
    fn recompute(&mut self, name: &str) {
        let Some(entry) = self.nodes.get_mut(name) else {
            return;
        };
        let Some(gpus) = entry.gpus.as_mut() else {
            return;
        };
        self.versions += 1;
        entry.stamp.version = self.versions;
        gpus.used.iter_mut().for_each(|u| *u = Default::default());
        let mut unindexed = Vec::new();
        let mut unheld = Vec::new();
        for key in &entry.pods {
            let Some(pod) = self.pods.get(key) else {
                continue;
            };
            match &pod.assignment {
                Some(a) if fits_indices(a, gpus.gpu_count()) => {
                    a.charge(gpus);
                    if !a.holds_init_of(&pod.request) {
                        unheld.push(key.clone());
                    }
                }
                _ => unindexed.push(key.clone()),
            }
        }
        for key in unheld {
            let Some(pod) = self.pods.get(&key) else {
                continue;
            };
            match fit_held(gpus, &pod.request) {
                Ok(held) => Assignment {
                    choices: Vec::new(),
                    held,
                }
                .charge(gpus),
                Err(misfit) => {
                    tracing::warn!(pod = %key, node = name, %misfit, "pod's init-container GPUs do not fit its node; not charged")
                }
            }
        }
        for key in unindexed {
            let Some(pod) = self.pods.get(&key) else {
                continue;
            };
            match fit(gpus, &pod.request) {
                Ok(a) => a.charge(gpus),
                Err(misfit) => {
                    tracing::warn!(pod = %key, node = name, %misfit, "pod on node does not fit its GPUs; not charged")
                }
            }
        }
    }

    // === quotas ===

    /// Insert or update a quota. The ledger's own writes land here as soon as the API
    /// server answers them, so the next admission decides on them without waiting for
    /// the watch; a watch event older than what the cache holds is then ignored.
    pub fn apply_quota(&mut self, quota: GPUQuota) {
        let key = quota_key(&quota);
        let held = self.quotas.get(&key).and_then(resource_version);
        if held.is_some_and(|held| resource_version(&quota).is_some_and(|new| new < held)) {
            return;
        }
        let namespace = key.0.clone();
        self.quotas.insert(key, quota);
        self.recharge_namespace(&namespace);
    }

    pub fn delete_quota(&mut self, quota: &GPUQuota) {
        let key = quota_key(quota);
        self.quotas.remove(&key);
        self.recharge_namespace(&key.0);
    }

    pub fn replace_quotas(&mut self, quotas: Vec<GPUQuota>) {
        let fresh = quotas.into_iter().map(|q| (quota_key(&q), q)).collect();
        let old = std::mem::replace(&mut self.quotas, fresh);
        let namespaces: std::collections::BTreeSet<String> = (old.into_keys())
            .chain(self.quotas.keys().cloned())
            .map(|(namespace, _)| namespace)
            .collect();
        for namespace in namespaces {
            self.recharge_namespace(&namespace);
        }
    }

    /// The namespace's GPUQuotas with `used` counted from the pods this cache holds
    /// (offline mode's ledger; API mode's reconciler).
    pub fn quota_views(&self, namespace: &str) -> Result<Vec<QuotaView>, String> {
        let mut views = self
            .namespace_quotas(namespace)
            .map(QuotaView::from_crd)
            .collect::<Result<Vec<_>, _>>()?;
        let used = self.usage(namespace);
        for view in &mut views {
            view.used = used
                .iter()
                .filter(|(m, _)| view.hard.contains_key(*m))
                .map(|(m, a)| (m.clone(), *a))
                .collect();
        }
        Ok(views)
    }

    /// The part of its namespace's usage `quota` reports in its status and metrics
    /// (see [`reported_usage`]).
    pub fn quota_usage(&self, quota: &GPUQuota) -> ModelAmounts {
        let namespace = quota.metadata.namespace.as_deref().unwrap_or_default();
        let listed = &self.namespace_limits(namespace).models;
        let lists = |model: &str| quota.spec.hard.contains_key(model);
        reported_usage(&self.usage(namespace), lists, listed)
    }

    /// GPUs per model that the namespace's live pods are charged (kept up to date as
    /// pods, nodes and quotas change: one entry per model, not a walk over the pods).
    pub fn usage(&self, namespace: &str) -> ModelAmounts {
        self.ledger.usage(namespace)
    }

    /// What a pod was surely charged at admission or binding, per quota key: a pod
    /// that wants one model, or a bound one (a merely annotated multi-model pod may
    /// not have been charged yet).
    fn ledger_charge(&self, namespace: &str, pod: &CachedPod) -> Option<ModelAmounts> {
        let limits = self.namespace_limits(namespace);
        let wanted =
            WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
        if !(wanted.len() == 1 || pod.bound) || pod.created == 0 {
            return None;
        }
        let mig = self.ledger.mig();
        let node = node_model(&self.nodes, pod);
        match wanted {
            // Admission charged it by the nodes that existed when it was created, and
            // placement what a dearer node costs beyond that (`ledger::excess`).
            [only] => {
                let label = self.pending_label(&pod.request, only, pod.created, limits);
                let mut charge = charge_on(&pod.request, label, mig);
                if let Some(node) = node.filter(|n| *n != label) {
                    let beyond = excess(&charge_on(&pod.request, node, mig), &charge);
                    add_charge(&mut charge, &beyond);
                }
                Some(charge)
            }
            _ => Some(charge_on(&pod.request, admitted_model(wanted, node)?, mig)),
        }
    }

    /// How MIG slices are charged (`resources.mig`); set once, before any pod arrives.
    pub fn set_mig(&mut self, mig: crate::placement::MigResources) {
        self.ledger.set_mig(mig);
    }

    /// What the pods seen created in each recent second account for, per (second,
    /// model): the namespace's live pods created at or after `since` (unix seconds) and
    /// those that have left since. The quota reconciler settles pending charges with it.
    pub fn seen_charges(&self, namespace: &str, since: i64) -> HashMap<(i64, String), Milli> {
        let mut seen: HashMap<(i64, String), Milli> = HashMap::default();
        let mut add = |created: i64, model: String, amount: Milli| {
            let entry = seen.entry((created, model)).or_default();
            entry.0 = entry.0.saturating_add(amount.0);
        };
        let keys = self.by_namespace.get(namespace).into_iter().flatten();
        for pod in keys.filter_map(|key| self.pods.get(key)) {
            if pod.created < since {
                continue;
            }
            for (key, amount) in self.ledger_charge(namespace, pod).into_iter().flatten() {
                add(pod.created, key, amount);
            }
        }
        for (_, claim) in self.namespace_claims(namespace) {
            if claim.created >= since {
                for (key, amount) in self.claim_charge(namespace, claim) {
                    add(claim.created, key, amount);
                }
            }
        }
        let departed = self.departed.iter().filter(|d| &*d.namespace == namespace);
        for d in departed.filter(|d| d.created >= since) {
            for (key, amount) in &d.charge {
                add(d.created, key.clone(), *amount);
            }
        }
        seen
    }

    /// Keep what a leaving pod that was created recently was charged: until its pending
    /// total is settled it must still count as seen, or its charge would count again.
    fn remember_departure(&mut self, namespace: &str, key: &str) {
        let created = self.pods.get(key).map_or(0, |p| p.created);
        self.remember_departed(namespace, created, |state| {
            state.ledger_charge(namespace, state.pods.get(key)?)
        });
    }

    /// Keep `charge` (what a leaving pod or claim created at `created` was counted with)
    /// while its pending total may still be settled; forget the older ones.
    fn remember_departed(
        &mut self,
        namespace: &str,
        created: i64,
        charge: impl FnOnce(&Self) -> Option<ModelAmounts>,
    ) {
        let horizon = crate::quota::pending::now_second()
            - crate::quota::pending::PENDING_TTL.as_secs() as i64;
        self.departed.retain(|d| d.created >= horizon);
        if created < horizon || !self.namespace_limits(namespace).has_quota {
            return;
        }
        if let Some(charge) = charge(self) {
            self.departed.push(Departed {
                namespace: namespace.into(),
                created,
                charge,
            });
        }
    }

    // === the filter transaction ===

    /// Choose a node for a pod among `candidates` and reserve its GPUs, atomically with
    /// respect to every other call. `subject` says which pod: one the cluster shows (API
    /// mode: the request names it, the cache's copy is what gets placed) or one the
    /// caller offers (offline mode: the file is the cluster, and a new pod joins it
    /// only once placed). A pod that already holds a placement on a candidate keeps
    /// it; one placed elsewhere is released and placed anew, so a re-filter never
    /// charges twice. `choose` runs the placement policy.
    pub fn reserve(
        &mut self,
        key: &PodKey,
        subject: Subject,
        candidates: &[&str],
        choose: impl FnOnce(&CachedPod, &mut Candidates<'_>) -> Outcome,
        now: Instant,
    ) -> Result<FilterDecision, PlanError> {
        let held = self.take_subject(key, subject)?;
        Ok(self.place_subject(key, held, candidates, choose, now))
    }

    /// [`ClusterState::reserve`]'s second half, for a caller that reads the pod in
    /// between (the extender reads the ledger only for pods that need it): `held` is
    /// what [`ClusterState::take_subject`] returned.
    pub fn place_subject(
        &mut self,
        key: &PodKey,
        held: Held,
        candidates: &[&str],
        choose: impl FnOnce(&CachedPod, &mut Candidates<'_>) -> Outcome,
        now: Instant,
    ) -> FilterDecision {
        let previous = held.0;
        self.expire_holds(now);
        if let Some(kept) = self.keep_existing(key, candidates) {
            return kept;
        }
        if let Some(mut released) = previous.clone().filter(|p| p.node.is_some()) {
            released.node = None;
            released.assignment = None;
            released.reserved = None;
            self.put_pod(key.clone(), released);
        }
        let mut misfits = Vec::new();
        let mut known = Candidates {
            nodes: Vec::with_capacity(candidates.len()),
            stamps: Vec::with_capacity(candidates.len()),
            memo: &mut self.memo,
        };
        for name in candidates {
            match self
                .nodes
                .get(*name)
                .and_then(|e| Some((e.gpus.as_ref()?, e.stamp)))
            {
                Some((gpus, stamp)) => {
                    known.nodes.push(gpus);
                    known.stamps.push(stamp);
                }
                None => misfits.push((Arc::from(*name), Misfit::NotCached)),
            }
        }
        let Some(pod) = self.pods.get(key) else {
            return FilterDecision::none(misfits);
        };
        let outcome = choose(pod, &mut known);
        let known = known.nodes;
        misfits.extend(
            outcome
                .misfits
                .into_iter()
                .map(|(i, m)| (known[i].name.clone(), m)),
        );
        let Some((index, assignment)) = outcome.chosen else {
            if previous.is_none() {
                // Offered and not placed: the cache keeps only what the cluster has.
                self.delete_pod(key);
            }
            return FilterDecision::none(misfits);
        };
        let node = known[index].name.clone();
        if let Some(mut pod) = self.pods.get(key).cloned() {
            pod.node = Some(node.clone());
            pod.assignment = Some(assignment.clone());
            pod.reserved = Some(now);
            self.put_pod(key.clone(), *pod);
            self.holds.push_back((now, key.clone()));
        }
        FilterDecision {
            reservation: Some(Reservation {
                node,
                assignment,
                kept: false,
                previous,
            }),
            misfits,
        }
    }

    /// Let go of placements held longer than [`HOLD_TTL`] that no bind (and no
    /// annotation coming back through the watch) confirmed.
    fn expire_holds(&mut self, now: Instant) {
        while let Some((at, _)) = self.holds.front() {
            if now.saturating_duration_since(*at) < HOLD_TTL {
                break;
            }
            let Some((at, key)) = self.holds.pop_front() else {
                break;
            };
            let Some(pod) = self.pods.get(&key) else {
                continue;
            };
            if pod.reserved == Some(at) && !pod.bound {
                tracing::info!(pod = %key, "placement held for a bind that never came; released");
                self.release_hold(&key);
            }
        }
    }

    /// The binding of a held placement went through: the pod is bound (the watch will
    /// show it; until then the cache keeps the placement as it is).
    pub fn mark_bound(&mut self, key: &str) {
        if let Some(pod) = self.pods.get_mut(key) {
            pod.bound = true;
        }
    }

    /// Let go of the placement held in memory for a pod (its bind failed). A placement
    /// the cluster shows (annotations, or a binding) is not ours to drop.
    pub fn release_hold(&mut self, key: &str) {
        let Some(pod) = self
            .pods
            .get(key)
            .filter(|p| p.reserved.is_some() && !p.bound)
        else {
            return;
        };
        let mut released = pod.clone();
        released.node = None;
        released.assignment = None;
        released.reserved = None;
        let key: PodKey = key.into();
        self.put_pod(key, *released);
    }

    /// Undo a reservation whose recording failed.
    pub fn rollback(&mut self, key: &PodKey, reservation: Reservation) {
        match reservation.previous {
            Some(previous) => self.put_pod(key.clone(), previous),
            None => self.delete_pod(key),
        }
    }

    /// The pod to place, checked: it must be the pod the cluster has (same uid) and not
    /// yet bound. Afterwards the cache holds it under `key`; the result remembers what
    /// the cache held before (nothing for a pod just offered).
    pub fn take_subject(&mut self, key: &PodKey, subject: Subject) -> Result<Held, PlanError> {
        self.subject(key, subject).map(Held)
    }

    fn subject(&mut self, key: &PodKey, subject: Subject) -> Result<Option<CachedPod>, PlanError> {
        let held = match subject {
            Subject::Known { uid } => {
                let held = self.pods.get(key).ok_or_else(|| PlanError::NotInCluster {
                    pod: key.to_string(),
                })?;
                if *held.uid != *uid {
                    return Err(PlanError::OtherUid {
                        pod: key.to_string(),
                        cluster: held.uid.to_string(),
                        request: uid.to_string(),
                    });
                }
                held
            }
            Subject::Offered(incoming) => match self.pods.get(key) {
                // The same name with the same (or no) uid: the pod the file holds.
                Some(old)
                    if incoming.uid.is_empty() || old.uid.is_empty() || old.uid == incoming.uid =>
                {
                    old
                }
                // A new pod (or the same name with another uid: what the old one held is gone).
                _ => {
                    check_unbound(key, &incoming)?;
                    self.put_pod(key.clone(), *incoming);
                    return Ok(None);
                }
            },
        };
        check_unbound(key, held)?;
        Ok(Some((**held).clone()))
    }

    fn keep_existing(&self, key: &PodKey, candidates: &[&str]) -> Option<FilterDecision> {
        let pod = self.pods.get(key)?;
        let node = pod.node.clone()?;
        let assignment = pod.assignment.clone()?;
        let gpus = self.node(&node)?;
        if !candidates.contains(&&*node) || !fits_indices(&assignment, gpus.gpu_count()) {
            return None;
        }
        Some(FilterDecision {
            reservation: Some(Reservation {
                node,
                assignment,
                kept: true,
                previous: Some((**pod).clone()),
            }),
            misfits: Vec::new(),
        })
    }
}

/// The candidates of a filter call that the cache knows, in the request's order: each
/// node's GPUs (the slice this derefs to) and stamp, and what placement kept from
/// earlier calls.
pub struct Candidates<'a> {
    nodes: Vec<&'a NodeGpus>,
    stamps: Vec<Stamp>,
    memo: &'a mut PlacementMemo,
}

impl<'a> std::ops::Deref for Candidates<'a> {
    type Target = [&'a NodeGpus];
    fn deref(&self) -> &Self::Target {
        &self.nodes
    }
}

impl Candidates<'_> {
    /// `placement::place` over these candidates, reusing the evaluations of nodes that
    /// have not changed since an earlier call with the same placer and request.
    pub fn place(
        &mut self,
        placer: &Placer,
        request: &GpuRequest,
        allowed: impl Fn(&NodeGpus) -> Result<(), Misfit>,
    ) -> Outcome {
        place_versioned(
            placer,
            request,
            &self.nodes,
            &self.stamps,
            allowed,
            self.memo,
        )
    }
}

fn check_unbound(key: &PodKey, pod: &CachedPod) -> Result<(), PlanError> {
    match pod.node.as_deref().filter(|_| pod.bound) {
        Some(node) => Err(PlanError::AlreadyBound {
            pod: key.to_string(),
            node: node.to_string(),
        }),
        None => Ok(()),
    }
}

/// The model of the node `pod` is on, as far as this cache knows it.
fn node_model<'a>(nodes: &'a HashMap<Arc<str>, NodeEntry>, pod: &CachedPod) -> Option<&'a str> {
    let entry = nodes.get(pod.node.as_deref()?)?;
    entry.gpus.as_ref()?.model.as_deref()
}

/// The namespace part of a `namespace/name` pod key.
fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(namespace, _)| namespace)
}

fn fits_indices(assignment: &Assignment, gpu_count: usize) -> bool {
    let held = assignment.held.iter().flat_map(|h| &h.gpus);
    assignment
        .choices
        .iter()
        .flat_map(|c| &c.gpus)
        .chain(held)
        .all(|&g| usize::from(g) < gpu_count)
}

/// A resourceVersion as a number: the API server's are etcd revisions, which only
/// grow. `None` for any other form (then the newest event wins, as before).
fn resource_version(quota: &GPUQuota) -> Option<u64> {
    quota.metadata.resource_version.as_deref()?.parse().ok()
}

fn quota_key(quota: &GPUQuota) -> (String, String) {
    (
        quota.metadata.namespace.clone().unwrap_or_default(),
        quota.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod charge_tests;
#[cfg(test)]
mod claim_tests;
pub mod claims;
#[cfg(test)]
mod pending_tests;
#[cfg(test)]
mod stamp_tests;
mod usage;
#[cfg(test)]
mod usage_tests;
