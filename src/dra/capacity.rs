//! Consumable capacity (KEP-5075, beta in Kubernetes 1.36): a device published with
//! `allowMultipleAllocations: true` goes to several claims at once, each consuming part of
//! its `capacity` entries. What a request consumes is not what it asks: the allocator
//! rounds the ask by the capacity's `requestPolicy` (up to `min`, to a `step`, to the next
//! of `validValues`), and a request that names no amount consumes the policy's `default`,
//! or the whole capacity. A charge must be by what is consumed: 1Gi asked of a capacity
//! whose step is 10Gi takes 10Gi.
//!
//! Pure arithmetic in the capacity's own units (bytes for memory), held as [`Milli`].

use serde::{Deserialize, Serialize};

use crate::placement::quantity::Milli;

/// Most `validValues` a policy may list (Kubernetes: 10).
const MAX_VALID_VALUES: usize = 16;

/// A capacity's `requestPolicy`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RequestPolicy {
    /// Consumed by a request that names no amount (none: the whole capacity).
    pub(crate) default: Option<Milli>,
    pub(crate) valid: Valid,
}

/// The amounts a request may consume.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Valid {
    /// Any amount up to the capacity.
    #[default]
    Any,
    /// From `min`, in steps of `step` (any amount when none), up to `max` (the capacity
    /// when none).
    Range {
        min: Milli,
        max: Option<Milli>,
        step: Option<Milli>,
    },
    /// One of these, ascending.
    Values(Vec<Milli>),
}

/// Why a policy as published cannot be read: the device is then charged whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PolicyError {
    #[error("requestPolicy {0}: {1}")]
    Quantity(&'static str, crate::placement::quantity::QuantityError),
    #[error("requestPolicy lists {0} validValues (at most {MAX_VALID_VALUES})")]
    TooManyValues(usize),
    #[error("requestPolicy has a step of zero")]
    ZeroStep,
}

/// `requestPolicy` as a ResourceSlice carries it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WirePolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    valid_range: Option<WireRange>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    valid_values: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
struct WireRange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

fn quantity(field: &'static str, text: &str) -> Result<Milli, PolicyError> {
    Milli::parse(text).map_err(|e| PolicyError::Quantity(field, e))
}

fn optional(field: &'static str, text: Option<&String>) -> Result<Option<Milli>, PolicyError> {
    text.map(|t| quantity(field, t)).transpose()
}

impl RequestPolicy {
    pub(crate) fn from_wire(wire: &WirePolicy) -> Result<Self, PolicyError> {
        let default = optional("default", wire.default.as_ref())?;
        let valid = if !wire.valid_values.is_empty() {
            if wire.valid_values.len() > MAX_VALID_VALUES {
                return Err(PolicyError::TooManyValues(wire.valid_values.len()));
            }
            let mut values = (wire.valid_values.iter())
                .map(|v| quantity("validValues", v))
                .collect::<Result<Vec<_>, _>>()?;
            values.sort();
            values.dedup();
            Valid::Values(values)
        } else if let Some(range) = &wire.valid_range {
            let step = optional("validRange.step", range.step.as_ref())?;
            if step == Some(Milli(0)) {
                return Err(PolicyError::ZeroStep);
            }
            Valid::Range {
                min: optional("validRange.min", range.min.as_ref())?.unwrap_or_default(),
                max: optional("validRange.max", range.max.as_ref())?,
                step,
            }
        } else {
            Valid::Any
        };
        Ok(RequestPolicy { default, valid })
    }
}

/// What a request asking `ask` of a capacity of `value` (`None`: it names no amount)
/// consumes under `policy` (`None`: the capacity has none), as the allocator rounds it;
/// `None` when no such device can be allocated to it.
pub(crate) fn consumed(
    ask: Option<Milli>,
    value: Milli,
    policy: Option<&RequestPolicy>,
) -> Option<Milli> {
    let Some(policy) = policy else {
        return Some(ask.unwrap_or(value)).filter(|c| *c <= value);
    };
    let wanted = ask.or(policy.default).unwrap_or(value);
    let rounded = match &policy.valid {
        Valid::Any => Some(wanted),
        Valid::Range { min, max, step } => {
            let above = wanted.0.saturating_sub(min.0);
            let stepped = match step {
                Some(step) => above.div_ceil(step.0).checked_mul(step.0),
                None => Some(above),
            };
            stepped
                .and_then(|s| s.checked_add(min.0))
                .map(Milli)
                .filter(|r| max.is_none_or(|max| *r <= max))
        }
        Valid::Values(values) => values.iter().copied().find(|v| *v >= wanted),
    };
    rounded.filter(|r| *r <= value)
}

/// The share of its device `consumed` is, in thousandths, rounded up: what the claim is
/// charged of the device's GPU. A zero capacity is the whole device.
pub(crate) fn share(consumed: Milli, value: Milli) -> Milli {
    if value.0 == 0 {
        return Milli(1000);
    }
    let thousandths = u128::from(consumed.0) * 1000;
    let share = thousandths.div_ceil(u128::from(value.0)).min(1000);
    Milli(share as u64)
}

#[cfg(test)]
#[path = "capacity_tests.rs"]
mod tests;
