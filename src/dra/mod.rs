//! Dynamic Resource Allocation (`resource.k8s.io/v1`): GPUs handed out through
//! ResourceClaims (docs/devices.md). Pure: what a claim asks for, which model each of its
//! requests names, what it is charged, and the selector that pins a model.
//!
//! A claim is charged per device, like Kubernetes' own quota counts claims: an
//! `ExactCount` request its count, an `All` request the most devices one claim can be
//! allocated (32), a request of prioritized alternatives (`firstAvailable`) the largest
//! alternative per quota key. The model comes from the request's CEL selectors
//! (`device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"`), else
//! from its DeviceClass (configured), else the namespace's default (which the mutating
//! webhook pins with a selector). Once allocated, the devices' own attributes (from the
//! ResourceSlices) say what the claim holds.

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

pub mod slices;
pub mod wire;

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::placement::mig::{self, MigResources};
use crate::placement::{GpuDemand, GpuRequest, MigDemand};
use crate::quota::ledger::{ModelAmounts, add_charge, charge_on};

pub use wire::{DeviceRequest, ExactRequest, ResourceClaim};

/// Kubernetes' `AllocationResultsMaxSize`: what an `All` request can be allocated at most.
pub const ALL_DEVICES: u32 = 32;

/// DRA configuration (`dra` in the config file); NVIDIA's DRA driver by default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Dra {
    /// Watch ResourceClaims and ResourceSlices and admit claims (needs
    /// `resource.k8s.io/v1`, Kubernetes ≥ 1.34).
    pub enabled: bool,
    /// The attribute domain of the GPU driver's devices (`device.attributes["<driver>"]`).
    pub driver: String,
    /// The device attribute that names the GPU model.
    pub model_attribute: String,
    /// The device attribute that names a MIG device's profile.
    pub profile_attribute: String,
    /// DeviceClasses whose devices are GPUs, each with the model it implies (empty: the
    /// model comes from the claim's selectors).
    pub device_classes: BTreeMap<String, String>,
    /// Stripped from the model attribute before spaces become dashes, so that
    /// `productName` "NVIDIA A100-SXM4-80GB" is the node label "A100-SXM4-80GB".
    pub product_prefix: String,
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
    pub fn label_of_product(&self, product: &str) -> String {
        let name = product
            .strip_prefix(self.product_prefix.as_str())
            .unwrap_or(product);
        name.trim().replace(' ', "-")
    }

    /// The values of `attribute` a CEL selector requires, if it says
    /// `device.attributes["<driver>"].<attribute> == "<value>"` (or with `["<attribute>"]`,
    /// either side of `==`), or `... in ["<value>", ...]`, as one clause of an `&&`. Other
    /// expressions do not name a model: they are left to the scheduler.
    pub fn required_values(&self, expression: &str, attribute: &str) -> Option<Vec<String>> {
        let dotted = format!("device.attributes[\"{}\"].{attribute}", self.driver);
        let indexed = format!("device.attributes[\"{}\"][\"{attribute}\"]", self.driver);
        let is_attribute = |side: &str| side == dotted || side == indexed;
        for clause in expression.split("&&") {
            if let Some((left, right)) = clause.split_once("==") {
                let (left, right) = (left.trim(), right.trim());
                let value = match () {
                    _ if is_attribute(left) => right,
                    _ if is_attribute(right) => left,
                    _ => continue,
                };
                if let Some(text) = string_literal(value) {
                    return Some(vec![text]);
                }
            } else if let Some((left, list)) = clause.split_once(" in ")
                && is_attribute(left.trim())
            {
                let list = list.trim().strip_prefix('[')?.strip_suffix(']')?;
                let values: Option<Vec<String>> = list.split(',').map(string_literal).collect();
                return values.filter(|v| !v.is_empty());
            }
        }
        None
    }

    /// The one model label a CEL selector requires of a device's model attribute.
    pub fn required_label(&self, expression: &str) -> Option<String> {
        let values = self.required_values(expression, &self.model_attribute)?;
        let mut labels = values.iter().map(|v| self.label_of_product(v));
        let first = labels.next()?;
        labels.all(|l| l == first).then_some(first)
    }

    /// The CEL expression that pins a request to `label`'s devices: their model
    /// attribute is one of `products` (the values the cluster's ResourceSlices carry for
    /// that label; the prefixed and plain label when none is known yet).
    pub fn pin_expression(&self, label: &str, products: &[String]) -> String {
        let mut values: Vec<String> = products.to_vec();
        if values.is_empty() {
            values = vec![format!("{}{label}", self.product_prefix), label.to_string()];
        }
        let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
        format!(
            "device.attributes[{:?}].{} in [{}]",
            self.driver,
            self.model_attribute,
            quoted.join(", ")
        )
    }
}

/// A `"..."` or `'...'` CEL string literal without escapes.
fn string_literal(text: &str) -> Option<String> {
    let text = text.trim_matches(|c: char| c == '(' || c == ')' || c.is_whitespace());
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .or_else(|| text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')))?;
    (!inner.contains(['\\', '"', '\''])).then(|| inner.to_string())
}

/// What one GPU request (or alternative) of a claim asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAsk {
    /// The request's name (`<request>/<subrequest>` for an alternative).
    pub request: String,
    /// The model label it names, if any.
    pub model: Option<String>,
    /// The MIG profile it names, if any.
    pub profile: Option<String>,
    pub count: u32,
}

/// A claim's GPU requests: those that must all be satisfied, and groups of alternatives
/// of which one will be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimAsks {
    pub exact: Vec<DeviceAsk>,
    pub alternatives: Vec<Vec<DeviceAsk>>,
}

impl ClaimAsks {
    /// The claim's GPU requests (requests for other DeviceClasses are not GPUs).
    pub fn of(claim: &ResourceClaim, dra: &Dra) -> Self {
        let mut asks = ClaimAsks::default();
        for request in claim.requests() {
            if let Some(exact) = &request.exactly {
                asks.exact.extend(ask_of(&request.name, exact, dra));
            }
            let alternatives: Vec<DeviceAsk> = request
                .first_available
                .iter()
                .flatten()
                .filter_map(|sub| {
                    ask_of(&format!("{}/{}", request.name, sub.name), &sub.request, dra)
                })
                .collect();
            if !alternatives.is_empty() {
                asks.alternatives.push(alternatives);
            }
        }
        asks
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.alternatives.is_empty()
    }

    /// Every GPU request and alternative.
    pub fn all(&self) -> impl Iterator<Item = &DeviceAsk> {
        self.exact.iter().chain(self.alternatives.iter().flatten())
    }

    /// The requests that name no model.
    pub fn untyped(&self) -> impl Iterator<Item = &DeviceAsk> {
        self.all().filter(|a| a.model.is_none())
    }

    /// What the claim is charged, per quota key, with `default` as the model of requests
    /// that name none (`None`: those are not charged). Alternatives: the largest per key.
    pub fn charge(&self, default: Option<&str>, mig: &MigResources) -> ModelAmounts {
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

/// One request's ask, if its DeviceClass is a GPU class.
pub fn ask_of(name: &str, exact: &ExactRequest, dra: &Dra) -> Option<DeviceAsk> {
    let class_model = dra.device_classes.get(&exact.device_class_name)?;
    let expressions = exact.expressions();
    let model = expressions
        .iter()
        .find_map(|e| dra.required_label(e))
        .or_else(|| (!class_model.is_empty()).then(|| class_model.clone()));
    let profile = expressions.iter().find_map(|e| {
        let values = dra.required_values(e, &dra.profile_attribute)?;
        (values.len() == 1).then(|| values[0].clone())
    });
    let count = match exact.allocation_mode.as_deref() {
        Some("All") => ALL_DEVICES,
        _ => exact.count.unwrap_or(1).clamp(0, i64::from(ALL_DEVICES)) as u32,
    };
    Some(DeviceAsk {
        request: name.to_string(),
        model,
        profile,
        count,
    })
}

/// One request's charge on its model (or `default`), as a pod asking for the same
/// devices through the device plugin would be charged: whole GPUs, or MIG slices.
fn ask_charge(ask: &DeviceAsk, default: Option<&str>, mig: &MigResources) -> ModelAmounts {
    let Some(label) = ask.model.as_deref().or(default) else {
        return ModelAmounts::new();
    };
    charge_on(&devices(ask.profile.as_deref(), ask.count), label, mig)
}

/// `count` devices as a GPU request: whole GPUs, or slices of `profile`.
pub fn devices(profile: Option<&str>, count: u32) -> GpuRequest {
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
