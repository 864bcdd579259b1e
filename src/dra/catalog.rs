//! The catalog a claim's requests are judged against: the GPU DeviceClasses, samples of
//! the published GPU devices (and made-up ones of the models the quotas know), the
//! shareable devices' capacities; what a request asks ([`DeviceAsk`]), what one pinned
//! costs, and the selector that pins it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::capacity::{Asks, WHOLE};
use super::cel::{self, AttributeValue, CelDevice, Selector};
use super::classes::DeviceClasses;
use super::slices::{DeviceIndex, SharedShapes};
use super::source::{CatalogSource, GpuClass, gpu_classes};
use super::{ALL_DEVICES, AskError, DeviceAsk, Dra, ExactRequest, Pin, UNMATCHABLE, ask_charge};
use crate::placement::mig::{self, MigResources};
use crate::placement::quantity::Milli;
use crate::quota::ModelAmounts;

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
        catalog.gpu_classes = gpu_classes(&catalog.dra, &catalog.samples, &classes);
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
    pub(super) fn is_gpu_class(&self, name: &str) -> bool {
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
    pub(super) fn unevaluated(&self, name: &str, exact: &ExactRequest) -> Option<DeviceAsk> {
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
