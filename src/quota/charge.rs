//! What a pod is charged (docs/design.md, "Quota"), pure: its cost per quota key on a
//! node label, what a dearer node adds, and a namespace's usage from its pods. When it
//! is charged, and by which label, is `quota::price`.

use std::collections::BTreeMap;

use crate::placement::GpuRequest;
use crate::placement::mig::{self, MigResources};
use crate::placement::quantity::Milli;

/// GPUs per model, in thousandths of a GPU.
pub(crate) type ModelAmounts = BTreeMap<String, Milli>;

/// What a pod on (or wanting) a node labelled `label` is charged, per quota key: its
/// GPUs (the effective request) to the label's GPU model, and MIG slices at their
/// fraction of a GPU to the model and one each to the profile's key
/// (`<model>/<profile>`, docs/devices.md). On a single-strategy MIG node
/// (`<model>-MIG-<profile>`) every whole GPU the pod asks for is one slice.
pub fn charge_on(request: &GpuRequest, label: &str, mig: &MigResources) -> ModelAmounts {
    let (model, single) = mig::split_product(label);
    let mut charge = ModelAmounts::new();
    let mut add = |key: &str, amount: u64| {
        if amount > 0 {
            let entry = charge.entry(key.to_string()).or_default();
            entry.0 = entry.0.saturating_add(amount);
        }
    };
    // 100 vcuda-core = 1 GPU = 1000 milli.
    let units = request.core_units();
    match single.and_then(|p| Some((p, mig::compute_slices(p).ok()?))) {
        Some((profile, compute)) => {
            let slices = units / 100;
            let each = mig.slice_fraction(model, compute).0;
            add(model, each.saturating_mul(slices) + units % 100 * 10);
            add(
                &mig::profile_key(model, profile),
                slices.saturating_mul(1000),
            );
        }
        None => add(model, units.saturating_mul(10)),
    }
    for demand in &request.mig {
        let count = u64::from(demand.count);
        let each = mig.slice_fraction(model, demand.compute).0;
        add(model, each.saturating_mul(count));
        add(&mig::profile_key(model, &demand.profile), count * 1000);
    }
    charge
}

/// What `cost` (a pod's charge on a node) asks beyond `charged` (what it was charged
/// at admission), per quota key: the keys where it costs more, by how much.
pub(crate) fn excess(cost: &ModelAmounts, charged: &ModelAmounts) -> ModelAmounts {
    let more = cost.iter().filter_map(|(key, amount)| {
        let before = charged.get(key).map_or(0, |m| m.0);
        (amount.0 > before).then(|| (key.clone(), Milli(amount.0 - before)))
    });
    more.collect()
}

/// Add `charge` to `total`, key by key.
pub(crate) fn add_charge(total: &mut ModelAmounts, charge: &ModelAmounts) {
    for (key, amount) in charge {
        let entry = total.entry(key.clone()).or_default();
        entry.0 = entry.0.saturating_add(amount.0);
    }
}

/// What a pod would be charged on each model (node label) it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Costs(Vec<(String, ModelAmounts)>);

impl Costs {
    pub(super) fn of(request: &GpuRequest, labels: &[String], mig: &MigResources) -> Self {
        let each = labels
            .iter()
            .map(|l| (l.clone(), charge_on(request, l, mig)));
        Costs(each.collect())
    }

    /// Costs given per label (tests, and callers that computed them).
    pub(crate) fn from_charges(charges: Vec<(String, ModelAmounts)>) -> Self {
        Costs(charges)
    }

    /// The cost of a pod already placed on a node labelled `label`.
    pub(crate) fn single(label: String, charge: ModelAmounts) -> Self {
        Costs(vec![(label, charge)])
    }

    /// The charge on `label` (empty for a label the costs were not computed for).
    pub(crate) fn on(&self, label: &str) -> ModelAmounts {
        let found = self.0.iter().find(|(l, _)| l == label);
        found.map(|(_, charge)| charge.clone()).unwrap_or_default()
    }
}

/// A pod as usage counting sees it.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodCharge<'a> {
    pub(crate) namespace: &'a str,
    /// What it is charged per quota key (empty: nothing, or not yet).
    pub(crate) charge: ModelAmounts,
    /// Finished or being deleted pods are not charged.
    pub(crate) live: bool,
}

/// Usage per model of one namespace, from its pods.
#[cfg(test)]
pub(crate) fn usage<'a>(
    namespace: &str,
    pods: impl IntoIterator<Item = PodCharge<'a>>,
) -> ModelAmounts {
    let mut used = ModelAmounts::new();
    for pod in pods
        .into_iter()
        .filter(|p| p.live && p.namespace == namespace)
    {
        for (key, amount) in pod.charge {
            let entry = used.entry(key).or_default();
            entry.0 = entry.0.saturating_add(amount.0);
        }
    }
    used
}

/// The part of a namespace's `usage` one quota reports (status, metrics): the models it
/// lists (`lists`) and those no quota of the namespace lists (`listed` holds every
/// model some quota lists). A pod charged to an unlisted model got around admission
/// (created before the quota, or while the webhook was down); its use is shown against
/// a quota of zero in every quota of the namespace rather than hidden.
pub(crate) fn reported_usage(
    usage: &ModelAmounts,
    lists: impl Fn(&str) -> bool,
    listed: &[String],
) -> ModelAmounts {
    usage
        .iter()
        .filter(|(key, _)| lists(key) || !(listed.contains(*key) || mig::is_profile_key(key)))
        .map(|(model, amount)| (model.clone(), *amount))
        .collect()
}
