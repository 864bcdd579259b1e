//! When a pod is charged, and by which node label (docs/design.md, "Quota"), pure.
//!
//! The one rule: a pod that wants one model is charged at admission, by its *pending
//! label* (the dearest label of that model among the nodes that existed when it was
//! created), and placement adds only what a dearer node costs beyond that; a pod that
//! accepts several models is charged at placement, by its node's label. Admission,
//! placement, the usage tally, the queue and the ledger's reconciler all ask
//! [`ChargedAt::of`], so the rule has one branch.

use crate::placement::GpuRequest;
use crate::placement::mig::{self, MigResources};

use super::NamespaceLimits;
use super::charge::{Costs, ModelAmounts, add_charge, charge_on, excess};

/// When a pod is charged: the rule's one branch, by the models it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChargedAt<'a> {
    /// It wants one model: charged at admission, by the pending label of `model`.
    Admission { model: &'a str },
    /// It accepts several models (or names none): charged at placement, by its node's
    /// label.
    Placement { models: &'a [String] },
}

/// What a pod is charged, as placement must respect it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Charged {
    /// No quota applies (none in the namespace): any node's cost is fine.
    Free,
    /// The pod accepts several models: charged at placement, for the node's label, so
    /// the quotas must have room for all of it there.
    AtPlacement,
    /// Charged this at admission (one model, by the dearest node label of it that
    /// existed then): a node that costs more needs the namespace's room for the
    /// difference (a whole-GPU node added after a slice-charged pod was admitted).
    Admitted(ModelAmounts),
}

impl<'a> ChargedAt<'a> {
    /// When a pod that wants `wanted` (its models, resolved) is charged.
    pub(crate) fn of(wanted: &'a [String]) -> Self {
        match wanted {
            [model] => ChargedAt::Admission { model },
            models => ChargedAt::Placement { models },
        }
    }

    /// Whether the pod is charged when it is placed: it accepts several models (one that
    /// names none, in a namespace whose quotas default none, is charged nothing).
    pub(super) fn at_placement(self) -> bool {
        matches!(self, ChargedAt::Placement { models } if !models.is_empty())
    }

    /// What admission decides on: the pod's charge on each label it may be charged by
    /// (one, its pending label, when it wants one model). `pending` gives a model's
    /// pending label.
    pub(crate) fn costs(
        self,
        request: &GpuRequest,
        mig: &MigResources,
        pending: impl FnOnce(&'a str) -> &'a str,
    ) -> Costs {
        match self {
            ChargedAt::Admission { model } => {
                let charge = charge_on(request, pending(model), mig);
                Costs::single(model.to_string(), charge)
            }
            ChargedAt::Placement { models } => Costs::of(request, models, mig),
        }
    }

    /// What the pod was charged, for placement to respect, in a namespace with a quota.
    pub(crate) fn charged(
        self,
        request: &GpuRequest,
        mig: &MigResources,
        pending: impl FnOnce(&'a str) -> &'a str,
    ) -> Charged {
        match self {
            ChargedAt::Admission { model } => {
                Charged::Admitted(charge_on(request, pending(model), mig))
            }
            ChargedAt::Placement { .. } if self.at_placement() => Charged::AtPlacement,
            ChargedAt::Placement { .. } => Charged::Free,
        }
    }

    /// The node label the pod is charged by now (`None`: not charged yet), given the
    /// model label of the node it is on (`node`, when known). A pod that wants one model
    /// is charged by a node of that model it is on (a single-strategy MIG node charges
    /// its slices), else by its pending label; one that accepts several, by its node's
    /// label. A node of another model than the one a pod wants (reachable only around
    /// admission, e.g. a node relabelled since) charges the pod's model: what it was
    /// admitted for.
    pub(crate) fn label(
        self,
        node: Option<&'a str>,
        pending: impl FnOnce(&'a str) -> &'a str,
    ) -> Option<&'a str> {
        match (self, node) {
            (ChargedAt::Admission { model }, Some(node)) if mig::model_of(node) == model => {
                Some(node)
            }
            (ChargedAt::Admission { model }, Some(_)) => Some(model),
            (ChargedAt::Admission { model }, None) => Some(pending(model)),
            (ChargedAt::Placement { .. }, node) => node,
        }
    }

    /// What the pod was surely charged in the ledger, per quota key, once admitted (one
    /// model: by its pending label, plus what its node costs beyond that) or bound
    /// (several: on its node; `None` before, as a pod the extender placed may not have
    /// been charged yet). `node`: the model label of its node; `bound`: whether it is
    /// bound to it.
    pub(crate) fn in_ledger(
        self,
        request: &GpuRequest,
        node: Option<&str>,
        bound: bool,
        mig: &MigResources,
        pending: impl FnOnce(&'a str) -> &'a str,
    ) -> Option<ModelAmounts> {
        match self {
            ChargedAt::Admission { model } => {
                let label = pending(model);
                let mut charge = charge_on(request, label, mig);
                if let Some(node) = node.filter(|n| *n != label) {
                    let beyond = excess(&charge_on(request, node, mig), &charge);
                    add_charge(&mut charge, &beyond);
                }
                Some(charge)
            }
            ChargedAt::Placement { .. } => Some(charge_on(request, node.filter(|_| bound)?, mig)),
        }
    }
}

/// The node label a pod that wants only `model` is charged by until it is bound (and
/// what admission charges it): of `labels` (the model labels of the nodes that existed
/// when it was created), those of `model` that could take it, the one it costs most on
/// ([`charge_on`]). Whole GPUs (`model` itself) cost the most, and are the charge when
/// a whole-GPU node of the model is among them or no node of it is; on a cluster whose
/// GPUs of the model are all cut into slices (single strategy, `<model>-MIG-<profile>`),
/// the dearest slice. A slice label whose profile the namespace caps takes only pods
/// that name it, so it does not count here. Placement refuses a node that costs more
/// than this plus the namespace's room ([`excess`]).
pub fn pending_label<'a>(
    request: &GpuRequest,
    model: &'a str,
    labels: impl IntoIterator<Item = &'a str>,
    limits: &NamespaceLimits,
    mig: &MigResources,
) -> &'a str {
    if mig::split_product(model).1.is_some() {
        return model; // it names a slice label: charged by it
    }
    let mut dearest: Option<(&str, u64)> = None;
    for label in labels {
        if label == model {
            return model;
        }
        let (of, Some(profile)) = mig::split_product(label) else {
            continue;
        };
        let capped = || limits.profile_caps.contains(&mig::profile_key(of, profile));
        if of != model || capped() {
            continue;
        }
        let cost = charge_on(request, label, mig).get(model).map_or(0, |m| m.0);
        if dearest.is_none_or(|(_, most)| cost > most) {
            dearest = Some((label, cost));
        }
    }
    dearest.map_or(model, |(label, _)| label)
}
