//! The webhooks for ResourceClaims (docs/devices.md): the validating one charges a new
//! claim's GPU devices to its namespace's quota, in the same ledger as pods, or denies
//! it with the same message; the mutating one pins every GPU request to the model it is
//! charged for — DRA's counterpart of the node affinity pods get. Which model that is
//! comes from evaluating the request's (and its DeviceClass's) CEL selectors against
//! the devices the cluster publishes (`dra::Catalog`).

use serde_json::{Value, json};

use crate::backend::{Ask, Backend};
use crate::cache::ClusterCache;
use crate::cache::pool::PoolError;
use crate::cache::state::claims::{CachedClaim, claim_key, extended_owner};
use crate::config::{Config, UntypedPods};
use crate::dra::cel::CostBudget;
use crate::dra::{
    AskError, Catalog, CatalogSource, ClaimAsks, DeviceAsk, ExactRequest, Pin, Resolved,
    ResourceClaim, UNMATCHABLE,
};
use crate::placement::mig::MigResources;
use crate::placement::models::WantedModels;
use crate::quota::NamespaceLimits;
use crate::quota::{self, ModelAmounts, QuotaView, add_charge};
use crate::quota::{Costs, Denial};
use crate::wire::review::UserInfo;

use super::validate::{ValidateError, created_or_now, verdict};
use super::verdict::{ClaimDenial, Reason, Verdict};

/// What the cluster state says about a claim, copied under the lock: its selectors are
/// compiled and evaluated after, in the CEL pool (docs/design.md, "Doors and trust").
struct Copied {
    source: CatalogSource,
    limits: NamespaceLimits,
    /// It is the claim a scheduler made for a pod's extended resources: the pod is
    /// charged, not the claim.
    serves_pod: bool,
    /// The DeviceClasses' version `source` holds.
    classes: u64,
    /// The namespace's quotas with their usage now, when a request of the claim has
    /// alternatives to choose among (none when their status cannot be read).
    views: Option<Vec<QuotaView>>,
}

/// A claim as judged: the catalog its selectors were evaluated with, and the
/// namespace's limits.
struct Seen {
    catalog: Catalog,
    limits: NamespaceLimits,
}

/// What the review says of the claim's creator: whether it is one of the schedulers
/// (`schedulerUsers`), the only ones whose extended-resource claims are a pod's own
/// GPUs. The API server's word (docs/security.md, "What the quota trusts").
fn by_scheduler(config: &Config, user: &UserInfo) -> bool {
    config.scheduler_users.contains(&user.username)
}

fn copied(
    cache: &ClusterCache,
    namespace: &str,
    claim: &ResourceClaim,
    by_scheduler: bool,
) -> Copied {
    cache.read(|s| {
        let owner = extended_owner(claim).filter(|_| by_scheduler);
        Copied {
            source: s.catalog_source(namespace),
            limits: s.namespace_limits(namespace).clone(),
            serves_pod: s.serves_pod(namespace, claim.requests(), owner.as_ref()),
            classes: s.classes_version(),
            views: has_alternatives(claim)
                .then(|| s.namespace_quota(namespace).views().ok())
                .flatten(),
        }
    })
}

/// Whether a request of `claim` has several alternatives (`firstAvailable`).
fn has_alternatives(claim: &ResourceClaim) -> bool {
    (claim.requests().iter()).any(|r| r.first_available.as_ref().is_some_and(|a| a.len() > 1))
}

/// Judge the creation of `claim` in `namespace`, asked by `user`. `dry_run` evaluates
/// without charging. Its selectors are evaluated in the CEL pool: a full pool is our
/// own failure (a 503), never a denial.
pub(crate) async fn validate_claim(
    backend: &Backend,
    config: &Config,
    (namespace, user): (&str, &UserInfo),
    claim: &ResourceClaim,
    dry_run: bool,
) -> Result<Verdict, ValidateError> {
    let Some(mut joining) = CachedClaim::from_claim(claim, &config.dra) else {
        return Ok(Verdict::Allow);
    };
    backend.ensure_quotas(namespace).await?;
    let cache = backend.cache();
    let copied = copied(cache, namespace, claim, by_scheduler(config, user));
    let (catalog, asks) = evaluate(cache, copied.source, &joining, !copied.serves_pod).await?;
    // Joined with the asks evaluated here: the cache runs no CEL for it again.
    joining.evaluated = Some(copied.classes);
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let key = claim_key(namespace, name);
    if copied.serves_pod {
        joining.asks = asks.unwrap_or_default();
        if !dry_run {
            backend.admitted(|state| state.apply_claim(key, joining));
        }
        return Ok(Verdict::Allow);
    }
    let asks = match asks {
        Ok(asks) if asks.is_empty() => return Ok(Verdict::Allow),
        Ok(asks) => asks,
        Err(error) => return Ok(Verdict::Deny(Reason::ClaimRequest(error))),
    };
    let seen = Seen {
        catalog,
        limits: copied.limits,
    };
    let (wanted, costs) = match charged(config, namespace, &seen, &asks) {
        Ok(Some(charged)) => charged,
        Ok(None) => return Ok(Verdict::Allow),
        Err(denial) => return Ok(Verdict::Deny(Reason::Claim(denial))),
    };
    joining.asks = asks;
    let ask = Ask {
        wanted,
        costs,
        rules: config.admit_rules(),
        created: created_or_now(&claim.metadata),
        charge_id: None,
        dry_run,
    };
    let join = move |state: &mut crate::cache::ClusterState, _: &_| state.apply_claim(key, joining);
    let outcome = backend.charge(namespace, ask, join).await?;
    verdict(outcome)
}

/// The claim's catalog and asks (`strict`: a selector out of bounds fails them),
/// worked out in the CEL pool.
async fn evaluate(
    cache: &ClusterCache,
    source: CatalogSource,
    claim: &CachedClaim,
    strict: bool,
) -> Result<(Catalog, Result<ClaimAsks, AskError>), PoolError> {
    let requests = claim.requests.clone();
    let job = move || {
        let catalog = Catalog::from_source(source);
        let asks = ClaimAsks::of_requests(&requests, &catalog, strict);
        (catalog, asks)
    };
    cache.cel_pool().run(job).await
}

/// The model a claim is charged under and its cost, `None` when nothing is charged (the
/// namespace has no quota), or the denial's message. Every GPU request must carry the
/// pin of the model it is charged for.
fn charged(
    config: &Config,
    namespace: &str,
    seen: &Seen,
    asks: &ClaimAsks,
) -> Result<Option<(WantedModels, Costs)>, ClaimDenial> {
    let limits = &seen.limits;
    let default = limits.default_type.as_deref();
    let mut models = Vec::new();
    let mut untyped = Vec::new();
    let mut ambiguous = Vec::new();
    for ask in asks.all() {
        match ask.resolve(default) {
            Resolved::Model(label) => models.push((ask, label)),
            Resolved::Unnamed => untyped.push(ask.request.as_str()),
            Resolved::Ambiguous(labels) => ambiguous.push((ask.request.as_str(), labels)),
        }
    }
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
        return Err(ClaimDenial::Quota(denial));
    }
    let attribute = || {
        (
            config.dra.driver.clone(),
            config.dra.model_attribute.clone(),
        )
    };
    if let Some((request, labels)) = ambiguous.first() {
        return Err(ClaimDenial::Ambiguous {
            namespace: namespace.into(),
            request: request.to_string(),
            labels: labels.clone(),
            attribute: attribute(),
        });
    }
    if !untyped.is_empty() {
        return Err(ClaimDenial::Untyped {
            namespace: namespace.into(),
            requests: untyped.iter().map(|r| r.to_string()).collect(),
            attribute: attribute(),
        });
    }
    if let Some((ask, label)) = models.iter().find(|(ask, _)| ask.pinned.is_none()) {
        let pin = ask.pin(default).unwrap_or_else(|| Pin::whole(label));
        let mut devices = match &pin.profile {
            None => "whole GPUs".to_string(),
            Some(profile) => format!("MIG {profile} slices"),
        };
        if pin.shared {
            devices += " that can be shared (allowMultipleAllocations)";
        }
        return Err(ClaimDenial::Unpinned {
            request: ask.request.clone(),
            label: label.clone(),
            devices,
            pin: seen.catalog.pin(&pin),
        });
    }
    let charge = asks.charge(default, &config.resources.mig);
    let label = models.first().map(|(_, l)| l.clone()).unwrap_or_default();
    let wanted = WantedModels::one(label.clone());
    Ok(Some((wanted, Costs::single(label, charge))))
}

/// What the mutating webhook knows of a namespace's quotas to choose among a request's
/// alternatives: their views with usage now.
pub(super) struct Room<'a> {
    pub(super) views: &'a [QuotaView],
    pub(super) mig: &'a MigResources,
}

/// The mutating webhook's work on a claim: its patch, and what it tells the creator.
#[derive(Debug, Default)]
pub(crate) struct Pinned {
    pub(crate) patch: json_patch::Patch,
    pub(crate) warnings: Vec<String>,
}

/// One GPU request or alternative of a claim, as the mutating webhook sees it.
struct Pinning<'a> {
    path: String,
    exact: &'a ExactRequest,
    ask: DeviceAsk,
}

/// The patch that adds, to every GPU request of `claim` and every alternative, the
/// selector that pins it to what it is charged for: its model, whole GPUs or one MIG
/// profile, and shareable devices for a request asking part of their capacity
/// (`DeviceAsk::pin`; none for a request whose model cannot be decided: the validating
/// webhook refuses it). Of a request's GPU alternatives, with `room`, the quota keeps
/// the first (in the user's order) whose model has room for it and makes every other
/// unmatchable ([`UNMATCHABLE`]), so the claim is charged the alternative it will get.
fn pin_patch(
    claim: &ResourceClaim,
    catalog: &Catalog,
    limits: &NamespaceLimits,
    room: Option<&Room>,
) -> Pinned {
    let default = limits.default_type.as_deref();
    let mut operations: Vec<Value> = Vec::new();
    let mut warnings = Vec::new();
    let mut budget = CostBudget::default();
    let mut gpu = |path: String, name: &str, exact| {
        let ask = catalog.ask(name, exact, &mut budget).ok().flatten()?;
        (!ask.unmatchable).then_some(Pinning { path, exact, ask })
    };
    let mut exact = Vec::new();
    let mut groups = Vec::new();
    for (i, request) in claim.requests().iter().enumerate() {
        if let Some(request_exact) = &request.exactly {
            let path = format!("/spec/devices/requests/{i}/exactly");
            exact.extend(gpu(path, &request.name, request_exact));
        }
        let mut group = Vec::new();
        for (j, sub) in request.first_available.iter().flatten().enumerate() {
            let path = format!("/spec/devices/requests/{i}/firstAvailable/{j}");
            let name = format!("{}/{}", request.name, sub.name);
            group.extend(gpu(path, &name, &sub.request));
        }
        groups.push((request.name.as_str(), group));
    }
    let pin = |p: &Pinning| {
        let pin = pin_to_add(&p.ask, default)?;
        Some(add_selector(&p.path, p.exact, &catalog.pin(&pin)))
    };
    operations.extend(exact.iter().filter_map(pin));
    // What the exact requests cost: an alternative needs room beside them.
    let mut fixed = ModelAmounts::new();
    for p in &exact {
        if let (Some(room), Some(pin)) = (room, p.ask.pin(default)) {
            add_charge(&mut fixed, &catalog.pinned_charge(&p.ask, &pin, room.mig));
        }
    }
    for (request, group) in groups {
        let chosen = match room.filter(|_| group.len() > 1) {
            Some(room) => choose(
                request,
                &group,
                catalog,
                default,
                (room, &fixed),
                &mut warnings,
            ),
            None => None,
        };
        for (j, p) in group.iter().enumerate() {
            match chosen {
                Some(c) if c != j => operations.push(add_selector(&p.path, p.exact, UNMATCHABLE)),
                _ => operations.extend(pin(p)),
            }
        }
    }
    let patch = serde_json::from_value(Value::Array(operations));
    Pinned {
        patch: patch.unwrap_or(json_patch::Patch(Vec::new())),
        warnings,
    }
}

/// Which of `request`'s GPU alternatives the quota keeps: the first whose pin has room
/// beside `fixed` (the claim's other requests), saying in `warnings` why each before it
/// was passed over; `None` when none has room (each is then pinned, and the validating
/// webhook refuses the claim, charged the largest).
fn choose(
    request: &str,
    group: &[Pinning],
    catalog: &Catalog,
    default: Option<&str>,
    (room, fixed): (&Room, &ModelAmounts),
    warnings: &mut Vec<String>,
) -> Option<usize> {
    let mut passed = Vec::new();
    for (j, p) in group.iter().enumerate() {
        let Some(pin) = p.ask.pin(default) else {
            continue;
        };
        let mut charge = fixed.clone();
        add_charge(&mut charge, &catalog.pinned_charge(&p.ask, &pin, room.mig));
        match quota::room(room.views, &pin.label, &charge) {
            Ok(()) => {
                if !passed.is_empty() {
                    warnings.push(format!(
                        "ResourceClaim request {request}: the quota chose alternative {} ({}); {}",
                        p.ask.request,
                        pin.label,
                        passed.join("; ")
                    ));
                }
                return Some(j);
            }
            Err(exceeded) => passed.push(format!(
                "alternative {} ({}) was made unmatchable: {exceeded}",
                p.ask.request, pin.label
            )),
        }
    }
    None
}

/// The pin to add to a request, unless it carries one.
fn pin_to_add(ask: &DeviceAsk, default: Option<&str>) -> Option<Pin> {
    match ask.pinned {
        Some(_) => None,
        None => ask.pin(default),
    }
}

fn add_selector(path: &str, request: &ExactRequest, expression: &str) -> Value {
    let selector = json!({"cel": {"expression": expression}});
    match request.selectors.is_empty() {
        true => json!({"op": "add", "path": format!("{path}/selectors"), "value": [selector]}),
        false => json!({"op": "add", "path": format!("{path}/selectors/-"), "value": selector}),
    }
}

/// The mutating webhook's patch for `claim` in `namespace`, created by `user` (none for
/// a scheduler's claim that serves a pod's extended resources), worked out in the CEL
/// pool: a full pool is our own failure (a 503), never a denial.
pub(crate) async fn mutate_claim(
    cache: &ClusterCache,
    config: &Config,
    (namespace, user): (&str, &UserInfo),
    claim: Box<ResourceClaim>,
) -> Result<Pinned, PoolError> {
    let copied = copied(cache, namespace, &claim, by_scheduler(config, user));
    if copied.serves_pod {
        return Ok(Pinned::default());
    }
    let (source, limits, views) = (copied.source, copied.limits, copied.views);
    let mig = config.resources.mig.clone();
    let job = move || {
        let views = views.filter(|v| !v.is_empty());
        let room = views.as_deref().map(|views| Room { views, mig: &mig });
        pin_patch(
            &claim,
            &Catalog::from_source(source),
            &limits,
            room.as_ref(),
        )
    };
    cache.cel_pool().run(job).await
}

#[cfg(test)]
#[path = "claim_pin_tests.rs"]
mod pin_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::pin_tests::limits;
    use super::*;
    use crate::dra::Dra;
    use crate::dra::classes::DeviceClasses;
    use crate::dra::slices::DeviceIndex;

    fn catalog() -> Catalog {
        let known = ["A100-SXM4-80GB".to_string(), "Tesla-T4".to_string()];
        Catalog::new(
            &Dra::default(),
            &DeviceClasses::new(),
            &DeviceIndex::default(),
            known,
        )
    }

    fn seen(default: Option<&str>) -> Seen {
        Seen {
            catalog: catalog(),
            limits: limits(default),
        }
    }

    fn claim(requests: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({"spec": {"devices": {"requests": requests}}})).unwrap()
    }

    fn patched(claim: &ResourceClaim, patch: &json_patch::Patch) -> ResourceClaim {
        let mut pinned = serde_json::to_value(claim).unwrap();
        json_patch::patch(&mut pinned, patch).unwrap();
        serde_json::from_value(pinned).unwrap()
    }

    const T4: &str = r#"device.attributes["gpu.nvidia.com"].productName == "Tesla T4""#;

    #[test]
    fn every_gpu_request_is_pinned_to_the_model_it_is_charged_for() {
        let claim = claim(json!([
            {"name": "any", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
            {"name": "typed", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel":
                {"expression": T4}}]}},
            {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com"}},
            {"name": "alt", "firstAvailable": [
                {"name": "one", "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": "true"}}]}]}
        ]));
        let catalog = catalog();
        let patch = pin_patch(&claim, &catalog, &limits(Some("A100-SXM4-80GB")), None).patch;
        let a100 = catalog.pin(&Pin::whole("A100-SXM4-80GB"));
        let t4 = catalog.pin(&Pin::whole("Tesla-T4"));
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "add", "path": "/spec/devices/requests/0/exactly/selectors",
                    "value": [{"cel": {"expression": a100}}]},
                {"op": "add", "path": "/spec/devices/requests/1/exactly/selectors/-",
                    "value": {"cel": {"expression": t4}}},
                {"op": "add", "path": "/spec/devices/requests/3/firstAvailable/0/selectors/-",
                    "value": {"cel": {"expression": a100}}}
            ])
        );
        let pinned = patched(&claim, &patch);
        let asks = ClaimAsks::of(&pinned, &catalog).unwrap();
        assert!(asks.all().all(|a| a.pinned.is_some()), "{asks:?}");
        let (_, costs) = charged(
            &Config::default(),
            "team-a",
            &seen(Some("A100-SXM4-80GB")),
            &asks,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            costs,
            Costs::single(
                "A100-SXM4-80GB".into(),
                asks.charge(Some("A100-SXM4-80GB"), &Default::default())
            )
        );
        assert!(
            pin_patch(&pinned, &catalog, &limits(Some("A100-SXM4-80GB")), None)
                .patch
                .0
                .is_empty(),
            "pinned once"
        );
        // Without a default, a request that matches both models cannot be pinned.
        let unpinned = pin_patch(&claim, &catalog, &limits(None), None).patch;
        assert_eq!(unpinned.0.len(), 1, "only the T4 request: {unpinned:?}");
    }

    #[test]
    fn a_gpu_request_without_its_pin_is_refused_by_name() {
        let claim = claim(
            json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": T4}}]}}]),
        );
        let asks = ClaimAsks::of(&claim, &catalog()).unwrap();
        let error = charged(&Config::default(), "team-a", &seen(None), &asks)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "ResourceClaim request gpu is not pinned to the model it is charged for (Tesla-T4)"
            ),
            "{error}"
        );
    }

    #[test]
    fn an_untyped_claim_without_a_default_is_refused_by_name() {
        let claim = claim(
            json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.attributes[\"gpu.nvidia.com\"].productName == \"H100\""}}]}}]),
        );
        let asks = ClaimAsks::of(&claim, &catalog()).unwrap();
        let error = charged(&Config::default(), "team-a", &seen(None), &asks)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            r#"ResourceClaim request gpu names no GPU model and namespace "team-a" has no default model (defaultType in a GPUQuota); select one with a CEL selector on device.attributes["gpu.nvidia.com"].productName"#
        );
        let mut free = seen(None);
        free.limits = NamespaceLimits::default();
        assert!(matches!(
            charged(&Config::default(), "team-a", &free, &asks),
            Ok(None)
        ));
    }

    #[test]
    fn a_request_matching_several_models_without_the_default_is_refused() {
        let claim =
            claim(json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]));
        let asks = ClaimAsks::of(&claim, &catalog()).unwrap();
        let error = charged(&Config::default(), "team-a", &seen(None), &asks)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            r#"ResourceClaim request gpu can be allocated GPUs of several models (A100-SXM4-80GB, Tesla-T4), none of them namespace "team-a"'s default model; name one with a CEL selector on device.attributes["gpu.nvidia.com"].productName"#
        );
    }
}

#[cfg(test)]
#[path = "claim_share_tests.rs"]
mod share_tests;
