//! End-to-end tests on a real control plane: etcd, kube-apiserver, kube-scheduler with
//! gpu-admission as its extender, and the `gpu-admission serve` binary watching the cluster.
//! `hack/e2e.sh` builds and starts all of that, then runs
//! `cargo test --test e2e -- --test-threads=1` with these variables set:
//!
//! - `GPU_ADMISSION_E2E_KUBECONFIG` — admin kubeconfig of the test cluster. Without it every
//!   test prints that it did NOT run and returns (so a plain `cargo test` stays offline).
//!   With it, an unreachable cluster is a failure, never a skip.
//! - `GPU_ADMISSION_E2E_CTL` — a script taking `stop` / `start` that stops and restarts the
//!   gpu-admission process (the extender-outage scenario needs it).
//! - `GPU_ADMISSION_E2E_SCHEDULER` — the scheduler profile name (default `gpu-scheduler`).
//!
//! No kubelets run: nodes are API objects whose `status` the tests write, and a bound
//! pod simply stays Pending. Each scenario uses its own namespace, its own node names
//! (labelled `gpu-admission-e2e/scenario`) and its own GPU model, and deletes its nodes
//! when it ends, so a failed scenario cannot disturb the next one.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

const KUBECONFIG_ENV: &str = "GPU_ADMISSION_E2E_KUBECONFIG";
const CTL_ENV: &str = "GPU_ADMISSION_E2E_CTL";
const SCENARIO_LABEL: &str = "gpu-admission-e2e/scenario";
const MODEL_LABEL: &str = "nvidia.com/gpu.product";
const TYPE_ANNOTATION: &str = "gpu-admission.io/gpu-type";
const CORE: &str = "tencent.com/vcuda-core";
const MEMORY: &str = "tencent.com/vcuda-memory";
/// vcuda-memory units per GPU on every test node.
const MEMORY_PER_GPU: u32 = 16;
const BIND_TIMEOUT: Duration = Duration::from_secs(60);

/// One scenario's view of the test cluster.
struct Cluster {
    client: Client,
    scenario: &'static str,
    ns: String,
}

/// Connects to the cluster named by `GPU_ADMISSION_E2E_KUBECONFIG` and creates the
/// scenario's namespace; `None` (after saying so) when the variable is not set.
async fn setup(scenario: &'static str) -> Option<Cluster> {
    let Some(path) = std::env::var_os(KUBECONFIG_ENV) else {
        println!(
            "e2e scenario `{scenario}` DID NOT RUN: {KUBECONFIG_ENV} is not set \
             (run `bash hack/e2e.sh` to start a control plane and run these tests)"
        );
        return None;
    };
    let path = PathBuf::from(path);
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("cannot read kubeconfig {}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("bad kubeconfig {}: {e}", path.display()));
    let client = Client::try_from(config).unwrap();
    let version = client
        .apiserver_version()
        .await
        .unwrap_or_else(|e| panic!("the API server of {} does not answer: {e}", path.display()));
    println!(
        "scenario `{scenario}` against Kubernetes {}",
        version.git_version
    );

    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let ns = format!("e2e-{scenario}-{:05x}", nanos & 0xfffff);
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let cluster = Cluster {
        client,
        scenario,
        ns,
    };
    cluster.delete_nodes().await;
    Some(cluster)
}

fn scheduler_name() -> String {
    std::env::var("GPU_ADMISSION_E2E_SCHEDULER").unwrap_or_else(|_| "gpu-scheduler".into())
}

/// What a test pod asks for.
#[derive(Clone, Copy, Debug)]
enum Gpu {
    /// Share mode: part of one GPU (`vcuda-core < 100`) and some memory units.
    Share { core: u32, memory: u32 },
    /// Exclusive mode: this many whole GPUs (`vcuda-core = 100 * n`).
    Whole(u32),
}

impl Gpu {
    fn core(self) -> u32 {
        match self {
            Gpu::Share { core, .. } => core,
            Gpu::Whole(n) => 100 * n,
        }
    }
}

impl Cluster {
    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A Ready, untainted node of `model` with `gpus` GPUs in gpu-manager resources
    /// (capacity and allocatable written through the status subresource).
    async fn create_gpu_node(&self, name: &str, model: &str, gpus: u32) {
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {MODEL_LABEL: model, SCENARIO_LABEL: self.scenario},
            },
        }))
        .unwrap();
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("creating node {name}: {e}"));
        let resources = json!({
            "cpu": "32",
            "memory": "128Gi",
            "pods": "110",
            CORE: (100 * gpus).to_string(),
            MEMORY: (MEMORY_PER_GPU * gpus).to_string(),
        });
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "e2e test node (no kubelet)",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
        }});
        self.nodes()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("setting the status of node {name}: {e}"));
        // The apiserver's TaintNodesByCondition admission plugin gives every new node a
        // `node.kubernetes.io/not-ready:NoSchedule` taint, which the node lifecycle
        // controller would lift once the node reports Ready; there is no
        // controller-manager here, so lift it ourselves.
        self.nodes()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await
            .unwrap_or_else(|e| panic!("removing the taints of node {name}: {e}"));
    }

    /// Deletes this scenario's nodes (left over from an earlier run, or at the end).
    async fn delete_nodes(&self) {
        let selector = format!("{SCENARIO_LABEL}={}", self.scenario);
        self.nodes()
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector),
            )
            .await
            .unwrap();
    }

    /// Creates a pod for the GPU scheduler wanting `gpu` on a node of `model`.
    async fn create_gpu_pod(&self, name: &str, model: &str, gpu: Gpu) -> Pod {
        let limits = match gpu {
            Gpu::Share { core, memory } => {
                json!({CORE: core.to_string(), MEMORY: memory.to_string()})
            }
            Gpu::Whole(n) => json!({CORE: (100 * n).to_string()}),
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {TYPE_ANNOTATION: model}},
            "spec": {
                "schedulerName": scheduler_name(),
                "containers": [{
                    "name": "cuda",
                    "image": "registry.invalid/never-pulled:e2e",
                    "resources": {"limits": limits},
                }],
            },
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating pod {}/{name}: {e}", self.ns))
    }

    /// Waits until the scheduler has bound pod `name` (`spec.nodeName` set).
    async fn wait_bound(&self, name: &str) -> Pod {
        let pods = self.pods();
        wait_for(
            &format!("pod {}/{name} to be bound", self.ns),
            BIND_TIMEOUT,
            || {
                let pods = pods.clone();
                async move {
                    let pod = pods.get(name).await.ok()?;
                    pod.spec.as_ref()?.node_name.as_ref()?;
                    Some(pod)
                }
            },
        )
        .await
    }

    /// Waits for a FailedScheduling event of pod `name` whose message contains `needle`;
    /// returns the message.
    async fn wait_failed_scheduling(&self, name: &str, needle: &str) -> String {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        let fields = format!("involvedObject.name={name},reason=FailedScheduling");
        let seen = std::sync::Mutex::new(Vec::<String>::new());
        let seen_ref = &seen;
        let what = format!(
            "a FailedScheduling event for pod {}/{name} containing {needle:?}",
            self.ns
        );
        let found = wait_for_or_none(BIND_TIMEOUT, || {
            let events = events.clone();
            let fields = fields.clone();
            let seen = seen_ref;
            async move {
                let list = events
                    .list(&ListParams::default().fields(&fields))
                    .await
                    .ok()?;
                let messages: Vec<String> =
                    list.items.into_iter().filter_map(|e| e.message).collect();
                let hit = messages.iter().find(|m| m.contains(needle)).cloned();
                *seen.lock().unwrap() = messages;
                hit
            }
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "timed out after {BIND_TIMEOUT:?} waiting for {what}; FailedScheduling messages seen: {:?}",
                seen.lock().unwrap()
            )
        })
    }
}

/// Polls `check` every 250 ms until it returns `Some`, for at most `timeout`;
/// panics naming `what` when time runs out.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_or_none(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

async fn wait_for_or_none<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

/// The GPU indices the extender chose for container 0, checked against the
/// gpu-manager protocol annotations.
fn assert_placement_annotations(pod: &Pod, gpus_on_node: u32) -> Vec<u32> {
    let name = pod.metadata.name.as_deref().unwrap();
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let a = annotations(pod);
    assert_eq!(
        a.get("tencent.com/predicate-node"),
        Some(&node),
        "pod {name}: predicate-node must name the node it was bound to; annotations: {a:?}"
    );
    assert_eq!(
        a.get("tencent.com/gpu-assigned").map(String::as_str),
        Some("false"),
        "pod {name}: annotations: {a:?}"
    );
    assert!(
        a.contains_key("tencent.com/predicate-time"),
        "pod {name}: annotations: {a:?}"
    );
    let idx = a
        .get("tencent.com/predicate-gpu-idx-0")
        .unwrap_or_else(|| panic!("pod {name} has no predicate-gpu-idx-0; annotations: {a:?}"));
    let indices: Vec<u32> = idx
        .split(',')
        .map(|i| {
            i.trim()
                .parse()
                .unwrap_or_else(|_| panic!("pod {name}: bad GPU index list {idx:?}"))
        })
        .collect();
    assert!(
        !indices.is_empty() && indices.iter().all(|&i| i < gpus_on_node),
        "pod {name}: GPU indices {indices:?} out of range for a {gpus_on_node}-GPU node"
    );
    indices
}

/// Scenario 1: a share-mode pod that wants Tesla-T4 is bound by kube-scheduler to a T4
/// node (not the A100 one), carrying the extender's gpu-manager annotations.
#[tokio::test]
async fn gpu_pod_is_bound_to_a_node_of_its_model_with_gpu_manager_annotations() {
    let Some(cluster) = setup("model").await else {
        return;
    };
    cluster
        .create_gpu_node("e2e-model-t4-1", "Tesla-T4", 4)
        .await;
    cluster
        .create_gpu_node("e2e-model-t4-2", "Tesla-T4", 4)
        .await;
    cluster
        .create_gpu_node("e2e-model-a100-1", "A100-SXM4-80GB", 4)
        .await;

    cluster
        .create_gpu_pod(
            "share-t4",
            "Tesla-T4",
            Gpu::Share {
                core: 30,
                memory: 4,
            },
        )
        .await;
    let pod = cluster.wait_bound("share-t4").await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    assert!(
        node.starts_with("e2e-model-t4-"),
        "a Tesla-T4 pod was bound to {node}"
    );
    let indices = assert_placement_annotations(&pod, 4);
    assert_eq!(indices.len(), 1, "a share-mode pod uses one GPU");

    cluster
        .create_gpu_pod("whole-a100", "A100-SXM4-80GB", Gpu::Whole(2))
        .await;
    let pod = cluster.wait_bound("whole-a100").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("e2e-model-a100-1")
    );
    let mut indices = assert_placement_annotations(&pod, 4);
    indices.sort_unstable();
    indices.dedup();
    assert_eq!(indices.len(), 2, "two whole GPUs, two distinct indices");

    cluster.delete_nodes().await;
}

/// Scenario 4-lite: share-mode and whole-GPU pods, one after the other, fill two
/// 2-GPU nodes exactly; no GPU is ever over-committed (per node and GPU index, the
/// vcuda-core of the pods placed there sums to at most 100, memory to at most the
/// GPU's), and one more pod stays Pending with the extender's reason in its
/// FailedScheduling event.
#[tokio::test]
async fn mixed_pods_never_overcommit_a_gpu_and_a_pod_that_cannot_fit_stays_pending() {
    let Some(cluster) = setup("pack").await else {
        return;
    };
    let model = "Tesla-V100";
    cluster.create_gpu_node("e2e-pack-1", model, 2).await;
    cluster.create_gpu_node("e2e-pack-2", model, 2).await;

    // 400 vcuda-core in all: with the `original` policy (tightest GPU first) they fit
    // exactly: {whole}, {50, 30, 20}, {60, 40}, {whole}.
    let sequence = [
        ("whole-a", Gpu::Whole(1)),
        (
            "share-b",
            Gpu::Share {
                core: 50,
                memory: 2,
            },
        ),
        (
            "share-c",
            Gpu::Share {
                core: 30,
                memory: 2,
            },
        ),
        (
            "share-d",
            Gpu::Share {
                core: 60,
                memory: 2,
            },
        ),
        (
            "share-e",
            Gpu::Share {
                core: 20,
                memory: 2,
            },
        ),
        (
            "share-f",
            Gpu::Share {
                core: 40,
                memory: 2,
            },
        ),
        ("whole-g", Gpu::Whole(1)),
    ];
    // (node, GPU index) -> (vcuda-core, vcuda-memory) handed out.
    let mut used: BTreeMap<(String, u32), (u32, u32)> = BTreeMap::new();
    for (name, gpu) in sequence {
        cluster.create_gpu_pod(name, model, gpu).await;
        let pod = cluster.wait_bound(name).await;
        let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
        let indices = assert_placement_annotations(&pod, 2);
        match gpu {
            Gpu::Share { core, memory } => {
                assert_eq!(indices.len(), 1, "{name}: share mode uses one GPU");
                let slot = used.entry((node, indices[0])).or_default();
                slot.0 += core;
                slot.1 += memory;
            }
            Gpu::Whole(n) => {
                assert_eq!(indices.len() as u32, n, "{name}: {n} whole GPUs");
                for i in indices {
                    let slot = used.entry((node.clone(), i)).or_default();
                    slot.0 += 100;
                    slot.1 += MEMORY_PER_GPU;
                }
            }
        }
        for ((node, idx), (core, memory)) in &used {
            assert!(
                *core <= 100 && *memory <= MEMORY_PER_GPU,
                "GPU {idx} of {node} over-committed after {name}: {core} vcuda-core, \
                 {memory} vcuda-memory; all placements: {used:?}"
            );
        }
    }
    let total: u32 = used.values().map(|(core, _)| core).sum();
    let wanted: u32 = sequence.iter().map(|(_, gpu)| gpu.core()).sum();
    assert_eq!(total, wanted);

    // Every GPU is full now: one more share-mode pod cannot be placed anywhere.
    cluster
        .create_gpu_pod(
            "share-h",
            model,
            Gpu::Share {
                core: 10,
                memory: 1,
            },
        )
        .await;
    let message = cluster
        .wait_failed_scheduling("share-h", "free vcuda-core")
        .await;
    println!("share-h: FailedScheduling: {message}");
    let pod = cluster.pods().get("share-h").await.unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name,
        None,
        "share-h must stay Pending"
    );
    assert!(
        !annotations(&pod).contains_key("tencent.com/predicate-node"),
        "an unplaceable pod must carry no placement: {:?}",
        annotations(&pod)
    );

    cluster.delete_nodes().await;
}

/// Runs the `GPU_ADMISSION_E2E_CTL` script with `action` (`stop` or `start`).
fn ctl(action: &str) {
    let script = std::env::var_os(CTL_ENV).unwrap_or_else(|| {
        panic!("{CTL_ENV} is not set: this scenario needs a script to stop/start gpu-admission")
    });
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(action)
        .status()
        .unwrap();
    assert!(status.success(), "`{script:?} {action}` failed: {status}");
}

/// Restarts gpu-admission when dropped, so a failing assertion does not leave the
/// extender down for the scenarios that follow.
struct RestartOnDrop(bool);

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if self.0 {
            ctl("start");
        }
    }
}

/// Scenario 6-lite: with gpu-admission stopped, a GPU pod stays Pending with a
/// FailedScheduling event (the scheduler cannot reach its extender); once gpu-admission
/// is back, the pod is placed.
#[tokio::test]
async fn pod_waits_while_the_extender_is_down_and_is_placed_after_restart() {
    let Some(cluster) = setup("outage").await else {
        return;
    };
    let model = "Tesla-P100";
    cluster.create_gpu_node("e2e-outage-1", model, 2).await;

    ctl("stop");
    let mut guard = RestartOnDrop(true);
    cluster
        .create_gpu_pod(
            "during-outage",
            model,
            Gpu::Share {
                core: 25,
                memory: 2,
            },
        )
        .await;
    let message = cluster
        .wait_failed_scheduling("during-outage", "scheduler/predicates")
        .await;
    println!("during-outage: FailedScheduling: {message}");
    let pod = cluster.pods().get("during-outage").await.unwrap();
    assert_eq!(pod.spec.as_ref().unwrap().node_name, None);

    guard.0 = false;
    ctl("start");
    let pod = cluster.wait_bound("during-outage").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("e2e-outage-1")
    );
    assert_placement_annotations(&pod, 2);

    cluster.delete_nodes().await;
}

/// Registers gpu-admission's `/mutate` and `/validate` as the apiserver's webhooks for
/// pods in namespaces labelled `gpu-admission-e2e/webhooks=<scenario>` (so other
/// scenarios are not affected), served at `GPU_ADMISSION_E2E_SERVER_URL` and trusted
/// through `GPU_ADMISSION_E2E_CA_FILE`; deleted again by `unregister_webhooks`.
async fn register_webhooks(cluster: &Cluster) {
    use base64::Engine as _;
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let url = std::env::var("GPU_ADMISSION_E2E_SERVER_URL")
        .expect("GPU_ADMISSION_E2E_SERVER_URL (gpu-admission's https URL) is not set");
    let ca_file = std::env::var("GPU_ADMISSION_E2E_CA_FILE")
        .expect("GPU_ADMISSION_E2E_CA_FILE (gpu-admission's CA) is not set");
    let ca = std::fs::read(&ca_file).unwrap();
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let name = format!("gpu-admission-e2e-{}", cluster.scenario);
    let webhook = |kind: &str| {
        json!({
            "name": format!("{kind}.gpu-admission.io"),
            "clientConfig": {"url": format!("{url}/{kind}"), "caBundle": ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"gpu-admission-e2e/webhooks": cluster.scenario}},
            "failurePolicy": "Fail",
            "sideEffects": "NoneOnDryRun",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        })
    };
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [webhook("mutate")],
    }))
    .unwrap();
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [webhook("validate")],
    }))
    .unwrap();
    unregister_webhooks(cluster).await;
    Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .unwrap();
}

async fn unregister_webhooks(cluster: &Cluster) {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let name = format!("gpu-admission-e2e-{}", cluster.scenario);
    let _ = Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
        .delete(&name, &DeleteParams::default())
        .await;
}

/// Webhooks through the real apiserver: in a namespace with a GPUQuota of one Tesla-K80,
/// a GPU pod that names no scheduler and no model is mutated (scheduler name, model
/// annotation) and placed on a K80 node; a second one is denied with the quota message.
#[tokio::test]
async fn webhooks_steer_a_gpu_pod_and_deny_one_over_the_namespace_quota() {
    use gpu_admission::quota::GPUQuota;
    let Some(cluster) = setup("quota").await else {
        return;
    };
    let model = "Tesla-K80";
    cluster.create_gpu_node("e2e-quota-1", model, 2).await;
    Api::<Namespace>::all(cluster.client.clone())
        .patch(
            &cluster.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"gpu-admission-e2e/webhooks": "quota"}}})),
        )
        .await
        .unwrap();
    let quota: GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": cluster.ns},
        "spec": {"hard": {model: "1"}},
    }))
    .unwrap();
    let quotas: Api<GPUQuota> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    register_webhooks(&cluster).await;
    // gpu-admission must have seen the quota before it judges pods.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let plain_pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{
                "name": "cuda",
                "image": "registry.invalid/never-pulled:e2e",
                "resources": {"limits": {CORE: "100"}},
            }]},
        }))
        .unwrap()
    };
    let created = cluster
        .pods()
        .create(&PostParams::default(), &plain_pod("first"))
        .await
        .unwrap_or_else(|e| panic!("the first pod is within quota and must be admitted: {e}"));
    assert_eq!(
        created.spec.as_ref().unwrap().scheduler_name.as_deref(),
        Some(scheduler_name().as_str()),
        "the mutating webhook must steer GPU pods to the GPU scheduler"
    );
    assert_eq!(
        annotations(&created)
            .get(TYPE_ANNOTATION)
            .map(String::as_str),
        Some(model),
        "the mutating webhook records the defaulted model"
    );
    let pod = cluster.wait_bound("first").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("e2e-quota-1")
    );
    assert_placement_annotations(&pod, 2);

    // The admission reserved the GPU in the quota's status.
    let used = quotas
        .get("default")
        .await
        .unwrap()
        .status
        .and_then(|s| s.used.get(model).cloned());
    assert!(
        matches!(used.as_ref().map(|q| q.0.as_str()), Some("1" | "1000m")),
        "GPUQuota status.used[{model}] after one admitted pod: {used:?}"
    );

    let denied = cluster
        .pods()
        .create(&PostParams::default(), &plain_pod("second"))
        .await
        .expect_err("the second pod goes over the quota and must be denied");
    let message = denied.to_string();
    println!("second: {message}");
    assert!(
        message.contains(&format!(
            "GPU quota exceeded in namespace \"{}\" for {model}: requested 1, used 1 of 1",
            cluster.ns
        )),
        "unexpected denial: {message}"
    );

    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}
