//! Claims' CEL selectors, evaluated for the cache and never under its lock
//! (docs/design.md, "One rule, one place"): what needs evaluating is copied out under
//! the lock ([`ClusterState::unevaluated`], [`ClusterState::unevaluated_claims`]),
//! evaluated outside it, in the CEL pool ([`Unevaluated::evaluate`]), and the results
//! applied under the lock if the claim and the DeviceClasses are still those evaluated
//! ([`ClusterState::apply_evaluated`]). A pinned request is charged by its pin and
//! compiles nothing; only requests without one (claims that did not pass the
//! webhooks) have their selectors evaluated, within one claim's budget each.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::dra::{Catalog, CatalogSource, ClaimAsks, DeviceRequest};

use super::super::pod::PodKey;
use super::claims::CachedClaim;
use super::{ClusterState, namespace_of};

/// Claims to evaluate, with what evaluating them needs.
#[derive(Debug, Default)]
pub(crate) struct Unevaluated {
    /// The DeviceClasses' version the sources were copied under.
    version: u64,
    claims: Vec<(PodKey, Arc<[DeviceRequest]>)>,
    /// By namespace ("" for none: to find the GPU classes the config does not list).
    sources: BTreeMap<String, CatalogSource>,
}

/// Claims' asks, evaluated.
#[derive(Debug, Default)]
pub(crate) struct Evaluated {
    version: u64,
    asks: Vec<(PodKey, Arc<[DeviceRequest]>, ClaimAsks)>,
    /// The GPU classes the config does not list, if looked for.
    found: Option<BTreeSet<String>>,
}

impl Unevaluated {
    pub(crate) fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.sources.is_empty()
    }

    /// Evaluate them: the CEL runs here (a claim whose selectors cannot be evaluated
    /// within its budget matches no model).
    pub(crate) fn evaluate(self) -> Evaluated {
        let mut catalogs: BTreeMap<String, Catalog> = self
            .sources
            .into_iter()
            .map(|(namespace, source)| (namespace, Catalog::from_source(source)))
            .collect();
        let found = catalogs
            .get("")
            .map(|c| c.found_gpu_classes().map(str::to_string).collect());
        let mut asks = Vec::with_capacity(self.claims.len());
        for (key, requests) in self.claims {
            let Some(catalog) = catalogs.get_mut(namespace_of(&key)) else {
                continue;
            };
            let evaluated = ClaimAsks::of_requests(&requests, catalog, false);
            asks.push((key, requests, evaluated.unwrap_or_default()));
        }
        Evaluated {
            version: self.version,
            asks,
            found,
        }
    }
}

impl Evaluated {
    /// Give `claims` the asks evaluated for them.
    pub(crate) fn give(self, claims: &mut [(PodKey, CachedClaim)]) {
        let mut asks: BTreeMap<PodKey, ClaimAsks> =
            self.asks.into_iter().map(|(k, _, a)| (k, a)).collect();
        for (key, claim) in claims {
            if let Some(asks) = asks.remove(key) {
                claim.asks = asks;
                claim.evaluated = Some(self.version);
            }
        }
    }
}

impl ClusterState {
    /// Of `claims` arriving from the watch, those to evaluate: the others are held with
    /// the same requests and asks evaluated under the current DeviceClasses, which they
    /// keep (an admitted claim keeps its verdict; no CEL runs again).
    pub(crate) fn unevaluated(&self, claims: &mut [(PodKey, CachedClaim)]) -> Unevaluated {
        let mut unevaluated = self.nothing_evaluated();
        for (key, claim) in claims.iter_mut() {
            match self.claims.get(key) {
                Some(held)
                    if held.requests == claim.requests
                        && held.evaluated == Some(self.classes_version) =>
                {
                    claim.asks = held.asks.clone();
                    claim.evaluated = held.evaluated;
                }
                _ => self.add(&mut unevaluated, key, &claim.requests),
            }
        }
        unevaluated
    }

    /// The held claims whose asks were not evaluated under the current DeviceClasses
    /// (a DeviceClass changed since).
    pub(crate) fn unevaluated_claims(&self) -> Unevaluated {
        let stale = self
            .claims
            .iter()
            .filter(|(_, c)| c.evaluated != Some(self.classes_version));
        let mut unevaluated = self.nothing_evaluated();
        for (key, claim) in stale {
            self.add(&mut unevaluated, key, &claim.requests);
        }
        if self.found_classes.0 != self.classes_version {
            unevaluated
                .sources
                .entry(String::new())
                .or_insert_with(|| self.catalog_source(""));
        }
        unevaluated
    }

    fn nothing_evaluated(&self) -> Unevaluated {
        Unevaluated {
            version: self.classes_version,
            ..Default::default()
        }
    }

    fn add(&self, unevaluated: &mut Unevaluated, key: &PodKey, requests: &Arc<[DeviceRequest]>) {
        let namespace = namespace_of(key);
        if !unevaluated.sources.contains_key(namespace) {
            let source = self.catalog_source(namespace);
            unevaluated.sources.insert(namespace.to_string(), source);
        }
        unevaluated.claims.push((key.clone(), requests.clone()));
    }

    /// Apply what was evaluated off the lock to the claims still held with the
    /// requests evaluated, if the DeviceClasses are still those it was evaluated under.
    pub(crate) fn apply_evaluated(&mut self, evaluated: Evaluated) {
        if evaluated.version != self.classes_version {
            return;
        }
        if let Some(found) = evaluated.found {
            self.log_found_classes(found);
        }
        for (key, requests, asks) in evaluated.asks {
            let Some(claim) = self.claims.get_mut(&key) else {
                continue;
            };
            if claim.requests == requests {
                claim.asks = asks;
                claim.evaluated = Some(evaluated.version);
                self.recharge_claim(&key);
            }
        }
    }

    /// Say which DeviceClasses the config does not list select GPUs (their claims are
    /// charged), once each.
    fn log_found_classes(&mut self, found: BTreeSet<String>) {
        for class in found.difference(&self.found_classes.1) {
            tracing::info!(
                class = class.as_str(),
                "DeviceClass can select GPUs: its claims are charged to the quota"
            );
        }
        self.found_classes = (self.classes_version, found);
    }

    /// Evaluate the claims due on the calling thread, the state borrowed throughout:
    /// offline loading (before anything else reads the cache) and tests only.
    pub(crate) fn evaluate_claims_now(&mut self) {
        let evaluated = self.unevaluated_claims().evaluate();
        self.apply_evaluated(evaluated);
    }
}
