//! Quota arithmetic (docs/design.md), pure: what a pod would be charged, whether the
//! namespace's quotas have room, and the denial a person reads when they do not.

use std::collections::BTreeMap;
use std::fmt;

use crate::placement::mig::{self, MigResources};
use crate::placement::models::{ModelSource, WantedModels, pool_admits};
use crate::placement::quantity::Milli;
use crate::placement::{GpuRequest, NodeGpus};

use super::{GPUQuota, NamespaceLimits};

/// GPUs per model, in thousandths of a GPU.
pub type ModelAmounts = BTreeMap<String, Milli>;

/// What a pod on (or wanting) a node labelled `label` is charged, per quota key: its
/// GPUs (the effective request) to the label's GPU model, and MIG slices at their
/// fraction of a GPU to the model and one each to the profile's key
/// (`<model>/<profile>`, docs/devices.md). On a single-strategy MIG node
/// (`<model>-MIG-<profile>`) every whole GPU the pod asks for is one slice.
pub fn charge_on(request: &GpuRequest, label: &str, mig: &MigResources) -> ModelAmounts {
    let (model, single) = mig::split_product(label);
    let mut charge = ModelAmounts::new();
    let mut add = |key: &str, amount: u64| {
        if amount > 0 {
            let entry = charge.entry(key.to_string()).or_default();
            entry.0 = entry.0.saturating_add(amount);
        }
    };
    // 100 vcuda-core = 1 GPU = 1000 milli.
    let units = request.core_units();
    match single.and_then(|p| Some((p, mig::compute_slices(p).ok()?))) {
        Some((profile, compute)) => {
            let slices = units / 100;
            let each = mig.slice_fraction(model, compute).0;
            add(model, each.saturating_mul(slices) + units % 100 * 10);
            add(
                &mig::profile_key(model, profile),
                slices.saturating_mul(1000),
            );
        }
        None => add(model, units.saturating_mul(10)),
    }
    for demand in &request.mig {
        let count = u64::from(demand.count);
        let each = mig.slice_fraction(model, demand.compute).0;
        add(model, each.saturating_mul(count));
        add(&mig::profile_key(model, &demand.profile), count * 1000);
    }
    charge
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

/// What `cost` (a pod's charge on a node) asks beyond `charged` (what it was charged
/// at admission), per quota key: the keys where it costs more, by how much.
pub fn excess(cost: &ModelAmounts, charged: &ModelAmounts) -> ModelAmounts {
    let more = cost.iter().filter_map(|(key, amount)| {
        let before = charged.get(key).map_or(0, |m| m.0);
        (amount.0 > before).then(|| (key.clone(), Milli(amount.0 - before)))
    });
    more.collect()
}

/// Add `charge` to `total`, key by key.
pub fn add_charge(total: &mut ModelAmounts, charge: &ModelAmounts) {
    for (key, amount) in charge {
        let entry = total.entry(key.clone()).or_default();
        entry.0 = entry.0.saturating_add(amount.0);
    }
}

/// What a pod would be charged on each model (node label) it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Costs(Vec<(String, ModelAmounts)>);

impl Costs {
    pub fn of(request: &GpuRequest, labels: &[String], mig: &MigResources) -> Self {
        let each = labels
            .iter()
            .map(|l| (l.clone(), charge_on(request, l, mig)));
        Costs(each.collect())
    }

    /// Costs given per label (tests, and callers that computed them).
    pub fn from_charges(charges: Vec<(String, ModelAmounts)>) -> Self {
        Costs(charges)
    }

    /// The cost of a pod already placed on a node labelled `label`.
    pub fn single(label: String, charge: ModelAmounts) -> Self {
        Costs(vec![(label, charge)])
    }

    /// The charge on `label` (empty for a label the costs were not computed for).
    pub fn on(&self, label: &str) -> ModelAmounts {
        let found = self.0.iter().find(|(l, _)| l == label);
        found.map(|(_, charge)| charge.clone()).unwrap_or_default()
    }
}

/// One GPUQuota as arithmetic sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaView {
    pub namespace: String,
    pub name: String,
    pub hard: ModelAmounts,
    pub used: ModelAmounts,
}

impl QuotaView {
    /// `used` is left empty: usage is counted by the caller, from pods and reservations.
    pub fn from_crd(quota: &GPUQuota) -> Result<Self, String> {
        let mut hard = ModelAmounts::new();
        for (model, quantity) in &quota.spec.hard {
            let amount =
                Milli::parse(&quantity.0).map_err(|e| format!("spec.hard.{model}: {e}"))?;
            hard.insert(model.clone(), amount);
        }
        Ok(QuotaView {
            namespace: quota.metadata.namespace.clone().unwrap_or_default(),
            name: quota.metadata.name.clone().unwrap_or_default(),
            hard,
            used: ModelAmounts::new(),
        })
    }

    fn room_for(&self, model: &str, amount: Milli) -> Result<(), Exceeded> {
        let hard = self.hard.get(model).copied().unwrap_or_default();
        let used = self.used.get(model).copied().unwrap_or_default();
        if used.0.saturating_add(amount.0) <= hard.0 {
            Ok(())
        } else {
            Err(Exceeded {
                model: model.to_string(),
                requested: amount,
                used,
                hard,
                quota: format!("{}/{}", self.namespace, self.name),
            })
        }
    }
}

/// What admission decided about a GPU pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charge {
    /// Charge `charge` (per quota key) now, for a pod that goes to nodes labelled `model`.
    Model { model: String, charge: ModelAmounts },
    /// Several models are acceptable and at least one has room: charged to the model of
    /// the node the extender places it on.
    AtPlacement { models: Vec<String> },
    /// The namespace has no quota: nothing to charge.
    Unlimited,
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
    pub model: String,
    pub requested: Milli,
    pub used: Milli,
    pub hard: Milli,
    pub quota: String,
}

impl Exceeded {
    fn short(&self) -> String {
        format!("{}: used {} of {}", self.model, self.used, self.hard)
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::Exceeded(e) => {
                let namespace = e.quota.split('/').next().unwrap_or_default();
                write!(
                    f,
                    "GPU quota exceeded in namespace {namespace:?} for {}: requested {}, used {} of {} (GPUQuota {})",
                    e.model, e.requested, e.used, e.hard, e.quota
                )
            }
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
    let mut tried = Vec::new();
    let mut with_room = Vec::new();
    for model in &wanted.models {
        if !allowed.iter().any(|a| a == mig::model_of(model)) {
            if wanted.models.len() == 1 {
                return Err(Denial::ModelNotAllowed {
                    namespace: namespace.into(),
                    model: model.clone(),
                    allowed,
                });
            }
            continue;
        }
        match room(quotas, model, &costs.on(model)) {
            Ok(()) => with_room.push(model.clone()),
            Err(exceeded) => tried.push(exceeded),
        }
    }
    match (wanted.models.len(), with_room.len()) {
        (1, 1) => {
            let model = with_room.remove(0);
            let charge = costs.on(&model);
            Ok(Charge::Model { model, charge })
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
        _ => Ok(Charge::AtPlacement { models: with_room }),
    }
}

/// How a pod reaches its node, which decides when a pod accepting several models can
/// be charged: the extender charges it at placement only if it is the one placing it.
#[derive(Debug, Clone, Copy)]
pub enum Route<'a> {
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
pub fn models_for_route(
    namespace: &str,
    limits: &NamespaceLimits,
    wanted: WantedModels,
    route: Route<'_>,
) -> Result<WantedModels, Denial> {
    if !limits.has_quota {
        return Ok(wanted);
    }
    match route {
        Route::GpuScheduler => Ok(wanted),
        Route::OtherScheduler { .. } if wanted.models.len() < 2 => Ok(wanted),
        Route::OtherScheduler {
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
        Route::Bound { node, gpus } => {
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
pub fn room(quotas: &[QuotaView], label: &str, charge: &ModelAmounts) -> Result<(), Exceeded> {
    let models = charge.keys().filter(|k| !mig::is_profile_key(k));
    for model in std::iter::once(mig::model_of(label)).chain(models.map(String::as_str)) {
        if !quotas.is_empty() && !quotas.iter().any(|q| q.hard.contains_key(model)) {
            let amount = charge.get(model).copied().unwrap_or_default();
            return Err(unlisted(quotas, model, amount));
        }
    }
    for (key, amount) in charge {
        let listing = quotas.iter().filter(|q| q.hard.contains_key(key));
        listing
            .into_iter()
            .try_for_each(|q| q.room_for(key, *amount))?;
    }
    Ok(())
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

/// A pod as usage counting sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCharge<'a> {
    pub namespace: &'a str,
    /// What it is charged per quota key (empty: nothing, or not yet).
    pub charge: ModelAmounts,
    /// Finished or being deleted pods are not charged.
    pub live: bool,
}

/// Usage per model of one namespace, from its pods.
pub fn usage<'a>(namespace: &str, pods: impl IntoIterator<Item = PodCharge<'a>>) -> ModelAmounts {
    let mut used = ModelAmounts::new();
    for pod in pods
        .into_iter()
        .filter(|p| p.live && p.namespace == namespace)
    {
        for (key, amount) in pod.charge {
            let entry = used.entry(key).or_default();
            entry.0 = entry.0.saturating_add(amount.0);
        }
    }
    used
}

/// The part of a namespace's `usage` one quota reports (status, metrics): the models it
/// lists (`lists`) and those no quota of the namespace lists (`listed` holds every
/// model some quota lists). A pod charged to an unlisted model got around admission
/// (created before the quota, or while the webhook was down); its use is shown against
/// a quota of zero in every quota of the namespace rather than hidden.
pub fn reported_usage(
    usage: &ModelAmounts,
    lists: impl Fn(&str) -> bool,
    listed: &[String],
) -> ModelAmounts {
    usage
        .iter()
        .filter(|(key, _)| lists(key) || !(listed.contains(*key) || mig::is_profile_key(key)))
        .map(|(model, amount)| (model.clone(), *amount))
        .collect()
}

/// The node label a pod is charged by ([`charge_on`]): its only wanted model, else
/// (several accepted) the label of the node it was placed on, once placed; a pod that
/// wants a model and is on a single-strategy MIG node of it (`<model>-MIG-<profile>`)
/// is charged the node's slices. `None`: not charged (yet). A node of a model the pod
/// does not accept (reachable only around admission, e.g. a node relabelled since)
/// still charges its model: usage is what pods use.
pub fn charged_model<'a>(wanted: &'a [String], node_model: Option<&'a str>) -> Option<&'a str> {
    match (wanted, node_model) {
        ([only], Some(node)) if node != only && mig::model_of(node) == only => Some(node),
        _ => admitted_model(wanted, node_model),
    }
}

/// The node label a pod was charged by when it was admitted (a pod wanting one model)
/// or placed (several): what its pending total in the ledger holds, even once it costs
/// a MIG slice ([`charged_model`]).
pub fn admitted_model<'a>(wanted: &'a [String], node_model: Option<&'a str>) -> Option<&'a str> {
    match wanted {
        [only] => Some(only),
        _ => node_model,
    }
}
