//! Helpers of the end-to-end tests (tests/e2e/): connecting to the test cluster, one
//! namespace per scenario, fake GPU nodes, GPU pods, bounded waits; webhook registration
//! and GPUQuotas (`admission`); stopping/starting gpu-admission, its doors' URLs and its
//! admin port (`server`); calling its doors directly (`https`). The families import it
//! whole (`use crate::support::*`).
#![allow(clippy::unwrap_used, dead_code)]

pub mod devices;
pub mod https;
pub mod prometheus;
pub mod proxy;
pub mod shapes;

mod admission;
mod server;
pub use admission::*;
pub use server::*;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

pub const KUBECONFIG_ENV: &str = "GPU_ADMISSION_E2E_KUBECONFIG";
pub const CTL_ENV: &str = "GPU_ADMISSION_E2E_CTL";
pub const SCENARIO_LABEL: &str = "gpu-admission-e2e/scenario";
pub use shapes::{CORE, MEMORY, MEMORY_PER_GPU, MODEL_LABEL, TYPE_ANNOTATION, WEBHOOK_LABEL};
pub const BIND_TIMEOUT: Duration = Duration::from_secs(60);

/// One scenario's view of the test cluster.
pub struct Cluster {
    pub client: Client,
    pub scenario: &'static str,
    pub ns: String,
}

/// Connects to the cluster named by `GPU_ADMISSION_E2E_KUBECONFIG` and creates the
/// scenario's namespace; `None` (after saying so) when the variable is not set.
pub async fn setup(scenario: &'static str) -> Option<Cluster> {
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

pub fn scheduler_name() -> String {
    std::env::var("GPU_ADMISSION_E2E_SCHEDULER").unwrap_or_else(|_| "gpu-scheduler".into())
}

/// What a test pod asks for.
#[derive(Clone, Copy, Debug)]
pub enum Gpu {
    /// Share mode: part of one GPU (`vcuda-core < 100`) and some memory units.
    Share { core: u32, memory: u32 },
    /// Exclusive mode: this many whole GPUs (`vcuda-core = 100 * n`).
    Whole(u32),
}

impl Gpu {
    pub fn core(self) -> u32 {
        match self {
            Gpu::Share { core, .. } => core,
            Gpu::Whole(n) => 100 * n,
        }
    }
}

impl Cluster {
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// A client that acts as `user` (impersonated by the admin), after granting that
    /// user what a namespace admin may do with pods in the scenario's namespace, and
    /// nothing else (spelled out rather than the built-in `admin` role, so a scenario
    /// proves what exactly it needs).
    pub async fn namespace_admin(&self, user: &str) -> Client {
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pod-admin"},
            "rules": [{"apiGroups": [""], "resources": ["pods"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]});
        let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(role).unwrap();
        Api::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("{user}-pod-admin")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
        let binding: k8s_openapi::api::rbac::v1::RoleBinding =
            serde_json::from_value(binding).unwrap();
        Api::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        self.impersonate(user).await
    }

    /// A client that acts as `user` (impersonated by the admin), with whatever that user
    /// is granted.
    pub async fn impersonate(&self, user: &str) -> Client {
        let path = PathBuf::from(std::env::var_os(KUBECONFIG_ENV).unwrap());
        let kubeconfig = Kubeconfig::read_from(&path).unwrap();
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
        config.auth_info.impersonate = Some(user.to_string());
        Client::try_from(config).unwrap()
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A Ready, untainted node of `model` with `gpus` GPUs in gpu-manager resources
    /// (capacity and allocatable written through the status subresource).
    pub async fn create_gpu_node(&self, name: &str, model: &str, gpus: u32) {
        let labels = json!({MODEL_LABEL: model});
        self.create_node_with(name, labels, shapes::node_resources(gpus))
            .await;
    }

    /// Deletes this scenario's nodes (left over from an earlier run, or at the end).
    pub async fn delete_nodes(&self) {
        let selector = format!("{SCENARIO_LABEL}={}", self.scenario);
        self.nodes()
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector),
            )
            .await
            .unwrap();
    }

    /// Deletes every pod of this scenario's namespace: a scenario that leaves hundreds
    /// of pending GPU pods behind would keep the waiting controller (a bounded number of
    /// condition writes a pass) busy with them through the scenarios after it.
    pub async fn delete_pods(&self) {
        self.pods()
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap();
    }

    /// Creates a pod for the GPU scheduler wanting `gpu` on a node of `model`.
    pub async fn create_gpu_pod(&self, name: &str, model: &str, gpu: Gpu) -> Pod {
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
    pub async fn wait_bound(&self, name: &str) -> Pod {
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
    pub async fn wait_failed_scheduling(&self, name: &str, needle: &str) -> String {
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
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_or_none(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

pub async fn wait_for_or_none<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
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

pub fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

/// The GPU indices the extender chose for container 0, checked against the
/// gpu-manager protocol annotations.
pub fn assert_placement_annotations(pod: &Pod, gpus_on_node: u32) -> Vec<u32> {
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

/// A scheduler nobody runs: pods that name it stay unbound, so deleting them is
/// immediate (a bound pod would wait for a kubelet that does not exist).
pub const NO_SCHEDULER: &str = "e2e-nobody";

/// A pod wanting `gpus` whole GPUs (vcuda-core `100 * gpus`) of `model` (annotation; `None`
/// leaves the model to the quota's `defaultType`), for the scheduler nobody runs.
pub fn unscheduled_gpu_pod(name: &str, model: Option<&str>, gpus: u32) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "containers": [{
                "name": "cuda",
                "image": "registry.invalid/never-pulled:e2e",
                "resources": {"limits": {CORE: (100 * gpus).to_string()}},
            }],
        },
    });
    if let Some(model) = model {
        pod["metadata"]["annotations"] = json!({TYPE_ANNOTATION: model});
    }
    serde_json::from_value(pod).unwrap()
}

/// A pod without GPU resources, for the scheduler nobody runs.
pub fn plain_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "containers": [{"name": "main", "image": "registry.invalid/never-pulled:e2e"}],
        },
    }))
    .unwrap()
}

/// Adds `labels` (`{"key": "value"}`) to `pod`.
pub fn with_labels(mut pod: Pod, labels: serde_json::Value) -> Pod {
    let labels: BTreeMap<String, String> = serde_json::from_value(labels).unwrap();
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .extend(labels);
    pod
}

/// The API error of a refused request: asserts HTTP 403 / reason `Forbidden` and returns
/// the message the user sees.
pub fn forbidden_message<T>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Ok(_) => panic!("{what} must be refused, but it was created"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(
                (status.code, status.reason.as_str()),
                (403, "Forbidden"),
                "{what}: expected HTTP 403 Forbidden, got {status:?}"
            );
            status.message
        }
        Err(other) => panic!("{what}: expected an API error, got {other}"),
    }
}

/// Run the cluster's own `kubectl` (`GPU_ADMISSION_E2E_KUBECTL`, the build the control
/// plane came from) as the admin, with `stdin`: its exit status, stdout and stderr.
pub fn kubectl(args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write as _;
    let binary = std::env::var("GPU_ADMISSION_E2E_KUBECTL")
        .expect("GPU_ADMISSION_E2E_KUBECTL names kubectl (hack/e2e.sh sets it)");
    let kubeconfig = std::env::var(KUBECONFIG_ENV).unwrap();
    let mut child = std::process::Command::new(binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}
