//! The validating webhook: charge a new GPU pod to its namespace's quota, or deny it.
//! Offline, the in-memory cluster is the ledger and an admitted pod joins it; in API
//! mode the reservation is written to `GPUQuota.status` with optimistic concurrency.

use k8s_openapi::api::core::v1::Pod;

use crate::cache::{CachedPod, ClusterCache, pod_key};
use crate::config::Config;
use crate::placement::GpuRequest;
use crate::quota::NamespaceLimits;
use crate::quota::ledger::{AdmitRules, Charge, admit, amount_of};
use crate::quota::reserve::{self, Reserved};

/// What the webhook answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny(String),
}

/// Our own failure: answered with HTTP 5xx so the apiserver's failure policy decides.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error("cannot judge the pod: GPUQuota in namespace {namespace} is unreadable: {reason}")]
    BadQuota { namespace: String, reason: String },
    #[error(transparent)]
    Api(#[from] reserve::ReserveError),
}

impl ValidateError {
    pub const fn kind(&self) -> &'static str {
        match self {
            ValidateError::BadQuota { .. } => "bad_quota",
            ValidateError::Api(_) => "api",
        }
    }
}

/// Judge the creation of `pod` in `namespace`. `dry_run` evaluates without reserving.
pub async fn validate(
    cache: &ClusterCache,
    config: &Config,
    namespace: &str,
    pod: &Pod,
    dry_run: bool,
) -> Result<Verdict, ValidateError> {
    let request = match GpuRequest::from_pod(pod, &cache.projection().names) {
        Ok(Some(request)) => request,
        Ok(None) => return Ok(Verdict::Allow),
        Err(error) => return Ok(Verdict::Deny(format!("invalid GPU request: {error}"))),
    };
    let rules = AdmitRules {
        untyped: config.untyped_pods,
        quota_required: config.quota_required,
    };
    let amount = amount_of(&request);
    match cache.client() {
        None => Ok(offline(
            cache, config, namespace, pod, amount, rules, dry_run,
        )?),
        Some(client) => {
            let (wanted, cached) = cache.with_state(|state| {
                let quotas: Vec<_> = state.namespace_quotas(namespace).cloned().collect();
                let wanted = NamespaceLimits::of(&quotas, namespace).wanted_models(pod, config);
                (wanted, Some(quotas))
            });
            let identity = reserve::PodIdentity::of(pod);
            match reserve::reserve(
                &client, cached, namespace, &wanted, amount, rules, &identity, dry_run,
            )
            .await?
            {
                Reserved::Yes => Ok(Verdict::Allow),
                Reserved::Denied(denial) => Ok(Verdict::Deny(denial.to_string())),
            }
        }
    }
}

/// Offline: check and record under one lock, so concurrent creates never over-admit.
fn offline(
    cache: &ClusterCache,
    config: &Config,
    namespace: &str,
    pod: &Pod,
    amount: crate::placement::quantity::Milli,
    rules: AdmitRules,
    dry_run: bool,
) -> Result<Verdict, ValidateError> {
    let projection = cache.projection().clone();
    cache.with_state(|state| {
        let limits = NamespaceLimits::of(state.quotas(), namespace);
        let views = state
            .quota_views(namespace)
            .map_err(|reason| ValidateError::BadQuota {
                namespace: namespace.to_string(),
                reason,
            })?;
        let decision = admit(
            namespace,
            &views,
            &limits.wanted_models(pod, config),
            amount,
            rules,
        );
        match decision {
            Err(denial) => Ok(Verdict::Deny(denial.to_string())),
            Ok(charge) => {
                if !dry_run && let Ok(mut cached) = CachedPod::from_pod(pod, &projection) {
                    if let Charge::Model { model, .. } = charge {
                        cached.models = vec![model];
                    }
                    state.apply_pod(pod_key(pod), cached);
                }
                Ok(Verdict::Allow)
            }
        }
    })
}
