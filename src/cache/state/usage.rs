//! Per-namespace GPU usage kept up to date as pods, nodes and quotas change, so that
//! reading a namespace's usage (offline mode's quota usage, read by every `/validate`; the
//! reconciler's recount) costs one entry per model instead of a walk over the
//! namespace's pods (docs/design.md, "The ledger").
//!
//! What a pod is charged depends on the pod (its models, request, node, whether its
//! deletion's grace period has passed), on its namespace's quotas (default model, listed models) and on its
//! node's model; `ClusterState` calls [`Tally::recharge`] for every pod whose inputs
//! change, and the tally keeps what it added for each pod, so it subtracts exactly
//! that when the pod changes or leaves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use foldhash::HashMap;

use crate::placement::MigResources;
use crate::placement::quantity::Milli;
use crate::quota::NamespaceLimits;
use crate::quota::{ModelAmounts, charge_on};

use super::super::pod::{CachedPod, PodKey};
use super::showback::Showback;

/// What one pod adds to its namespace's usage, per quota key (a model, and a MIG
/// profile's key for slices), and whether it holds that on a node now (bound; a claim:
/// allocated), which the showback meters count. The keys are those of the namespace's
/// totals (shared, not copied).
#[derive(Debug)]
struct Charge {
    amounts: Vec<(Arc<str>, Milli)>,
    bound: bool,
}

/// One model's total in a namespace: exact (no saturation while adding and
/// subtracting), and the number of pods in it, so the entry leaves with its last pod as
/// a recount would not list it.
#[derive(Debug, Default)]
struct Total {
    milli: u128,
    pods: usize,
}

#[derive(Debug, Default)]
pub(super) struct Tally {
    /// The limits of every namespace that has a GPUQuota (others have none).
    limits: HashMap<Box<str>, NamespaceLimits>,
    /// What each charged pod adds, by pod key.
    charged: HashMap<PodKey, Charge>,
    /// How MIG slices are charged.
    mig: MigResources,
    /// Totals per namespace and model.
    totals: HashMap<Box<str>, BTreeMap<Arc<str>, Total>>,
    /// GPU-seconds of bound pods per namespace and model.
    showback: Showback,
}

static NO_LIMITS: NamespaceLimits = NamespaceLimits {
    has_quota: false,
    default_type: None,
    models: Vec::new(),
    profile_caps: Vec::new(),
    pools: Vec::new(),
    queued_models: Vec::new(),
};

impl Tally {
    /// The namespace's limits, as [`NamespaceLimits::of`] its quotas.
    pub(super) fn limits(&self, namespace: &str) -> &NamespaceLimits {
        self.limits.get(namespace).unwrap_or(&NO_LIMITS)
    }

    /// Replace the namespace's limits (after its quotas changed); the caller then
    /// recharges the namespace's pods.
    pub(super) fn set_limits(&mut self, namespace: &str, limits: NamespaceLimits) {
        if limits == NO_LIMITS {
            self.limits.remove(namespace);
        } else {
            self.limits.insert(namespace.into(), limits);
        }
    }

    /// GPUs per model that the namespace's live pods are charged.
    pub(super) fn usage(&self, namespace: &str) -> ModelAmounts {
        let totals = self.totals.get(namespace).into_iter().flatten();
        totals
            .map(|(model, total)| {
                let milli = u64::try_from(total.milli).unwrap_or(u64::MAX);
                (model.to_string(), Milli(milli))
            })
            .collect()
    }

    /// How MIG slices are charged (the configuration's slice table).
    pub(super) fn set_mig(&mut self, mig: MigResources) {
        self.mig = mig;
    }

    pub(super) fn mig(&self) -> &MigResources {
        &self.mig
    }

    /// Charge `key` (a pod of `namespace`) for what it is at `now` (unix seconds): `pod`
    /// is `None` once it is gone, `label` the node label it is charged by
    /// (`ChargedAt::label`; `None`: not charged yet).
    pub(super) fn recharge(
        &mut self,
        key: &PodKey,
        namespace: &str,
        pod: Option<&CachedPod>,
        label: Option<&str>,
        now: i64,
    ) {
        // A pod waiting in the quota queue is charged when it is let go, not before.
        let charged = pod.filter(|pod| pod.charged_at(now) && !pod.gated);
        let bound = charged.is_some_and(|pod| pod.bound && pod.node.is_some());
        let now = charged.and_then(|pod| Some(charge_on(&pod.request, label?, &self.mig)));
        self.set_charge(key, namespace, now, bound);
    }

    /// Make `key` (a pod or claim of `namespace`) add `now` to the namespace's totals
    /// (`None`: nothing); `bound`: it holds that on a node now.
    pub(super) fn set_charge(
        &mut self,
        key: &PodKey,
        namespace: &str,
        now: Option<ModelAmounts>,
        bound: bool,
    ) {
        let unchanged = self.charged.get(&**key).is_some_and(|before| {
            let amounts = before.amounts.iter().map(|(key, amount)| (&**key, amount));
            now.as_ref().is_some_and(|now| {
                before.bound == bound && amounts.eq(now.iter().map(|(k, a)| (k.as_str(), a)))
            })
        });
        if unchanged {
            return;
        }
        self.discharge(key, namespace);
        let Some(now) = now.filter(|now| !now.is_empty()) else {
            return;
        };
        let totals = self.totals.entry(namespace.into()).or_default();
        let mut charge = Vec::with_capacity(now.len());
        for (model, amount) in now {
            let model: Arc<str> = match totals.get_key_value(model.as_str()) {
                Some((shared, _)) => shared.clone(),
                None => Arc::from(model),
            };
            let total = totals.entry(model.clone()).or_default();
            total.milli += u128::from(amount.0);
            total.pods += 1;
            charge.push((model, amount));
        }
        if bound {
            let held = charge.iter().map(|(model, amount)| (&**model, *amount));
            self.showback.moved(namespace, held, true, Instant::now());
        }
        let charge = Charge {
            amounts: charge,
            bound,
        };
        self.charged.insert(key.clone(), charge);
    }

    /// What the showback meters say `namespace`'s bound pods hold now, per model.
    #[cfg(test)]
    pub(super) fn held(&self, namespace: &str) -> BTreeMap<String, u128> {
        self.showback.held(namespace)
    }

    /// GPU-seconds that bound pods held, per namespace and model, up to `now`.
    pub(super) fn gpu_seconds(&self, now: Instant) -> impl Iterator<Item = (&str, &str, f64)> {
        self.showback.gpu_seconds(now)
    }

    /// What `key` adds to its namespace's totals, per quota key (nothing when it adds
    /// nothing).
    pub(super) fn charge(&self, key: &str) -> impl Iterator<Item = (&str, Milli)> {
        let amounts = self.charged.get(key).map(|c| c.amounts.as_slice());
        let amounts = amounts.unwrap_or_default().iter();
        amounts.map(|(model, amount)| (&**model, *amount))
    }

    /// Whether `key` adds anything to its namespace's totals.
    pub(super) fn is_charged(&self, key: &str) -> bool {
        self.charged.contains_key(key)
    }

    /// Take back what `key` (a pod of `namespace`) was charged, if anything.
    pub(super) fn discharge(&mut self, key: &str, namespace: &str) {
        let Some(before) = self.charged.remove(key) else {
            return;
        };
        if before.bound {
            let held = before
                .amounts
                .iter()
                .map(|(model, amount)| (&**model, *amount));
            self.showback.moved(namespace, held, false, Instant::now());
        }
        let Some(models) = self.totals.get_mut(namespace) else {
            return;
        };
        for (model, amount) in &before.amounts {
            if let Some(total) = models.get_mut(model) {
                total.milli = total.milli.saturating_sub(u128::from(amount.0));
                total.pods = total.pods.saturating_sub(1);
                if total.pods == 0 {
                    models.remove(model);
                }
            }
        }
        if models.is_empty() {
            self.totals.remove(namespace);
        }
    }
}
