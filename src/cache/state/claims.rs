//! ResourceClaims and the GPU devices of ResourceSlices in the cluster state: what each
//! claim holds is charged to its namespace alongside its pods (docs/devices.md). A
//! claim is charged once however many pods share it: pods are charged for their
//! containers' GPU resources only.

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::Arc;

use crate::dra::classes::{ClassInfo, DeviceClasses};
use crate::dra::slices::{GpuDevice, SliceDevices};
use crate::dra::{self, CatalogSource, ClaimAsks, DeviceRequest, Dra, ResourceClaim};
use crate::placement::GpuDemand;
use crate::placement::models::WantedModels;
use crate::quota::{ChargedAt, ModelAmounts, add_charge};

use super::super::pod::PodKey;
use super::{ClusterState, namespace_of};

/// The annotation kube-scheduler puts on the claim it creates for a pod's DRA-backed
/// extended resources (the pod owns the claim).
const EXTENDED_RESOURCE_CLAIM: &str = "resource.kubernetes.io/extended-resource-claim";

/// A claim as quota sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CachedClaim {
    /// `creationTimestamp`, unix seconds (the ledger's pending total it joined).
    pub(super) created: i64,
    /// Its device requests, evaluated again when the DeviceClasses change.
    pub(crate) requests: Arc<[DeviceRequest]>,
    /// Its GPU requests, evaluated off the cache's lock before it joined the cluster
    /// state (`evaluation.rs`), or kept from when it was.
    pub(crate) asks: ClaimAsks,
    /// The version of the DeviceClasses `asks` were evaluated under (`None`: not yet).
    pub(crate) evaluated: Option<u64>,
    /// The GPU driver's devices allocated to it: (pool, device), with what it consumes
    /// of a shared device's capacities.
    allocated: Vec<(String, String, Option<dra::Asks>)>,
    /// The pod it says it serves the extended resources of, if annotated so.
    extended_for: Option<ExtendedFor>,
}

impl CachedClaim {
    /// `None` for a claim that asks for no device and holds no GPU.
    pub(crate) fn from_claim(claim: &ResourceClaim, dra: &Dra) -> Option<Self> {
        let allocated: Vec<_> = claim
            .allocated()
            .iter()
            .filter(|d| d.driver == dra.driver)
            .map(|d| (d.pool.clone(), d.device.clone(), d.consumed()))
            .collect();
        if claim.requests().is_empty() && allocated.is_empty() {
            return None;
        }
        let created = claim.metadata.creation_timestamp.as_ref();
        Some(CachedClaim {
            created: created.map_or(0, |t| t.0.as_second()),
            requests: claim.requests().into(),
            asks: ClaimAsks::default(),
            evaluated: None,
            allocated,
            extended_for: extended_owner(claim),
        })
    }
}

impl CachedClaim {
    /// Whether devices of the GPU driver are allocated to it.
    pub(crate) fn is_allocated(&self) -> bool {
        !self.allocated.is_empty()
    }
}

/// What a claim says of the pod whose extended resources it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExtendedFor {
    pod: String,
    uid: String,
    /// The claim's own name (a pod that names it in its spec uses it as any claim).
    claim: String,
}

/// The pod a claim says it serves the extended resources of: annotated so, controlled by
/// that pod, and not made from the pod's ResourceClaimTemplate (whose metadata the
/// tenant writes). Whether the pod exists and asks for them is the cluster state's to say.
pub(crate) fn extended_owner(claim: &ResourceClaim) -> Option<ExtendedFor> {
    let meta = &claim.metadata;
    let annotations = meta.annotations.as_ref()?;
    if annotations.get(EXTENDED_RESOURCE_CLAIM)? != "true"
        || annotations.contains_key("resource.kubernetes.io/pod-claim-name")
    {
        return None;
    }
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let pod = owners
        .iter()
        .find(|o| o.kind == "Pod" && o.api_version == "v1" && o.controller == Some(true))?;
    Some(ExtendedFor {
        pod: pod.name.clone(),
        uid: pod.uid.clone(),
        claim: meta.name.clone().unwrap_or_default(),
    })
}

/// The key of a claim among the namespace's charged objects (pod names have no `/`).
pub(crate) fn claim_key(namespace: &str, name: &str) -> PodKey {
    format!("{namespace}/resourceclaims/{name}").into()
}

impl ExtendedFor {
    /// Whether `other` says it serves the same pod (name and uid).
    fn same_pod(&self, other: &ExtendedFor) -> bool {
        self.pod == other.pod && self.uid == other.uid
    }
}

impl ClusterState {
    /// A claim arrived or changed, its asks evaluated (or not) off the lock: no CEL runs
    /// here. One the cache holds with the same requests keeps the asks it was given
    /// (an admitted claim keeps its verdict) unless these are newer.
    pub(crate) fn apply_claim(&mut self, key: PodKey, mut claim: CachedClaim) {
        if let Some(held) = self.claims.get(&key)
            && held.requests == claim.requests
            && held.evaluated >= claim.evaluated
        {
            claim.asks = held.asks.clone();
            claim.evaluated = held.evaluated;
        }
        let extended_for = claim.extended_for.clone();
        let old = self.claims.insert(key.clone(), claim);
        self.recharge_claim(&key);
        for owner in [extended_for, old.and_then(|c| c.extended_for)] {
            self.recharge_siblings(&key, owner.as_ref());
        }
    }

    /// A claim naming the pod `owner` came or went: the other claims naming it are
    /// charged again (a pod's claim is free only while it is the only one).
    fn recharge_siblings(&mut self, key: &PodKey, owner: Option<&ExtendedFor>) {
        let Some(owner) = owner else {
            return;
        };
        let namespace = namespace_of(key);
        let siblings: Vec<PodKey> = self
            .namespace_claims(namespace)
            .filter(|(k, c)| {
                *k != key && c.extended_for.as_ref().is_some_and(|o| o.same_pod(owner))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for sibling in siblings {
            self.recharge_claim(&sibling);
        }
    }

    /// The claim `name` of `namespace`, when it asks for or holds GPUs.
    pub(crate) fn claim(&self, namespace: &str, name: &str) -> Option<&CachedClaim> {
        self.claims.get(&claim_key(namespace, name))
    }

    /// The published GPU devices.
    pub(crate) fn gpu_devices(&self) -> &crate::dra::slices::DeviceIndex {
        &self.devices
    }

    /// What decides the model of a claim's requests in `namespace`: the DeviceClasses,
    /// the published devices, and the models its quotas and the nodes name. Copied
    /// out: the [`crate::dra::Catalog`] is built from it off the lock.
    pub(crate) fn catalog_source(&self, namespace: &str) -> CatalogSource {
        let limits = self.namespace_limits(namespace);
        let mut known: Vec<String> = limits.models.clone();
        known.extend(limits.profile_caps.iter().cloned());
        known.extend(limits.default_type.iter().cloned());
        known.extend(
            self.nodes()
                .filter_map(|n| n.model.as_deref().map(str::to_string)),
        );
        CatalogSource::new(&self.dra, &self.classes, &self.devices, known)
    }

    /// The version of the DeviceClasses (see [`CachedClaim::evaluated`]).
    pub(crate) fn classes_version(&self) -> u64 {
        self.classes_version
    }

    pub(crate) fn set_dra(&mut self, dra: Dra) {
        self.dra = dra;
    }

    /// A DeviceClass arrived or changed: every claim's requests are to be evaluated
    /// again, off the lock ([`ClusterState::unevaluated_claims`]); until then each keeps
    /// its charge.
    pub fn apply_class(&mut self, name: &str, class: ClassInfo) {
        if self.classes.get(name) != Some(&class) {
            self.classes.insert(name.to_string(), class);
            self.classes_version += 1;
        }
    }

    pub(crate) fn delete_class(&mut self, name: &str) {
        if self.classes.remove(name).is_some() {
            self.classes_version += 1;
        }
    }

    pub(crate) fn replace_classes(&mut self, classes: DeviceClasses) {
        if self.classes != classes {
            self.classes = classes;
            self.classes_version += 1;
        }
    }

    pub(crate) fn classes(&self) -> &DeviceClasses {
        &self.classes
    }

    /// Whether a claim in `namespace` may be the one kube-scheduler made for a pod's
    /// DRA-backed extended resources, so the pod is charged, not the claim: it names
    /// (`extended_for`) a pod of the namespace, with that uid, that asks for whole GPUs
    /// and does not name the claim in its spec; its requests are plain `exactly` ones
    /// (no selectors: the mutating webhook pins every other GPU claim) of classes serving
    /// a whole-GPU resource, for no more devices than the pod's whole GPUs; and no other
    /// claim of the namespace names that pod. Who created the claim is not in the object:
    /// the claim webhooks also ask that its creator be one of `schedulerUsers`
    /// (docs/security.md, "What the quota trusts").
    pub(crate) fn serves_pod(
        &self,
        namespace: &str,
        requests: &[DeviceRequest],
        extended_for: Option<&ExtendedFor>,
    ) -> bool {
        let Some(owner) = extended_for else {
            return false;
        };
        let pod = self.pod(&format!("{namespace}/{}", owner.pod));
        let Some(pod) = pod.filter(|p| *p.uid == *owner.uid) else {
            return false;
        };
        if pod.claim_names().iter().any(|n| **n == *owner.claim) {
            return false;
        }
        let whole = |resource: &str| match self.gpu_resources.is_empty() {
            true => resource == "nvidia.com/gpu",
            false => self.gpu_resources.iter().any(|r| r == resource),
        };
        let mut devices = 0u64;
        for request in requests {
            let Some(exact) = request
                .exactly
                .as_ref()
                .filter(|_| request.first_available.is_none())
            else {
                return false;
            };
            let class = self.classes.get(&exact.device_class_name);
            let serves = class
                .and_then(|c| c.extended_resource.as_deref())
                .is_some_and(whole);
            if !serves
                || !exact.selectors.is_empty()
                || exact.allocation_mode.as_deref() == Some("All")
            {
                return false;
            }
            devices += exact.count.unwrap_or(1).max(0) as u64;
        }
        devices > 0
            && devices <= u64::from(pod.request.whole_gpus())
            && !self.names_pod_besides(namespace, owner)
    }

    /// Whether a claim of `namespace` other than `owner.claim` names the same pod.
    fn names_pod_besides(&self, namespace: &str, owner: &ExtendedFor) -> bool {
        self.namespace_claims(namespace).any(|(_, c)| {
            c.extended_for
                .as_ref()
                .is_some_and(|o| o.same_pod(owner) && o.claim != owner.claim)
        })
    }

    /// The whole-GPU resource names (`resources.wholeGpu`).
    pub(crate) fn set_gpu_resources(&mut self, names: Vec<String>) {
        self.gpu_resources = names;
    }

    /// The nodes among `names` that can give the pod `key` its whole GPUs only through
    /// DRA-backed extended resources: no GPU capacity of their own, GPUs published in
    /// ResourceSlices, of a model the pod may use (docs/devices.md). kube-scheduler's
    /// DRA plugin allocates them (in a claim it makes for the pod, charged to the pod).
    pub(crate) fn dra_nodes(&self, key: &str, names: &[&str]) -> Vec<String> {
        let Some(pod) = self.pod(key) else {
            return Vec::new();
        };
        let whole = pod.request.mig.is_empty()
            && pod
                .request
                .init
                .is_none_or(|d| matches!(d, GpuDemand::Whole { .. }))
            && pod
                .request
                .containers
                .iter()
                .all(|c| matches!(c.demand, GpuDemand::Whole { .. }));
        let served = self.classes.values().any(|c| c.extended_resource.is_some());
        if !whole || !served || self.devices.is_empty() {
            return Vec::new();
        }
        let limits = self.namespace_limits(namespace_of(key));
        let models =
            WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
        // A pod accepting several models is charged at placement, by the node the
        // extender picks: only one charged at admission has a model to look for.
        let ChargedAt::Admission { model } = ChargedAt::of(models) else {
            return Vec::new();
        };
        let published = self.devices.node_models();
        names
            .iter()
            .filter(|name| self.node(name).is_none_or(|n| n.gpu_count() == 0))
            .filter(|name| published.get(**name).is_some_and(|l| l.contains(model)))
            .map(|name| name.to_string())
            .collect()
    }

    /// A pod arrived: the claim serving its extended resources stops being charged.
    pub(super) fn recharge_extended(&mut self, namespace: &str, pod: &str) {
        let keys: Vec<PodKey> = self
            .namespace_claims(namespace)
            .filter(|(_, c)| c.extended_for.as_ref().is_some_and(|o| o.pod == pod))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.recharge_claim(&key);
        }
    }

    pub(crate) fn delete_claim(&mut self, key: &str) {
        let namespace = namespace_of(key);
        let Some(claim) = self.claims.get(key) else {
            return;
        };
        // Its charge as it was, its siblings still there.
        let charge = self.claim_charge(namespace, claim);
        let Some(claim) = self.claims.remove(key) else {
            return;
        };
        self.remember_departed(namespace, claim.created, |_| Some(charge));
        self.tally.discharge(key, namespace);
        let key: PodKey = key.into();
        self.recharge_siblings(&key, claim.extended_for.as_ref());
    }

    pub(crate) fn replace_claims(&mut self, claims: Vec<(PodKey, CachedClaim)>) {
        let listed: HashSet<&PodKey> = claims.iter().map(|(key, _)| key).collect();
        let gone: Vec<PodKey> = self
            .claims
            .keys()
            .filter(|k| !listed.contains(k))
            .cloned()
            .collect();
        for key in gone {
            self.delete_claim(&key);
        }
        for (key, claim) in claims {
            self.apply_claim(key, claim);
        }
    }

    /// A ResourceSlice's GPU devices arrived or changed: allocated claims are charged
    /// by them.
    pub fn apply_slice(&mut self, name: &str, devices: SliceDevices) {
        self.devices.apply(name, devices);
        self.recharge_allocated();
    }

    pub(crate) fn delete_slice(&mut self, name: &str) {
        self.devices.delete(name);
        self.recharge_allocated();
    }

    pub(crate) fn replace_slices(&mut self, slices: Vec<(String, SliceDevices)>) {
        self.devices.replace(slices);
        self.recharge_allocated();
    }

    /// The namespace's claims, with their keys (a range of the ordered keys, which all
    /// start with `<namespace>/`).
    pub(super) fn namespace_claims<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = (&'a PodKey, &'a CachedClaim)> + 'a {
        let prefix = format!("{namespace}/");
        let from = (Bound::Included(prefix.as_str()), Bound::Unbounded);
        self.claims
            .range::<str, _>(from)
            .take_while(move |(key, _)| key.starts_with(&prefix))
    }

    /// What a claim is charged: its allocated devices as the ResourceSlices describe
    /// them, or until it is allocated (or while a device is unknown), what it asks for,
    /// with the namespace's default model for requests that name none.
    pub(super) fn claim_charge(&self, namespace: &str, claim: &CachedClaim) -> ModelAmounts {
        if self.serves_pod(namespace, &claim.requests, claim.extended_for.as_ref()) {
            return ModelAmounts::new();
        }
        let mig = self.tally.mig();
        let devices: Option<Vec<(&GpuDevice, _)>> = claim
            .allocated
            .iter()
            .map(|(pool, device, consumed)| Some((self.devices.device(pool, device)?, consumed)))
            .collect();
        match devices {
            Some(devices) if !devices.is_empty() => {
                let mut total = ModelAmounts::new();
                for (device, consumed) in devices {
                    add_charge(&mut total, &dra::allocated_charge(device, consumed, mig));
                }
                total
            }
            _ => {
                let default = self.namespace_limits(namespace).default_type.as_deref();
                claim.asks.charge(default, mig)
            }
        }
    }

    pub(super) fn recharge_claim(&mut self, key: &PodKey) {
        let namespace = namespace_of(key);
        let claim = self.claims.get(key);
        let charge = claim.map(|c| self.claim_charge(namespace, c));
        // An allocated claim holds its devices, whichever pod uses them.
        let bound = claim.is_some_and(|c| !c.allocated.is_empty());
        self.tally.set_charge(key, namespace, charge, bound);
    }

    fn recharge_allocated(&mut self) {
        let allocated: Vec<Arc<str>> = self
            .claims
            .iter()
            .filter(|(_, c)| !c.allocated.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for key in allocated {
            self.recharge_claim(&key);
        }
    }
}
