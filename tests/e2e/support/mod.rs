//! Helpers of the end-to-end tests (tests/e2e/): connecting to the test cluster, one
//! namespace per scenario, fake GPU nodes, GPU pods, bounded waits, webhook registration,
//! stopping/starting gpu-admission, reading its admin port, and calling its doors
//! directly (`https`).
#![allow(clippy::unwrap_used, dead_code)]

pub mod devices;
pub mod https;
pub mod shapes;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
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
    /// user what a namespace admin may do with pods in the scenario's namespace. (The
    /// built-in `admin` role is aggregated by kube-controller-manager, which this suite
    /// does not run, so the rules are spelled out.)
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

/// Runs the `GPU_ADMISSION_E2E_CTL` script with `action` (`stop` or `start`) for
/// gpu-admission replica `a` (the extender, and the webhooks' usual backend).
pub fn ctl(action: &str) {
    ctl_replica(action, "a");
}

/// Runs the `GPU_ADMISSION_E2E_CTL` script with `action` for `replica` (`a` or `b`).
pub fn ctl_replica(action: &str, replica: &str) {
    let script = std::env::var_os(CTL_ENV).unwrap_or_else(|| {
        panic!("{CTL_ENV} is not set: this scenario needs a script to stop/start gpu-admission")
    });
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(action)
        .arg(replica)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "`{script:?} {action} {replica}` failed: {status}"
    );
}

/// Restarts gpu-admission when dropped, so a failing assertion does not leave the
/// extender down for the scenarios that follow.
pub struct RestartOnDrop(pub bool);

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if self.0 {
            ctl("start");
        }
    }
}

fn env(name: &str, what: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} ({what}) is not set"))
}

/// The gpu-admission binary of the run (`GPU_ADMISSION_E2E_BIN`, a copy hack/e2e.sh took
/// of this checkout's build: cargo's own output may be replaced by another checkout's build
/// when the target directory is shared); cargo's when the variable is not set.
pub fn gpu_admission_bin() -> PathBuf {
    std::env::var_os("GPU_ADMISSION_E2E_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpu-admission")))
}

/// https URL of the webhook door of gpu-admission replica `a`
/// (`GPU_ADMISSION_E2E_SERVER_URL`).
pub fn server_url() -> String {
    env("GPU_ADMISSION_E2E_SERVER_URL", "gpu-admission's https URL")
}

/// https URL of the webhook door of the second replica `b`
/// (`GPU_ADMISSION_E2E_SERVER_URL_B`).
pub fn server_url_b() -> String {
    env("GPU_ADMISSION_E2E_SERVER_URL_B", "replica b's https URL")
}

/// https URL of replica `a`'s extender door (`GPU_ADMISSION_E2E_EXTENDER_URL`), the
/// kube-scheduler's `urlPrefix` without `/scheduler`.
pub fn extender_url() -> String {
    env(
        "GPU_ADMISSION_E2E_EXTENDER_URL",
        "gpu-admission's extender https URL",
    )
}

/// gpu-admission's serving CA (`GPU_ADMISSION_E2E_CA_FILE`).
pub fn serving_ca() -> PathBuf {
    env("GPU_ADMISSION_E2E_CA_FILE", "gpu-admission's CA").into()
}

/// The client certificate and key kube-apiserver presents to the webhooks
/// (`GPU_ADMISSION_E2E_CLIENT_CERT`, `GPU_ADMISSION_E2E_CLIENT_KEY`), signed by the CA
/// gpu-admission gets as `--client-ca` (`GPU_ADMISSION_E2E_CLIENT_CA`).
pub fn apiserver_client_identity() -> (PathBuf, PathBuf) {
    (
        env(
            "GPU_ADMISSION_E2E_CLIENT_CERT",
            "kube-apiserver's webhook client certificate",
        )
        .into(),
        env(
            "GPU_ADMISSION_E2E_CLIENT_KEY",
            "kube-apiserver's webhook client key",
        )
        .into(),
    )
}

/// A TLS client trusting gpu-admission's serving CA, presenting no certificate.
pub fn anonymous_tls() -> std::sync::Arc<rustls::ClientConfig> {
    https::client_config(&serving_ca(), None)
}

/// A TLS client trusting gpu-admission's serving CA, presenting kube-apiserver's webhook
/// client certificate.
pub fn apiserver_tls() -> std::sync::Arc<rustls::ClientConfig> {
    let (cert, key) = apiserver_client_identity();
    https::client_config(&serving_ca(), Some((&cert, &key)))
}

/// POSTs an `ExtenderArgs` to replica `a`'s extender door at `/scheduler/predicates`
/// (no client certificate, as the scheduler calls it); asserts HTTP 200 and returns the
/// `ExtenderFilterResult`.
pub async fn extender_filter(args: &serde_json::Value) -> serde_json::Value {
    let url = extender_url();
    let (status, body) = https::post(
        &url,
        "/scheduler/predicates",
        args.to_string(),
        anonymous_tls(),
    )
    .await
    .unwrap_or_else(|e| panic!("POST {url}/scheduler/predicates: {}", https::chain(&*e)));
    assert_eq!(
        status, 200,
        "POST {url}/scheduler/predicates answered {status}: {body}"
    );
    serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("the extender's answer is not JSON ({e}): {body}"))
}

/// POSTs `args` (ExtenderBindingArgs) to replica a's `/scheduler/bind`, as kube-scheduler
/// does, and returns the answer's `Error` (empty: bound).
pub async fn extender_bind(args: &serde_json::Value) -> String {
    let url = extender_url();
    let (status, body) = https::post(&url, "/scheduler/bind", args.to_string(), anonymous_tls())
        .await
        .unwrap_or_else(|e| panic!("POST {url}/scheduler/bind: {}", https::chain(&*e)));
    assert_eq!(
        status, 200,
        "POST {url}/scheduler/bind answered {status}: {body}"
    );
    let answer: serde_json::Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("the extender's answer is not JSON ({e}): {body}"));
    answer["Error"].as_str().unwrap_or_default().to_string()
}

/// One webhook in a webhook configuration: gpu-admission's route `path` (`mutate` or
/// `validate`) at `url`, named `name`, for the pods `object_selector` matches (all
/// when `None`) in the scenario's labelled namespace.
pub struct Hook {
    pub name: String,
    pub url: String,
    pub object_selector: Option<serde_json::Value>,
    /// The webhook's `rules`, when not pod CREATEs (and UPDATEs for a validating one).
    pub rules: Option<serde_json::Value>,
}

impl Hook {
    /// `<path>.gpu-admission.io` at `<server>/<path>`, for every pod.
    pub fn new(path: &str, server: &str) -> Self {
        Hook {
            name: format!("{path}.gpu-admission.io"),
            url: format!("{server}/{path}"),
            object_selector: None,
            rules: None,
        }
    }

    /// `<path>-claims.gpu-admission.io` at `<server>/<path>/resourceclaims`, for
    /// ResourceClaim CREATEs, as deploy/ registers it.
    pub fn claims(path: &str, server: &str) -> Self {
        Hook {
            name: format!("{path}-claims.gpu-admission.io"),
            url: format!("{server}/{path}/resourceclaims"),
            object_selector: None,
            rules: Some(
                json!([{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["resourceclaims"]}]),
            ),
        }
    }
}

/// Registers gpu-admission's `/mutate` and `/validate` (replica `a`) as the apiserver's
/// webhooks for pods in namespaces labelled `gpu-admission-e2e/webhooks=<scenario>` (see
/// [`Cluster::label_for_webhooks`]; so other scenarios are not affected), trusted through
/// `GPU_ADMISSION_E2E_CA_FILE`; deleted again by `unregister_webhooks`.
pub async fn register_webhooks(cluster: &Cluster) {
    let url = server_url();
    register_hooks(
        cluster,
        vec![Hook::new("mutate", &url)],
        vec![Hook::new("validate", &url)],
    )
    .await;
}

/// Registers the given mutating and validating webhooks (a configuration of a kind is
/// left out when its list is empty) as `gpu-admission-e2e-<scenario>`.
pub async fn register_hooks(cluster: &Cluster, mutating: Vec<Hook>, validating: Vec<Hook>) {
    use base64::Engine as _;
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let ca = std::fs::read(serving_ca()).unwrap();
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let name = format!("gpu-admission-e2e-{}", cluster.scenario);
    // As deploy/ registers them (see shapes::webhook).
    let webhook = |hook: &Hook, validating: bool| {
        let mut webhook = shapes::webhook(
            &hook.name,
            &hook.url,
            &ca_bundle,
            validating,
            cluster.scenario,
            hook.object_selector.as_ref(),
        );
        if let Some(rules) = &hook.rules {
            webhook["rules"] = rules.clone();
        }
        webhook
    };
    unregister_webhooks(cluster).await;
    if !mutating.is_empty() {
        let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": mutating.iter().map(|h| webhook(h, false)).collect::<Vec<_>>(),
        }))
        .unwrap();
        Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
    }
    if !validating.is_empty() {
        let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": validating.iter().map(|h| webhook(h, true)).collect::<Vec<_>>(),
        }))
        .unwrap();
        Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
    }
    // The apiserver picks new webhook configurations up from its informer, not at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
}

pub async fn unregister_webhooks(cluster: &Cluster) {
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
pub fn forbidden_message(result: Result<Pod, kube::Error>, what: &str) -> String {
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

/// A Kubernetes quantity of GPUs (`"2"`, `"1.5"`, `"2500m"`) in milli-GPUs.
pub fn milli_gpus(quantity: &str) -> u64 {
    if let Some(milli) = quantity.strip_suffix('m') {
        return milli.parse().unwrap();
    }
    (quantity.parse::<f64>().unwrap() * 1000.0).round() as u64
}

impl Cluster {
    /// Labels the scenario's namespace so the webhooks of `register_webhooks` apply.
    pub async fn label_for_webhooks(&self) {
        Api::<Namespace>::all(self.client.clone())
            .patch(
                &self.ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {WEBHOOK_LABEL: self.scenario}}})),
            )
            .await
            .unwrap();
    }

    /// Creates another namespace for this scenario (`<ns>-<suffix>`), without labels.
    pub async fn create_namespace(&self, suffix: &str) -> String {
        let name = format!("{}-{suffix}", self.ns);
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        name
    }

    pub fn quotas(&self) -> Api<gpu_admission::quota::GPUQuota> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates GPUQuota `name` with `hard` (model -> GPUs) and an optional `defaultType`.
    pub async fn create_quota(
        &self,
        name: &str,
        hard: serde_json::Value,
        default_type: Option<&str>,
    ) {
        let mut spec = json!({"hard": hard});
        if let Some(model) = default_type {
            spec["defaultType"] = json!(model);
        }
        let quota: gpu_admission::quota::GPUQuota = serde_json::from_value(json!({
            "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        }))
        .unwrap();
        self.quotas()
            .create(&PostParams::default(), &quota)
            .await
            .unwrap_or_else(|e| panic!("creating GPUQuota {}/{name}: {e}", self.ns));
    }

    /// `status` of GPUQuota `name` (empty when it has none yet).
    pub async fn quota_status(&self, name: &str) -> gpu_admission::quota::GpuQuotaStatus {
        self.quotas()
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    }

    /// Waits until GPUQuota `name` reports `used[model]` = `gpus` (milli-GPUs) with no
    /// pending charge left (every admitted pod seen by the reconciler and its pending
    /// total settled); returns the status.
    pub async fn wait_used(
        &self,
        name: &str,
        model: &str,
        milli: u64,
    ) -> gpu_admission::quota::GpuQuotaStatus {
        let last = std::sync::Mutex::new(None);
        let last_ref = &last;
        let found = wait_for_or_none(QUOTA_TIMEOUT, || async move {
            let status = self.quota_status(name).await;
            let used = status.used.get(model).map(|q| milli_gpus(&q.0));
            let settled = status.pending.is_empty() && status.reservations.is_empty();
            let done = used.unwrap_or(0) == milli && settled;
            *last_ref.lock().unwrap() = Some(status.clone());
            done.then_some(status)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "timed out after {QUOTA_TIMEOUT:?} waiting for GPUQuota {}/{name} to show \
                 used {model} = {milli}m and no pending charge; last status: {:?}",
                self.ns,
                last.lock().unwrap()
            )
        })
    }

    /// Milli-GPUs the live (non-terminal) pods of the namespace ask for, from the API.
    pub async fn live_pod_gpus(&self) -> u64 {
        let pods = self.pods().list(&ListParams::default()).await.unwrap();
        pods.items
            .iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                p.metadata.deletion_timestamp.is_none()
                    && !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .map(|p| {
                let spec = p.spec.as_ref().unwrap();
                spec.containers
                    .iter()
                    .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(CORE))
                    .map(|q| q.0.parse::<u64>().unwrap() * 10)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Creates `pod` in the scenario's namespace, returning the API's answer.
    pub async fn try_create(&self, pod: &Pod) -> Result<Pod, kube::Error> {
        self.pods().create(&PostParams::default(), pod).await
    }

    /// Retries creating `pod` once a second until it succeeds (the reconciler frees quota
    /// every 15 s and on pod deletion); panics with the last refusal after `timeout`.
    pub async fn create_when_admitted(&self, pod: &Pod, timeout: Duration) -> Pod {
        let name = pod.metadata.name.clone().unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_create(pod).await {
                Ok(created) => return created,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => panic!(
                    "pod {}/{name} still refused after {timeout:?}: {e}",
                    self.ns
                ),
            }
        }
    }
}

/// Bound on waiting for the quota reconciler (it runs every 15 s).
pub const QUOTA_TIMEOUT: Duration = Duration::from_secs(40);

/// gpu-admission's metrics (Prometheus text) from its admin port
/// (`GPU_ADMISSION_E2E_ADMIN_URL`).
pub fn admin_metrics() -> String {
    let admin = env("GPU_ADMISSION_E2E_ADMIN_URL", "gpu-admission's admin URL");
    let out = std::process::Command::new("curl")
        .args(["-fsS", &format!("{admin}/metrics")])
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {admin}/metrics failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The value of `metric` (the line starting `metric `, labels included) on
/// gpu-admission's admin port; 0 when absent.
pub fn admin_metric(metric: &str) -> f64 {
    sum_metric(&admin_metrics(), metric, "")
}

/// The sum of every sample of `text` whose series starts with `name` and contains
/// `fragment` (e.g. `route="validate"`); 0 when there is none.
pub fn sum_metric(text: &str, name: &str, fragment: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| series.starts_with(name) && series.contains(fragment))
        .filter(|(series, _)| {
            // `name` itself, or `name{...}`, not a longer metric name.
            matches!(series.as_bytes().get(name.len()), None | Some(b'{'))
        })
        .map(|(_, value)| value.parse::<f64>().unwrap_or(0.0))
        .sum()
}

/// p-th percentile (0..=100, nearest rank) of `samples`, in milliseconds.
pub fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}
