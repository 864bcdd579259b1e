//! ResourceSlices (`resource.k8s.io/v1`): the devices a DRA driver publishes, reduced to
//! what quota needs: each GPU device's model label (and MIG profile), by the
//! (driver, pool, device) names an allocation result uses.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::Dra;
use super::wire::bounded;

/// Most devices one slice may list (Kubernetes: 128; 64 with taints or counters).
const MAX_DEVICES: usize = 256;

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct ResourceSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SliceSpec,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct SliceSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: Pool,
    #[serde(default, deserialize_with = "bounded::<_, MAX_DEVICES, _>")]
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct Pool {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct Device {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, Attribute>,
}

/// A device attribute; only string values name models and profiles.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct Attribute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
}

super::lite_resource!(
    ResourceSlice,
    "ResourceSlice",
    "resourceslices",
    ClusterResourceScope
);

/// A device by the names an allocation result uses: (pool, device).
pub type DeviceKey = (String, String);

/// A slice's GPU devices.
pub type SliceDevices = Vec<(DeviceKey, GpuDevice)>;

/// One GPU device as quota sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    /// The model attribute as published (for pinning selectors).
    pub product: String,
    /// Its model label (`Dra::label_of_product`).
    pub label: String,
    pub profile: Option<String>,
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
            };
            Some(((pool.clone(), device.name.clone()), gpu))
        })
        .collect()
}

/// The GPU devices of every slice of the configured driver, by slice name.
#[derive(Debug, Default)]
pub struct DeviceIndex {
    by_slice: HashMap<String, SliceDevices>,
    devices: HashMap<DeviceKey, GpuDevice>,
}

impl DeviceIndex {
    pub fn apply(&mut self, slice: &str, devices: SliceDevices) {
        self.delete(slice);
        for (key, device) in &devices {
            self.devices.insert(key.clone(), device.clone());
        }
        self.by_slice.insert(slice.to_string(), devices);
    }

    pub fn delete(&mut self, slice: &str) {
        for (key, _) in self.by_slice.remove(slice).into_iter().flatten() {
            self.devices.remove(&key);
        }
    }

    pub fn replace(&mut self, slices: Vec<(String, SliceDevices)>) {
        *self = DeviceIndex::default();
        for (name, devices) in slices {
            self.apply(&name, devices);
        }
    }

    pub fn device(&self, pool: &str, device: &str) -> Option<&GpuDevice> {
        self.devices.get(&(pool.to_string(), device.to_string()))
    }

    /// The model attribute values published for `label`, sorted, for pinning.
    pub fn products_of(&self, label: &str) -> Vec<String> {
        let mut products: Vec<String> = self
            .devices
            .values()
            .filter(|d| d.label == label)
            .map(|d| d.product.clone())
            .collect();
        products.sort();
        products.dedup();
        products
    }
}
