//! A real node: kubelet, containerd and runc, with a bridge CNI network (hack/lib/node.sh),
//! registered after the other scenarios ran. `GPU_ADMISSION_E2E_NODE` names it and
//! `GPU_ADMISSION_E2E_IMAGE` is the image deploy/ runs, built by hack/image.sh without a
//! container engine and imported into the node's containerd.

use std::time::Duration;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{LogParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

mod faults;
mod install;
mod rbac;

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

/// One object of `kind` from a multi-document manifest of deploy/.
fn shipped<T: serde::de::DeserializeOwned>(file: &str, kind: &str) -> T {
    use serde::Deserialize;
    let text = std::fs::read_to_string(crate::repo::path(file)).unwrap();
    let doc = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .find(|v| v["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in {file}"));
    serde_yaml::from_value(doc).unwrap()
}

/// A pod over the quota is refused, with the quota's message.
async fn refused_for_quota(cluster: &Cluster, what: &str) {
    let name = format!("over-{what}");
    let result = cluster
        .try_create(&unscheduled_gpu_pod(&name, None, 1))
        .await;
    let message = forbidden_message(result, "a pod over the quota");
    assert!(message.contains("GPU quota exceeded"), "{what}: {message}");
}

/// Secret `name` of `files` (key -> content) in the scenario's namespace.
async fn put_secret(cluster: &Cluster, name: &str, files: &[(&str, String)]) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": files.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    match secrets.get_opt(name).await.unwrap() {
        None => drop(
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .unwrap(),
        ),
        Some(_) => {
            let patch = Patch::Merge(serde_json::to_value(&secret).unwrap());
            drop(
                secrets
                    .patch(name, &PatchParams::default(), &patch)
                    .await
                    .unwrap(),
            );
        }
    }
}

/// gpu-admission in a container on the real node, as deploy/30-webhook.yaml runs it: the
/// shipped pod template (non-root user, read-only root file system, no capabilities, its
/// probes, its Secret and ConfigMap mounts, `--release-queue=false`) as the webhook
/// servers' ServiceAccount. Only what the test cluster needs changes: the host network
/// and a kubeconfig (the API server listens on 127.0.0.1; no kube-proxy), the API server's
/// client CA. It becomes Ready through its probes, judges admission (a pod over its
/// quota is refused by it), and when its Secret is rotated the kubelet updates the
/// mounted files and it serves the new certificate without a restart, still judging.
#[tokio::test]
#[ignore = "needs a control plane and a real node: bash hack/e2e.sh runs it"]
async fn a_containerized_replica_serves_admission_and_reloads_its_rotated_secret() {
    use k8s_openapi::api::apps::v1::Deployment;
    let Some(cluster) = setup("node-serve").await else {
        return;
    };
    let (node, image) = (
        env("GPU_ADMISSION_E2E_NODE"),
        env("GPU_ADMISSION_E2E_IMAGE"),
    );
    let read = |name: &str| std::fs::read_to_string(env(name)).unwrap();
    let cert_dir = std::path::PathBuf::from(env("GPU_ADMISSION_E2E_CERT_DIR"));
    let file = |name: &str| std::fs::read_to_string(cert_dir.join(name)).unwrap();
    put_secret(
        &cluster,
        "tls",
        &[("tls.crt", file("tls.crt")), ("tls.key", file("tls.key"))],
    )
    .await;
    put_secret(
        &cluster,
        "client-ca",
        &[("ca.crt", read("GPU_ADMISSION_E2E_CLIENT_CA"))],
    )
    .await;
    put_secret(
        &cluster,
        "kubeconfig",
        &[("config", read("GPU_ADMISSION_E2E_POD_KUBECONFIG"))],
    )
    .await;
    put_secret(
        &cluster,
        "config",
        &[("config.yaml", read("GPU_ADMISSION_E2E_CONFIG"))],
    )
    .await;

    let deployment: Deployment = shipped("deploy/30-webhook.yaml", "Deployment");
    let mut spec = deployment.spec.unwrap().template.spec.unwrap();
    spec.node_name = Some(node.clone());
    spec.host_network = Some(true);
    spec.service_account_name = None;
    spec.automount_service_account_token = Some(false);
    spec.priority_class_name = None;
    spec.affinity = None;
    let container = &mut spec.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some(image.as_str()),
        "hack/image.sh built what deploy/ names"
    );
    container.image_pull_policy = Some("Never".into());
    let args = container.args.get_or_insert_with(Vec::new);
    args.extend([
        "--kubeconfig=/etc/gpu-admission/kubeconfig/config".to_string(),
        "--client-ca=/etc/gpu-admission/client-ca/ca.crt".to_string(),
        "--tls-reload-interval=1s".to_string(),
    ]);
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    for name in ["kubeconfig", "client-ca"] {
        mounts.push(serde_json::from_value(json!({"name": name, "mountPath": format!("/etc/gpu-admission/{name}"), "readOnly": true})).unwrap());
    }
    spec.volumes = Some(
        [
            ("tls", "tls"),
            ("config", "config"),
            ("kubeconfig", "kubeconfig"),
            ("client-ca", "client-ca"),
        ]
        .iter()
        .map(|(volume, secret)| {
            serde_json::from_value(json!({"name": volume, "secret": {"secretName": secret}}))
                .unwrap()
        })
        .collect(),
    );
    let pod = Pod {
        metadata: serde_json::from_value(json!({"name": "webhook"})).unwrap(),
        spec: Some(spec),
        status: None,
    };
    cluster
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let ready = |pod: &Pod| {
        let conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    wait_for(
        "the containerized replica to be Ready (its readiness probe)",
        Duration::from_secs(90),
        || async {
            let pod = cluster.pods().get("webhook").await.ok()?;
            ready(&pod).then_some(())
        },
    )
    .await;

    // It judges admission: the webhook door of the pod (host network, deploy/'s port).
    let door = "https://127.0.0.1:3456";
    let model = "Tesla-P100";
    cluster.label_for_webhooks().await;
    cluster
        .create_quota("default", json!({model: "1"}), Some(model))
        .await;
    register_hooks(&cluster, vec![], vec![Hook::new("validate", door)]).await;
    cluster
        .try_create(&unscheduled_gpu_pod("one", None, 1))
        .await
        .unwrap();
    refused_for_quota(&cluster, "before").await;

    // Rotation through the kubelet: a renewal under the same CA goes into the Secret.
    let old = fingerprint(door);
    let scratch = renew_certificate(&cert_dir, "rotated-in-a-pod.e2e.invalid");
    let renewed = |name: &str| std::fs::read_to_string(scratch.path().join(name)).unwrap();
    let new = fingerprint(scratch.path().join("tls.crt").to_str().unwrap());
    assert_ne!(new, old);
    // Calls flow through the rotation: a create over the quota every 0.5 s, each must be
    // refused by the quota (a failed TLS handshake or call fails the scenario).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn({
        let (pods, stop) = (cluster.pods(), stop.clone());
        async move {
            let mut answers = BTreeMap::<String, u32>::new();
            for i in 0.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let pod = unscheduled_gpu_pod(&format!("during-{i}"), None, 1);
                let answer = match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => "created".to_string(),
                    Err(e) if e.to_string().contains("GPU quota exceeded") => {
                        "refused by the quota".to_string()
                    }
                    Err(e) => e.to_string(),
                };
                *answers.entry(answer).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            answers
        }
    });
    let rotated = std::time::Instant::now();
    put_secret(
        &cluster,
        "tls",
        &[
            ("tls.crt", renewed("tls.crt")),
            ("tls.key", renewed("tls.key")),
        ],
    )
    .await;
    wait_for(
        "the pod to serve the rotated certificate",
        Duration::from_secs(150),
        || {
            let new = new.clone();
            async move { (fingerprint(door) == new).then_some(()) }
        },
    )
    .await;
    println!(
        "the rotated Secret was served {:.1?} after the update (kubelet sync + reload)",
        rotated.elapsed()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = load.await.unwrap();
    println!("creates during the rotation: {answers:?}");
    assert!(
        answers.len() == 1 && answers.contains_key("refused by the quota"),
        "every create during the rotation is judged: {answers:?}"
    );
    refused_for_quota(&cluster, "after").await;
    let pod = cluster.pods().get("webhook").await.unwrap();
    let restarts = pod
        .status
        .and_then(|s| s.container_statuses)
        .map(|c| c[0].restart_count);
    assert_eq!(restarts, Some(0), "reloaded in place, not restarted");
    unregister_webhooks(&cluster).await;
    let _ = cluster.pods().delete("webhook", &Default::default()).await;
}

/// The API server restarted (hack/e2e.sh restarts it at the start of the node phase, to
/// turn the ServiceAccount plugin on): every watch of both gpu-admission replicas was cut.
/// They watch again: a GPUQuota created after the restart is enforced by each replica,
/// which admits an unquoted namespace's pod on what its watch shows and would let both
/// pods in had its quota watch not come back.
#[tokio::test]
#[ignore = "needs a control plane and a real node: bash hack/e2e.sh runs it"]
async fn both_replicas_watch_again_after_the_api_server_restarted() {
    let Some(cluster) = setup("node-restart").await else {
        return;
    };
    cluster.wait_default_service_account().await;
    let model = "Tesla-M40";
    cluster.label_for_webhooks().await;
    cluster
        .create_quota("default", json!({model: "1"}), None)
        .await;
    register_validate_per_replica(&cluster).await;
    let through = |name: &str, replica: &str| {
        with_labels(
            unscheduled_gpu_pod(name, Some(model), 1),
            json!({"replica": replica}),
        )
    };
    cluster
        .create_when_admitted(&through("one", "a"), Duration::from_secs(30))
        .await;
    for (name, replica) in [("two", "b"), ("three", "a")] {
        let message = forbidden_message(cluster.try_create(&through(name, replica)).await, name);
        assert!(
            message.contains("GPU quota exceeded"),
            "replica {replica}: {message}"
        );
    }
    unregister_webhooks(&cluster).await;
}
