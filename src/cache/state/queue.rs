//! The pods waiting in the quota queue (`onExceed: Queue`, docs/quota.md), by namespace,
//! as the releaser and the status read them: who waits, and what each would cost.

use std::collections::{BTreeMap, BTreeSet};

use crate::placement::models::WantedModels;
use crate::quota::queue::Waiting;
use crate::quota::{ModelAmounts, add_charge};

use super::super::pod::PodKey;
use super::{ClusterState, namespace_of};

/// The keys of the gated pods, by namespace (kept by `put_pod` and `delete_pod`).
#[derive(Debug, Default)]
pub(super) struct WaitingIndex(BTreeMap<Box<str>, BTreeSet<PodKey>>);

impl WaitingIndex {
    /// Record whether pod `key` waits.
    pub(super) fn set(&mut self, key: &PodKey, waits: bool) {
        if waits {
            let keys = self.0.entry(namespace_of(key).into()).or_default();
            keys.insert(key.clone());
        } else {
            self.remove(key);
        }
    }

    pub(super) fn remove(&mut self, key: &str) {
        let namespace = namespace_of(key);
        if let Some(keys) = self.0.get_mut(namespace) {
            keys.remove(key);
            if keys.is_empty() {
                self.0.remove(namespace);
            }
        }
    }
}

impl ClusterState {
    /// The namespaces where pods wait in the quota queue.
    pub fn waiting_namespaces(&self) -> Vec<String> {
        self.waiting.0.keys().map(|n| n.to_string()).collect()
    }

    /// How many pods wait in the quota queue, in every namespace.
    pub fn waiting_count(&self) -> usize {
        self.waiting.0.values().map(BTreeSet::len).sum()
    }

    /// The pods waiting in `namespace`, each with what it would be charged if let go in
    /// second `now` (the second its charge is then made in), in no particular order.
    pub fn waiting(&self, namespace: &str, now: i64) -> Vec<Waiting> {
        let keys = self.waiting.0.get(namespace).into_iter().flatten();
        let limits = self.namespace_limits(namespace);
        let pods = keys.filter_map(|key| Some((key, self.pod(key)?)));
        pods.map(|(key, pod)| {
            let default = limits.default_type.as_deref();
            let wanted = WantedModels::of_own(&pod.models, default, &limits.models);
            let costs = self.admission_costs(&pod.request, &wanted.models, now, limits);
            Waiting {
                key: key.to_string(),
                uid: pod.uid.to_string(),
                priority: pod.priority,
                created: pod.created,
                wanted,
                costs,
            }
        })
        .collect()
    }

    /// GPUs per quota key the pods waiting in `namespace` would be charged now: what
    /// `status.queued` reports. A pod that accepts several models counts on the first.
    pub fn queued_usage(&self, namespace: &str, now: i64) -> ModelAmounts {
        let mut total = ModelAmounts::new();
        for pod in self.waiting(namespace, now) {
            if let Some(model) = pod.wanted.models.first() {
                add_charge(&mut total, &pod.costs.on(model));
            }
        }
        total
    }

    /// How many pods wait in `namespace`, by the (first) model each wants.
    pub fn queued_pods(&self, namespace: &str) -> BTreeMap<String, u32> {
        let mut pods = BTreeMap::new();
        let keys = self.waiting.0.get(namespace).into_iter().flatten();
        let limits = self.namespace_limits(namespace);
        for pod in keys.filter_map(|key| self.pod(key)) {
            let default = limits.default_type.as_ref();
            let wanted = WantedModels::resolve(&pod.models, default, &limits.models);
            if let Some(model) = wanted.first() {
                *pods.entry(model.clone()).or_default() += 1;
            }
        }
        pods
    }
}
