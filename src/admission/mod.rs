//! Admission webhooks for Pods: `/mutate` steers GPU pods to the GPU scheduler and
//! their models; `/validate` enforces the per-namespace, per-model GPU quota.

pub mod mutate;
pub mod review;
pub mod validate;
