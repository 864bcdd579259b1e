//! tkestack gpu-admission's quota ConfigMap (`kube-system/gpuquota`, key `gpu_quota`):
//! `{"<namespace>": {"quota": {"<model>": <GPUs>}, "pool": ["<pool>"]}}`, turned into
//! the equivalent GPUQuota objects (docs/design.md).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;

use super::{GPUQuota, GpuQuotaSpec};
use crate::placement::quantity::Milli;

/// The name given to imported quotas in each namespace.
const IMPORTED_NAME: &str = "default";
/// The ConfigMap key tkestack read.
pub(crate) const CONFIGMAP_KEY: &str = "gpu_quota";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyNamespace {
    #[serde(default)]
    quota: BTreeMap<String, serde_json::Number>,
    #[serde(default)]
    pool: Vec<String>,
}

/// Why the legacy JSON cannot be imported.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LegacyError {
    #[error("legacy quota JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("namespace {namespace:?}, model {model:?}: {source}")]
    Amount {
        namespace: String,
        model: String,
        source: crate::placement::quantity::QuantityError,
    },
}

/// Parse the legacy JSON; errors name the namespace and model at fault.
pub(crate) fn quotas_from_legacy(json: &str) -> Result<Vec<GPUQuota>, LegacyError> {
    let namespaces: BTreeMap<String, LegacyNamespace> = serde_json::from_str(json)?;
    namespaces
        .into_iter()
        .map(|(namespace, legacy)| {
            let mut hard = BTreeMap::new();
            for (model, number) in legacy.quota {
                let amount =
                    Milli::parse(&number.to_string()).map_err(|source| LegacyError::Amount {
                        namespace: namespace.clone(),
                        model: model.clone(),
                        source,
                    })?;
                hard.insert(model, Quantity(amount.to_string()));
            }
            let mut quota = GPUQuota::new(
                IMPORTED_NAME,
                GpuQuotaSpec {
                    hard,
                    pools: legacy.pool,
                    ..Default::default()
                },
            );
            quota.metadata.namespace = Some(namespace);
            Ok(quota)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn converts_every_namespace_with_models_and_pools() {
        let quotas = quotas_from_legacy(
            r#"{"team-a": {"quota": {"M40": 4, "P100": 1.5}, "pool": ["public"]}, "team-b": {"quota": {"T4": 2}}}"#,
        )
        .unwrap();
        assert_eq!(quotas.len(), 2);
        assert_eq!(quotas[0].metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(quotas[0].metadata.name.as_deref(), Some("default"));
        assert_eq!(quotas[0].spec.hard["P100"], Quantity("1.5".into()));
        assert_eq!(quotas[0].spec.hard["M40"], Quantity("4".into()));
        assert_eq!(quotas[0].spec.pools, ["public"]);
        assert!(quotas[1].spec.pools.is_empty());
    }

    #[test]
    fn bad_legacy_data_is_named() {
        let err = quotas_from_legacy(r#"{"team-a": {"quota": {"T4": -1}}}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"namespace "team-a", model "T4": "-1" is negative"#
        );
        assert!(
            quotas_from_legacy(r#"{"team-a": {"quotas": {}}}"#)
                .unwrap_err()
                .to_string()
                .contains("unknown field `quotas`")
        );
        assert!(
            quotas_from_legacy("[]")
                .unwrap_err()
                .to_string()
                .starts_with("legacy quota JSON")
        );
    }
}
