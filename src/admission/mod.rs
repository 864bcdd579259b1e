//! Admission webhooks for Pods: `/mutate` steers GPU pods to the GPU scheduler and
//! their models; `/validate` enforces the per-namespace, per-model GPU quota. For
//! ResourceClaims, `/mutate/resourceclaims` pins a model and `/validate/resourceclaims`
//! charges the claim's GPU devices.

pub mod claim;
pub mod mutate;
pub mod validate;
pub mod verdict;
