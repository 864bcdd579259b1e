//! Per-namespace GPU usage kept up to date as pods, nodes and quotas change, so that
//! reading a namespace's usage (offline mode's ledger, read by every `/validate`; the
//! reconciler's recount) costs one entry per model instead of a walk over the
//! namespace's pods (docs/design.md, "The ledger").
//!
//! What a pod is charged depends on the pod (its models, request, node, whether it is
//! terminating), on its namespace's quotas (default model, listed models) and on its
//! node's model; `ClusterState` calls [`Ledger::recharge`] for every pod whose inputs
//! change, and the ledger keeps what it added for each pod, so it subtracts exactly
//! that when the pod changes or leaves.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;

use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;
use crate::quota::NamespaceLimits;
use crate::quota::ledger::{ModelAmounts, amount_of, charged_model};

use super::super::pod::{CachedPod, PodKey};

/// What one pod adds to its namespace's usage.
#[derive(Debug)]
struct Charge {
    /// The key of the model's entry in the namespace's totals (shared, not copied).
    model: Arc<str>,
    amount: Milli,
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
pub(super) struct Ledger {
    /// The limits of every namespace that has a GPUQuota (others have none).
    limits: HashMap<Box<str>, NamespaceLimits>,
    /// What each charged pod adds, by pod key.
    charged: HashMap<PodKey, Charge>,
    /// Totals per namespace and model.
    totals: HashMap<Box<str>, BTreeMap<Arc<str>, Total>>,
}

static NO_LIMITS: NamespaceLimits = NamespaceLimits {
    has_quota: false,
    default_type: None,
    models: Vec::new(),
    pools: Vec::new(),
};

impl Ledger {
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

    /// Charge `key` (a pod of `namespace`) for what it is now: `pod` is `None` once it
    /// is gone, `node_model` the model of the node it is on, if known.
    pub(super) fn recharge(
        &mut self,
        key: &PodKey,
        namespace: &str,
        pod: Option<&CachedPod>,
        node_model: Option<&str>,
    ) {
        let limits = self.limits.get(namespace).unwrap_or(&NO_LIMITS);
        let now = pod.filter(|pod| !pod.terminating).and_then(|pod| {
            let wanted =
                WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
            charged_model(wanted, node_model).map(|model| (model, amount_of(&pod.request)))
        });
        let unchanged = self.charged.get(&**key).is_some_and(|before| {
            now.is_some_and(|(model, amount)| *before.model == *model && before.amount == amount)
        });
        if unchanged {
            return;
        }
        let Some((model, amount)) = now else {
            return self.discharge(key, namespace);
        };
        let model: Arc<str> = match self
            .totals
            .get(namespace)
            .and_then(|m| m.get_key_value(model))
        {
            Some((shared, _)) => shared.clone(),
            None => Arc::from(model),
        };
        self.discharge(key, namespace);
        let total = self
            .totals
            .entry(namespace.into())
            .or_default()
            .entry(model.clone())
            .or_default();
        total.milli += u128::from(amount.0);
        total.pods += 1;
        self.charged.insert(key.clone(), Charge { model, amount });
    }

    /// Take back what `key` (a pod of `namespace`) was charged, if anything.
    pub(super) fn discharge(&mut self, key: &str, namespace: &str) {
        let Some(before) = self.charged.remove(key) else {
            return;
        };
        let Some(models) = self.totals.get_mut(namespace) else {
            return;
        };
        if let Some(total) = models.get_mut(&before.model) {
            total.milli = total.milli.saturating_sub(u128::from(before.amount.0));
            total.pods = total.pods.saturating_sub(1);
            if total.pods == 0 {
                models.remove(&before.model);
            }
        }
        if models.is_empty() {
            self.totals.remove(namespace);
        }
    }
}
