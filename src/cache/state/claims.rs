//! ResourceClaims and the GPU devices of ResourceSlices in the cluster state: what each
//! claim holds is charged to its namespace alongside its pods (docs/devices.md). A
//! claim is charged once however many pods share it: pods are charged for their
//! containers' GPU resources only.

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::Arc;

use crate::dra::slices::{GpuDevice, SliceDevices};
use crate::dra::{self, ClaimAsks, Dra, ResourceClaim};
use crate::quota::ledger::{ModelAmounts, add_charge, charge_on};

use super::super::pod::PodKey;
use super::{ClusterState, namespace_of};

/// A claim as quota sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedClaim {
    /// `creationTimestamp`, unix seconds (the ledger's pending total it joined).
    pub created: i64,
    pub asks: ClaimAsks,
    /// The GPU driver's devices allocated to it: (pool, device).
    pub allocated: Vec<(String, String)>,
}

impl CachedClaim {
    /// `None` for a claim that asks for no GPU and holds none.
    pub fn from_claim(claim: &ResourceClaim, dra: &Dra) -> Option<Self> {
        let asks = ClaimAsks::of(claim, dra);
        let allocated: Vec<(String, String)> = claim
            .allocated()
            .iter()
            .filter(|d| d.driver == dra.driver)
            .map(|d| (d.pool.clone(), d.device.clone()))
            .collect();
        if asks.is_empty() && allocated.is_empty() {
            return None;
        }
        let created = claim.metadata.creation_timestamp.as_ref();
        Some(CachedClaim {
            created: created.map_or(0, |t| t.0.as_second()),
            asks,
            allocated,
        })
    }
}

/// The key of a claim among the namespace's charged objects (pod names have no `/`).
pub fn claim_key(namespace: &str, name: &str) -> PodKey {
    format!("{namespace}/resourceclaims/{name}").into()
}

impl ClusterState {
    pub fn apply_claim(&mut self, key: PodKey, claim: CachedClaim) {
        self.claims.insert(key.clone(), claim);
        self.recharge_claim(&key);
    }

    pub fn delete_claim(&mut self, key: &str) {
        let namespace = namespace_of(key);
        let Some(claim) = self.claims.remove(key) else {
            return;
        };
        self.remember_departed(namespace, claim.created, |state| {
            Some(state.claim_charge(namespace, &claim))
        });
        self.ledger.discharge(key, namespace);
    }

    pub fn replace_claims(&mut self, claims: Vec<(PodKey, CachedClaim)>) {
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

    pub fn delete_slice(&mut self, name: &str) {
        self.devices.delete(name);
        self.recharge_allocated();
    }

    pub fn replace_slices(&mut self, slices: Vec<(String, SliceDevices)>) {
        self.devices.replace(slices);
        self.recharge_allocated();
    }

    /// The model attribute values the cluster's devices publish for a model label.
    pub fn products_of(&self, label: &str) -> Vec<String> {
        self.devices.products_of(label)
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
        let mig = self.ledger.mig();
        let devices: Option<Vec<&GpuDevice>> = claim
            .allocated
            .iter()
            .map(|(pool, device)| self.devices.device(pool, device))
            .collect();
        match devices {
            Some(devices) if !devices.is_empty() => {
                let mut total = ModelAmounts::new();
                for device in devices {
                    let one = dra::devices(device.profile.as_deref(), 1);
                    add_charge(&mut total, &charge_on(&one, &device.label, mig));
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
        let charge = self
            .claims
            .get(key)
            .map(|c| self.claim_charge(namespace, c));
        self.ledger.set_charge(key, namespace, charge);
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
