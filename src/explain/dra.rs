//! The DRA stage: whether the selectors of a pod's ResourceClaims can match a GPU its
//! namespace may use. Each GPU request's CEL selectors, with its DeviceClass's, are
//! evaluated against every distinct published GPU device (never a sample: a sample
//! cannot say that nothing matches), within one claim's CEL budget. A claim already
//! allocated passes; a claim that does not exist yet, or asks for no GPU, says nothing.

use crate::cache::ClusterState;
use crate::dra::cel::CostBudget;
use crate::dra::{Catalog, DeviceRequest, ExactRequest, UNMATCHABLE};

use super::verdict::{Code, Stage};

/// The DRA stage of a pod of `namespace` with the ResourceClaims `claims`; `None` when
/// none of them asks for a GPU, or when their selectors cost more than the budget to
/// judge (nothing is claimed that was not worked out).
pub(super) fn stage(state: &ClusterState, namespace: &str, claims: &[Box<str>]) -> Option<Stage> {
    let stage = |code, message| Stage {
        stage: "dra",
        code,
        message,
    };
    let held: Vec<(&str, _)> = (claims.iter())
        .filter_map(|name| Some((&**name, state.claim(namespace, name)?)))
        .collect();
    if held.is_empty() {
        return None;
    }
    let chosen: String = held
        .iter()
        .flat_map(|(name, c)| chosen(name, &c.requests))
        .collect();
    if held.iter().all(|(_, claim)| claim.is_allocated()) {
        let message = format!("its ResourceClaims are allocated{chosen}");
        return Some(stage(Code::Fits, message));
    }
    let allowed = &state.namespace_limits(namespace).models;
    let devices: Vec<_> = state
        .gpu_devices()
        .distinct()
        .filter(|d| allowed.is_empty() || allowed.contains(&d.label))
        .map(|d| &*d.cel)
        .collect();
    let catalog = Catalog::from_source(state.catalog_source(namespace));
    let mut judged = false;
    for (name, claim) in held.iter().filter(|(_, c)| !c.is_allocated()) {
        let mut budget = CostBudget::default();
        for request in claim.requests.iter() {
            let matched = matches(&catalog, request, &devices, &mut budget)?;
            judged |= matched.is_some();
            if matched == Some(false) {
                let models = if allowed.is_empty() {
                    String::new()
                } else {
                    format!(
                        " of the models its namespace may use ({})",
                        allowed.join(", ")
                    )
                };
                let message = format!(
                    "ResourceClaim {name}, request {}: its selectors match none of the {} distinct GPU devices published{models}",
                    request.name,
                    devices.len()
                );
                return Some(stage(Code::SelectorNoMatch, message));
            }
        }
    }
    let message = format!("the selectors of its ResourceClaims match GPUs it may use{chosen}");
    judged.then(|| stage(Code::Fits, message))
}

/// Which alternative the quota chose of each of a claim's `firstAvailable` requests, and
/// why (the mutating webhook made every other GPU alternative unmatchable), as clauses
/// to append to a message.
fn chosen(claim: &str, requests: &[DeviceRequest]) -> Vec<String> {
    let mut said = Vec::new();
    for request in requests {
        let subs = request.first_available.iter().flatten();
        let closed = |s: &&crate::dra::SubRequest| s.request.expressions().contains(&UNMATCHABLE);
        let (shut, open): (Vec<_>, Vec<_>) = subs.enumerate().partition(|(_, s)| closed(s));
        let ([(at, kept)], false) = (open.as_slice(), shut.is_empty()) else {
            continue;
        };
        let why = match shut.iter().any(|(j, _)| j < at) {
            true => {
                "the alternatives before it had no room in the quota when the claim was created"
            }
            false => {
                "it was the first with room; the others were made unmatchable so that the claim is charged only the alternative it gets"
            }
        };
        said.push(format!(
            "; ResourceClaim {claim}, request {}: the quota chose alternative {} ({why})",
            request.name, kept.name
        ));
    }
    said
}

/// Whether `request` (one of its alternatives, for a `firstAvailable` request) can be
/// matched by one of `devices`: `Some(None)` when it is not for a GPU class; `None` when
/// it could not be judged (a selector refused, or over the budget).
fn matches(
    catalog: &Catalog,
    request: &DeviceRequest,
    devices: &[&crate::dra::cel::CelDevice],
    budget: &mut CostBudget,
) -> Option<Option<bool>> {
    let mut ask = |name: &str, exact: &ExactRequest| {
        let matched = catalog.matches_any(name, exact, devices.iter().copied(), budget);
        matched
            .inspect_err(|error| tracing::debug!(%error, "a claim's selectors not judged"))
            .ok()
    };
    if let Some(exact) = &request.exactly {
        return ask(&request.name, exact);
    }
    let mut verdict = None;
    for sub in request.first_available.iter().flatten() {
        let name = format!("{}/{}", request.name, sub.name);
        match ask(&name, &sub.request)? {
            Some(true) => return Some(Some(true)),
            Some(false) => verdict = Some(false),
            None => {}
        }
    }
    Some(verdict)
}
