//! A real node: kubelet, containerd and runc, with a bridge CNI network (hack/lib/node.sh),
//! registered after the other scenarios ran. `GPU_ADMISSION_E2E_NODE` names it and
//! `GPU_ADMISSION_E2E_IMAGE` is the image deploy/ runs, built by hack/image.sh without a
//! container engine and imported into the node's containerd.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{LogParams, PostParams};
use serde_json::json;

use crate::support::*;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: hack/e2e.sh sets it when it starts the real node")
    })
}

/// The image deploy/ names runs on a real node as deploy/ runs it (user 65532, read-only
/// root file system, no privileges): a pod that runs `gpu-admission version` succeeds,
/// and its log, read through the API server from the kubelet, is the binary's version.
#[tokio::test]
#[ignore = "needs a control plane and a real node: bash hack/e2e.sh runs it"]
async fn the_image_deploy_names_runs_on_a_real_node() {
    let Some(cluster) = setup("node-image").await else {
        return;
    };
    let (node, image) = (
        env("GPU_ADMISSION_E2E_NODE"),
        env("GPU_ADMISSION_E2E_IMAGE"),
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "version"},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "gpu-admission",
                "image": image,
                "imagePullPolicy": "Never",
                "args": ["version"],
                "securityContext": {
                    "runAsNonRoot": true,
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                }
            }]
        }
    }))
    .unwrap();
    cluster
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let phase = wait_for(
        "the pod to finish on the real node",
        Duration::from_secs(60),
        || async {
            let pod = cluster.pods().get("version").await.ok()?;
            let phase = pod.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        },
    )
    .await;
    let log = cluster
        .pods()
        .logs("version", &LogParams::default())
        .await
        .unwrap();
    println!("{image} on {node}: {phase}; log: {log:?}");
    assert_eq!(phase, "Succeeded", "log: {log}");
    assert!(
        log.starts_with("gpu-admission "),
        "the binary's version, read from the kubelet: {log:?}"
    );
}
