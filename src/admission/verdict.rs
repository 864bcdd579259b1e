//! What a validating webhook answers: allow, or deny with a typed reason. A denial is a
//! value, never an error (an error of ours is a 5xx: the API server's failure policy
//! decides); its text is what `kubectl` prints after "denied the request:".

use crate::dra::AskError;
use crate::marks::{Change, Writer};
use crate::placement::RequestError;
use crate::quota::{Denial, Exceeded, OnExceed};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allow,
    /// Allowed past the `Warn` quotas listed: the answer carries a warning for each,
    /// which `kubectl` prints.
    Warn(Vec<Exceeded>),
    Deny(Reason),
}

impl Verdict {
    /// The warnings the answer carries: the denial each quota would have given, marked
    /// as not enforced.
    pub(crate) fn warnings(&self) -> Vec<String> {
        let Verdict::Warn(over) = self else {
            return Vec::new();
        };
        over.iter()
            .map(|e| format!("{e} (onExceed: Warn)"))
            .collect()
    }

    /// Every quota that had no room, with what it did: (namespace, model, action). A
    /// model no quota lists is the pod's own word: it is given as `unlisted`, so what
    /// is counted by it stays bounded by what the operator wrote.
    pub(crate) fn exceeded(&self) -> Vec<(&str, &str, &'static str)> {
        fn of<'e>(e: &'e Exceeded, action: &'static str) -> (&'e str, &'e str, &'static str) {
            let model = if e.listed {
                e.model.as_str()
            } else {
                "unlisted"
            };
            (e.namespace(), model, action)
        }
        match self {
            Verdict::Warn(over) => over.iter().map(|e| of(e, OnExceed::Warn.label())).collect(),
            Verdict::Deny(Reason::Quota(Denial::Exceeded(e)))
            | Verdict::Deny(Reason::Claim(ClaimDenial::Quota(Denial::Exceeded(e)))) => {
                vec![of(e, OnExceed::Deny.label())]
            }
            Verdict::Deny(Reason::Quota(Denial::NoModelHasRoom { tried, .. }))
            | Verdict::Deny(Reason::Claim(ClaimDenial::Quota(Denial::NoModelHasRoom {
                tried,
                ..
            }))) => tried
                .iter()
                .map(|e| of(e, OnExceed::Deny.label()))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Why an object is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Reason {
    /// The namespace's quotas do not admit the charge (the quota arithmetic's own).
    #[error("{0}")]
    Quota(Denial),
    #[error("invalid GPU request: {0}")]
    Request(RequestError),
    /// A ResourceClaim's requests cannot be read as GPU asks.
    #[error("{0}")]
    ClaimRequest(AskError),
    #[error("{0}")]
    Claim(ClaimDenial),
    /// A mark only gpu-admission (or gpu-manager) writes (`crate::marks`), changed by
    /// `user`, or (`user` none) on a pod being created.
    #[error("{}", match user {
        Some(user) => change.mark.refusal(&change.key, user),
        None => change.mark.refusal_at_create(&change.key),
    })]
    Mark {
        change: Change,
        user: Option<String>,
    },
}

impl Reason {
    /// A bounded label for metrics and logs.
    pub(crate) const fn kind(&self) -> &'static str {
        match self {
            Reason::Quota(_) => "quota",
            Reason::Request(_) => "request",
            Reason::ClaimRequest(_) | Reason::Claim(_) => "claim",
            Reason::Mark { change, .. } => match change.mark.writer {
                Writer::Nobody => "model_annotation",
                Writer::Placement => "placement_annotation",
                Writer::GpuAdmission => "gpu_admission_mark",
            },
        }
    }
}

/// Why a claim is refused (a denial, a value: its text is what `kubectl` prints).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimDenial {
    #[error("{0}")]
    Quota(Denial),
    /// `attribute`: the driver and the model attribute a CEL selector names.
    #[error(
        "ResourceClaim request {request} can be allocated GPUs of several models ({}), none of them namespace {namespace:?}'s default model; name one with a CEL selector on device.attributes[{:?}].{}",
        labels.join(", "), attribute.0, attribute.1
    )]
    Ambiguous {
        namespace: String,
        request: String,
        labels: Vec<String>,
        attribute: (String, String),
    },
    #[error(
        "ResourceClaim request {} names no GPU model and namespace {namespace:?} has no default model (defaultType in a GPUQuota); select one with a CEL selector on device.attributes[{:?}].{}",
        requests.join(", "), attribute.0, attribute.1
    )]
    Untyped {
        namespace: String,
        requests: Vec<String>,
        attribute: (String, String),
    },
    /// `devices`: what of the model it is charged for ("whole GPUs", "MIG 1g.10gb slices").
    #[error(
        "ResourceClaim request {request} is not pinned to the model it is charged for ({label}), {devices}: gpu-admission's mutating webhook adds the CEL selector {pin} (a claim created while the webhook was not called, or pinned by an earlier version to its model only, lacks it; or another webhook removed it)"
    )]
    Unpinned {
        request: String,
        label: String,
        devices: String,
        pin: String,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::admission::validate::validate;
    use crate::backend::Backend;
    use crate::cache::{CacheWriter, Projection};
    use crate::config::Config;
    use crate::placement::testing::{node, pod_with};
    use crate::quota::{GPUQuota, GpuQuotaSpec};

    /// A namespace whose quota allows one T4, on a cluster of one T4 node.
    fn backend(config: &Config) -> Backend {
        let cache = CacheWriter::in_memory(Projection::from_config(config));
        let mut quota = GPUQuota::new(
            "q",
            GpuQuotaSpec {
                hard: [("T4".to_string(), Quantity("1".into()))].into(),
                pools: vec![],
                default_type: Some("T4".into()),
                on_exceed: Default::default(),
                ..Default::default()
            },
        );
        quota.metadata.namespace = Some("team".into());
        cache.write(|state| {
            let mut t4 = node("n", 4, 16);
            t4.model = Some("T4".into());
            state.apply_node(t4);
            state.apply_quota(quota);
        });
        Backend::offline(cache)
    }

    fn gpu_pod(name: &str, gpus: &str) -> k8s_openapi::api::core::v1::Pod {
        let mut pod = pod_with(&[&[("nvidia.com/gpu", gpus)]]);
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("team".into());
        pod.metadata.uid = Some(format!("uid-{name}"));
        pod
    }

    #[tokio::test]
    async fn a_quota_denial_reaches_the_verdict_as_the_quota_said_it() {
        let config = Config::default();
        let backend = backend(&config);
        let first = validate(&backend, &config, "team", &gpu_pod("a", "1"), false).await;
        assert_eq!(first.unwrap(), Verdict::Allow);
        let second = validate(&backend, &config, "team", &gpu_pod("b", "1"), false).await;
        let Verdict::Deny(reason) = second.unwrap() else {
            panic!("the second GPU is over the quota of one");
        };
        assert!(
            matches!(&reason, Reason::Quota(Denial::Exceeded(e)) if e.model == "T4"),
            "{reason:?}"
        );
        assert_eq!(reason.kind(), "quota");
    }

    #[tokio::test]
    async fn an_unreadable_gpu_request_is_a_request_denial() {
        let config = Config::default();
        let (backend, pod) = (backend(&config), gpu_pod("c", "x"));
        let verdict = validate(&backend, &config, "team", &pod, false).await;
        let Verdict::Deny(reason) = verdict.unwrap() else {
            panic!("nvidia.com/gpu: x is not a number");
        };
        assert!(matches!(reason, Reason::Request(_)), "{reason:?}");
        assert!(
            reason.to_string().starts_with("invalid GPU request: "),
            "{reason}"
        );
    }
}
