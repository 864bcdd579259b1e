//! The install (`deploy/` and the Helm chart's default rendering) against the real API
//! server.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::support::*;

/// Every object in `deploy/` — and, when hack/e2e.sh rendered it, the Helm chart with its
/// default values — is accepted by the real API server (server-side apply, dry run).
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn every_deploy_manifest_passes_server_side_dry_run() {
    let Some(cluster) = setup("manifests").await else {
        return;
    };
    // Namespaced objects can only be dry-run into a namespace that exists.
    let install: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "gpu-admission"}})).unwrap();
    let _ = Api::<Namespace>::all(cluster.client.clone())
        .create(&PostParams::default(), &install)
        .await;
    let deploy = crate::repo::path("deploy");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&deploy)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    if let Some(rendered) = std::env::var_os("GPU_ADMISSION_E2E_CHART_RENDER") {
        files.push(rendered.into());
    }
    let discovery = kube::Discovery::new(cluster.client.clone())
        .run()
        .await
        .unwrap();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document).unwrap();
            if value.is_null() {
                continue;
            }
            let object: kube::api::DynamicObject = serde_yaml::from_value(value).unwrap();
            let types = object.types.clone().unwrap();
            let gvk = kube::api::GroupVersionKind::try_from(&types).unwrap();
            let name = object.metadata.name.clone().unwrap();
            let (resource, caps) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| {
                panic!(
                    "{}: the API server does not serve {gvk:?} ({name})",
                    file.display()
                )
            });
            let api: Api<kube::api::DynamicObject> = match caps.scope {
                kube::discovery::Scope::Namespaced => {
                    let namespace = object
                        .metadata
                        .namespace
                        .as_deref()
                        .unwrap_or("gpu-admission");
                    Api::namespaced_with(cluster.client.clone(), namespace, &resource)
                }
                kube::discovery::Scope::Cluster => Api::all_with(cluster.client.clone(), &resource),
            };
            let params = kube::api::PatchParams::apply("gpu-admission-e2e")
                .dry_run()
                .force();
            api.patch(&name, &params, &kube::api::Patch::Apply(&object))
                .await
                .unwrap_or_else(|e| panic!("{}: {} {name} refused: {e}", file.display(), gvk.kind));
            checked += 1;
        }
    }
    println!(
        "server-side dry run accepted {checked} objects from {} files",
        files.len()
    );
    assert!(
        checked >= 20,
        "deploy/ should hold the whole install, saw {checked} objects"
    );
}
