//! The parts of `resource.k8s.io/v1` ResourceClaims gpu-admission reads (webhook bodies
//! and the watch), decoded with bounded lists. A webhook body's claim is decoded by
//! `crate::wire::claim`, under the value budget of every body part.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::capacity::Asks;
use crate::placement::quantity::Milli;

/// Most requests (and alternatives of one request) a claim may carry; Kubernetes
/// allows 32 of each.
const MAX_REQUESTS: usize = 64;
/// Most selectors of one request (Kubernetes: 32).
const MAX_SELECTORS: usize = 64;
/// Most allocated devices (Kubernetes: 32).
const MAX_RESULTS: usize = 64;
/// Most capacities a request asks, or an allocation records (Kubernetes: 32).
pub(super) const MAX_CAPACITIES: usize = 64;

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    pub(crate) spec: ClaimSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<ClaimStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClaimSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) devices: Option<DeviceClaim>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeviceClaim {
    #[serde(default, deserialize_with = "bounded::<_, MAX_REQUESTS, _>")]
    pub(crate) requests: Vec<DeviceRequest>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeviceRequest {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exactly: Option<ExactRequest>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded_opt::<_, MAX_REQUESTS, _>"
    )]
    pub(crate) first_available: Option<Vec<SubRequest>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SubRequest {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(flatten)]
    pub(crate) request: ExactRequest,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExactRequest {
    #[serde(default)]
    pub(crate) device_class_name: String,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "bounded::<_, MAX_SELECTORS, _>"
    )]
    pub(crate) selectors: Vec<Selector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) allocation_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) count: Option<i64>,
    /// What it asks of a shareable device's capacities (consumable capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) capacity: Option<CapacityRequirements>,
}

/// `capacity` of a request: amounts by capacity name.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub(crate) struct CapacityRequirements {
    #[serde(default, deserialize_with = "bounded_map::<_, MAX_CAPACITIES, _>")]
    pub(crate) requests: BTreeMap<String, String>,
}

impl ExactRequest {
    /// The CEL expressions of its selectors.
    pub(crate) fn expressions(&self) -> Vec<&str> {
        let cel = self.selectors.iter().filter_map(|s| s.cel.as_ref());
        cel.map(|c| c.expression.as_str()).collect()
    }

    /// What it asks of a device's capacities: empty when nothing, `None` when an amount
    /// cannot be read (it is then charged whole devices).
    pub(crate) fn capacity_asks(&self) -> Option<Asks> {
        let requests = self.capacity.iter().flat_map(|c| &c.requests);
        requests
            .map(|(name, amount)| Some((name.clone(), Milli::parse(amount).ok()?)))
            .collect()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub(crate) struct Selector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) cel: Option<CelSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub(super) struct CelSelector {
    #[serde(default)]
    pub(super) expression: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allocation: Option<Allocation>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
struct Allocation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    devices: Option<AllocatedDevices>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
struct AllocatedDevices {
    #[serde(default, deserialize_with = "bounded::<_, MAX_RESULTS, _>")]
    results: Vec<AllocatedDevice>,
}

/// One allocated device: `driver`/`pool`/`device` name it in the ResourceSlices.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AllocatedDevice {
    #[serde(default)]
    request: String,
    #[serde(default)]
    pub(crate) driver: String,
    #[serde(default)]
    pub(crate) pool: String,
    #[serde(default)]
    pub(crate) device: String,
    /// What it consumes of a shared device's capacities.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "bounded_map::<_, MAX_CAPACITIES, _>"
    )]
    consumed_capacity: BTreeMap<String, String>,
}

impl AllocatedDevice {
    /// What it consumes of its device's capacities (an unreadable amount is left out,
    /// and so charged as all of that capacity).
    pub(crate) fn consumed(&self) -> Option<Asks> {
        let amounts = self.consumed_capacity.iter();
        let read = amounts.filter_map(|(n, a)| Some((n.clone(), Milli::parse(a).ok()?)));
        let read: Asks = read.collect();
        (!self.consumed_capacity.is_empty()).then_some(read)
    }
}

impl ResourceClaim {
    pub(crate) fn requests(&self) -> &[DeviceRequest] {
        self.spec
            .devices
            .as_ref()
            .map_or(&[], |d| d.requests.as_slice())
    }

    /// The devices allocated to the claim (empty until the scheduler allocates it).
    pub(crate) fn allocated(&self) -> &[AllocatedDevice] {
        let status = self.status.as_ref().and_then(|s| s.allocation.as_ref());
        status
            .and_then(|a| a.devices.as_ref())
            .map_or(&[], |d| d.results.as_slice())
    }
}

super::lite_resource!(
    ResourceClaim,
    "ResourceClaim",
    "resourceclaims",
    NamespaceResourceScope
);

/// A list of at most `N` items: longer ones are refused while decoding.
pub(super) fn bounded<'de, T: Deserialize<'de>, const N: usize, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    let items: Vec<T> = Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default();
    if items.len() > N {
        return Err(serde::de::Error::custom(format!(
            "more than {N} items; refusing it"
        )));
    }
    Ok(items)
}

fn bounded_opt<'de, T: Deserialize<'de>, const N: usize, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<T>>, D::Error> {
    bounded::<T, N, D>(deserializer).map(|v| (!v.is_empty()).then_some(v))
}

/// A map of at most `N` entries: larger ones are refused while decoding.
pub(super) fn bounded_map<'de, T: Deserialize<'de>, const N: usize, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, T>, D::Error> {
    let items: BTreeMap<String, T> =
        Option::<BTreeMap<String, T>>::deserialize(deserializer)?.unwrap_or_default();
    if items.len() > N {
        return Err(serde::de::Error::custom(format!(
            "more than {N} entries; refusing it"
        )));
    }
    Ok(items)
}
