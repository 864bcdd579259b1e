//! DeviceClasses (`resource.k8s.io/v1`): which of them hand out GPUs. A class the
//! config lists is a GPU class (with the model it implies, if any); any other is one
//! when its selectors can match a device of the GPU driver (docs/devices.md).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::wire::{Selector, bounded};

/// Most selectors of a class (Kubernetes: 32).
const MAX_SELECTORS: usize = 64;

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct DeviceClass {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    spec: ClassSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClassSpec {
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "bounded::<_, MAX_SELECTORS, _>"
    )]
    selectors: Vec<Selector>,
    /// The extended resource a pod asks for to get a device of this class
    /// (DRA-backed extended resources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    extended_resource_name: Option<String>,
}

super::lite_resource!(
    DeviceClass,
    "DeviceClass",
    "deviceclasses",
    ClusterResourceScope
);

/// A DeviceClass as the cache keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassInfo {
    /// Its selectors' CEL expressions.
    pub(crate) selectors: Vec<String>,
    pub(crate) extended_resource: Option<String>,
}

impl ClassInfo {
    pub fn of(class: &DeviceClass) -> Self {
        let expressions = class.spec.selectors.iter().filter_map(|s| s.cel.as_ref());
        ClassInfo {
            selectors: expressions.map(|c| c.expression.clone()).collect(),
            extended_resource: class.spec.extended_resource_name.clone(),
        }
    }
}

/// The cluster's DeviceClasses by name.
pub type DeviceClasses = BTreeMap<String, ClassInfo>;
