//! `gpu-admission quota import`: the legacy quota ConfigMap (or its JSON in a file) to
//! GPUQuota objects, created or updated by server-side apply.

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};

use crate::cli::QuotaImportArgs;
use crate::quota::GPUQuota;
use crate::quota::legacy::{CONFIGMAP_KEY, quotas_from_legacy};

const FIELD_MANAGER: &str = "gpu-admission-import";

pub async fn run(args: QuotaImportArgs) -> anyhow::Result<()> {
    let json = match (&args.file, &args.configmap) {
        (Some(path), _) => {
            std::fs::read_to_string(path).with_context(|| format!("--file {}", path.display()))?
        }
        (None, Some(reference)) => read_configmap(&args, reference).await?,
        (None, None) => bail!("give --configmap NAMESPACE/NAME or --file PATH"),
    };
    let quotas = quotas_from_legacy(&json)?;
    if args.dry_run {
        for quota in &quotas {
            print!("---\n{}", serde_yaml::to_string(quota)?);
        }
        return Ok(());
    }
    let client = crate::api_client::kube_client(args.kubeconfig.as_deref(), None).await?;
    for quota in &quotas {
        let namespace = quota.metadata.namespace.clone().unwrap_or_default();
        let name = quota.metadata.name.clone().unwrap_or_default();
        let api: Api<GPUQuota> = Api::namespaced(client.clone(), &namespace);
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(quota),
        )
        .await
        .with_context(|| format!("applying GPUQuota {namespace}/{name}"))?;
        println!("gpuquota {namespace}/{name} applied");
    }
    Ok(())
}

async fn read_configmap(args: &QuotaImportArgs, reference: &str) -> anyhow::Result<String> {
    let Some((namespace, name)) = reference.split_once('/') else {
        bail!("--configmap {reference:?}: expected NAMESPACE/NAME");
    };
    let client = crate::api_client::kube_client(args.kubeconfig.as_deref(), None).await?;
    let configmap = Api::<ConfigMap>::namespaced(client, namespace)
        .get(name)
        .await
        .with_context(|| format!("reading ConfigMap {reference}"))?;
    configmap
        .data
        .and_then(|mut data| data.remove(CONFIGMAP_KEY))
        .with_context(|| format!("ConfigMap {reference} has no {CONFIGMAP_KEY:?} key"))
}
