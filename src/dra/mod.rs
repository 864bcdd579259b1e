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
pub mod cel;
pub mod classes;
mod pin;
pub mod slices;
mod source;
mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use capacity::{WHOLE, scaled};
use cel::{AttributeValue, CelDevice, Selector};
use classes::DeviceClasses;
use slices::{DeviceIndex, SharedShapes};

use serde::Deserialize;

use crate::placement::mig::{self, MigResources};
use crate::placement::quantity::Milli;
use crate::placement::{GpuDemand, GpuRequest, MigDemand};
use crate::quota::{ModelAmounts, add_charge, charge_on};

pub(crate) use capacity::Asks;
pub(crate) use pin::Pin;
pub(crate) use source::CatalogSource;
use source::{GpuClass, gpu_classes};
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

/// What decides a request's model: the GPU DeviceClasses, samples of the published
/// GPU devices, and the model labels known without published devices.
#[derive(Debug)]
pub struct Catalog {
    dra: Dra,
    /// GPU classes by name: the model the config says each implies, and its selectors.
    gpu_classes: BTreeMap<String, GpuClass>,
    samples: BTreeMap<(String, Option<String>), Vec<Arc<CelDevice>>>,
    /// The model attribute values published, by label.
    products: BTreeMap<String, Vec<String>>,
    /// The capacities of every shareable device, by (label, profile).
    shared: SharedShapes,
    /// Devices made up for the known labels no published device has: (label, profile).
    synthetic: Vec<(String, Option<String>, CelDevice)>,
}

impl Catalog {
    /// `known`: model labels and `<model>/<profile>` quota keys (the namespace's quotas,
    /// the nodes' labels).
    pub fn new(
        dra: &Dra,
        classes: &DeviceClasses,
        devices: &DeviceIndex,
        known: impl IntoIterator<Item = String>,
    ) -> Self {
        Self::from_source(CatalogSource::new(dra, classes, devices, known))
    }

    /// Built from what was copied out of the cluster state: this compiles (and for
    /// DeviceClasses not in the config, evaluates) CEL, so it is never done under the
    /// cache's lock.
    pub(crate) fn from_source(source: CatalogSource) -> Self {
        let CatalogSource {
            dra,
            classes,
            samples,
            products,
            shared,
            known,
        } = source;
        let published: BTreeSet<&str> = samples.keys().map(|(l, _)| l.as_str()).collect();
        let mut synthetic = Vec::new();
        for key in &known {
            let (label, profile) = match key.split_once('/') {
                Some((label, profile)) => (label, Some(profile.to_string())),
                None => (key.as_str(), None),
            };
            if label.is_empty() || published.contains(label) {
                continue;
            }
            for product in dra.products_of_label(label) {
                let device = synthetic_device(&dra, &product, profile.as_deref());
                synthetic.push((label.to_string(), profile.clone(), device));
            }
        }
        let mut catalog = Catalog {
            dra,
            gpu_classes: BTreeMap::new(),
            samples,
            products,
            shared,
            synthetic,
        };
        catalog.gpu_classes = gpu_classes(&catalog, &classes);
        catalog
    }

    /// The DeviceClasses that are GPU classes without the config listing them.
    pub(crate) fn found_gpu_classes(&self) -> impl Iterator<Item = &str> {
        let listed = &self.dra.device_classes;
        self.gpu_classes
            .keys()
            .map(String::as_str)
            .filter(|c| !listed.contains_key(*c))
    }

    /// The selector that pins a request to `pin`'s devices.
    pub(crate) fn pin(&self, pin: &Pin) -> String {
        let products = self
            .products
            .get(&pin.label)
            .map(Vec::as_slice)
            .unwrap_or_default();
        self.dra.pin_expression(pin, products)
    }

    /// What one device of `pin` costs a request asking `asks` of its capacities, as a
    /// share of it: for a shared pin, the dearest of the shareable devices of the pin's
    /// model and profile that can take the ask (their policies round it; CEL cannot see
    /// a policy, so every published one counts), or the whole device when none can or
    /// none is published; for any other pin, or asks that cannot be read, the whole.
    fn share(&self, pin: &Pin, asks: Option<&Asks>) -> Milli {
        let Some(asks) = asks.filter(|_| pin.shared) else {
            return WHOLE;
        };
        let shapes = self.shared.get(&(pin.label.clone(), pin.profile.clone()));
        let shares = shapes
            .into_iter()
            .flatten()
            .filter_map(|s| s.share_for(asks));
        shares.max().unwrap_or(WHOLE)
    }

    /// What `ask` costs once pinned to `pin` (the mutating webhook's choice among
    /// alternatives: the charge the validating webhook will find).
    pub(crate) fn pinned_charge(
        &self,
        ask: &DeviceAsk,
        pin: &Pin,
        mig: &MigResources,
    ) -> ModelAmounts {
        let mut pinned = ask.clone();
        pinned.pinned = Some(pin.clone());
        ask_charge(&self.priced(pinned), None, mig)
    }

    /// `ask` with the share its pin costs worked out.
    fn priced(&self, mut ask: DeviceAsk) -> DeviceAsk {
        if let Some(pin) = &ask.pinned {
            ask.share = self.share(pin, ask.capacity.as_ref());
        }
        ask
    }

    /// Whether requests for the class `name` get GPUs.
    #[cfg(test)]
    fn is_gpu_class(&self, name: &str) -> bool {
        self.gpu_classes.contains_key(name)
    }

    /// One request's ask, if its DeviceClass is a GPU class.
    pub(crate) fn ask(
        &self,
        name: &str,
        exact: &ExactRequest,
        budget: &mut cel::CostBudget,
    ) -> Result<Option<DeviceAsk>, AskError> {
        let Some(class) = self.gpu_classes.get(&exact.device_class_name) else {
            return Ok(None);
        };
        let expressions = exact.expressions();
        if expressions.contains(&UNMATCHABLE) {
            return Ok(self.unevaluated(name, exact));
        }
        let pinned = expressions.iter().find_map(|e| self.dra.pinned(e));
        let mut selectors = Vec::with_capacity(expressions.len());
        for expression in &expressions {
            let selector = Selector::compile_within(expression, budget)?;
            selectors.push(selector.map_err(|error| AskError::Selector {
                request: name.to_string(),
                error,
            })?);
        }
        // A pinned request is charged by its pin: what its selectors match among the
        // samples decides nothing (docs/devices.md, "The pin").
        let matched = match pinned {
            Some(_) => BTreeMap::new(),
            None => self.matched(&selectors, &class.selectors, budget)?,
        };
        Ok(Some(self.priced(DeviceAsk {
            request: name.to_string(),
            matched,
            named: class.model.clone(),
            pinned,
            count: count_of(exact),
            capacity: exact.capacity_asks(),
            share: WHOLE,
            unmatchable: false,
        })))
    }

    /// Whether some device of `devices` matches every selector of the request `name` and
    /// of its DeviceClass: `None` when its class is not a GPU class. The devices
    /// themselves are asked, never a sample, so `Some(false)` means none of them can be
    /// allocated to it (`explain`'s `SelectorNoMatch`).
    pub(crate) fn matches_any<'d>(
        &self,
        name: &str,
        exact: &ExactRequest,
        devices: impl IntoIterator<Item = &'d CelDevice>,
        budget: &mut cel::CostBudget,
    ) -> Result<Option<bool>, AskError> {
        let Some(class) = self.gpu_classes.get(&exact.device_class_name) else {
            return Ok(None);
        };
        let mut selectors = Vec::new();
        for expression in exact.expressions() {
            let selector = Selector::compile_within(expression, budget)?;
            selectors.push(selector.map_err(|error| AskError::Selector {
                request: name.to_string(),
                error,
            })?);
        }
        for device in devices {
            if matches_all(device, &class.selectors, budget)?
                && matches_all(device, &selectors, budget)?
            {
                return Ok(Some(true));
            }
        }
        Ok(Some(false))
    }

    /// A GPU request whose selectors were not evaluated: it matches no model.
    fn unevaluated(&self, name: &str, exact: &ExactRequest) -> Option<DeviceAsk> {
        let class = self.gpu_classes.get(&exact.device_class_name)?;
        let expressions = exact.expressions();
        Some(self.priced(DeviceAsk {
            request: name.to_string(),
            matched: BTreeMap::new(),
            named: class.model.clone(),
            pinned: expressions.iter().find_map(|e| self.dra.pinned(e)),
            count: count_of(exact),
            capacity: exact.capacity_asks(),
            share: WHOLE,
            unmatchable: expressions.contains(&UNMATCHABLE),
        }))
    }

    /// The labels of the devices all of `selectors` and `class` match, with the profile
    /// each costs most as. Made-up devices are matched by the request's selectors only
    /// (they carry the model attribute and profile, nothing a class looks at).
    fn matched(
        &self,
        selectors: &[Selector],
        class: &[Selector],
        budget: &mut cel::CostBudget,
    ) -> Result<BTreeMap<String, Option<String>>, cel::OverBudget> {
        let mut matched = BTreeMap::new();
        let all = matches_all;
        for ((label, profile), devices) in &self.samples {
            for device in devices {
                if all(device, class, budget)? && all(device, selectors, budget)? {
                    record(&mut matched, label, profile.as_deref());
                    break;
                }
            }
        }
        for (label, profile, device) in &self.synthetic {
            if all(device, selectors, budget)? {
                record(&mut matched, label, profile.as_deref());
            }
        }
        Ok(matched)
    }
}

/// Whether `device` matches every selector of `list`.
fn matches_all(
    device: &CelDevice,
    list: &[Selector],
    budget: &mut cel::CostBudget,
) -> Result<bool, cel::OverBudget> {
    for selector in list {
        if !selector.matches(device, budget)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How many devices a request can be allocated.
fn count_of(exact: &ExactRequest) -> u32 {
    match exact.allocation_mode.as_deref() {
        Some("All") => ALL_DEVICES,
        _ => exact.count.unwrap_or(1).clamp(0, i64::from(ALL_DEVICES)) as u32,
    }
}

/// Note that a device of `label` (a slice of `profile`) matched: a whole GPU costs more
/// than any slice, a larger slice more than a smaller.
fn record(matched: &mut BTreeMap<String, Option<String>>, label: &str, profile: Option<&str>) {
    let slices = |p: &str| mig::compute_slices(p).unwrap_or(u32::MAX);
    match matched.get_mut(label) {
        None => {
            matched.insert(label.to_string(), profile.map(str::to_string));
        }
        Some(None) => {}
        Some(Some(had)) => match profile {
            None => {
                matched.insert(label.to_string(), None);
            }
            Some(p) if slices(p) > slices(had) => *had = p.to_string(),
            Some(_) => {}
        },
    }
}

fn synthetic_device(dra: &Dra, product: &str, profile: Option<&str>) -> CelDevice {
    let mut names = BTreeMap::from([(
        dra.model_attribute.clone(),
        AttributeValue::String(product.to_string()),
    )]);
    if let Some(profile) = profile {
        names.insert(
            dra.profile_attribute.clone(),
            AttributeValue::String(profile.to_string()),
        );
    }
    let attributes = BTreeMap::from([(dra.driver.clone(), names)]);
    CelDevice::new(&dra.driver, &attributes, &BTreeMap::new())
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
