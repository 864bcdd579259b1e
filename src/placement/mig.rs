//! MIG (Multi-Instance GPU) slices, as NVIDIA's device plugin exposes them
//! (docs/devices.md):
//!
//! - **mixed** strategy: a resource per profile, `nvidia.com/mig-1g.10gb`; the node's
//!   product label stays the GPU's (`A100-SXM4-80GB`);
//! - **single** strategy: the resource stays `nvidia.com/gpu`, one device per slice, and
//!   the product label becomes `<model>-MIG-<profile>` (`A100-SXM4-40GB-MIG-1g.5gb`).
//!
//! A slice is charged to its GPU model as the fraction of the GPU's compute slices its
//! profile takes (`1g` of a 7-slice A100: 1/7, rounded down to a thousandth, so a whole
//! GPU's worth of slices never costs more than one GPU), and one unit to the profile's own
//! quota key, `<model>/<profile>`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::quantity::Milli;

/// What the single strategy puts between the model and the profile in the product label.
pub(super) const SINGLE_INFIX: &str = "-MIG-";

/// MIG configuration (`resources.mig` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MigResources {
    /// Mixed strategy: `<prefix><profile>` is a MIG resource.
    pub(crate) resource_prefix: String,
    /// Compute slices in one whole GPU, by a fragment of the model name; the longest
    /// fragment the model contains wins.
    pub(crate) compute_slices: BTreeMap<String, u32>,
    /// Compute slices of a model no fragment matches.
    pub(crate) default_compute_slices: u32,
}

impl Default for MigResources {
    fn default() -> Self {
        let seven = ["A100", "H100", "H200", "H20", "H800", "B200", "GB200"];
        let mut compute_slices: BTreeMap<String, u32> =
            seven.iter().map(|m| (m.to_string(), 7)).collect();
        compute_slices.insert("A30".into(), 4);
        MigResources {
            resource_prefix: "nvidia.com/mig-".into(),
            compute_slices,
            default_compute_slices: 7,
        }
    }
}

/// A MIG profile name that does not say how many compute slices it takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MIG profile (expected <compute slices>g.<memory>gb, e.g. 1g.10gb)")]
pub struct ProfileError(String);

/// The compute slices a profile takes: the number before `g.` (`3g.40gb` → 3). Suffixes
/// after the memory (`1g.10gb+me`) are allowed.
pub(crate) fn compute_slices(profile: &str) -> Result<u32, ProfileError> {
    let bad = || ProfileError(profile.to_string());
    let (slices, memory) = profile.split_once("g.").ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let memory_digits: String = memory.chars().take_while(char::is_ascii_digit).collect();
    if !digits(slices) || slices.len() > 2 || !digits(&memory_digits) {
        return Err(bad());
    }
    match slices.parse() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(n) => Ok(n),
    }
}

/// Split a product label value into the GPU model and, for a single-strategy MIG node,
/// its profile: `A100-SXM4-40GB-MIG-1g.5gb` → (`A100-SXM4-40GB`, `Some("1g.5gb")`).
/// Placement asks this of every candidate node: a scan of the label's few bytes, not a
/// substring searcher set up per call (that cost the filter 0.3 ms at 5,000 nodes).
pub(crate) fn split_product(label: &str) -> (&str, Option<&str>) {
    let infix = SINGLE_INFIX.as_bytes();
    let at = label
        .as_bytes()
        .windows(infix.len())
        .position(|w| w == infix);
    match at {
        Some(at) if at > 0 && at + infix.len() < label.len() => {
            (&label[..at], Some(&label[at + infix.len()..]))
        }
        _ => (label, None),
    }
}

/// The GPU model a product label value is charged to (the label without a MIG suffix).
pub(crate) fn model_of(label: &str) -> &str {
    split_product(label).0
}

/// The quota key of a profile of a model: `A100-SXM4-80GB/1g.10gb`.
pub(crate) fn profile_key(model: &str, profile: &str) -> String {
    format!("{model}/{profile}")
}

/// Whether a quota key caps a MIG profile rather than a model.
pub(crate) fn is_profile_key(key: &str) -> bool {
    key.contains('/')
}

impl MigResources {
    /// The profile a resource name is for (`nvidia.com/mig-1g.10gb` → `1g.10gb`).
    pub(super) fn profile_of_resource<'a>(&self, resource: &'a str) -> Option<&'a str> {
        resource
            .strip_prefix(self.resource_prefix.as_str())
            .filter(|p| !p.is_empty())
    }

    /// Compute slices in one whole GPU of `model`.
    fn slices_per_gpu(&self, model: &str) -> u32 {
        let matching = self
            .compute_slices
            .iter()
            .filter(|(f, _)| model.contains(*f));
        matching
            .max_by_key(|(fragment, _)| fragment.len())
            .map_or(self.default_compute_slices, |(_, slices)| *slices)
            .max(1)
    }

    /// What one slice of `compute` compute slices costs of a GPU of `model`, in
    /// thousandths of a GPU, rounded down (never more than one GPU).
    pub(crate) fn slice_fraction(&self, model: &str, compute: u32) -> Milli {
        let total = u64::from(self.slices_per_gpu(model));
        Milli(1000 * u64::from(compute).min(total) / total)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_slice_costs_its_share_of_the_gpus_compute_slices() {
        let mig = MigResources::default();
        let a100 = |p: &str| mig.slice_fraction("A100-SXM4-80GB", compute_slices(p).unwrap());
        assert_eq!(a100("1g.10gb"), Milli(142));
        assert_eq!(a100("2g.20gb"), Milli(285));
        assert_eq!(a100("3g.40gb"), Milli(428));
        assert_eq!(a100("4g.40gb"), Milli(571));
        assert_eq!(a100("7g.80gb"), Milli(1000));
        assert_eq!(a100("1g.10gb+me"), Milli(142));
        // Seven 1g slices never cost more than the GPU they are cut from.
        assert!(a100("1g.10gb").0 * 7 <= 1000);
        let a30 = |p: &str| mig.slice_fraction("A30", compute_slices(p).unwrap());
        assert_eq!(a30("1g.6gb"), Milli(250));
        assert_eq!(a30("2g.12gb"), Milli(500));
        assert_eq!(a30("4g.24gb"), Milli(1000));
        assert_eq!(mig.slice_fraction("H100-80GB-HBM3", 3), Milli(428));
        assert_eq!(mig.slice_fraction("unknown-gpu", 1), Milli(142));
    }

    #[test]
    fn the_longest_fragment_decides_the_slice_count() {
        let mut mig = MigResources::default();
        mig.compute_slices.insert("A100-SXM4-40GB".into(), 8);
        assert_eq!(mig.slices_per_gpu("A100-SXM4-40GB"), 8);
        assert_eq!(mig.slices_per_gpu("A100-SXM4-80GB"), 7);
    }

    #[test]
    fn profile_names_are_checked() {
        assert_eq!(compute_slices("3g.40gb"), Ok(3));
        for bad in [
            "", "g.5gb", "0g.5gb", "1g", "xg.5gb", "1g.gb", "100g.5gb", "1.5gb",
        ] {
            assert!(compute_slices(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn single_strategy_labels_split_into_model_and_profile() {
        assert_eq!(
            split_product("A100-SXM4-40GB-MIG-1g.5gb"),
            ("A100-SXM4-40GB", Some("1g.5gb"))
        );
        assert_eq!(split_product("A100-SXM4-40GB"), ("A100-SXM4-40GB", None));
        assert_eq!(split_product("-MIG-1g.5gb"), ("-MIG-1g.5gb", None));
        assert_eq!(split_product("A100-MIG-"), ("A100-MIG-", None));
        assert_eq!(model_of("H100-80GB-HBM3-MIG-3g.40gb"), "H100-80GB-HBM3");
        let mig = MigResources::default();
        assert_eq!(
            mig.profile_of_resource("nvidia.com/mig-1g.10gb"),
            Some("1g.10gb")
        );
        assert_eq!(mig.profile_of_resource("nvidia.com/gpu"), None);
        assert_eq!(mig.profile_of_resource("nvidia.com/mig-"), None);
    }
}
