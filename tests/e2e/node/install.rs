//! gpu-admission installed as an operator installs it, on the cluster with the real node:
//! `kubectl apply -f deploy/` exactly as shipped, then (after `kubectl delete -f deploy/`)
//! `helm install` of the chart with its defaults. Each install must come up on its own
//! (certificate Job, webhook replicas through their probes, the GPU scheduler's two
//! replicas with their leader), judge pods through its Service, place a GPU pod on a GPU
//! node (an API object: placed and bound, never run), show usage in `kubectl get gq`, and
//! uninstall leaving only what the README says stays. The shipped install also goes
//! through the faults of [`super::faults`].
//!
//! Every component runs as the ServiceAccount its manifest names, with the RBAC it ships;
//! at the end [`super::rbac`] holds that RBAC to the API server's audit log.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;

use super::faults;
use crate::support::*;

pub const NAMESPACE: &str = "gpu-admission";
/// The GPU node both installs place on: 4 GPUs of this model.
pub const GPU_NODE: &str = "install-gpu-node";
pub const GPU_MODEL: &str = "Tesla-P100-PCIE-16GB";
/// A second GPU node, of another model, 2 GPUs: pods of one model must never land on the
/// other's node.
pub const OTHER_NODE: &str = "install-gpu-node-t4";
pub const OTHER_MODEL: &str = "Tesla-T4";
/// The model whose quota of 1 the refusal checks fill.
pub const REFUSED_MODEL: &str = "Tesla-P4";
/// The model of the burst that a killed webhook replica must not let past its quota.
pub const BURST_MODEL: &str = "Tesla-V100-SXM2-16GB";
pub const BURST_QUOTA: u32 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a control plane and a real node: bash hack/e2e.sh runs it"]
async fn deploy_as_shipped_then_the_chart_install_serve_survive_faults_and_uninstall() {
    let Some(cluster) = setup("node-install").await else {
        return;
    };
    cluster.wait_default_service_account().await;
    create_gpu_node(&cluster).await;
    let lender = cluster.create_namespace("lender").await;
    let before = cluster_objects(&cluster.ns);
    let deploy_uninstalled = with_kubectl(&cluster, &lender, &before).await;
    let (chart_installed, chart_uninstalled) = with_helm(&cluster, &lender, &before).await;
    let (ok, out, err) = kubectl(
        &["delete", "namespace", NAMESPACE, "--wait", "--timeout=120s"],
        "",
    );
    assert!(ok, "{out}{err}");
    cluster.delete_nodes().await;
    let uninstalling = [
        (deploy_uninstalled, chart_installed),
        (chart_uninstalled, i64::MAX),
    ];
    super::rbac::the_shipped_rbac_is_what_the_components_use(&uninstalling);
}

/// `kubectl apply -f deploy/` as shipped: up and serving, the faults, then `kubectl
/// delete -f deploy/`, which leaves nothing. Returns when the delete began.
async fn with_kubectl(cluster: &Cluster, lender: &str, before: &BTreeSet<String>) -> i64 {
    println!("== kubectl apply -f deploy/");
    let deploy = crate::repo::path("deploy");
    let (ok, out, err) = kubectl(&["apply", "-f", &deploy], "");
    assert!(ok, "kubectl apply -f deploy/: {out}{err}");
    comes_up_and_serves(cluster, lender, "deploy").await;
    faults::the_scheduler_leader_deleted_while_placing(cluster).await;
    faults::a_webhook_replica_killed_mid_burst(cluster).await;
    faults::the_kubelet_restarted(cluster).await;
    faults::a_drain_respects_the_disruption_budget(cluster).await;
    delete_gpu_pods(cluster).await;
    let uninstalled = super::rbac::now_seconds();
    let (ok, out, err) = kubectl(&["delete", "-f", &deploy, "--wait", "--timeout=120s"], "");
    assert!(ok, "kubectl delete -f deploy/: {out}{err}");
    leaves_only(&cluster.ns, before, &[], "kubectl delete -f deploy/").await;
    let after = cluster_objects(&cluster.ns);
    for gone in [NAMESPACE_OBJECT, CRD_OBJECT] {
        assert!(
            !after.contains(gone),
            "kubectl delete -f deploy/ removes {gone}"
        );
    }
    uninstalled
}

/// `helm install` with the chart's defaults: up and serving; `helm upgrade` runs the
/// certificate Job again (a post-upgrade hook: it keeps the Secret that is still good)
/// and the webhooks go on judging; `helm uninstall` leaves exactly [`HELM_LEAVES`].
/// Returns when the install and the uninstall began.
async fn with_helm(cluster: &Cluster, lender: &str, before: &BTreeSet<String>) -> (i64, i64) {
    println!("== helm install (the chart's defaults)");
    let installed = super::rbac::now_seconds();
    let chart = crate::repo::path("charts/gpu-admission");
    let release = [
        "gpu-admission",
        chart.as_str(),
        "--namespace",
        NAMESPACE,
        "--timeout=180s",
    ];
    let (ok, out, err) = helm(&[&["install", "--create-namespace"][..], &release[..]].concat());
    assert!(ok, "helm install: {out}{err}\n{}", install_state());
    comes_up_and_serves(cluster, lender, "chart").await;
    let (ok, out, err) = helm(&[&["upgrade"][..], &release[..]].concat());
    assert!(ok, "helm upgrade: {out}{err}\n{}", install_state());
    let pod = unscheduled_gpu_pod("after-upgrade", None, 1);
    let after_upgrade = cluster.try_create(&pod);
    let message = forbidden_message(
        after_upgrade.await,
        "a pod over the quota after helm upgrade",
    );
    assert!(message.contains("GPU quota exceeded"), "{message}");
    delete_gpu_pods(cluster).await;
    let uninstalled = super::rbac::now_seconds();
    let (ok, out, err) = helm(&[
        "uninstall",
        "gpu-admission",
        "--namespace",
        NAMESPACE,
        "--wait",
    ]);
    assert!(ok, "helm uninstall: {out}{err}");
    leaves_only(&cluster.ns, before, HELM_LEAVES, "helm uninstall").await;
    let after = cluster_objects(&cluster.ns);
    for kept in [NAMESPACE_OBJECT, CRD_OBJECT] {
        assert!(after.contains(kept), "helm uninstall keeps {kept}");
    }
    (installed, uninstalled)
}

/// The install's namespace and the GPUQuota CRD: the suite's own set-up created both
/// before the scenario (so they are not among what an uninstall adds); `kubectl delete -f
/// deploy/` removes them, `helm uninstall` keeps them (below).
const NAMESPACE_OBJECT: &str = "Namespace//gpu-admission";
const CRD_OBJECT: &str = "CustomResourceDefinition//gpuquotas.gpu-admission.io";

/// What `helm uninstall` leaves besides the namespace and the CRD, as the README says:
/// Helm never deletes what a chart's `crds/` installed (deleting the CRD would delete every
/// GPUQuota), and the release's namespace (`--create-namespace` is not part of the
/// release) keeps what no release object owns: the serving certificate the Job wrote,
/// the last certificate Job (a hook) and its pod, the GPU scheduler's leader Lease and the
/// cohorts' Leases.
const HELM_LEAVES: &[&str] = &[
    "Secret/gpu-admission/gpu-admission-tls",
    "Job/gpu-admission/gpu-admission-certs",
    "Pod/gpu-admission/gpu-admission-certs-*",
    "Lease/gpu-admission/gpu-scheduler",
    "Lease/gpu-admission/gpu-admission-cohort-install",
];

/// The install comes up and does its job: the certificate Job completes, the webhook
/// replicas and the GPU scheduler's become Ready, a pod over its quota is refused through
/// the Service, a GPU pod is placed by the GPU scheduler on the GPU node with gpu-manager's
/// annotations and charged, and `kubectl get gq` shows it.
async fn comes_up_and_serves(cluster: &Cluster, lender: &str, how: &str) {
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let done = wait_for_or_none(Duration::from_secs(120), || async {
        let job = jobs.get("gpu-admission-certs").await.ok()?;
        (job.status?.succeeded? >= 1).then_some(())
    })
    .await;
    done.unwrap_or_else(|| {
        panic!(
            "{how}: the certificate Job did not complete:\n{}",
            install_state()
        )
    });
    for deployment in ["gpu-admission", "gpu-scheduler"] {
        let ready = deployment_ready(cluster, deployment).await;
        println!("{how}: {deployment}: {ready} replicas Ready");
    }
    let hard = json!({REFUSED_MODEL: "1", GPU_MODEL: "8", OTHER_MODEL: "8", BURST_MODEL: BURST_QUOTA.to_string(), COHORT_MODEL: "0"});
    let spec = json!({"hard": hard, "defaultType": REFUSED_MODEL, "cohort": COHORT});
    cluster.create_quota_spec("default", spec).await;
    borrows_from_its_cohort(cluster, lender, how).await;
    // The first create may race the webhook's endpoints: retried until admitted.
    let one = format!("{how}-one");
    cluster
        .create_when_admitted(&unscheduled_gpu_pod(&one, None, 1), Duration::from_secs(60))
        .await;
    // Calls through the Service, one after another with pauses past the servers' opening
    // deadline (3 s) and shorter ones: every one answered by the quota.
    let mut answers = BTreeMap::<String, u32>::new();
    for i in 0..12u64 {
        let over = format!("{how}-over-{i}");
        let answer = match cluster
            .try_create(&unscheduled_gpu_pod(&over, None, 1))
            .await
        {
            Ok(_) => "created".to_string(),
            Err(kube::Error::Api(status)) => format!("{} {}", status.code, status.message),
            Err(other) => other.to_string(),
        };
        *answers.entry(answer).or_default() += 1;
        let pause = if i % 3 == 2 { 3500 } else { 300 * i };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    println!("{how}: 12 creates over the quota: {answers:?}");
    let refused = "403 admission webhook \"validate.gpu-admission.io\" denied the request: GPU quota exceeded";
    assert!(
        answers.keys().all(|a| a.starts_with(refused)),
        "{how}: every create over the quota is refused by the quota: {answers:?}\n{}",
        install_state()
    );
    let placed = format!("{how}-placed");
    create_placed_pod(cluster, &placed, GPU_MODEL, 50).await;
    let pod = wait_bound(cluster, &placed).await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(GPU_NODE)
    );
    assert_placement_annotations(&pod, 4);
    let (ok, table, err) = kubectl(&["get", "gq", "-n", &cluster.ns], "");
    println!("{how}: kubectl get gq:\n{table}");
    assert!(ok, "{err}");
    let used = wait_for("the placed pod's charge", QUOTA_TIMEOUT, || async {
        let status = cluster.quota_status("default").await;
        let used = status.used.get(GPU_MODEL).map(|q| milli_gpus(&q.0))?;
        (used > 0).then_some(used)
    })
    .await;
    assert_eq!(used, 500, "half a GPU charged for the placed pod");
}

/// The cohort the scenario's quota borrows [`COHORT_MODEL`] from, a GPUQuota in namespace
/// `lender` that owns 2 and uses none.
const COHORT: &str = "install";
const COHORT_MODEL: &str = "Tesla-M10";

/// A pod of a model the namespace owns none of is admitted on what its cohort lends: the
/// webhook servers agree on the charge under the cohort's Lease (a permission of theirs
/// the suite would not use otherwise). The lender's quota goes before the uninstall: the
/// CRD, and so the quota, outlives `helm uninstall`.
async fn borrows_from_its_cohort(cluster: &Cluster, lender: &str, how: &str) {
    let quotas: Api<gpu_admission::quota::GPUQuota> =
        Api::namespaced(cluster.client.clone(), lender);
    let quota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "lender", "namespace": lender},
        "spec": {"hard": {COHORT_MODEL: "2"}, "cohort": COHORT},
    }))
    .unwrap();
    quotas
        .create(&kube::api::PostParams::default(), &quota)
        .await
        .unwrap();
    let name = format!("{how}-borrowed");
    let pod = unscheduled_gpu_pod(&name, Some(COHORT_MODEL), 1);
    cluster
        .create_when_admitted(&pod, Duration::from_secs(60))
        .await;
    cluster.wait_used("default", COHORT_MODEL, 1000).await;
    let borrowed = wait_for("status.borrowed", QUOTA_TIMEOUT, || async {
        let status = cluster.quota_status("default").await;
        let borrowed = status.borrowed.get(COHORT_MODEL).map(|q| milli_gpus(&q.0));
        borrowed.filter(|b| *b == 1000)
    })
    .await;
    println!("{how}: {name} admitted on what cohort {COHORT} lends; borrowed {borrowed}m");
    quotas
        .delete("lender", &DeleteParams::default())
        .await
        .unwrap();
}

/// Pods only the test places there tolerate this taint of the GPU node (an API object
/// without a kubelet), which keeps the installs' own pods on the real node.
const NO_KUBELET: &str = "gpu-admission-e2e/no-kubelet";

async fn create_gpu_node(cluster: &Cluster) {
    let taints = json!({"spec": {"taints": [{"key": NO_KUBELET, "effect": "NoSchedule"}]}});
    let patch = kube::api::Patch::Merge(&taints);
    let params = kube::api::PatchParams::default();
    for (node, model, gpus) in [(GPU_NODE, GPU_MODEL, 4), (OTHER_NODE, OTHER_MODEL, 2)] {
        cluster.create_gpu_node(node, model, gpus).await;
        cluster.nodes().patch(node, &params, &patch).await.unwrap();
    }
}

/// A pod for the GPU scheduler wanting `core` vcuda-core of `model`, tolerating the GPU
/// nodes' taint.
pub async fn create_placed_pod(cluster: &Cluster, name: &str, model: &str, core: u32) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {TYPE_ANNOTATION: model}},
        "spec": {
            "schedulerName": scheduler_name(),
            "tolerations": [{"key": NO_KUBELET, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "cuda",
                "image": "registry.invalid/never-pulled:e2e",
                "resources": {"limits": {CORE: core.to_string(), MEMORY: "1"}},
            }],
        },
    }))
    .unwrap();
    let created = cluster
        .pods()
        .create(&kube::api::PostParams::default(), &pod)
        .await;
    created.unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
}

/// Waits until pod `name` is bound; panics with what the install shows when it is not.
pub async fn wait_bound(cluster: &Cluster, name: &str) -> k8s_openapi::api::core::v1::Pod {
    let bound = wait_for_or_none(BIND_TIMEOUT, || async {
        let pod = cluster.pods().get(name).await.ok()?;
        pod.spec.as_ref()?.node_name.as_ref()?;
        Some(pod)
    })
    .await;
    bound.unwrap_or_else(|| {
        let (_, events, _) = kubectl(&["get", "events", "-n", &cluster.ns], "");
        let (_, taints, _) = kubectl(
            &[
                "get",
                "nodes",
                "-o",
                "custom-columns=N:.metadata.name,T:.spec.taints,L:.metadata.labels",
            ],
            "",
        );
        let (_, pod, _) = kubectl(&["get", "pod", name, "-n", &cluster.ns, "-o", "yaml"], "");
        panic!(
            "pod {name} was not bound:\n{events}\n{taints}\n{pod}\n{}",
            install_state()
        )
    })
}

/// Waits until Deployment `name` in gpu-admission's namespace has all its replicas Ready.
pub async fn deployment_ready(cluster: &Cluster, name: &str) -> i32 {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let ready = wait_for_or_none(Duration::from_secs(180), || async {
        let deployment = deployments.get(name).await.ok()?;
        let want = deployment.spec?.replicas?;
        let status = deployment.status?;
        let ready = status.ready_replicas?;
        (ready == want && status.replicas == Some(want)).then_some(ready)
    })
    .await;
    ready.unwrap_or_else(|| {
        panic!(
            "Deployment {name} did not become Ready:\n{}",
            install_state()
        )
    })
}

/// Deletes the scenario's pods at once: those bound to the GPU node have no kubelet to
/// confirm a graceful deletion.
pub async fn delete_gpu_pods(cluster: &Cluster) {
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    cluster
        .pods()
        .delete_collection(&now, &ListParams::default())
        .await
        .unwrap();
}

/// Runs the helm binary hack/e2e.sh names against the test cluster.
fn helm(args: &[&str]) -> (bool, String, String) {
    let binary =
        std::env::var("GPU_ADMISSION_E2E_HELM").expect("GPU_ADMISSION_E2E_HELM names helm");
    let out = std::process::Command::new(binary)
        .arg("--kubeconfig")
        .arg(std::env::var(KUBECONFIG_ENV).unwrap())
        .args(args)
        .output()
        .expect("helm runs");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// Every object of the cluster as `Kind/namespace/name` (cluster-scoped: empty namespace),
/// but Events and what lives in namespace `skip`.
fn cluster_objects(skip: &str) -> BTreeSet<String> {
    let (_, kinds, err) = kubectl(&["api-resources", "--verbs=list", "-o", "name"], "");
    let kinds: Vec<&str> = kinds.lines().filter(|k| !k.starts_with("events")).collect();
    assert!(!kinds.is_empty(), "kubectl api-resources: {err}");
    let columns = "custom-columns=K:.kind,N:.metadata.namespace,M:.metadata.name";
    let (_, out, err) = kubectl(
        &["get", &kinds.join(","), "-A", "--no-headers", "-o", columns],
        "",
    );
    assert!(!out.is_empty(), "kubectl get (every kind): {err}");
    out.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (kind, ns, name) = (fields.next()?, fields.next()?, fields.next()?);
            let ns = if ns == "<none>" { "" } else { ns };
            (ns != skip).then(|| format!("{kind}/{ns}/{name}"))
        })
        .collect()
}

/// Waits (garbage collection is asynchronous) until the objects added since `before` are
/// exactly `expected` (a trailing `*` matches any suffix); panics with the difference.
async fn leaves_only(skip: &str, before: &BTreeSet<String>, expected: &[&str], what: &str) {
    let matches = |object: &str, pattern: &str| match pattern.strip_suffix('*') {
        Some(prefix) => object.starts_with(prefix),
        None => object == pattern,
    };
    let mut left = BTreeSet::new();
    for _ in 0..60 {
        left = cluster_objects(skip).difference(before).cloned().collect();
        let unexpected = left.iter().any(|o| !expected.iter().any(|p| matches(o, p)));
        let missing = expected.iter().any(|p| !left.iter().any(|o| matches(o, p)));
        if !unexpected && !missing {
            println!("{what} left {left:?}");
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("{what} must leave exactly {expected:?}; left {left:?}");
}

/// What a person would look at when an install does not come up: its pods, their events.
pub fn install_state() -> String {
    let (_, pods, _) = kubectl(
        &[
            "get",
            "pods,jobs,endpointslices",
            "-n",
            NAMESPACE,
            "-o",
            "wide",
        ],
        "",
    );
    let (_, events, _) = kubectl(
        &["get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"],
        "",
    );
    let (_, logs, _) = kubectl(
        &[
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/name=gpu-admission",
            "--all-containers",
            "--prefix",
            "--tail=25",
        ],
        "",
    );
    format!("{pods}\n{events}\n{logs}")
}
