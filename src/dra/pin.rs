//! The pin (docs/devices.md, "The pin"): the selector the mutating webhook appends to
//! every GPU request, fixing everything a device's charge depends on — its model label,
//! and whole GPUs or one MIG profile — and what a pinned request is charged.

use super::{Dra, devices};
use crate::placement::mig::MigResources;
use crate::quota::{ModelAmounts, charge_on};

/// What the mutating webhook pins a GPU request to, and so everything its devices' charge
/// depends on (docs/devices.md, "The pin"): the model label, and whole GPUs or MIG
/// slices of one profile. Every device the pin lets the allocator choose costs exactly
/// [`Pin::charge`] of one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pin {
    pub(crate) label: String,
    /// The MIG profile (`None`: whole GPUs, devices without a profile attribute).
    pub(crate) profile: Option<String>,
    /// Only devices that can be allocated to several claims at once
    /// (`allowMultipleAllocations`): a request that asks part of their capacity is
    /// charged its share, never a device it would take whole.
    pub(crate) shared: bool,
}

impl Pin {
    /// Whole GPUs of `label`.
    pub(crate) fn whole(label: &str) -> Self {
        Pin {
            label: label.to_string(),
            profile: None,
            shared: false,
        }
    }

    /// What `count` devices of the pinned set cost, per quota key.
    pub(super) fn charge(&self, count: u32, mig: &MigResources) -> ModelAmounts {
        charge_on(&devices(self.profile.as_deref(), count), &self.label, mig)
    }
}

impl Dra {
    /// The CEL expression that pins a request to `pin`'s devices: their model attribute
    /// is one of `products` (the values the cluster's ResourceSlices carry for its label;
    /// [`Dra::products_of_label`] when none is published yet), and they are whole GPUs
    /// (no profile attribute) or MIG slices of its profile. Each clause is guarded so
    /// that it evaluates on any device of the driver: Kubernetes aborts an allocation on
    /// an evaluation error.
    pub(crate) fn pin_expression(&self, pin: &Pin, products: &[String]) -> String {
        let values = match products.is_empty() {
            true => self.products_of_label(&pin.label),
            false => products.to_vec(),
        };
        let list: Vec<String> = values.iter().map(|v| quote(v)).collect();
        let model = format!(
            "{} in [{}]",
            self.attribute(&self.model_attribute),
            list.join(", ")
        );
        let profile = self.attribute(&self.profile_attribute);
        let kind = match &pin.profile {
            None => format!("{model} && !has({profile})"),
            Some(p) => format!("{model} && has({profile}) && {profile} == {}", quote(p)),
        };
        match pin.shared {
            true => format!("{kind}{SHARED}"),
            false => kind,
        }
    }

    /// `device.attributes["<driver>"].<name>`.
    fn attribute(&self, name: &str) -> String {
        format!("device.attributes[{}].{name}", quote(&self.driver))
    }

    /// What `expression` pins, if it is a pin ([`Dra::pin_expression`], exactly as it
    /// writes one): a device it matches has the pin's model label, and is a whole GPU or
    /// a slice of the pin's profile.
    pub(super) fn pinned(&self, expression: &str) -> Option<Pin> {
        let head = format!("{} in ", self.attribute(&self.model_attribute));
        let rest = expression.strip_prefix(head.as_str())?;
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Vec<String>>();
        let products = values.next()?.ok()?;
        let tail = &rest[values.byte_offset()..];
        let (tail, shared) = match tail.strip_suffix(SHARED) {
            Some(tail) => (tail, true),
            None => (tail, false),
        };
        let profile = self.attribute(&self.profile_attribute);
        let profile = match tail.strip_prefix(&format!(" && has({profile}) && {profile} == ")) {
            Some(value) => Some(serde_json::from_str::<String>(value).ok()?),
            None => None,
        };
        let mut labels = products.iter().map(|p| self.label_of_product(p));
        let label = labels.next()?;
        if !labels.all(|l| l == label) {
            return None;
        }
        let pin = Pin {
            label,
            profile,
            shared,
        };
        (self.pin_expression(&pin, &products) == expression).then_some(pin)
    }
}

/// The clause of a shared pin: Kubernetes' CEL sees whether a device may be allocated
/// to several claims (`device.allowMultipleAllocations`, always set from 1.34 on).
const SHARED: &str = " && device.allowMultipleAllocations";

fn quote(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
