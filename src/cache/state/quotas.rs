//! Quotas and the usage they limit: what a pod is charged (and by which node label
//! while it is pending), the namespaces' usage kept current as pods, nodes and quotas
//! change (`usage`), the views admission decides on, and the recently departed pods
//! the quota reconciler still counts as seen.

use std::collections::BTreeSet;

use foldhash::HashMap;

use crate::cache::pod::{CachedPod, PodKey};
use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;
use crate::quota::StatusError;
use crate::quota::pool;
use crate::quota::{ChargedAt, ModelAmounts, QuotaView, charge_on, reported_usage};
use crate::quota::{GPUQuota, NamespaceLimits};

use super::{ClusterState, Departed, namespace_of, node_model};

impl ClusterState {
    /// The label a pod that wants only `model` is charged by before it is bound: the
    /// dearest label of that model among the nodes that existed when it was created
    /// (`quota::pending_label`; a node added later does not lower it, and placement
    /// refuses a node that costs more than this plus the namespace's room).
    fn pending_label<'a>(
        &'a self,
        request: &crate::placement::GpuRequest,
        model: &'a str,
        created: i64,
        limits: &NamespaceLimits,
    ) -> &'a str {
        let labels = self.labels_born_by(created);
        crate::quota::pending_label(request, model, labels, limits, self.tally.mig())
    }

    /// [`pending_label`](Self::pending_label) for a pod asking `request`, created at
    /// `created`, in a namespace limited by `limits`: what [`ChargedAt`] asks for.
    pub(super) fn pending<'a>(
        &'a self,
        request: &'a crate::placement::GpuRequest,
        created: i64,
        limits: &'a NamespaceLimits,
    ) -> impl FnOnce(&'a str) -> &'a str {
        move |model| self.pending_label(request, model, created, limits)
    }

    /// Bring the usage tally's charge of pod `key` up to date.
    pub(super) fn recharge(&mut self, key: &PodKey) {
        self.recharge_at(key, crate::quota::pending::now_second());
    }

    /// [`recharge`](Self::recharge) as at `now` (unix seconds).
    fn recharge_at(&mut self, key: &PodKey, now: i64) {
        let pod = self.pods.get(key);
        let model = pod.and_then(|p| self.charge_label(namespace_of(key), p));
        let pod = self.pods.get(key).map(|pod| &**pod);
        self.tally
            .recharge(key, namespace_of(key), pod, model.as_deref(), now);
        if pod.is_some_and(|pod| pod.terminating().is_some()) {
            self.deleting.insert(key.clone());
        } else {
            self.deleting.remove(key);
        }
        // A waiting pod is in the quota queue's line, with what it would be charged;
        // the charge is priced for waiting pods only (this runs for every pod change).
        match pod {
            Some(pod) if pod.gated && pod.terminating().is_none() => {
                let mig = self.tally.mig();
                let queued = model.map(|label| charge_on(&pod.request, &label, mig));
                self.waiting.set(key, pod, queued);
            }
            _ => self.waiting.remove(key),
        }
    }

    /// The node label `pod` is charged by now ([`ChargedAt::label`]).
    fn charge_label(&self, namespace: &str, pod: &CachedPod) -> Option<String> {
        let limits = self.namespace_limits(namespace);
        let wanted =
            WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
        let pending = self.pending(&pod.request, pod.created, limits);
        let label = ChargedAt::of(wanted).label(node_model(&self.nodes, pod), pending);
        label.map(str::to_string)
    }

    /// Stop charging the pods being deleted whose grace period has passed by `now`
    /// (unix seconds): no event marks that moment, so the reconciler (and offline
    /// admission) call this before they count.
    pub(crate) fn expire_deletions(&mut self, now: i64) {
        let expired: Vec<PodKey> = (self.deleting.iter())
            .filter(|key| self.tally.is_charged(key))
            .filter(|key| self.pods.get(*key).is_some_and(|p| !p.charged_at(now)))
            .cloned()
            .collect();
        for key in &expired {
            self.recharge_at(key, now);
        }
    }

    /// Recharge the pods on node `name` (its model changed, or it left).
    pub(super) fn recharge_node(&mut self, name: &str) {
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
        self.tally.set_limits(namespace, limits);
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

    // === quotas ===

    /// Insert or update a quota. The ledger's own writes land here as soon as the API
    /// server answers them, so the next admission decides on them without waiting for
    /// the watch; a watch event older than what the cache holds is then ignored.
    pub fn apply_quota(&mut self, quota: GPUQuota) {
        let key = quota_key(&quota);
        let held = self.quotas.get(&key).and_then(|h| resource_version(&h.crd));
        if held.is_some_and(|held| resource_version(&quota).is_some_and(|new| new < held)) {
            return;
        }
        let namespace = key.0.clone();
        self.quotas.insert(key, HeldQuota::from(quota));
        self.recharge_namespace(&namespace);
    }

    pub(crate) fn delete_quota(&mut self, quota: &GPUQuota) {
        let key = quota_key(quota);
        self.quotas.remove(&key);
        self.recharge_namespace(&key.0);
    }

    pub(crate) fn replace_quotas(&mut self, quotas: Vec<GPUQuota>) {
        let fresh = (quotas.into_iter())
            .map(|q| (quota_key(&q), HeldQuota::from(q)))
            .collect();
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
    /// (offline mode's ledger), with their cohorts' pools counted the same way.
    pub fn quota_views(&self, namespace: &str) -> Result<Vec<QuotaView>, StatusError> {
        self.views_of(namespace, |held| {
            let mut view = held.view.clone()?;
            let used = self.usage(&view.namespace);
            view.used = used
                .iter()
                .filter(|(m, _)| view.hard.contains_key(*m))
                .map(|(m, a)| (m.clone(), *a))
                .collect();
            Ok(view)
        })
    }

    /// The namespace's GPUQuotas with `used` as their status records it (API mode's
    /// ledger, which every replica charges against), with their cohorts' pools.
    pub(super) fn recorded_quota_views(
        &self,
        namespace: &str,
    ) -> Result<Vec<QuotaView>, StatusError> {
        self.views_of(namespace, |held| held.recorded.clone())
    }

    /// The views `view` makes of the namespace's quotas, with the pools of their
    /// cohorts attached (made of every member's view).
    fn views_of(
        &self,
        namespace: &str,
        view: impl Fn(&HeldQuota) -> Result<QuotaView, StatusError>,
    ) -> Result<Vec<QuotaView>, StatusError> {
        let mut views: Vec<QuotaView> = self
            .held_quotas(namespace)
            .map(&view)
            .collect::<Result<_, _>>()?;
        let cohorts = pool::cohorts_of(&views);
        if !cohorts.is_empty() {
            let members = (self.quotas.values()).filter(|h| in_cohorts(&h.crd, &cohorts));
            let members: Vec<QuotaView> = members.map(&view).collect::<Result<_, _>>()?;
            pool::attach_pools(&mut views, &members);
        }
        Ok(views)
    }

    /// The pods of `namespace` charged to `key` (admitted or let go; those being deleted
    /// while their grace period runs, as the usage counts them), with their priority,
    /// creation second and charge of it: the pods reclaim chooses among.
    pub(crate) fn charged_pods(
        &self,
        namespace: &str,
        key: &str,
    ) -> Vec<(PodKey, i32, i64, Milli)> {
        let now = crate::quota::pending::now_second();
        let keys = self.by_namespace.get(namespace).into_iter().flatten();
        keys.filter_map(|pod_key| {
            let pod = self.pods.get(pod_key)?;
            if !pod.charged_at(now) {
                return None;
            }
            let amount = *self.admitted_charge(namespace, pod)?.get(key)?;
            Some((pod_key.clone(), pod.priority, pod.created, amount))
        })
        .collect()
    }

    /// Every GPUQuota, in any namespace, of one of `cohorts`.
    pub(crate) fn cohort_quotas<'a>(
        &'a self,
        cohorts: &'a BTreeSet<String>,
    ) -> impl Iterator<Item = &'a GPUQuota> {
        self.quotas().filter(|q| in_cohorts(q, cohorts))
    }

    /// The part of its namespace's usage `quota` reports in its status and metrics
    /// (see [`reported_usage`]).
    pub(crate) fn quota_usage(&self, quota: &GPUQuota) -> ModelAmounts {
        let namespace = quota.metadata.namespace.as_deref().unwrap_or_default();
        let listed = &self.namespace_limits(namespace).models;
        let lists = |model: &str| quota.spec.hard.contains_key(model);
        reported_usage(&self.usage(namespace), lists, listed)
    }

    /// GPU-seconds that bound pods held, per namespace and model, up to `now`
    /// (`gpu_admission_gpu_seconds_total`).
    pub(crate) fn gpu_seconds(
        &self,
        now: std::time::Instant,
    ) -> impl Iterator<Item = (&str, &str, f64)> {
        self.tally.gpu_seconds(now)
    }

    /// GPUs per model that the namespace's live pods are charged (kept up to date as
    /// pods, nodes and quotas change: one entry per model, not a walk over the pods).
    pub fn usage(&self, namespace: &str) -> ModelAmounts {
        self.tally.usage(namespace)
    }

    /// What pod (or claim) `key` adds to its namespace's usage now, per quota key: the
    /// ledger's charge, which its end gives back.
    pub(crate) fn charge_of(&self, key: &str) -> impl Iterator<Item = (&str, Milli)> {
        self.tally.charge(key)
    }

    /// What a pod was surely charged at admission or binding, per quota key
    /// ([`ChargedAt::in_ledger`]); nothing for a pod still waiting in the quota queue.
    fn admitted_charge(&self, namespace: &str, pod: &CachedPod) -> Option<ModelAmounts> {
        let limits = self.namespace_limits(namespace);
        let wanted =
            WantedModels::resolve(&pod.models, limits.default_type.as_ref(), &limits.models);
        if pod.created == 0 || pod.gated {
            return None;
        }
        let node = node_model(&self.nodes, pod);
        let pending = self.pending(&pod.request, pod.created, limits);
        let mig = self.tally.mig();
        ChargedAt::of(wanted).in_ledger(&pod.request, node, pod.bound, mig, pending)
    }

    /// How MIG slices are charged (`resources.mig`); set once, before any pod arrives.
    pub(crate) fn set_mig(&mut self, mig: crate::placement::MigResources) {
        self.tally.set_mig(mig);
    }

    /// What the pods seen created in each recent second account for, per (second,
    /// model): the namespace's live pods created at or after `since` (unix seconds) and
    /// those that have left since. The quota reconciler settles pending charges with it.
    pub(crate) fn seen_charges(
        &self,
        namespace: &str,
        since: i64,
    ) -> HashMap<(i64, String), Milli> {
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
            for (key, amount) in self.admitted_charge(namespace, pod).into_iter().flatten() {
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
    pub(super) fn remember_departure(&mut self, namespace: &str, key: &str) {
        let created = self.pods.get(key).map_or(0, |p| p.created);
        self.remember_departed(namespace, created, |state| {
            state.admitted_charge(namespace, state.pods.get(key)?)
        });
    }

    /// Keep `charge` (what a leaving pod or claim created at `created` was counted with)
    /// while its pending total may still be settled; forget the older ones.
    pub(super) fn remember_departed(
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

/// Whether `quota` is a member of one of `cohorts`.
fn in_cohorts(quota: &GPUQuota, cohorts: &BTreeSet<String>) -> bool {
    let cohort = quota.spec.cohort.as_ref();
    cohort.is_some_and(|c| cohorts.contains(c))
}

/// A GPUQuota as the cache holds it, with the views admission decides on parsed once,
/// when the quota arrives: admission reads them on every create, and the quota (its
/// status in API mode) changes far less often.
#[derive(Debug)]
pub(super) struct HeldQuota {
    pub(super) crd: GPUQuota,
    /// `used` empty: offline, counted from the pods when a view is asked for.
    view: Result<QuotaView, StatusError>,
    /// `used` as the status records it (API mode).
    recorded: Result<QuotaView, StatusError>,
}

impl From<GPUQuota> for HeldQuota {
    fn from(crd: GPUQuota) -> Self {
        let view = QuotaView::from_crd(&crd);
        let recorded =
            (view.clone()).and_then(|view| crate::quota::status::with_recorded_use(view, &crd));
        HeldQuota {
            crd,
            view,
            recorded,
        }
    }
}
