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
    /// when none). Without a `min` the allocator does not round.
    Range {
        min: Option<Milli>,
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
        // The allocator looks at a range first (API validation allows only one).
        let valid = if let Some(range) = &wire.valid_range {
            let step = optional("validRange.step", range.step.as_ref())?;
            if step == Some(Milli(0)) {
                return Err(PolicyError::ZeroStep);
            }
            Valid::Range {
                min: optional("validRange.min", range.min.as_ref())?,
                max: optional("validRange.max", range.max.as_ref())?,
                step,
            }
        } else if !wire.valid_values.is_empty() {
            if wire.valid_values.len() > MAX_VALID_VALUES {
                return Err(PolicyError::TooManyValues(wire.valid_values.len()));
            }
            let mut values = (wire.valid_values.iter())
                .map(|v| quantity("validValues", v))
                .collect::<Result<Vec<_>, _>>()?;
            values.sort();
            values.dedup();
            Valid::Values(values)
        } else {
            Valid::Any
        };
        Ok(RequestPolicy { default, valid })
    }

    /// The ask rounded up as the allocator rounds it (`None`: past every valid value).
    fn round_up(&self, ask: Milli) -> Option<Milli> {
        match &self.valid {
            Valid::Any | Valid::Range { min: None, .. } => Some(ask),
            Valid::Range {
                min: Some(min),
                step,
                ..
            } => {
                if ask <= *min {
                    return Some(*min);
                }
                let Some(step) = step else {
                    return Some(ask);
                };
                let steps = (ask.0 - min.0).div_ceil(step.0);
                steps.checked_mul(step.0)?.checked_add(min.0).map(Milli)
            }
            Valid::Values(values) => values.iter().copied().find(|v| *v >= ask),
        }
    }

    /// Whether the policy forbids consuming `amount` (its default is always allowed).
    fn forbids(&self, amount: Milli) -> bool {
        if self.default == Some(amount) {
            return false;
        }
        match &self.valid {
            Valid::Any => false,
            Valid::Range { min, max, step } => {
                let past_max = max.is_some_and(|max| amount > max);
                let min = min.unwrap_or_default();
                // Go's remainder of a negative difference is zero only on a step, too.
                let off = |s: Milli| amount.0.abs_diff(min.0) % s.0 != 0;
                let off_step = step.is_some_and(off);
                past_max || off_step
            }
            Valid::Values(values) => !values.contains(&amount),
        }
    }
}

/// What a request asking `ask` of a capacity of `value` (`None`: it names no amount)
/// consumes under `policy` (`None`: the capacity has none), as the allocator works it
/// out: no ask, the policy's default (not rounded) or the whole capacity; an ask,
/// rounded up by the policy. `None` when no such device can be allocated to it.
pub(crate) fn consumed(
    ask: Option<Milli>,
    value: Milli,
    policy: Option<&RequestPolicy>,
) -> Option<Milli> {
    let amount = match (ask, policy) {
        (None, policy) => policy.and_then(|p| p.default).unwrap_or(value),
        (Some(ask), None) => ask,
        (Some(ask), Some(policy)) => policy.round_up(ask)?,
    };
    let forbidden = policy.is_some_and(|p| p.forbids(amount));
    (!forbidden && amount <= value).then_some(amount)
}

/// The share of its device `consumed` is, in thousandths, rounded up: what the claim is
/// charged of the device's GPU. A zero capacity is the whole device.
pub(crate) fn share(consumed: Milli, value: Milli) -> Milli {
    if value.0 == 0 {
        return WHOLE;
    }
    let thousandths = u128::from(consumed.0) * 1000;
    let share = thousandths.div_ceil(u128::from(value.0)).min(1000);
    Milli(share as u64)
}

/// A whole device, as a share.
pub(crate) const WHOLE: Milli = Milli(1000);

/// One capacity of a device that can be allocated to several claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Capacity {
    pub(crate) value: Milli,
    /// `Err`: published but unreadable; the device is then charged whole.
    pub(crate) policy: Option<Result<RequestPolicy, PolicyError>>,
}

/// The capacities of a device published with `allowMultipleAllocations: true`, by their
/// name as published: every allocation consumes part of each (docs/devices.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Shared {
    pub(crate) capacities: std::collections::BTreeMap<String, Capacity>,
}

/// A request's capacity asks (`capacity.requests`), by capacity name.
pub(crate) type Asks = std::collections::BTreeMap<String, Milli>;

impl Shared {
    /// What one allocation of the device to a request asking `asks` costs, as a share of
    /// it: the largest share it consumes of any capacity. `None` when the device cannot
    /// be allocated to it (an ask of a capacity it lacks, or one its policy refuses).
    /// An allocation that consumes nothing is bounded by nothing: a whole device.
    pub(crate) fn share_for(&self, asks: &Asks) -> Option<Milli> {
        if asks.keys().any(|name| !self.capacities.contains_key(name)) {
            return None;
        }
        let mut most = Milli(0);
        for (name, capacity) in &self.capacities {
            let taken = match &capacity.policy {
                Some(Err(_)) => capacity.value,
                Some(Ok(policy)) => {
                    consumed(asks.get(name).copied(), capacity.value, Some(policy))?
                }
                None => consumed(asks.get(name).copied(), capacity.value, None)?,
            };
            most = most.max(share(taken, capacity.value));
        }
        Some(if most.0 == 0 { WHOLE } else { most })
    }

    /// What an allocation that recorded `consumed` (its `consumedCapacity`) costs, as a
    /// share: the largest of any capacity; a capacity it does not record, all of it.
    pub(crate) fn share_of_consumed(&self, consumed: &Asks) -> Milli {
        let most = (self.capacities.iter())
            .map(|(name, c)| share(consumed.get(name).copied().unwrap_or(c.value), c.value))
            .max()
            .unwrap_or_default();
        if most.0 == 0 { WHOLE } else { most }
    }
}

/// `amounts` scaled by `share` thousandths, each rounded up: what `share` of a device
/// charged `amounts` whole costs.
pub(crate) fn scaled(
    amounts: &crate::quota::ModelAmounts,
    share: Milli,
) -> crate::quota::ModelAmounts {
    (amounts.iter())
        .map(|(key, amount)| {
            let part = (u128::from(amount.0) * u128::from(share.0)).div_ceil(1000);
            (key.clone(), Milli(u64::try_from(part).unwrap_or(u64::MAX)))
        })
        .collect()
}

#[cfg(test)]
#[path = "capacity_tests.rs"]
mod tests;
