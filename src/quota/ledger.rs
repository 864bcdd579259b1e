//! Quota arithmetic (DESIGN §3.2–3.3), pure: what a pod would be charged, whether the
//! namespace's quotas have room, and the denial a person reads when they do not.

use std::collections::BTreeMap;
use std::fmt;

use crate::config::UntypedPods;
use crate::placement::GpuRequest;
use crate::placement::models::{ModelSource, WantedModels};
use crate::placement::quantity::Milli;

use super::GPUQuota;

/// GPUs per model, in thousandths of a GPU.
pub type ModelAmounts = BTreeMap<String, Milli>;

/// A pod's GPU amount (the effective request) in thousandths of a GPU.
pub fn amount_of(request: &GpuRequest) -> Milli {
    // 100 vcuda-core = 1 GPU = 1000 milli.
    Milli(request.core_units().saturating_mul(10))
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
    /// Charge `amount` to `model` now.
    Model { model: String, amount: Milli },
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
        }
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

/// Decide how a GPU pod in `namespace` is charged, given the namespace's quotas with
/// their current usage. Every quota that lists a model limits it; a model no quota
/// lists is not allowed once the namespace has a quota.
pub fn admit(
    namespace: &str,
    quotas: &[QuotaView],
    wanted: &WantedModels,
    amount: Milli,
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
        if !allowed.contains(model) {
            if wanted.models.len() == 1 {
                return Err(Denial::ModelNotAllowed {
                    namespace: namespace.into(),
                    model: model.clone(),
                    allowed,
                });
            }
            continue;
        }
        match room(quotas, model, amount) {
            Ok(()) => with_room.push(model.clone()),
            Err(exceeded) => tried.push(exceeded),
        }
    }
    match (wanted.models.len(), with_room.len()) {
        (1, 1) => Ok(Charge::Model {
            model: with_room.remove(0),
            amount,
        }),
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

/// Whether every quota listing `model` has room for `amount` more.
pub fn room(quotas: &[QuotaView], model: &str, amount: Milli) -> Result<(), Exceeded> {
    quotas
        .iter()
        .filter(|q| q.hard.contains_key(model))
        .try_for_each(|q| q.room_for(model, amount))
}

pub fn listed_models(quotas: &[QuotaView]) -> Vec<String> {
    let mut models: Vec<String> = quotas.iter().flat_map(|q| q.hard.keys().cloned()).collect();
    models.sort();
    models.dedup();
    models
}

/// A pod as usage counting sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCharge<'a> {
    pub namespace: &'a str,
    /// The model it is charged to, if any (single wanted model, or its node's model).
    pub model: Option<&'a str>,
    pub amount: Milli,
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
        if let Some(model) = pod.model {
            let entry = used.entry(model.to_string()).or_default();
            entry.0 = entry.0.saturating_add(pod.amount.0);
        }
    }
    used
}

/// The model a pod is charged to: its only wanted model, else (several accepted) the
/// model of the node it was placed on, once placed. `None`: not charged (yet).
pub fn charged_model<'a>(wanted: &'a [String], node_model: Option<&'a str>) -> Option<&'a str> {
    match wanted {
        [only] => Some(only),
        [] => node_model,
        several => node_model.filter(|m| several.iter().any(|w| w == m)),
    }
}
