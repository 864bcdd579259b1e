//! ResourceSlices (`resource.k8s.io/v1`): the devices a DRA driver publishes, reduced to
//! what quota needs: each GPU device's model label (and MIG profile), by the
//! (driver, pool, device) names an allocation result uses.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use std::sync::Arc;

use super::Dra;
use super::capacity::{Capacity as SharedCapacity, RequestPolicy, Shared, WirePolicy};
use super::cel::{AttributeValue, CelDevice};
use super::wire::{bounded, bounded_map};
use crate::placement::quantity::Milli;

/// Most devices one slice may list (Kubernetes: 128; 64 with taints or counters).
const MAX_DEVICES: usize = 256;
/// Most attributes (and capacities) of one device (Kubernetes: 32 together).
const MAX_ATTRIBUTES: usize = 64;
/// Most distinct devices of one model (and profile) a claim's selectors are evaluated
/// against: devices that differ only in, say, their UUID say the same about models.
pub(crate) const MAX_SAMPLES: usize = 8;

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct ResourceSlice {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    spec: SliceSpec,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SliceSpec {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    pool: Pool,
    /// The node whose devices these are (node-local drivers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_name: Option<String>,
    #[serde(default, deserialize_with = "bounded::<_, MAX_DEVICES, _>")]
    devices: Vec<Device>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
struct Pool {
    #[serde(default)]
    name: String,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    #[serde(default)]
    name: String,
    /// It may be allocated to several claims at once, each consuming part of its
    /// capacities (consumable capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allow_multiple_allocations: Option<bool>,
    #[serde(default, deserialize_with = "bounded_map::<_, MAX_ATTRIBUTES, _>")]
    attributes: BTreeMap<String, Attribute>,
    #[serde(default, deserialize_with = "bounded_map::<_, MAX_ATTRIBUTES, _>")]
    capacity: BTreeMap<String, Capacity>,
}

/// A device attribute: one of a string, an integer, a boolean or a version.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
struct Attribute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    string: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    int: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bool: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

impl Attribute {
    fn value(&self) -> Option<AttributeValue> {
        let string = self.string.clone().map(AttributeValue::String);
        let int = self.int.map(AttributeValue::Int);
        let boolean = self.bool.map(AttributeValue::Bool);
        let version = self.version.clone().map(AttributeValue::Version);
        string.or(int).or(boolean).or(version)
    }
}

/// A device capacity (`value` is a quantity).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Capacity {
    #[serde(default)]
    value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request_policy: Option<WirePolicy>,
}

super::lite_resource!(
    ResourceSlice,
    "ResourceSlice",
    "resourceslices",
    ClusterResourceScope
);

/// A device by the names an allocation result uses: (pool, device).
type DeviceKey = (String, String);

/// A slice's GPU devices.
pub(crate) type SliceDevices = Vec<(DeviceKey, GpuDevice)>;

/// One GPU device as quota sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDevice {
    /// The model attribute as published (for pinning selectors).
    product: String,
    /// Its model label (`Dra::label_of_product`).
    pub(crate) label: String,
    pub(crate) profile: Option<String>,
    /// The node the device is on, if its slice names one.
    node: Option<String>,
    /// Its capacities, when it may be allocated to several claims at once.
    pub(crate) shared: Option<Arc<Shared>>,
    /// The device as CEL selectors see it.
    pub(crate) cel: Arc<CelDevice>,
}

/// A slice's GPU devices: ((pool, device), what it is). Devices of other drivers, or
/// without the model attribute, are not GPUs to quota.
pub fn gpu_devices(slice: &ResourceSlice, dra: &Dra) -> SliceDevices {
    if slice.spec.driver != dra.driver {
        return Vec::new();
    }
    let string = |device: &Device, attribute: &str| -> Option<String> {
        let qualified = format!("{}/{attribute}", dra.driver);
        let value = device
            .attributes
            .get(attribute)
            .or_else(|| device.attributes.get(&qualified))?;
        value.string.clone()
    };
    let pool = &slice.spec.pool.name;
    slice
        .spec
        .devices
        .iter()
        .filter_map(|device| {
            let product = string(device, &dra.model_attribute)?;
            let gpu = GpuDevice {
                label: dra.label_of_product(&product),
                product,
                profile: string(device, &dra.profile_attribute),
                node: slice.spec.node_name.clone(),
                shared: shared(device),
                cel: Arc::new(cel_device(&dra.driver, device)),
            };
            Some(((pool.clone(), device.name.clone()), gpu))
        })
        .collect()
}

/// A device that may go to several claims: its capacities, with their policies. An
/// unreadable value makes the capacity zero, which every allocation takes whole.
fn shared(device: &Device) -> Option<Arc<Shared>> {
    if device.allow_multiple_allocations != Some(true) {
        return None;
    }
    let capacities = device.capacity.iter().map(|(name, capacity)| {
        let value = Milli::parse(&capacity.value).unwrap_or_default();
        let policy = capacity
            .request_policy
            .as_ref()
            .map(RequestPolicy::from_wire);
        (name.clone(), SharedCapacity { value, policy })
    });
    Some(Arc::new(Shared {
        capacities: capacities.collect(),
    }))
}

/// `device` as CEL sees it: attributes and capacities by domain (unqualified names are
/// the driver's), capacities in thousandths (an unreadable one is left out).
fn cel_device(driver: &str, device: &Device) -> CelDevice {
    let split = |name: &str| -> (String, String) {
        match name.rsplit_once('/') {
            Some((domain, name)) => (domain.to_string(), name.to_string()),
            None => (driver.to_string(), name.to_string()),
        }
    };
    let mut attributes: BTreeMap<String, BTreeMap<String, AttributeValue>> = BTreeMap::new();
    for (name, attribute) in &device.attributes {
        let (domain, name) = split(name);
        if let Some(value) = attribute.value() {
            attributes.entry(domain).or_default().insert(name, value);
        }
    }
    let mut capacity: BTreeMap<String, BTreeMap<String, Milli>> = BTreeMap::new();
    for (name, value) in &device.capacity {
        let (domain, name) = split(name);
        if let Ok(quantity) = Milli::parse(&value.value) {
            capacity.entry(domain).or_default().insert(name, quantity);
        }
    }
    let shared = device.allow_multiple_allocations == Some(true);
    CelDevice::published(driver, &attributes, &capacity, shared)
}

/// The GPU devices of every slice of the configured driver, by slice name.
#[derive(Debug, Default)]
pub struct DeviceIndex {
    by_slice: HashMap<String, SliceDevices>,
    devices: HashMap<DeviceKey, GpuDevice>,
    /// `samples` and `products`, worked out once per change of the devices (every
    /// claim judged reads them).
    derived: std::sync::OnceLock<Derived>,
}

/// Sample devices by (model label, profile), and published products by label.
type Samples = BTreeMap<(String, Option<String>), Vec<Arc<CelDevice>>>;

/// The distinct capacities of the shareable devices, by (model label, profile).
pub(crate) type SharedShapes = BTreeMap<(String, Option<String>), Vec<Arc<Shared>>>;

#[derive(Debug, Default)]
struct Derived {
    samples: Samples,
    products: BTreeMap<String, Vec<String>>,
    shared: SharedShapes,
}

impl DeviceIndex {
    pub fn apply(&mut self, slice: &str, devices: SliceDevices) {
        self.delete(slice);
        self.derived = Default::default();
        for (key, device) in &devices {
            self.devices.insert(key.clone(), device.clone());
        }
        self.by_slice.insert(slice.to_string(), devices);
    }

    pub(crate) fn delete(&mut self, slice: &str) {
        self.derived = Default::default();
        for (key, _) in self.by_slice.remove(slice).into_iter().flatten() {
            self.devices.remove(&key);
        }
    }

    pub(crate) fn replace(&mut self, slices: Vec<(String, SliceDevices)>) {
        *self = DeviceIndex::default();
        for (name, devices) in slices {
            self.apply(&name, devices);
        }
    }

    pub(crate) fn device(&self, pool: &str, device: &str) -> Option<&GpuDevice> {
        self.devices.get(&(pool.to_string(), device.to_string()))
    }

    /// Up to [`MAX_SAMPLES`] distinct devices of each (model label, profile), in a
    /// stable order: what a claim's selectors are evaluated against.
    pub(super) fn samples(&self) -> Samples {
        self.derived().samples.clone()
    }

    fn derived(&self) -> &Derived {
        self.derived.get_or_init(|| Derived {
            samples: self.sample(),
            products: self.published_products(),
            shared: self.shared_shapes(),
        })
    }

    /// Every distinct set of capacities (and policies) the shareable devices of each
    /// (model label, profile) publish: all of them, never a sample, since the policies
    /// decide what a share costs and CEL cannot see them.
    pub(super) fn shared(&self) -> SharedShapes {
        self.derived().shared.clone()
    }

    fn shared_shapes(&self) -> SharedShapes {
        let mut shapes = SharedShapes::new();
        for device in self.devices.values() {
            let Some(shared) = &device.shared else {
                continue;
            };
            let key = (device.label.clone(), device.profile.clone());
            let entry = shapes.entry(key).or_default();
            if !entry.iter().any(|s| s == shared) {
                entry.push(shared.clone());
            }
        }
        shapes
    }

    fn sample(&self) -> Samples {
        let mut keys: Vec<&DeviceKey> = self.devices.keys().collect();
        keys.sort();
        let mut samples: BTreeMap<(String, Option<String>), Vec<Arc<CelDevice>>> = BTreeMap::new();
        for key in keys {
            let device = &self.devices[key];
            let entry = samples
                .entry((device.label.clone(), device.profile.clone()))
                .or_default();
            let seen = entry
                .iter()
                .any(|d| d.fingerprint == device.cel.fingerprint);
            if entry.len() < MAX_SAMPLES && !seen {
                entry.push(device.cel.clone());
            }
        }
        samples
    }

    /// The model attribute values published, by model label, sorted.
    pub(super) fn products(&self) -> BTreeMap<String, Vec<String>> {
        self.derived().products.clone()
    }

    fn published_products(&self) -> BTreeMap<String, Vec<String>> {
        let mut products: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for device in self.devices.values() {
            products
                .entry(device.label.clone())
                .or_default()
                .push(device.product.clone());
        }
        for values in products.values_mut() {
            values.sort();
            values.dedup();
        }
        products
    }

    /// Every published GPU device, each distinct one (as CEL sees it) once.
    pub(crate) fn distinct(&self) -> impl Iterator<Item = &GpuDevice> {
        let mut seen: HashMap<u64, Vec<&CelDevice>> = HashMap::new();
        (self.devices.values()).filter(move |d| {
            let same = seen.entry(d.cel.fingerprint).or_default();
            let new = !same.iter().any(|s| **s == *d.cel);
            if new {
                same.push(&d.cel);
            }
            new
        })
    }

    /// Whether no GPU device is published.
    pub(crate) fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The nodes with published GPU devices, and the model labels of each node's.
    pub(crate) fn node_models(&self) -> BTreeMap<String, std::collections::BTreeSet<String>> {
        let mut nodes: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for device in self.devices.values() {
            if let Some(node) = &device.node {
                nodes
                    .entry(node.clone())
                    .or_default()
                    .insert(device.label.clone());
            }
        }
        nodes
    }
}
