//! Admission webhooks for Pods: `/mutate` steers GPU pods to the GPU scheduler and
//! their models; `/validate` enforces the per-namespace, per-model GPU quota. For
//! ResourceClaims, `/mutate/resourceclaims` pins a model and `/validate/resourceclaims`
//! charges the claim's GPU devices.

pub(crate) mod claim;
pub(crate) mod mutate;
pub(crate) mod validate;
mod verdict;
