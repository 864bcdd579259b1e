//! Whether a namespace's quotas admit a charge (docs/design.md, "Quota"), pure: the
//! admission rule, the room a charge needs in every quota that lists its keys, and the
//! models a pod may be charged to by how it reaches a node.

use crate::placement::NodeGpus;
use crate::placement::mig;
use crate::placement::models::{ModelSource, WantedModels, pool_admits};
use crate::placement::quantity::Milli;

use super::NamespaceLimits;
use super::charge::{Costs, ModelAmounts};
use super::denial::{Denial, Exceeded, NodeProblem};
use super::price::ChargedAt;
use super::view::QuotaView;

/// What admission decided about a GPU pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charge {
    /// Charge `charge` (per quota key) now, for a pod that goes to nodes labelled `model`;
    /// `over`: the `Warn` quotas it goes past (the admission warns).
    Model {
        model: String,
        charge: ModelAmounts,
        over: Vec<Exceeded>,
    },
    /// Several models are acceptable and at least one has room: charged to the model of
    /// the node the extender places it on; `over`: the `Warn` quotas it would go past on
    /// some of them.
    AtPlacement {
        models: Vec<String>,
        over: Vec<Exceeded>,
    },
    /// The namespace has no quota: nothing to charge.
    Unlimited,
}

impl Charge {
    /// The `Warn` quotas this charge goes past.
    pub(crate) fn into_over(self) -> Vec<Exceeded> {
        match self {
            Charge::Model { over, .. } | Charge::AtPlacement { over, .. } => over,
            Charge::Unlimited => Vec::new(),
        }
    }
}

/// Admission rules that are configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmitRules {
    pub(crate) untyped: UntypedPods,
    pub(crate) quota_required: bool,
}

/// The scheduler a pod with an empty `schedulerName` gets.
pub(crate) const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// What becomes of a GPU pod that names no model in a namespace whose quota has no
/// default model (`untypedPods` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum UntypedPods {
    Allow,
    Deny,
}

/// Decide how a GPU pod in `namespace` is charged, given the namespace's quotas with
/// their current usage. Every quota that lists a model limits it; a model no quota
/// lists is not allowed once the namespace has a quota.
pub(crate) fn admit(
    namespace: &str,
    quotas: &[QuotaView],
    wanted: &WantedModels,
    costs: &Costs,
    rules: AdmitRules,
) -> Result<Charge, Denial> {
    if quotas.is_empty() {
        if rules.quota_required {
            return Err(Denial::QuotaRequired {
                namespace: namespace.into(),
            });
        }
        if wanted.source == ModelSource::Untyped && rules.untyped == UntypedPods::Deny {
            return Err(Denial::UntypedDenied {
                namespace: namespace.into(),
            });
        }
        return Ok(Charge::Unlimited);
    }
    let allowed: Vec<String> = listed_models(quotas);
    // Only quotas that enforce refuse a model none of them lists (Warn: audit only).
    let enforced = quotas.iter().any(QuotaView::enforces);
    let not_allowed = |model: &str| enforced && !allowed.iter().any(|a| a == mig::model_of(model));
    if let ChargedAt::Admission { model } = ChargedAt::of(&wanted.models) {
        if not_allowed(model) {
            return Err(Denial::ModelNotAllowed {
                namespace: namespace.into(),
                model: model.into(),
                allowed,
            });
        }
        let charge = costs.on(model);
        room(quotas, model, &charge).map_err(Denial::Exceeded)?;
        let over = over_warn_quotas(quotas, model, &charge);
        return Ok(Charge::Model {
            model: model.into(),
            charge,
            over,
        });
    }
    // Charged at placement: the models allowed that have room are its choices.
    let mut tried = Vec::new();
    let mut with_room = Vec::new();
    let mut over = Vec::new();
    for model in wanted.models.iter().filter(|m| !not_allowed(m)) {
        let charge = costs.on(model);
        match room(quotas, model, &charge) {
            Ok(()) => {
                over.extend(over_warn_quotas(quotas, model, &charge));
                with_room.push(model.clone());
            }
            Err(exceeded) => tried.push(exceeded),
        }
    }
    if !with_room.is_empty() {
        Ok(Charge::AtPlacement {
            models: with_room,
            over,
        })
    } else if tried.is_empty() {
        Err(Denial::ModelNotAllowed {
            namespace: namespace.into(),
            model: wanted.models.join(","),
            allowed,
        })
    } else {
        Err(Denial::NoModelHasRoom {
            namespace: namespace.into(),
            tried,
        })
    }
}

/// How a pod reaches its node, which decides when a pod accepting several models can
/// be charged: the extender charges it at placement only if it is the one placing it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arrival<'a> {
    /// Placed by the GPU scheduler (whose extender charges it at placement).
    GpuScheduler,
    /// Placed by another scheduler (`name`; an empty schedulerName is
    /// default-scheduler): the extender never sees it.
    OtherScheduler {
        name: &'a str,
        gpu_scheduler: &'a str,
        type_annotation: &'a str,
    },
    /// Created with `spec.nodeName`: no scheduler at all. `gpus` is the node as the
    /// cache knows it, `None` when it does not.
    Bound {
        node: &'a str,
        gpus: Option<&'a NodeGpus>,
    },
}

/// The models a pod may be charged to at admission, given its route to a node. In a
/// namespace with a quota, a pod created on a node is charged to that node's model
/// (which it must accept, in an allowed pool), and a pod accepting several models must
/// go through the GPU scheduler. Namespaces without a quota charge nothing: `wanted`
/// is returned as it is.
pub(crate) fn models_for_arrival(
    namespace: &str,
    limits: &NamespaceLimits,
    wanted: WantedModels,
    route: Arrival<'_>,
) -> Result<WantedModels, Denial> {
    if !limits.has_quota {
        return Ok(wanted);
    }
    match route {
        Arrival::GpuScheduler => Ok(wanted),
        Arrival::OtherScheduler { .. } if !ChargedAt::of(&wanted.models).at_placement() => {
            Ok(wanted)
        }
        Arrival::OtherScheduler {
            name,
            gpu_scheduler,
            type_annotation,
        } => Err(Denial::NeedsGpuScheduler {
            namespace: namespace.into(),
            models: wanted.models,
            scheduler: if name.is_empty() {
                DEFAULT_SCHEDULER.into()
            } else {
                name.into()
            },
            gpu_scheduler: gpu_scheduler.into(),
            type_annotation: type_annotation.into(),
        }),
        Arrival::Bound { node, gpus } => {
            let refuse = |problem| Denial::BoundNode {
                namespace: namespace.into(),
                node: node.into(),
                problem,
            };
            let model = bound_model(gpus, &wanted, &limits.pools).map_err(refuse)?;
            Ok(WantedModels {
                models: vec![model],
                source: wanted.source,
            })
        }
    }
}

/// The model of the node a pod is created on, if the pod may be charged to it.
fn bound_model(
    gpus: Option<&NodeGpus>,
    wanted: &WantedModels,
    pools: &[String],
) -> Result<String, NodeProblem> {
    // The same model and pool rules the extender applies to a candidate node.
    let gpus = gpus.ok_or(NodeProblem::Unknown)?;
    let model = gpus.model.as_deref().ok_or(NodeProblem::NoModel)?;
    wanted
        .admits(gpus)
        .map_err(|_| NodeProblem::ModelNotWanted {
            model: model.into(),
            wanted: wanted.models.clone(),
        })?;
    pool_admits(pools, gpus).map_err(|_| NodeProblem::PoolNotAllowed {
        pool: gpus.pool.as_deref().map(str::to_string),
        allowed: pools.to_vec(),
    })?;
    Ok(model.to_string())
}

/// Whether the namespace whose quotas these are has room for `charge` (per quota key)
/// of a pod going to nodes labelled `label`: every quota listing a key must. A model no
/// quota lists has a quota of zero once the namespace has any quota; a MIG profile key
/// no quota lists is not limited beyond its model (admission and placement both ask
/// here, so the rule is one). Without quotas there is no limit.
/// `Warn` quotas never refuse (see [`over_warn_quotas`]).
pub(crate) fn room(
    quotas: &[QuotaView],
    label: &str,
    charge: &ModelAmounts,
) -> Result<(), Exceeded> {
    let enforcing = quotas.iter().any(QuotaView::enforces);
    if let Some(exceeded) = unlisted_in(quotas, label, charge).filter(|_| enforcing) {
        return Err(exceeded);
    }
    for (key, amount) in charge {
        let listing = quotas
            .iter()
            .filter(|q| q.enforces() && q.hard.contains_key(key));
        listing
            .into_iter()
            .try_for_each(|q| q.room_for(key, *amount))?;
    }
    Ok(())
}

/// What [`room`] lets through only because the quotas in the way say `Warn`: every
/// `Warn` quota that `charge` goes past, and a model no quota lists when none enforces.
/// The admission reports each (a warning, a metric).
pub(super) fn over_warn_quotas(
    quotas: &[QuotaView],
    label: &str,
    charge: &ModelAmounts,
) -> Vec<Exceeded> {
    // With a quota that enforces, an unlisted model is refused, never let through.
    let enforcing = quotas.iter().any(QuotaView::enforces);
    if let Some(exceeded) = unlisted_in(quotas, label, charge).filter(|_| !enforcing) {
        return vec![exceeded];
    }
    let mut over = Vec::new();
    for (key, amount) in charge {
        let warning = quotas
            .iter()
            .filter(|q| !q.enforces() && q.hard.contains_key(key));
        over.extend(warning.filter_map(|q| q.room_for(key, *amount).err()));
    }
    over
}

/// The first model of a charge to nodes labelled `label` that no quota lists: its quota
/// is zero once the namespace has any quota.
fn unlisted_in(quotas: &[QuotaView], label: &str, charge: &ModelAmounts) -> Option<Exceeded> {
    if quotas.is_empty() {
        return None;
    }
    let models = charge.keys().filter(|k| !mig::is_profile_key(k));
    let mut models = std::iter::once(mig::model_of(label)).chain(models.map(String::as_str));
    let model = models.find(|m| !quotas.iter().any(|q| q.hard.contains_key(*m)))?;
    let amount = charge.get(model).copied().unwrap_or_default();
    Some(unlisted(quotas, model, amount))
}

/// The refusal for a model no quota lists: its quota is zero, in all of them.
fn unlisted(quotas: &[QuotaView], model: &str, amount: Milli) -> Exceeded {
    let names: Vec<String> = quotas
        .iter()
        .map(|q| format!("{}/{}", q.namespace, q.name))
        .collect();
    Exceeded {
        model: model.to_string(),
        requested: amount,
        used: Milli::default(),
        hard: Milli::default(),
        quota: names.join(", "),
        listed: false,
        cohort: None,
    }
}

/// The GPU models the quotas list (MIG profile keys aside).
fn listed_models(quotas: &[QuotaView]) -> Vec<String> {
    let keys = quotas.iter().flat_map(|q| q.hard.keys());
    let mut models: Vec<String> = keys.filter(|k| !mig::is_profile_key(k)).cloned().collect();
    models.sort();
    models.dedup();
    models
}
