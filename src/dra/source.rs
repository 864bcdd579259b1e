//! What a [`Catalog`] is built from, and which DeviceClasses are GPU classes: copied
//! out of the cluster state under its lock, worked out (CEL compiled and evaluated)
//! outside it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Dra;
use super::cel::{CelDevice, Selector};
use super::classes::{ClassInfo, DeviceClasses};
use super::slices::DeviceIndex;

/// What a [`Catalog`] is built from, copied out of the cluster state (cheap: the
/// sampled devices are shared).
#[derive(Debug, Clone)]
pub(crate) struct CatalogSource {
    pub(super) dra: Dra,
    pub(super) classes: DeviceClasses,
    pub(super) samples: BTreeMap<(String, Option<String>), Vec<Arc<CelDevice>>>,
    pub(super) products: BTreeMap<String, Vec<String>>,
    pub(super) shared: super::slices::SharedShapes,
    pub(super) known: BTreeSet<String>,
}

impl CatalogSource {
    pub(crate) fn new(
        dra: &Dra,
        classes: &DeviceClasses,
        devices: &DeviceIndex,
        known: impl IntoIterator<Item = String>,
    ) -> Self {
        CatalogSource {
            dra: dra.clone(),
            classes: classes.clone(),
            samples: devices.samples(),
            products: devices.products(),
            shared: devices.shared(),
            known: known.into_iter().collect(),
        }
    }
}

#[derive(Debug)]
pub(super) struct GpuClass {
    pub(super) model: Option<String>,
    pub(super) selectors: Vec<Selector>,
}

/// The GPU classes: those the config lists, and those whose selectors match a published
/// device of the GPU driver, or do not rule out a device of it (on a device of that
/// driver with no attributes, each evaluates true or fails for want of one).
pub(super) fn gpu_classes(
    dra: &Dra,
    samples: &BTreeMap<(String, Option<String>), Vec<Arc<CelDevice>>>,
    classes: &DeviceClasses,
) -> BTreeMap<String, GpuClass> {
    let compile = |info: Option<&ClassInfo>| -> Option<Vec<Selector>> {
        let expressions = info.map(|i| i.selectors.as_slice()).unwrap_or_default();
        expressions
            .iter()
            .map(|e| Selector::compile(e).ok())
            .collect()
    };
    let mut gpu = BTreeMap::new();
    for (name, model) in &dra.device_classes {
        let selectors = compile(classes.get(name)).unwrap_or_default();
        let model = (!model.is_empty()).then(|| model.clone());
        gpu.insert(name.clone(), GpuClass { model, selectors });
    }
    let bare = CelDevice::new(&dra.driver, &BTreeMap::new(), &BTreeMap::new());
    for (name, info) in classes {
        if gpu.contains_key(name) {
            continue;
        }
        let Some(selectors) = compile(Some(info)) else {
            continue;
        };
        let mut published = samples.values().flatten();
        let matches = |d: &CelDevice| selectors.iter().all(|s| s.evaluate(d) == Some(true));
        let is_gpu = published.any(|d| matches(d))
            || selectors.iter().all(|s| s.evaluate(&bare) != Some(false));
        if is_gpu {
            gpu.insert(
                name.clone(),
                GpuClass {
                    model: None,
                    selectors,
                },
            );
        }
    }
    gpu
}
