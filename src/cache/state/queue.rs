//! The pods waiting in the quota queue (`onExceed: Queue`, docs/quota.md), by namespace,
//! kept in line order as they come and go, with what they would be charged in total: the
//! releaser reads the head of a line (never the whole of a long one, under the lock) and
//! the status and metrics read the totals.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use foldhash::HashMap;

use crate::placement::TaskMix;
use crate::placement::free::{FreeByCause, free_by_cause};
use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;
use crate::quota::ModelAmounts;
use crate::quota::queue::{LinePlace, Waiting};

use super::super::pod::{CachedPod, PodKey};
use super::{ClusterState, namespace_of};

/// A waiting pod's place: what orders it, and what it adds to its line's `totals`
/// (milli-GPUs per quota key, the keys shared with `totals`').
#[derive(Debug)]
struct Place {
    priority: i32,
    created: i64,
    charge: Box<[(Arc<str>, u64)]>,
}

/// One namespace's line.
#[derive(Debug, Default)]
struct Line {
    pods: HashMap<PodKey, Place>,
    /// Every pod as if none were overdue, in line order ([`LinePlace::OnTime`]).
    by_priority: BTreeSet<LinePlace<PodKey>>,
    /// Every pod as if all were overdue, in line order ([`LinePlace::Overdue`]): those
    /// that are overdue are a prefix of it.
    by_age: BTreeSet<LinePlace<PodKey>>,
    /// GPUs per quota key the waiting pods would be charged, and how many pods.
    totals: BTreeMap<Arc<str>, (u128, usize)>,
}

/// The waiting pods of every namespace (kept by `put_pod`, `recharge` and `delete_pod`).
#[derive(Debug, Default)]
pub(super) struct WaitingIndex(BTreeMap<Box<str>, Line>);

impl WaitingIndex {
    /// Record waiting pod `key` as it is now, with what it would be charged.
    pub(super) fn set(&mut self, key: &PodKey, pod: &CachedPod, charge: Option<ModelAmounts>) {
        self.remove(key);
        let line = self.0.entry(namespace_of(key).into()).or_default();
        let mut shares = Vec::new();
        for (model, amount) in charge.unwrap_or_default() {
            let model: Arc<str> = match line.totals.get_key_value(model.as_str()) {
                Some((shared, _)) => shared.clone(),
                None => Arc::from(model),
            };
            let total = line.totals.entry(model.clone()).or_default();
            total.0 += u128::from(amount.0);
            total.1 += 1;
            shares.push((model, amount.0));
        }
        let (priority, created) = (pod.priority, pod.created);
        let place = |overdue| LinePlace::of(priority, created, key.clone(), overdue);
        line.by_priority.insert(place(false));
        line.by_age.insert(place(true));
        let charge = shares.into_boxed_slice();
        let place = Place {
            priority,
            created,
            charge,
        };
        line.pods.insert(key.clone(), place);
    }

    pub(super) fn remove(&mut self, key: &str) {
        let namespace = namespace_of(key);
        let Some(line) = self.0.get_mut(namespace) else {
            return;
        };
        let Some((key, place)) = line.pods.remove_entry(key) else {
            return;
        };
        let (priority, created) = (place.priority, place.created);
        line.by_priority
            .remove(&LinePlace::of(priority, created, key.clone(), false));
        line.by_age
            .remove(&LinePlace::of(priority, created, key, true));
        for (model, amount) in place.charge {
            if let Some(total) = line.totals.get_mut(&model) {
                total.0 = total.0.saturating_sub(u128::from(amount));
                total.1 = total.1.saturating_sub(1);
                if total.1 == 0 {
                    line.totals.remove(&model);
                }
            }
        }
        if line.pods.is_empty() {
            self.0.remove(namespace);
        }
    }

    /// The first `limit` keys of `namespace`'s line: overdue pods (created at or
    /// before `overdue_by`) oldest first, then the rest by priority and age.
    fn head(&self, namespace: &str, overdue_by: i64, limit: usize) -> Vec<PodKey> {
        let Some(line) = self.0.get(namespace) else {
            return Vec::new();
        };
        let overdue = (line.by_age.iter()).take_while(|place| place.created() <= overdue_by);
        let rest = (line.by_priority.iter()).filter(|place| place.created() > overdue_by);
        let keys = overdue.chain(rest).map(LinePlace::key);
        keys.take(limit).cloned().collect()
    }
}

impl ClusterState {
    /// The namespaces where pods wait in the quota queue.
    pub(crate) fn waiting_namespaces(&self) -> Vec<String> {
        self.waiting.0.keys().map(|n| n.to_string()).collect()
    }

    /// How many pods wait in the quota queue, in every namespace.
    pub fn waiting_count(&self) -> usize {
        self.waiting.0.values().map(|line| line.pods.len()).sum()
    }

    /// The head of `namespace`'s line, at most `limit` pods in line order for second
    /// `now` (a pod created `max_pass_over` seconds before is overdue: see
    /// `quota::queue`), each with what it would be charged if let go in second `now`.
    pub fn waiting_line(
        &self,
        namespace: &str,
        now: i64,
        max_pass_over: i64,
        limit: usize,
    ) -> Vec<Waiting> {
        let keys = self
            .waiting
            .head(namespace, now.saturating_sub(max_pass_over), limit);
        let quota = self.namespace_quota(namespace);
        let pods = keys.iter().filter_map(|key| Some((key, self.pod(key)?)));
        pods.map(|(key, pod)| {
            let wanted = quota.wanted(&pod.models);
            let costs = quota.costs(&pod.request, &wanted.models, now);
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

    /// GPUs per quota key the pods waiting in `namespace` would be charged (by the node
    /// label each is charged by while it waits): what `status.queued` reports. A pod that
    /// accepts several models counts on none.
    pub(crate) fn queued_usage(&self, namespace: &str) -> ModelAmounts {
        let line = self.waiting.0.get(namespace);
        let totals = line.into_iter().flat_map(|line| &line.totals);
        totals
            .map(|(key, (milli, _))| {
                let milli = u64::try_from(*milli).unwrap_or(u64::MAX);
                (key.to_string(), Milli(milli))
            })
            .collect()
    }

    /// How many pods wait in `namespace`, by the quota key each would be charged to.
    /// Free GPUs by cause ([`free_by_cause`]): usable capacity on nodes of a model some
    /// pod in the quota queue would be charged for is quota-blocked.
    pub(crate) fn free_gpus(&self, mix: &TaskMix) -> FreeByCause {
        let lines = self.waiting.0.values();
        let keys = lines.flat_map(|line| line.totals.iter().filter(|(_, (_, pods))| *pods > 0));
        let keys: BTreeSet<&str> = keys.map(|(key, _)| &**key).collect();
        let wanted: Vec<WantedModels> = keys.into_iter().map(WantedModels::one).collect();
        free_by_cause(self.nodes(), mix, |node| {
            wanted.iter().any(|w| w.admits(node).is_ok())
        })
    }

    pub(crate) fn queued_pods(&self, namespace: &str) -> BTreeMap<String, usize> {
        let line = self.waiting.0.get(namespace);
        let totals = line.into_iter().flat_map(|line| &line.totals);
        totals
            .map(|(key, (_, pods))| (key.to_string(), *pods))
            .collect()
    }
}
