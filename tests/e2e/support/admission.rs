//! Admission-side helpers: registering gpu-admission's webhooks for one scenario, and
//! the scenario's namespaces, GPUQuotas and pod creates as the webhooks judge them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{CORE, Cluster, WEBHOOK_LABEL, server_url, serving_ca, shapes, wait_for_or_none};

/// One webhook in a webhook configuration: gpu-admission's route `path` (`mutate` or
/// `validate`) at `url`, named `name`, for the pods `object_selector` matches (all
/// when `None`) in the scenario's labelled namespace.
pub struct Hook {
    pub name: String,
    pub url: String,
    pub object_selector: Option<serde_json::Value>,
    /// The webhook's `rules`, when not pod CREATEs (and UPDATEs for a validating one).
    pub rules: Option<serde_json::Value>,
    /// The validating webhook's match condition, when gpu-admission runs with writers
    /// other than the harness's ([`shapes::guarded_change`]).
    pub condition: Option<String>,
}

impl Hook {
    /// `<path>.gpu-admission.io` at `<server>/<path>`, for every pod.
    pub fn new(path: &str, server: &str) -> Self {
        Hook {
            name: format!("{path}.gpu-admission.io"),
            url: format!("{server}/{path}"),
            object_selector: None,
            rules: None,
            condition: None,
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
            condition: None,
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
        if let Some(condition) = &hook.condition {
            webhook["matchConditions"][0]["expression"] = condition.clone().into();
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

/// Registers one validating webhook per gpu-admission replica: replica `a` judges the
/// pods labelled `replica: a`, replica `b` those labelled `replica: b`.
pub async fn register_validate_per_replica(cluster: &Cluster) {
    register_validate_for(cluster, &["a", "b"]).await;
}

/// The validating webhook registered once per replica of `replicas` (`a`, `b`, `c`), each
/// for the pods labelled `replica: <it>`.
pub async fn register_validate_for(cluster: &Cluster, replicas: &[&str]) {
    let hook = |replica: &str| Hook {
        name: format!("validate-{replica}.gpu-admission.io"),
        url: format!("{}/validate", super::replica_server_url(replica)),
        object_selector: Some(json!({"matchLabels": {"replica": replica}})),
        rules: None,
        condition: None,
    };
    let hooks = replicas.iter().map(|r| hook(r)).collect();
    register_hooks(cluster, vec![], hooks).await;
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

    /// Waits for the namespace's default ServiceAccount: with the ServiceAccount admission
    /// plugin on (the real node's phase), a pod is refused until it exists.
    pub async fn wait_default_service_account(&self) {
        use k8s_openapi::api::core::v1::ServiceAccount;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.ns);
        super::wait_for(
            "the namespace's default ServiceAccount",
            Duration::from_secs(30),
            || async { accounts.get_opt("default").await.ok()?.map(drop) },
        )
        .await;
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
        self.create_quota_spec(name, spec).await;
    }

    /// The usual opening of a quota scenario: the namespace selected by the webhooks,
    /// GPUQuota `name` with `spec`, then gpu-admission's webhooks registered.
    pub async fn quota_under_webhooks(&self, name: &str, spec: serde_json::Value) {
        self.label_for_webhooks().await;
        self.create_quota_spec(name, spec).await;
        register_webhooks(self).await;
    }

    /// Create GPUQuota `name` with `spec` as it is.
    pub async fn create_quota_spec(&self, name: &str, spec: serde_json::Value) {
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

    /// Waits until GPUQuota `name` reports `used[model]` = `gpus` (milli-GPUs) and no
    /// reservation of earlier versions; returns the status. (Pending totals stay for
    /// their whole TTL, counted or not: `used` is what admission decides on.)
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
            let done = used.unwrap_or(0) == milli && status.reservations.is_empty();
            *last_ref.lock().unwrap() = Some(status.clone());
            done.then_some(status)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "timed out after {QUOTA_TIMEOUT:?} waiting for GPUQuota {}/{name} to show \
                 used {model} = {milli}m; last status: {:?}",
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

/// The opening of a two-replica burst: the namespace selected by the webhooks, GPUQuota
/// `default` of `quota` GPUs of `model`, the validating webhook registered once per
/// replica (and a second for both to see the quota); returns `creates` 1-GPU pods of
/// `model`, labelled for replica `a` and `b` in turn and tagged with it, for
/// [`create_in_parallel`].
pub async fn two_replica_burst(
    cluster: &Cluster,
    model: &str,
    quota: u32,
    creates: u32,
) -> Vec<(String, Api<Pod>, Pod)> {
    replica_burst(cluster, model, quota, creates, &["a", "b"]).await
}

/// [`two_replica_burst`] through each of `replicas` in turn.
pub async fn replica_burst(
    cluster: &Cluster,
    model: &str,
    quota: u32,
    creates: u32,
    replicas: &[&str],
) -> Vec<(String, Api<Pod>, Pod)> {
    cluster.label_for_webhooks().await;
    let hard = json!({model: quota.to_string()});
    cluster.create_quota("default", hard, None).await;
    register_validate_for(cluster, replicas).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    (0..creates)
        .map(|i| {
            let replica = replicas[i as usize % replicas.len()];
            let pod = super::with_labels(
                super::unscheduled_gpu_pod(&format!("p{i:03}-{replica}"), Some(model), 1),
                json!({"replica": replica}),
            );
            (replica.to_string(), cluster.pods(), pod)
        })
        .collect()
}

/// Creates every pod at once (each with the tag it is counted under); returns how many
/// were admitted per tag, and the refusals counted by `kind` (the error's text when
/// `kind` does not name it).
pub async fn create_in_parallel(
    creates: Vec<(String, Api<Pod>, Pod)>,
    kind: impl Fn(&str) -> Option<&'static str>,
) -> (BTreeMap<String, u32>, BTreeMap<String, u32>) {
    let mut running = tokio::task::JoinSet::new();
    for (tag, pods, pod) in creates {
        running.spawn(async move { (tag, pods.create(&PostParams::default(), &pod).await) });
    }
    let mut admitted: BTreeMap<String, u32> = BTreeMap::new();
    let mut refusals: BTreeMap<String, u32> = BTreeMap::new();
    while let Some(joined) = running.join_next().await {
        match joined.unwrap() {
            (tag, Ok(_)) => *admitted.entry(tag).or_default() += 1,
            (_, Err(e)) => {
                let text = e.to_string();
                let kind = kind(&text).map_or(text, str::to_string);
                *refusals.entry(kind).or_default() += 1;
            }
        }
    }
    (admitted, refusals)
}
