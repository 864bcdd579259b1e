//! Whether a namespace's quota lets a pod use a node: one chain of rules — model, pool,
//! MIG profile caps, quota room — asked by the filter verb, the bind verb and Volcano's
//! predicate alike (each then fits the pod's GPUs on the node). Written once so that
//! the three cannot drift apart (a Volcano predicate that skipped the profile cap did).
//! Pure: the caller reads the usage (`Views`) from wherever the run mode keeps it.

use std::cell::RefCell;
use std::sync::Arc;

use crate::placement::mig::{self, MigResources};
use crate::placement::models::{WantedModels, pool_admits};
use crate::placement::{GpuRequest, Misfit, NodeGpus};

use super::NamespaceLimits;
use super::StatusError;
use super::price::Charged;
use super::{ModelAmounts, QuotaView, charge_on, excess, room};

/// The namespace's quotas with their usage, when placement read them.
type Views = Result<Vec<QuotaView>, StatusError>;

/// The rules a node must pass for one pod of a namespace.
pub(crate) struct Eligibility<'a> {
    limits: &'a NamespaceLimits,
    wanted: WantedModels,
    quota: PlacementQuota<'a>,
    /// The answer for each (model label, pool) asked about: every rule reads only
    /// these of the node, and thousands of candidates share a handful of them.
    by_kind: RefCell<Vec<KindAnswer>>,
}

/// The answer for nodes of one model label and pool.
type KindAnswer = (Option<Arc<str>>, Option<Arc<str>>, Result<(), Misfit>);

/// Most (model label, pool) answers kept per pod: beyond, each node is asked anew
/// (a cluster with thousands of labels would make the search the cost).
const KINDS_KEPT: usize = 64;

impl<'a> Eligibility<'a> {
    /// The rules for a pod that wants `wanted`, in a namespace limited by `limits`;
    /// `views`: the namespace's quotas with their usage, read when [`needs_views`].
    pub(crate) fn new(
        limits: &'a NamespaceLimits,
        wanted: WantedModels,
        charged: Charged,
        mig: &'a MigResources,
        views: Option<Views>,
    ) -> Self {
        Eligibility {
            limits,
            wanted,
            quota: PlacementQuota {
                checks: needs_views(&charged),
                charged,
                mig,
                views,
                by_label: RefCell::default(),
            },
            by_kind: RefCell::default(),
        }
    }

    /// What the quota ledger is charged when the pod is placed on a node labelled
    /// `label`: for a pod that accepts several models, its cost there; for one charged
    /// at admission, what the node costs beyond that (`None`: nothing).
    pub(crate) fn placement_charge(
        &self,
        label: &str,
        request: &GpuRequest,
    ) -> Option<ModelAmounts> {
        if !self.quota.checks {
            return None; // charged the most it can cost (or nothing applies)
        }
        let cost = charge_on(request, label, self.quota.mig);
        let charge = match &self.quota.charged {
            Charged::Free => return None,
            Charged::AtPlacement => cost,
            Charged::Admitted(charged) => excess(&cost, charged),
        };
        (!charge.is_empty()).then_some(charge)
    }

    /// Whether `node` may take the pod asking `request`, fit aside. (`request` is the
    /// pod's, the same in every call: the answers are kept by the node's model label
    /// and pool.)
    pub(crate) fn admits(&self, node: &NodeGpus, request: &GpuRequest) -> Result<(), Misfit> {
        let known = self
            .by_kind
            .borrow()
            .iter()
            .find(|(model, pool, _)| *model == node.model && *pool == node.pool)
            .map(|(_, _, answer)| answer.clone());
        if let Some(answer) = known {
            return answer;
        }
        let answer = self.rules(node, request);
        let mut by_kind = self.by_kind.borrow_mut();
        if by_kind.len() < KINDS_KEPT {
            by_kind.push((node.model.clone(), node.pool.clone(), answer.clone()));
        }
        answer
    }

    /// [`Eligibility::admits`], every rule asked.
    fn rules(&self, node: &NodeGpus, request: &GpuRequest) -> Result<(), Misfit> {
        self.wanted
            .admits(node)
            .and_then(|()| pool_admits(&self.limits.pools, node))
            .and_then(|()| profile_admits(self.limits, &self.wanted, node))
            .and_then(|()| self.quota.room_on(node, request))
    }
}

/// A pod charged at admission for a model, not for a MIG profile, may not take a
/// single-strategy slice of a profile its namespace caps: the cap would not see it
/// (a pod that names the profile's node label is charged for it at admission).
fn profile_admits(
    limits: &NamespaceLimits,
    wanted: &WantedModels,
    node: &NodeGpus,
) -> Result<(), Misfit> {
    let Some(label) = node.model.as_deref() else {
        return Ok(());
    };
    // Most namespaces cap no profile: then nothing is read of the node.
    if limits.profile_caps.is_empty() || wanted.models.len() != 1 || wanted.models[0] == label {
        return Ok(());
    }
    let (model, Some(profile)) = mig::split_product(label) else {
        return Ok(());
    };
    let key = mig::profile_key(model, profile);
    if !limits.profile_caps.contains(&key) {
        return Ok(());
    }
    Err(Misfit::QuotaFull {
        detail: format!(
            "the namespace caps MIG profile {key}; a pod using it names the node label {label} as its GPU model"
        ),
        model: key,
    })
}

/// Whether placement may need the namespace's quota usage for a pod charged so: one
/// charged at placement always; one charged at admission by a single-strategy slice
/// label, when a dearer node of its model is a candidate. A pod charged whole GPUs at
/// admission costs no more anywhere it may go, and the ledger is not read for it.
pub(crate) fn needs_views(charged: &Charged) -> bool {
    match charged {
        Charged::Free => false,
        Charged::AtPlacement => true,
        Charged::Admitted(charge) => charge.keys().any(|key| mig::is_profile_key(key)),
    }
}

/// The quota rule of placement: the node's cost must fit what the pod was charged
/// plus the namespace's room.
struct PlacementQuota<'a> {
    /// Whether any node can cost more than the pod was charged ([`needs_views`]): most
    /// pods are charged the most they can cost, and the filter's hot path then skips
    /// the rule.
    checks: bool,
    charged: Charged,
    mig: &'a MigResources,
    views: Option<Views>,
    /// The answer for each model label asked about in this call: thousands of
    /// candidates share a handful of labels.
    by_label: RefCell<Vec<LabelRoom>>,
}

/// Whether the quota has room on nodes of one model label.
type LabelRoom = (Option<Arc<str>>, Result<(), Misfit>);

impl PlacementQuota<'_> {
    fn room_on(&self, node: &NodeGpus, request: &GpuRequest) -> Result<(), Misfit> {
        if !self.checks {
            return Ok(());
        }
        let known = self
            .by_label
            .borrow()
            .iter()
            .find(|(l, _)| *l == node.model)
            .map(|(_, r)| r.clone());
        if let Some(answer) = known {
            return answer;
        }
        let answer = self.room_for(node.model.as_deref().unwrap_or_default(), request);
        let mut by_label = self.by_label.borrow_mut();
        by_label.push((node.model.clone(), answer.clone()));
        answer
    }

    fn room_for(&self, label: &str, request: &GpuRequest) -> Result<(), Misfit> {
        let cost = charge_on(request, label, self.mig);
        let beyond = match &self.charged {
            Charged::Free => return Ok(()),
            Charged::AtPlacement => cost,
            Charged::Admitted(charged) => excess(&cost, charged),
        };
        if beyond.is_empty() {
            return Ok(()); // no dearer than its admission charge: nothing to read
        }
        let full = |model: &str, detail: String| Misfit::QuotaFull {
            model: model.to_string(),
            detail,
        };
        // Not read (`needs_views` said no node could cost more): refuse rather than
        // take a node unchecked.
        let Some(views) = &self.views else {
            return Err(full(
                label,
                "the namespace's quota usage was not read".into(),
            ));
        };
        let views = views.as_ref().map_err(|e| full(label, e.to_string()))?;
        room(views, label, &beyond).map_err(|e| {
            full(
                &e.model,
                format!("used {} of {} in GPUQuota {}", e.used, e.hard, e.quota),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::models::ModelSource;
    use crate::placement::testing::node;

    /// An answer kept for a (model label, pool) is the one every rule gives: asked of
    /// nodes of several labels and pools, in any order, twice, with and without a
    /// quota to check (a multi-model pod, charged at placement).
    #[test]
    fn a_kept_answer_is_the_one_the_rules_give() {
        let limits = NamespaceLimits {
            has_quota: true,
            models: vec!["T4".into(), "A100-SXM4-40GB".into()],
            profile_caps: vec!["A100-SXM4-40GB/1g.5gb".into()],
            pools: vec!["train".into()],
            ..Default::default()
        };
        let mig = MigResources::default();
        let request = GpuRequest::one(crate::placement::GpuDemand::Whole { gpus: 1 });
        let labels = [
            None,
            Some("T4"),
            Some("V100"),
            Some("A100-SXM4-40GB"),
            Some("A100-SXM4-40GB-MIG-1g.5gb"),
        ];
        let pools = [None, Some("train"), Some("serve")];
        let mut nodes = Vec::new();
        for (i, label) in labels.iter().enumerate() {
            for (j, pool) in pools.iter().enumerate() {
                let mut n = node(&format!("n{i}{j}"), 2, 100);
                n.model = label.map(Into::into);
                n.pool = pool.map(Into::into);
                nodes.push(n);
            }
        }
        for (wanted, charged) in [
            (WantedModels::one("A100-SXM4-40GB"), Charged::Free),
            (
                WantedModels {
                    models: limits.models.clone(),
                    source: ModelSource::QuotaList,
                },
                Charged::AtPlacement,
            ),
        ] {
            let eligibility =
                Eligibility::new(&limits, wanted, charged, &mig, Some(Ok(Vec::new())));
            for n in nodes.iter().chain(nodes.iter().rev()) {
                assert_eq!(
                    eligibility.admits(n, &request),
                    eligibility.rules(n, &request),
                    "{}",
                    n.name
                );
            }
            assert_eq!(eligibility.by_kind.borrow().len(), nodes.len());
        }
    }

    #[test]
    fn a_capped_mig_profile_is_only_for_pods_that_name_it() {
        let mut slices = node("n", 7, 0);
        slices.model = Some("A100-SXM4-40GB-MIG-1g.5gb".into());
        let capped = NamespaceLimits {
            has_quota: true,
            models: vec!["A100-SXM4-40GB".into()],
            profile_caps: vec!["A100-SXM4-40GB/1g.5gb".into()],
            ..Default::default()
        };
        let refused =
            profile_admits(&capped, &WantedModels::one("A100-SXM4-40GB"), &slices).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "namespace GPU quota for A100-SXM4-40GB/1g.5gb has no room (the namespace caps MIG profile A100-SXM4-40GB/1g.5gb; a pod using it names the node label A100-SXM4-40GB-MIG-1g.5gb as its GPU model)"
        );
        assert!(
            profile_admits(
                &capped,
                &WantedModels::one("A100-SXM4-40GB-MIG-1g.5gb"),
                &slices
            )
            .is_ok()
        );
        let uncapped = NamespaceLimits {
            profile_caps: Vec::new(),
            ..capped
        };
        assert!(profile_admits(&uncapped, &WantedModels::one("A100-SXM4-40GB"), &slices).is_ok());
    }
}
