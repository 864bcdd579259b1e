//! Whether a namespace's quotas admit a charge (docs/design.md, "Quota"), pure: the
//! quotas as arithmetic sees them, the admission rule, the models a pod may be charged
//! to by how it reaches a node, and the denial a person reads when there is no room.

use std::fmt;

use crate::placement::NodeGpus;
use crate::placement::mig::{self};
use crate::placement::models::{ModelSource, WantedModels, pool_admits};
use crate::placement::quantity::Milli;

use super::charge::{Costs, ModelAmounts};
use super::cohort::{self, CohortTerms, Pool, Short};
use super::{GPUQuota, NamespaceLimits, OnExceed, StatusError, quota_name};

/// One GPUQuota as arithmetic sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaView {
    pub namespace: String,
    pub name: String,
    pub hard: ModelAmounts,
    pub used: ModelAmounts,
    /// A `Warn` quota never refuses: a charge past its `hard` is admitted and reported
    /// ([`over_warn_quotas`]).
    pub on_exceed: OnExceed,
    /// Its cohort's terms, when it lends and borrows (`None`: `hard` is a wall).
    pub cohort: Option<CohortTerms>,
}

impl QuotaView {
    /// `used` is left empty: usage is counted by the caller, from pods and reservations.
    pub fn from_crd(quota: &GPUQuota) -> Result<Self, StatusError> {
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
    pub fn enforces(&self) -> bool {
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
    pub fn into_over(self) -> Vec<Exceeded> {
        match self {
            Charge::Model { over, .. } | Charge::AtPlacement { over, .. } => over,
            Charge::Unlimited => Vec::new(),
        }
    }
}

/// Why a pod is refused. The message is what `kubectl` prints after "denied the request:".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    Exceeded(Exceeded),
    NoModelHasRoom {
        namespace: String,
        tried: Vec<Exceeded>,
    },
    ModelNotAllowed {
        namespace: String,
        model: String,
        allowed: Vec<String>,
    },
    QuotaRequired {
        namespace: String,
    },
    UntypedDenied {
        namespace: String,
    },
    /// Created bound to a node (`spec.nodeName`) it cannot be charged to.
    BoundNode {
        namespace: String,
        node: String,
        problem: NodeProblem,
    },
    /// Accepts several models but another scheduler places it, so the extender never
    /// charges it at placement.
    NeedsGpuScheduler {
        namespace: String,
        models: Vec<String>,
        scheduler: String,
        gpu_scheduler: String,
        type_annotation: String,
    },
}

/// Why a pod created bound to a node cannot be charged to that node's model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeProblem {
    /// gpu-admission does not know the node (not a GPU node, or not seen yet).
    Unknown,
    /// The node has no GPU model label.
    NoModel,
    ModelNotWanted {
        model: String,
        wanted: Vec<String>,
    },
    PoolNotAllowed {
        pool: Option<String>,
        allowed: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// A quota key: a model or a MIG profile key (`<model>/<profile>`).
    pub model: String,
    pub requested: Milli,
    pub used: Milli,
    pub hard: Milli,
    /// `<namespace>/<name>` of the quota, or of every quota when none lists `model`.
    pub quota: String,
    /// Whether some quota lists `model`; when none does, `model` is the pod's own word.
    pub listed: bool,
    /// The quota's cohort, and why it lends no more (boxed: rare, and a denial is
    /// passed by value).
    pub cohort: Option<Box<(String, Short)>>,
}

/// The refusal of one quota, as `kubectl` prints it (a `Warn` quota's warning too).
impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU quota exceeded in namespace {:?} for {}: requested {}, used {} of {} (GPUQuota {})",
            self.namespace(),
            self.model,
            self.requested,
            self.used,
            self.hard,
            self.quota
        )?;
        match self.cohort.as_deref() {
            Some((cohort, short)) => write!(f, "; cohort {cohort}: {short}"),
            None => Ok(()),
        }
    }
}

impl Exceeded {
    /// The namespace of the quota (or quotas) that had no room.
    pub fn namespace(&self) -> &str {
        self.quota.split('/').next().unwrap_or_default()
    }

    fn short(&self) -> String {
        format!("{}: used {} of {}", self.model, self.used, self.hard)
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::Exceeded(e) => write!(f, "{e}"),
            Denial::NoModelHasRoom { namespace, tried } => {
                let tried: Vec<String> = tried.iter().map(Exceeded::short).collect();
                let requested = tried_requested(self);
                write!(
                    f,
                    "GPU quota exceeded in namespace {namespace:?} for every model the pod accepts: requested {requested}; {}",
                    tried.join("; ")
                )
            }
            Denial::ModelNotAllowed {
                namespace,
                model,
                allowed,
            } => write!(
                f,
                "GPU model {model} is not in any GPUQuota of namespace {namespace:?} (allowed: {})",
                allowed.join(", ")
            ),
            Denial::QuotaRequired { namespace } => write!(
                f,
                "namespace {namespace:?} has no GPUQuota, and GPU pods need one here (quotaRequired)"
            ),
            Denial::UntypedDenied { namespace } => write!(
                f,
                "the pod names no GPU model and namespace {namespace:?} has no GPUQuota to default one; set the gpu-admission.io/gpu-type annotation"
            ),
            Denial::BoundNode {
                namespace,
                node,
                problem,
            } => {
                write!(f, "the pod is bound to node {node:?} (spec.nodeName), ")?;
                bound_node_problem(f, namespace, problem)
            }
            Denial::NeedsGpuScheduler {
                namespace,
                models,
                scheduler,
                gpu_scheduler,
                type_annotation,
            } => write!(
                f,
                "the pod accepts several GPU models ({}) and is scheduled by {scheduler:?}, so the GPU quota of namespace {namespace:?} cannot charge it to the model it lands on; name one model in the {type_annotation} annotation, or use schedulerName {gpu_scheduler:?}",
                models.join(",")
            ),
        }
    }
}

/// The rest of a [`Denial::BoundNode`] message: what is wrong with the node.
fn bound_node_problem(
    f: &mut fmt::Formatter<'_>,
    namespace: &str,
    problem: &NodeProblem,
) -> fmt::Result {
    const CHARGE: &str = "a pod created on a node is charged to that node's GPU model";
    match problem {
        NodeProblem::Unknown => write!(
            f,
            "which gpu-admission does not know as a GPU node; namespace {namespace:?} has a GPUQuota and {CHARGE}"
        ),
        NodeProblem::NoModel => write!(
            f,
            "which has no GPU model label; namespace {namespace:?} has a GPUQuota and {CHARGE}"
        ),
        NodeProblem::ModelNotWanted { model, wanted } => write!(
            f,
            "whose GPU model {model} is not one the pod accepts ({}); {CHARGE}",
            wanted.join(",")
        ),
        NodeProblem::PoolNotAllowed {
            pool: Some(pool),
            allowed,
        } => write!(
            f,
            "whose node pool {pool} is not one namespace {namespace:?} may use ({})",
            allowed.join(",")
        ),
        NodeProblem::PoolNotAllowed {
            pool: None,
            allowed,
        } => write!(
            f,
            "which has no node pool label; namespace {namespace:?} may use only the pools {}",
            allowed.join(",")
        ),
    }
}

fn tried_requested(denial: &Denial) -> String {
    match denial {
        Denial::NoModelHasRoom { tried, .. } => tried
            .first()
            .map(|e| e.requested.to_string())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// Admission rules that are configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmitRules {
    pub untyped: UntypedPods,
    pub quota_required: bool,
}

/// The scheduler a pod with an empty `schedulerName` gets.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// What becomes of a GPU pod that names no model in a namespace whose quota has no
/// default model (`untypedPods` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UntypedPods {
    Allow,
    Deny,
}

/// Decide how a GPU pod in `namespace` is charged, given the namespace's quotas with
/// their current usage. Every quota that lists a model limits it; a model no quota
/// lists is not allowed once the namespace has a quota.
pub fn admit(
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
    let mut tried = Vec::new();
    let mut with_room = Vec::new();
    let mut over = Vec::new();
    for model in &wanted.models {
        if enforced && !allowed.iter().any(|a| a == mig::model_of(model)) {
            if wanted.models.len() == 1 {
                return Err(Denial::ModelNotAllowed {
                    namespace: namespace.into(),
                    model: model.clone(),
                    allowed,
                });
            }
            continue;
        }
        let charge = costs.on(model);
        match room(quotas, model, &charge) {
            Ok(()) => {
                over.extend(over_warn_quotas(quotas, model, &charge));
                with_room.push((model.clone(), charge));
            }
            Err(exceeded) => tried.push(exceeded),
        }
    }
    match (wanted.models.len(), with_room.len()) {
        (1, 1) => {
            let (model, charge) = with_room.remove(0);
            Ok(Charge::Model {
                model,
                charge,
                over,
            })
        }
        (1, _) => Err(Denial::Exceeded(tried.remove(0))),
        (_, 0) if tried.is_empty() => Err(Denial::ModelNotAllowed {
            namespace: namespace.into(),
            model: wanted.models.join(","),
            allowed,
        }),
        (_, 0) => Err(Denial::NoModelHasRoom {
            namespace: namespace.into(),
            tried,
        }),
        _ => Ok(Charge::AtPlacement {
            models: with_room.into_iter().map(|(model, _)| model).collect(),
            over,
        }),
    }
}

/// How a pod reaches its node, which decides when a pod accepting several models can
/// be charged: the extender charges it at placement only if it is the one placing it.
#[derive(Debug, Clone, Copy)]
pub enum Arrival<'a> {
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
pub fn models_for_arrival(
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
        Arrival::OtherScheduler { .. } if wanted.models.len() < 2 => Ok(wanted),
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
pub fn room(quotas: &[QuotaView], label: &str, charge: &ModelAmounts) -> Result<(), Exceeded> {
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
pub fn over_warn_quotas(quotas: &[QuotaView], label: &str, charge: &ModelAmounts) -> Vec<Exceeded> {
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
pub fn listed_models(quotas: &[QuotaView]) -> Vec<String> {
    let keys = quotas.iter().flat_map(|q| q.hard.keys());
    let mut models: Vec<String> = keys.filter(|k| !mig::is_profile_key(k)).cloned().collect();
    models.sort();
    models.dedup();
    models
}
