//! One GPUQuota as arithmetic sees it (docs/design.md, "Quota"), pure: its `hard`, the
//! use counted against it, its cohort's terms and pools, and whether it has room for a
//! charge.

use crate::placement::mig;
use crate::placement::quantity::Milli;

use super::charge::ModelAmounts;
use super::cohort::{self, CohortTerms, Pool};
use super::denial::Exceeded;
use super::{GPUQuota, OnExceed, StatusError, quota_name};

/// One GPUQuota as arithmetic sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaView {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) hard: ModelAmounts,
    pub(crate) used: ModelAmounts,
    /// A `Warn` quota never refuses: a charge past its `hard` is admitted and reported
    /// ([`over_warn_quotas`](super::admit::over_warn_quotas)).
    pub(crate) on_exceed: OnExceed,
    /// Its cohort's terms, when it lends and borrows (`None`: `hard` is a wall).
    pub(crate) cohort: Option<CohortTerms>,
}

impl QuotaView {
    /// `used` is left empty: usage is counted by the caller, from pods and reservations.
    pub(crate) fn from_crd(quota: &GPUQuota) -> Result<Self, StatusError> {
        let mut hard = ModelAmounts::new();
        for (model, quantity) in &quota.spec.hard {
            let amount = Milli::parse(&quantity.0).map_err(|e| StatusError {
                quota: quota_name(quota),
                reason: format!("spec.hard.{model}: {e}"),
            })?;
            hard.insert(model.clone(), amount);
        }
        Ok(QuotaView {
            namespace: quota.metadata.namespace.clone().unwrap_or_default(),
            name: quota.metadata.name.clone().unwrap_or_default(),
            hard,
            used: ModelAmounts::new(),
            on_exceed: quota.spec.on_exceed,
            cohort: CohortTerms::from_crd(quota)?,
        })
    }

    /// Whether this quota refuses what it has no room for.
    pub(crate) fn enforces(&self) -> bool {
        self.on_exceed != OnExceed::Warn
    }

    pub(super) fn room_for(&self, model: &str, amount: Milli) -> Result<(), Exceeded> {
        let hard = self.hard.get(model).copied().unwrap_or_default();
        let used = self.used.get(model).copied().unwrap_or_default();
        let exceeded = |cohort| Exceeded {
            model: model.to_string(),
            requested: amount,
            used,
            hard,
            quota: format!("{}/{}", self.namespace, self.name),
            listed: true,
            cohort,
        };
        match self.cohort.as_ref().filter(|_| !mig::is_profile_key(model)) {
            Some(terms) => {
                let share = terms.share(model, hard, used);
                let pool = terms
                    .pools
                    .get(model)
                    .copied()
                    .unwrap_or(Pool::of([&share]));
                cohort::fits(&share, &pool, amount, terms.reclaim)
                    .map(drop)
                    .map_err(|short| exceeded(Some(Box::new((terms.name.clone(), short)))))
            }
            None if used.0.saturating_add(amount.0) <= hard.0 => Ok(()),
            None => Err(exceeded(None)),
        }
    }
}

/// Counting use in quota views: a member's use past its guaranteed part is drawn from
/// its cohort's pool as it is counted.
impl QuotaView {
    /// The quota as if nothing used it, nor anything of its cohort's pools: what could
    /// ever be admitted.
    pub(crate) fn forget_use(&mut self) {
        self.used.clear();
        let pools = self.cohort.iter_mut().flat_map(|t| t.pools.values_mut());
        pools.for_each(|pool| pool.drawn = 0);
    }

    /// Count `amount` more of `key` as used (and drawn from its cohort's pool).
    fn add_used(&mut self, key: &str, amount: Milli) {
        let hard = self.hard.get(key).copied().unwrap_or_default();
        let used = self.used.entry(key.to_string()).or_default();
        if let Some(terms) = self.cohort.as_mut() {
            let before = terms.share(key, hard, *used);
            let after = terms.share(key, hard, Milli(used.0.saturating_add(amount.0)));
            if let Some(pool) = terms.pools.get_mut(key) {
                pool.drawn += u128::from(after.drawn().0 - before.drawn().0);
            }
        }
        used.0 = used.0.saturating_add(amount.0);
    }
}

/// Count `charge` (per quota key) as used in every view that lists its key, so the
/// next decision on these views sees it (a batch of admissions, the queue's plan).
pub(crate) fn count_charge(views: &mut [QuotaView], charge: &ModelAmounts) {
    for view in views.iter_mut() {
        for (key, amount) in charge {
            if view.hard.contains_key(key) {
                view.add_used(key, *amount);
            }
        }
    }
}
