//! Per-namespace, per-GPU-model quota: the `GPUQuota` custom resource (docs/design.md).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec` of a GPUQuota: GPUs per model, optional node pools and a default model.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gpu-admission.io",
    version = "v1alpha1",
    kind = "GPUQuota",
    plural = "gpuquotas",
    shortname = "gq",
    namespaced,
    status = "GpuQuotaStatus",
    printcolumn = r#"{"name":"Hard","type":"string","jsonPath":".spec.hard"}"#,
    printcolumn = r#"{"name":"Used","type":"string","jsonPath":".status.used"}"#,
    printcolumn = r#"{"name":"Queued","type":"string","jsonPath":".status.queued"}"#,
    printcolumn = r#"{"name":"Borrowed","type":"string","jsonPath":".status.borrowed"}"#,
    printcolumn = r#"{"name":"Lent","type":"string","jsonPath":".status.lent"}"#,
    printcolumn = r#"{"name":"OnExceed","type":"string","jsonPath":".spec.onExceed","priority":1}"#,
    printcolumn = r#"{"name":"Cohort","type":"string","jsonPath":".spec.cohort","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.borrowingLimit) || self.borrowingLimit.all(m, m in self.hard)",
        "message": "borrowingLimit may only name models that hard lists"
    },
    {
        "rule": "!has(self.lendingLimit) || self.lendingLimit.all(m, m in self.hard)",
        "message": "lendingLimit may only name models that hard lists"
    },
    {
        "rule": "has(self.cohort) || (!has(self.borrowingLimit) && !has(self.lendingLimit))",
        "message": "borrowingLimit and lendingLimit need a cohort"
    }
]))]
pub struct GpuQuotaSpec {
    /// GPUs per model, as Kubernetes quantities (`"4"`, `"1.5"`).
    #[schemars(schema_with = "gpu_amounts")]
    pub hard: BTreeMap<String, Quantity>,
    /// Node pools this namespace may use; empty or absent means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pools: Vec<String>,
    /// The model a pod that names none is charged to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) default_type: Option<String>,
    /// What becomes of a pod this quota has no room for (docs/quota.md).
    #[serde(default, skip_serializing_if = "OnExceed::is_deny")]
    pub(crate) on_exceed: OnExceed,
    /// GPUQuotas with the same cohort, in any namespaces, lend each other per model what
    /// they leave unused (docs/quota.md, "Cohorts").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "cohort_name")]
    pub(crate) cohort: Option<String>,
    /// Per model, how far past `hard` this quota may borrow; a model not listed: as far
    /// as the cohort lends.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "gpu_amounts")]
    pub(crate) borrowing_limit: BTreeMap<String, Quantity>,
    /// Per model, how much of `hard` this quota lends at most; a model not listed: all
    /// that it leaves unused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "gpu_amounts")]
    pub(crate) lending_limit: BTreeMap<String, Quantity>,
    /// How this quota takes back what it lent: `Evict` (the default) admits its pod at
    /// once and evicts borrowing pods; `Never` waits for them to finish.
    #[serde(default, skip_serializing_if = "cohort::Reclaim::is_evict")]
    pub(crate) reclaim: cohort::Reclaim,
}

fn cohort_name(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "A cohort's name: a DNS label",
        "type": "string",
        "maxLength": 63,
        "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    })
}

/// What becomes of a pod a quota has no room for.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub(crate) enum OnExceed {
    /// Refused at creation (tkestack's behaviour, the default).
    #[default]
    Deny,
    /// Admitted and charged past `hard`, with a warning the client prints: an audit mode
    /// for turning enforcement on in a live cluster.
    Warn,
    /// Created held by the scheduling gate `gpu-admission.io/quota`, charged and let go
    /// in priority-then-age order as room appears (docs/quota.md).
    Queue,
}

impl OnExceed {
    fn is_deny(&self) -> bool {
        *self == OnExceed::Deny
    }

    /// A bounded label for metrics.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            OnExceed::Deny => "deny",
            OnExceed::Warn => "warn",
            OnExceed::Queue => "queue",
        }
    }
}

/// A non-negative quantity, so that the API server itself refuses `-3` or `abc`.
const QUANTITY_PATTERN: &str =
    r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+]?[0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$";

fn gpu_amount(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "GPUs, a non-negative Kubernetes quantity such as 2 or 1.5",
        "x-kubernetes-int-or-string": true,
        "anyOf": [
            {"type": "integer", "minimum": 0},
            {"type": "string", "pattern": QUANTITY_PATTERN}
        ]
    })
}

fn gpu_amounts(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "GPUs per GPU model (the value of the node's model label)",
        "type": "object",
        "additionalProperties": gpu_amount(generator)
    })
}

/// `status` of a GPUQuota, maintained by gpu-admission.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuQuotaStatus {
    /// GPUs per model in use, including the charges of pods being created.
    #[serde(default)]
    #[schemars(schema_with = "gpu_amounts")]
    pub used: BTreeMap<String, Quantity>,
    /// Charges of admitted pods, totalled by the second each pod was created and its
    /// model: part of `used` until the reconciler sees the pods (then they count as pods)
    /// or the total expires (pods never created). A handful of entries however many pods
    /// are being created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingCharges>,
    /// Room a gpu-admission replica holds ahead of the pods it admits, part of `used`
    /// (`quota::grant`): one entry per replica and model at most, kept while it may be
    /// used and for a bound after.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<QuotaGrant>,
    /// Per-pod reservations written by earlier versions; read (until they expire) so an
    /// upgrade releases nothing in flight, never written any more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<QuotaReservation>,
    /// GPUs per model of the pods waiting in the quota queue (`onExceed: Queue`): not
    /// part of `used` until they are let go.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "gpu_amounts")]
    pub queued: BTreeMap<String, Quantity>,
    /// GPUs per model in use beyond `hard`, lent by other members of the cohort.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "gpu_amounts")]
    pub borrowed: BTreeMap<String, Quantity>,
    /// GPUs per model of this quota's `hard` that other members of the cohort use now.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "gpu_amounts")]
    pub lent: BTreeMap<String, Quantity>,
}

/// The charges of the pods created in one second, for one model (see `quota::pending`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingCharges {
    /// The pods' `creationTimestamp` (RFC 3339, whole seconds).
    created: String,
    pub model: String,
    #[schemars(schema_with = "gpu_amount")]
    amount: Quantity,
    /// How many pods the amount is for.
    #[serde(default)]
    pub pods: u32,
    /// The ids of the charges in the amount that can be taken back exactly (at most
    /// `quota::pending::MAX_IDS`): one per charge the quota queue's releaser wrote, so a
    /// releaser whose write failed without an answer takes back its own, if it was stored,
    /// and nothing else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    charge_ids: Vec<String>,
}

impl PendingCharges {
    /// Whether the quota queue's releaser has charged the pod with `uid` here: it is
    /// being let go, its gate about to come off.
    pub(crate) fn releases(&self, uid: &str) -> bool {
        let ids = self.charge_ids.iter();
        ids.map(|id| pending::release_of(id)).any(|of| of == uid)
    }
}

/// Room one gpu-admission replica holds in a quota (see `quota::grant`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaGrant {
    /// The holder's process and a count: new for every grant taken.
    pub(crate) id: String,
    /// The quota key (a model, or a MIG profile key).
    pub(crate) model: String,
    /// What is held: room not yet used, and the charges of pods admitted from it that
    /// the holder has not yet moved into `pending`.
    #[schemars(schema_with = "gpu_amount")]
    pub(crate) amount: Quantity,
    /// RFC 3339: the holder admits from it only until some seconds before this, and
    /// any reconciler drops it a pending total's lifetime after.
    pub(crate) until: String,
}

/// One admitted pod's charge, as versions before `pending` recorded it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaReservation {
    /// `name` of the pod in the quota's namespace.
    pod: String,
    #[serde(default)]
    uid: String,
    model: String,
    #[schemars(schema_with = "gpu_amount")]
    amount: Quantity,
    /// RFC 3339 time after which an unseen pod's reservation is released.
    expires: String,
}

/// What a namespace's GPUQuotas say about where its pods may go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceLimits {
    /// True when the namespace has at least one GPUQuota.
    pub(crate) has_quota: bool,
    pub(crate) default_type: Option<String>,
    /// Every model some quota lists (others have a quota of zero); MIG profile keys
    /// (`<model>/<profile>`) are not models.
    pub(crate) models: Vec<String>,
    /// MIG profile keys (`<model>/<profile>`) some quota lists.
    pub(crate) profile_caps: Vec<String>,
    /// Pools every quota that names pools allows (each limit must hold); empty = any.
    pub(crate) pools: Vec<String>,
    /// The models some `onExceed: Queue` quota lists: a pod wanting one of them waits in
    /// the quota queue (created gated, `quota::queue`).
    pub(crate) queued_models: Vec<String>,
}

impl NamespaceLimits {
    /// Whether a pod that wants only `model` (a model or a MIG slice label) is created
    /// gated, to wait in the quota queue.
    pub(crate) fn queues(&self, model: &str) -> bool {
        let model = crate::placement::mig::model_of(model);
        self.queued_models.iter().any(|m| m == model)
    }
}

impl NamespaceLimits {
    pub(crate) fn of<'a>(quotas: impl IntoIterator<Item = &'a GPUQuota>, namespace: &str) -> Self {
        let mut limits = NamespaceLimits::default();
        let mut pools: Option<Vec<String>> = None;
        let in_namespace = quotas
            .into_iter()
            .filter(|q| q.metadata.namespace.as_deref() == Some(namespace));
        for quota in in_namespace {
            limits.has_quota = true;
            if limits.default_type.is_none() {
                limits.default_type = quota.spec.default_type.clone();
            }
            for model in quota.spec.hard.keys() {
                // A MIG profile key (`<model>/<profile>`) queues its model's pods.
                let queued = model.split('/').next().unwrap_or(model);
                if quota.spec.on_exceed == OnExceed::Queue
                    && !limits.queued_models.iter().any(|m| m == queued)
                {
                    limits.queued_models.push(queued.to_string());
                }
                if crate::placement::mig::is_profile_key(model) {
                    if !limits.profile_caps.contains(model) {
                        limits.profile_caps.push(model.clone());
                    }
                } else if !limits.models.contains(model) {
                    limits.models.push(model.clone());
                }
            }
            if !quota.spec.pools.is_empty() {
                pools = Some(match pools {
                    None => quota.spec.pools.clone(),
                    Some(held) => held
                        .into_iter()
                        .filter(|p| quota.spec.pools.contains(p))
                        .collect(),
                });
            }
        }
        limits.pools = pools.unwrap_or_default();
        limits
    }
}

/// A GPUQuota whose spec or status cannot be read as amounts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPUQuota {quota}: {reason}")]
pub struct StatusError {
    pub(crate) quota: String,
    pub(crate) reason: String,
}

/// `namespace/name` of a quota, for messages.
pub(crate) fn quota_name(quota: &GPUQuota) -> String {
    format!(
        "{}/{}",
        quota.metadata.namespace.as_deref().unwrap_or_default(),
        quota.metadata.name.as_deref().unwrap_or_default()
    )
}

pub(crate) mod admit;
#[cfg(test)]
mod admit_tests;
mod charge;
pub mod cohort;
mod denial;
pub(crate) mod eligible;
pub(crate) mod grant;
pub(crate) mod legacy;
#[cfg(test)]
mod mig_tests;
pub(crate) mod pending;
pub(crate) mod pool;
mod price;
pub mod queue;
#[cfg(test)]
mod queue_tests;
pub(crate) mod status;
pub(crate) mod view;

pub(crate) use admit::{
    AdmitRules, Arrival, Charge, DEFAULT_SCHEDULER, UntypedPods, admit, models_for_arrival, room,
};
pub use charge::charge_on;
pub(crate) use charge::{Costs, ModelAmounts, add_charge, excess, reported_usage};
#[cfg(test)]
pub(crate) use charge::{PodCharge, usage};
pub(crate) use denial::{Denial, Exceeded};
pub use price::pending_label;
pub(crate) use price::{Charged, ChargedAt};
pub(crate) use view::QuotaView;
