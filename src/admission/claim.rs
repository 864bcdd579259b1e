//! The webhooks for ResourceClaims (docs/devices.md): the validating one charges a new
//! claim's GPU devices to its namespace's quota, in the same ledger as pods, or denies
//! it with the same message; the mutating one pins the namespace's default model on
//! GPU requests that name none — DRA's counterpart of the node affinity pods get.

use serde_json::{Value, json};

use crate::cache::ClusterCache;
use crate::cache::state::claims::{CachedClaim, claim_key};
use crate::config::{Config, UntypedPods};
use crate::dra::{ClaimAsks, Dra, ResourceClaim};
use crate::placement::models::{ModelSource, WantedModels};
use crate::quota::NamespaceLimits;
use crate::quota::ledger::{AdmitRules, Costs, Denial, admit};
use crate::quota::reserve;

use super::validate::{ValidateError, Verdict, created_or_now, offline_views, reserved};

/// Judge the creation of `claim` in `namespace`. `dry_run` evaluates without charging.
pub async fn validate_claim(
    cache: &ClusterCache,
    config: &Config,
    namespace: &str,
    claim: &ResourceClaim,
    dry_run: bool,
) -> Result<Verdict, ValidateError> {
    // What joins the cluster (offline) is what is judged: the claim's GPU requests.
    let joining = CachedClaim::from_claim(claim, &config.dra);
    let Some(joining) = joining.filter(|c| !c.asks.is_empty()) else {
        return Ok(Verdict::Allow);
    };
    let limits = cache.with_state(|s| s.namespace_limits(namespace).clone());
    let (wanted, costs) = match charged(config, namespace, &limits, &joining.asks) {
        Ok(Some(charged)) => charged,
        Ok(None) => return Ok(Verdict::Allow),
        Err(message) => return Ok(Verdict::Deny(message)),
    };
    let ask = reserve::Ask {
        wanted,
        costs,
        rules: AdmitRules::of(config),
        created: created_or_now(&claim.metadata),
        dry_run,
    };
    if let Some(ledger) = cache.ledger() {
        return reserved(ledger, cache, namespace, ask).await;
    }
    // Offline: decide and join the cluster under one lock.
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    cache.with_state(|state| {
        let views = offline_views(state, namespace)?;
        match admit(namespace, &views, &ask.wanted, &ask.costs, ask.rules) {
            Err(denial) => Ok(Verdict::Deny(denial.to_string())),
            Ok(_) => {
                if !dry_run {
                    state.apply_claim(claim_key(namespace, name), joining);
                }
                Ok(Verdict::Allow)
            }
        }
    })
}

/// The model a claim is charged under and its cost, `None` when nothing is charged (the
/// namespace has no quota), or the denial's message.
fn charged(
    config: &Config,
    namespace: &str,
    limits: &NamespaceLimits,
    asks: &ClaimAsks,
) -> Result<Option<(WantedModels, Costs)>, String> {
    let untyped: Vec<&str> = asks.untyped().map(|a| a.request.as_str()).collect();
    if !limits.has_quota {
        let denial = match () {
            _ if config.quota_required => Denial::QuotaRequired {
                namespace: namespace.into(),
            },
            _ if !untyped.is_empty() && config.untyped_pods == UntypedPods::Deny => {
                Denial::UntypedDenied {
                    namespace: namespace.into(),
                }
            }
            _ => return Ok(None),
        };
        return Err(denial.to_string());
    }
    let default = limits.default_type.as_deref();
    if !untyped.is_empty() && default.is_none() {
        return Err(untyped_message(&config.dra, namespace, &untyped));
    }
    let charge = asks.charge(default, &config.resources.mig);
    let label = asks
        .all()
        .find_map(|a| a.model.clone())
        .or_else(|| default.map(str::to_string))
        .unwrap_or_default();
    let wanted = WantedModels {
        models: vec![label.clone()],
        source: ModelSource::Annotation,
    };
    Ok(Some((wanted, Costs::single(label, charge))))
}

fn untyped_message(dra: &Dra, namespace: &str, untyped: &[&str]) -> String {
    format!(
        "ResourceClaim request {} names no GPU model and namespace {namespace:?} has no default model (defaultType in a GPUQuota); select one with a CEL selector on device.attributes[{:?}].{}",
        untyped.join(", "),
        dra.driver,
        dra.model_attribute
    )
}

/// The JSON Patch that adds a selector for the namespace's default model to every GPU
/// request of `claim` that names no model (empty when there is none to pin, or the
/// namespace has no default). `products` gives the model attribute values the cluster's
/// devices publish for a model label.
pub fn pin_patch(
    claim: &ResourceClaim,
    dra: &Dra,
    limits: &NamespaceLimits,
    products: impl Fn(&str) -> Vec<String>,
) -> json_patch::Patch {
    let Some(default) = limits.default_type.as_deref() else {
        return json_patch::Patch(Vec::new());
    };
    let selector = json!({"cel": {"expression": dra.pin_expression(default, &products(default))}});
    let mut operations: Vec<Value> = Vec::new();
    for (i, request) in claim.requests().iter().enumerate() {
        if let Some(exact) = &request.exactly {
            let path = format!("/spec/devices/requests/{i}/exactly");
            pin(&mut operations, &path, exact, dra, &selector);
        }
        for (j, sub) in request.first_available.iter().flatten().enumerate() {
            let path = format!("/spec/devices/requests/{i}/firstAvailable/{j}");
            pin(&mut operations, &path, &sub.request, dra, &selector);
        }
    }
    serde_json::from_value(Value::Array(operations)).unwrap_or(json_patch::Patch(Vec::new()))
}

/// Add `selector` to the request at `path` if it is a GPU request naming no model.
fn pin(
    operations: &mut Vec<Value>,
    path: &str,
    request: &crate::dra::ExactRequest,
    dra: &Dra,
    selector: &Value,
) {
    let untyped = crate::dra::ask_of("", request, dra).is_some_and(|ask| ask.model.is_none());
    if !untyped {
        return;
    }
    operations.push(match request.selectors.is_empty() {
        true => json!({"op": "add", "path": format!("{path}/selectors"), "value": [selector]}),
        false => json!({"op": "add", "path": format!("{path}/selectors/-"), "value": selector}),
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn limits(default: Option<&str>) -> NamespaceLimits {
        NamespaceLimits {
            has_quota: true,
            default_type: default.map(str::to_string),
            models: vec!["A100-SXM4-80GB".into(), "Tesla-T4".into()],
            ..Default::default()
        }
    }

    #[test]
    fn requests_naming_no_model_get_the_default_pinned() {
        let claim: ResourceClaim = serde_json::from_value(json!({"spec": {"devices": {"requests": [
            {"name": "any", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
            {"name": "typed", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel":
                {"expression": "device.attributes[\"gpu.nvidia.com\"].productName == \"Tesla T4\""}}]}},
            {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com"}},
            {"name": "alt", "firstAvailable": [
                {"name": "one", "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": "true"}}]}]}
        ]}}}))
        .unwrap();
        let dra = Dra::default();
        let products = |_: &str| vec!["NVIDIA A100-SXM4-80GB".to_string()];
        let patch = pin_patch(&claim, &dra, &limits(Some("A100-SXM4-80GB")), products);
        let expression =
            r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA A100-SXM4-80GB"]"#;
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "add", "path": "/spec/devices/requests/0/exactly/selectors",
                    "value": [{"cel": {"expression": expression}}]},
                {"op": "add", "path": "/spec/devices/requests/3/firstAvailable/0/selectors/-",
                    "value": {"cel": {"expression": expression}}}
            ])
        );
        let mut pinned = serde_json::to_value(&claim).unwrap();
        json_patch::patch(&mut pinned, &patch).unwrap();
        let pinned: ResourceClaim = serde_json::from_value(pinned).unwrap();
        let asks = ClaimAsks::of(&pinned, &dra);
        assert_eq!(asks.untyped().count(), 0, "{asks:?}");
        assert!(
            pin_patch(&claim, &dra, &limits(None), products)
                .0
                .is_empty()
        );
    }

    #[test]
    fn an_untyped_claim_without_a_default_is_refused_by_name() {
        let claim: ResourceClaim =
            serde_json::from_value(json!({"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}))
            .unwrap();
        let asks = ClaimAsks::of(&claim, &Dra::default());
        let error = charged(&Config::default(), "team-a", &limits(None), &asks).unwrap_err();
        assert_eq!(
            error,
            r#"ResourceClaim request gpu names no GPU model and namespace "team-a" has no default model (defaultType in a GPUQuota); select one with a CEL selector on device.attributes["gpu.nvidia.com"].productName"#
        );
        let free = NamespaceLimits::default();
        assert!(matches!(
            charged(&Config::default(), "team-a", &free, &asks),
            Ok(None)
        ));
    }
}
