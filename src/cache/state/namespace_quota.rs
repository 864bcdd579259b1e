//! A namespace's quota picture, read from the cache for one decision (docs/design.md,
//! "Quota"): what its quotas say about where its pods go, what a pod is charged
//! (`quota::price`), and its quotas with their usage as the ledger counts it. Pod
//! admission, placement (the extender's verbs and Volcano's), the quota queue and
//! offline charging all build one [`NamespaceQuota`] and ask it (claim admission copies
//! only the limits out of the lock: its selectors are evaluated off it).

use crate::placement::GpuRequest;
use crate::placement::mig::MigResources;
use crate::placement::models::WantedModels;
use crate::quota::eligible::{Eligibility, needs_views};
use crate::quota::{
    AdmitRules, Charge, Charged, ChargedAt, Costs, Denial, GPUQuota, ModelAmounts, NamespaceLimits,
    QuotaView, StatusError, admit,
};

use super::ClusterState;

/// Whose count of usage a quota's view holds: decided once, when the cache is made for
/// its run mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Ledger {
    /// `GPUQuota.status` (API mode): the ledger every replica charges against.
    Recorded,
    /// The pods this cache holds (offline: the file is the cluster).
    #[default]
    Counted,
}

/// One namespace's quota picture, borrowed from the cache under its lock.
#[derive(Clone, Copy)]
pub(crate) struct NamespaceQuota<'a> {
    state: &'a ClusterState,
    namespace: &'a str,
    pub(crate) limits: &'a NamespaceLimits,
}

impl ClusterState {
    /// The quota picture of `namespace`, for one decision.
    pub(crate) fn namespace_quota<'a>(&'a self, namespace: &'a str) -> NamespaceQuota<'a> {
        NamespaceQuota {
            state: self,
            namespace,
            limits: self.namespace_limits(namespace),
        }
    }

    /// Say whose usage the quotas' views count ([`Ledger`]); set once, before use.
    pub(crate) fn set_ledger(&mut self, ledger: Ledger) {
        self.ledger = ledger;
    }

    /// What `quota` reports as used (its metrics): its status in API mode, the cached
    /// pods' usage offline.
    pub(crate) fn quota_used(&self, quota: &GPUQuota) -> ModelAmounts {
        match self.ledger {
            Ledger::Recorded => {
                let status = quota.status.iter().flat_map(|s| &s.used);
                let parse = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
                    crate::placement::quantity::Milli::parse(&q.0).unwrap_or_default()
                };
                status.map(|(model, q)| (model.clone(), parse(q))).collect()
            }
            Ledger::Counted => self.quota_usage(quota),
        }
    }
}

impl<'a> NamespaceQuota<'a> {
    /// The models a pod that names `own` (its own annotation's models, possibly none)
    /// wants: the quotas' default and list applied.
    pub(crate) fn wanted(&self, own: &[String]) -> WantedModels {
        let default = self.limits.default_type.as_deref();
        WantedModels::of_own(own, default, &self.limits.models)
    }

    /// What a pod asking `request` that wants `wanted`, created in second `created`,
    /// costs on each model it may be charged to at admission ([`ChargedAt::costs`]).
    pub(crate) fn costs(&self, request: &GpuRequest, wanted: &[String], created: i64) -> Costs {
        let pending = self.state.pending(request, created, self.limits);
        ChargedAt::of(wanted).costs(request, self.state.tally.mig(), pending)
    }

    /// What such a pod was charged, for placement to respect: nothing without a quota,
    /// else [`ChargedAt::charged`].
    pub(crate) fn charged(
        &self,
        wanted: &WantedModels,
        request: &GpuRequest,
        created: i64,
    ) -> Charged {
        if !self.limits.has_quota {
            return Charged::Free;
        }
        let pending = self.state.pending(request, created, self.limits);
        ChargedAt::of(&wanted.models).charged(request, self.state.tally.mig(), pending)
    }

    /// The rules a node must pass for a pod asking `request` that wants `wanted`,
    /// created in second `created`: the quota chain (model, pool, profile caps, room),
    /// with the usage read only when some node's cost may call for it (most pods: never,
    /// the filter's hot path). Asked by the filter and bind verbs, Volcano's predicate,
    /// explain and the defragmentation planner alike. `limits`: the quota's own, or a
    /// copy when the cache changes while the rules are asked.
    pub(crate) fn eligibility<'l>(
        &self,
        limits: &'l NamespaceLimits,
        wanted: WantedModels,
        (request, created): (&GpuRequest, i64),
        mig: &'l MigResources,
    ) -> Eligibility<'l> {
        let (charged, views) = self.priced(&wanted, request, created);
        Eligibility::new(limits, wanted, charged, mig, views)
    }

    /// [`Self::eligibility`]'s inputs, owned: read under the cache's lock, asked outside
    /// it ([`PlacementPrice::eligibility`]; the defragmentation planner's searches).
    pub(crate) fn placement_price(
        &self,
        wanted: WantedModels,
        (request, created): (&GpuRequest, i64),
    ) -> PlacementPrice {
        let (charged, views) = self.priced(&wanted, request, created);
        PlacementPrice {
            limits: self.limits.clone(),
            wanted,
            charged,
            views,
        }
    }

    /// What the pod was charged, and the usage when some node's cost may call for it.
    fn priced(
        &self,
        wanted: &WantedModels,
        request: &GpuRequest,
        created: i64,
    ) -> (Charged, Option<Result<Vec<QuotaView>, StatusError>>) {
        let charged = self.charged(wanted, request, created);
        let views = needs_views(&charged).then(|| self.views());
        (charged, views)
    }

    /// Whether the quota queue's releaser has charged the (gated) pod `uid` already: its
    /// charge is in the namespace's ledger (by its id), and the watch has not shown the
    /// pod let go yet.
    pub(crate) fn being_released(&self, uid: &str) -> bool {
        let quotas = self.state.quotas();
        let mine = quotas.filter(|q| q.metadata.namespace.as_deref() == Some(self.namespace));
        let pending = mine
            .filter_map(|q| q.status.as_ref())
            .flat_map(|s| &s.pending);
        pending.into_iter().any(|p| p.releases(uid))
    }

    /// The namespace's quotas with their usage as the [`Ledger`] counts it, with their
    /// cohorts' pools.
    pub(crate) fn views(&self) -> Result<Vec<QuotaView>, StatusError> {
        match self.state.ledger {
            Ledger::Recorded => self.state.recorded_quota_views(self.namespace),
            Ledger::Counted => self.state.quota_views(self.namespace),
        }
    }

    /// Whether the quotas, with their usage now, admit a pod that wants `wanted` at
    /// `costs` ([`admit`]).
    pub(crate) fn admit(
        &self,
        wanted: &WantedModels,
        costs: &Costs,
        rules: AdmitRules,
    ) -> Result<Result<Charge, Denial>, StatusError> {
        let views = self.views()?;
        Ok(admit(self.namespace, &views, wanted, costs, rules))
    }
}

/// A pod's quota picture for placement, taken out of the cache: the rules are asked of
/// it with no lock held.
#[derive(Debug, Clone)]
pub(crate) struct PlacementPrice {
    limits: NamespaceLimits,
    wanted: WantedModels,
    charged: Charged,
    views: Option<Result<Vec<QuotaView>, StatusError>>,
}

impl PlacementPrice {
    /// The rules a node must pass, as [`NamespaceQuota::eligibility`] gives them.
    pub(crate) fn eligibility<'l>(&'l self, mig: &'l MigResources) -> Eligibility<'l> {
        let (wanted, charged) = (self.wanted.clone(), self.charged.clone());
        Eligibility::new(&self.limits, wanted, charged, mig, self.views.clone())
    }
}
