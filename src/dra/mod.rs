//! Dynamic Resource Allocation (`resource.k8s.io/v1`): GPUs handed out through
//! ResourceClaims (docs/devices.md). Pure: which requests of a claim are for GPUs (their
//! DeviceClass is configured, or its selectors can match the GPU driver's devices), which
//! model each is charged for, what the claim is charged, and the selector that pins a
//! request to what it is charged for.
//!
//! A claim is charged per device, like Kubernetes' own quota counts claims: an
//! `ExactCount` request its count, an `All` request the most devices one claim can be
//! allocated (32), a request of prioritized alternatives (`firstAvailable`) the largest
//! alternative per quota key. The model is decided by evaluating the request's CEL
//! selectors and its DeviceClass's ([`cel`]) against samples of the devices the
//! ResourceSlices publish, or made-up devices of the models the quotas know
//! ([`Catalog`]). A sample cannot say what a selector matches among the devices it does
//! not hold, so the charge is not taken from it: the mutating webhook pins every GPU
//! request ([`Pin`]: the model, and whole GPUs or one MIG profile, ANDed with everything
//! else) and the claim is charged by its pins, what the dearest device each lets the
//! allocator choose costs (docs/devices.md, "The pin"). Once allocated, the devices' own
//! attributes say what the claim holds.

/// `kube::Resource` for a `resource.k8s.io/v1` type of ours that holds only the fields
/// gpu-admission reads (`metadata` included), so the watches can list and watch it.
macro_rules! lite_resource {
    ($type:ty, $kind:literal, $plural:literal, $scope:ident) => {
        impl kube::Resource for $type {
            type DynamicType = ();
            type Scope = kube::core::$scope;
            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                "resource.k8s.io".into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                "v1".into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
use lite_resource;

mod capacity;
mod catalog;
pub mod cel;
pub mod classes;
mod pin;
pub mod slices;
mod source;
mod wire;

use std::collections::BTreeMap;

use capacity::scaled;

use serde::Deserialize;

use crate::placement::mig::{self, MigResources};
use crate::placement::quantity::Milli;
use crate::placement::{GpuDemand, GpuRequest, MigDemand};
use crate::quota::{ModelAmounts, add_charge, charge_on};

pub(crate) use capacity::Asks;
pub use catalog::Catalog;
pub(crate) use pin::Pin;
pub(crate) use source::CatalogSource;
pub use wire::ResourceClaim;
pub(crate) use wire::{DeviceRequest, ExactRequest, SubRequest};

/// Kubernetes' `AllocationResultsMaxSize`: what an `All` request can be allocated at most.
pub(crate) const ALL_DEVICES: u32 = 32;

/// DRA configuration (`dra` in the config file); NVIDIA's DRA driver by default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Dra {
    /// Watch ResourceClaims and ResourceSlices and admit claims (needs
    /// `resource.k8s.io/v1`, Kubernetes ≥ 1.34).
    pub(crate) enabled: bool,
    /// The attribute domain of the GPU driver's devices (`device.attributes["<driver>"]`).
    pub(crate) driver: String,
    /// The device attribute that names the GPU model.
    pub(crate) model_attribute: String,
    /// The device attribute that names a MIG device's profile.
    profile_attribute: String,
    /// DeviceClasses whose devices are GPUs, each with the model it implies (empty: the
    /// model comes from the claim's selectors).
    device_classes: BTreeMap<String, String>,
    /// Stripped from the model attribute before spaces become dashes, so that
    /// `productName` "NVIDIA A100-SXM4-80GB" is the node label "A100-SXM4-80GB".
    product_prefix: String,
}

impl Default for Dra {
    fn default() -> Self {
        Dra {
            enabled: true,
            driver: "gpu.nvidia.com".into(),
            model_attribute: "productName".into(),
            profile_attribute: "profile".into(),
            device_classes: [
                ("gpu.nvidia.com".to_string(), String::new()),
                ("mig.nvidia.com".to_string(), String::new()),
            ]
            .into(),
            product_prefix: "NVIDIA ".into(),
        }
    }
}

impl Dra {
    /// The model label of a device's model attribute value.
    fn label_of_product(&self, product: &str) -> String {
        let name = product
            .strip_prefix(self.product_prefix.as_str())
            .unwrap_or(product);
        name.trim().replace(' ', "-")
    }

    /// The model attribute values a device of `label` may carry, when no device of it
    /// is published yet: with and without the prefix, with dashes or spaces.
    fn products_of_label(&self, label: &str) -> Vec<String> {
        let spaced = label.replace('-', " ");
        let mut products = vec![
            format!("{}{label}", self.product_prefix),
            label.to_string(),
            format!("{}{spaced}", self.product_prefix),
            spaced,
        ];
        products.sort();
        products.dedup();
        products
    }
}

/// One GPU request (or alternative) of a claim: which models its selectors (and its
/// DeviceClass's) can be allocated, and how many devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceAsk {
    /// The request's name (`<request>/<subrequest>` for an alternative).
    pub(crate) request: String,
    /// The model labels of devices the selectors match, each with the MIG profile it
    /// costs most as (`None`: a whole GPU).
    matched: BTreeMap<String, Option<String>>,
    /// The model its DeviceClass implies (config).
    named: Option<String>,
    /// The pin it carries ([`Dra::pin_expression`]), if any: it is charged by it.
    pub(crate) pinned: Option<Pin>,
    count: u32,
    /// What it asks of a shareable device's capacities (empty: nothing; `None`: an
    /// amount that cannot be read).
    capacity: Option<Asks>,
    /// What one device of a shared pin costs, as a share of it ([`Catalog::share`]).
    share: Milli,
    /// It carries [`UNMATCHABLE`]: no device can be allocated to it.
    pub(crate) unmatchable: bool,
}

/// The selector that makes an alternative of `firstAvailable` unmatchable: the
/// mutating webhook adds it to every GPU alternative but the one the quota chose.
pub(crate) const UNMATCHABLE: &str = "false";

/// The model a request is charged for, given the namespace's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolved {
    Model(String),
    /// Its selectors match several models, none of them the default.
    Ambiguous(Vec<String>),
    /// Its selectors match no model and there is no default.
    Unnamed,
}

impl DeviceAsk {
    /// One model the selectors match: that one. Several: the default if among them.
    /// None: the default.
    pub(crate) fn resolve(&self, default: Option<&str>) -> Resolved {
        let pinned = self.pinned.as_ref().map(|p| &p.label);
        if let Some(named) = pinned.or(self.named.as_ref()) {
            return Resolved::Model(named.clone());
        }
        let mut labels = self.matched.keys();
        match (labels.next(), labels.next(), default) {
            (Some(one), None, _) => Resolved::Model(one.clone()),
            (None, _, Some(default)) => Resolved::Model(default.into()),
            (None, _, None) => Resolved::Unnamed,
            (Some(_), Some(_), Some(d)) if self.matched.contains_key(d) => {
                Resolved::Model(d.into())
            }
            (Some(_), Some(_), _) => Resolved::Ambiguous(self.matched.keys().cloned().collect()),
        }
    }

    /// The MIG profile it costs on `label` (`None`: whole GPUs).
    fn profile(&self, label: &str) -> Option<&str> {
        self.matched.get(label).and_then(|p| p.as_deref())
    }

    /// What the request is pinned to: the pin it carries, or else the model it is
    /// charged for (with `default`) and the dearest of what its selectors matched of
    /// that model — whole GPUs if any, else the largest profile — so that it is
    /// allocated nothing dearer than it is charged. `None` when no model is decided.
    pub(crate) fn pin(&self, default: Option<&str>) -> Option<Pin> {
        if let Some(pin) = &self.pinned {
            return Some(pin.clone());
        }
        // A request that asks part of a device's capacity is pinned to devices that
        // can be shared; any other, to devices whatever they are.
        let shared = self.capacity.as_ref().is_some_and(|asks| !asks.is_empty());
        match self.resolve(default) {
            Resolved::Model(label) => Some(Pin {
                profile: self.profile(&label).map(str::to_string),
                label,
                shared,
            }),
            Resolved::Ambiguous(_) | Resolved::Unnamed => None,
        }
    }
}

/// A claim's GPU requests: those that must all be satisfied, and groups of alternatives
/// of which one will be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimAsks {
    exact: Vec<DeviceAsk>,
    alternatives: Vec<Vec<DeviceAsk>>,
}

/// Why a claim's requests cannot be judged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    #[error("ResourceClaim request {request}: CEL selector {error}")]
    Selector {
        request: String,
        error: cel::CelError,
    },
    #[error(transparent)]
    OverBudget(#[from] cel::OverBudget),
}

impl ClaimAsks {
    /// The claim's GPU requests (requests for other DeviceClasses are not GPUs),
    /// evaluated against `catalog`'s devices.
    pub fn of(claim: &ResourceClaim, catalog: &Catalog) -> Result<Self, AskError> {
        Self::of_requests(claim.requests(), catalog, true)
    }

    /// As [`ClaimAsks::of`]; unless `strict`, a request whose selectors cannot be
    /// evaluated (refused, or over the claim's budget) matches no model, rather than
    /// failing the claim (the cache charges what the webhook could not refuse).
    pub(crate) fn of_requests(
        requests: &[DeviceRequest],
        catalog: &Catalog,
        strict: bool,
    ) -> Result<Self, AskError> {
        let mut asks = ClaimAsks::default();
        let mut budget = cel::CostBudget::default();
        let mut ask = |name: &str, exact: &ExactRequest| {
            let pinned = || {
                catalog
                    .unevaluated(name, exact)
                    .filter(|a| a.pinned.is_some())
            };
            if !strict && let Some(ask) = pinned() {
                // Charged by its pin: nothing to compile.
                return Ok(Some(ask));
            }
            match catalog.ask(name, exact, &mut budget) {
                Err(error) if strict => Err(error),
                Err(_) => Ok(catalog.unevaluated(name, exact)),
                Ok(ask) => Ok(ask),
            }
        };
        for request in requests {
            if let Some(exact) = &request.exactly
                && let Some(ask) = ask(&request.name, exact)?
            {
                asks.exact.push(ask);
            }
            let mut alternatives = Vec::new();
            for sub in request.first_available.iter().flatten() {
                let name = format!("{}/{}", request.name, sub.name);
                alternatives.extend(ask(&name, &sub.request)?);
            }
            if !alternatives.is_empty() {
                asks.alternatives.push(alternatives);
            }
        }
        Ok(asks)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.alternatives.is_empty()
    }

    /// Every GPU request and alternative that can be allocated a device.
    pub(crate) fn all(&self) -> impl Iterator<Item = &DeviceAsk> {
        let all = self.exact.iter().chain(self.alternatives.iter().flatten());
        all.filter(|a| !a.unmatchable)
    }

    /// What the claim is charged, per quota key, with `default` as the model of requests
    /// that name none (`None`: those are not charged); a request matching several models
    /// none of which is the default, the first. Alternatives: the largest per key.
    pub(crate) fn charge(&self, default: Option<&str>, mig: &MigResources) -> ModelAmounts {
        let mut total = ModelAmounts::new();
        for ask in &self.exact {
            add_charge(&mut total, &ask_charge(ask, default, mig));
        }
        for group in &self.alternatives {
            let mut largest = ModelAmounts::new();
            for ask in group {
                for (key, amount) in ask_charge(ask, default, mig) {
                    let entry = largest.entry(key).or_default();
                    entry.0 = entry.0.max(amount.0);
                }
            }
            add_charge(&mut total, &largest);
        }
        total
    }
}

/// One request's charge, as a pod asking for the same devices through the device plugin
/// would be charged: whole GPUs, or MIG slices. A pinned request is charged by its pin
/// (what its dearest allowed device costs); one without (a claim that did not pass the
/// webhooks) by what its selectors matched, on its model or `default`.
fn ask_charge(ask: &DeviceAsk, default: Option<&str>, mig: &MigResources) -> ModelAmounts {
    if ask.unmatchable {
        return ModelAmounts::new();
    }
    if let Some(pin) = &ask.pinned {
        if !pin.shared {
            return pin.charge(ask.count, mig);
        }
        // Per device, as each allocated device is charged (`allocated_charge`).
        let one = scaled(&pin.charge(1, mig), ask.share);
        let count = u64::from(ask.count);
        return (one.into_iter())
            .map(|(key, amount)| (key, Milli(amount.0.saturating_mul(count))))
            .collect();
    }
    let label = match ask.resolve(default) {
        Resolved::Model(label) => label,
        Resolved::Ambiguous(labels) => labels.into_iter().next().unwrap_or_default(),
        Resolved::Unnamed => return ModelAmounts::new(),
    };
    charge_on(&devices(ask.profile(&label), ask.count), &label, mig)
}

/// What one allocated device costs: what a whole one of its model (or MIG profile)
/// costs, times the share of it the allocation recorded consuming, when the device is
/// shared and the allocation records its consumption.
pub(crate) fn allocated_charge(
    device: &slices::GpuDevice,
    consumed: &Option<Asks>,
    mig: &MigResources,
) -> ModelAmounts {
    let whole = charge_on(&devices(device.profile.as_deref(), 1), &device.label, mig);
    match (&device.shared, consumed) {
        (Some(shared), Some(consumed)) => scaled(&whole, shared.share_of_consumed(consumed)),
        _ => whole,
    }
}

/// `count` devices as a GPU request: whole GPUs, or slices of `profile`.
pub(crate) fn devices(profile: Option<&str>, count: u32) -> GpuRequest {
    match profile.and_then(|p| Some((p, mig::compute_slices(p).ok()?))) {
        Some((profile, compute)) => GpuRequest {
            mig: vec![MigDemand {
                profile: profile.into(),
                compute,
                count,
            }],
            ..Default::default()
        },
        None => GpuRequest::one(GpuDemand::Whole { gpus: count }),
    }
}

#[cfg(test)]
mod tests;
