//! Helpers of the device-type scenarios (MIG nodes, DRA claims and slices): nodes with
//! any capacity and labels, objects of the `resource.k8s.io/v1` API through kube's
//! dynamic API.
#![allow(clippy::unwrap_used, dead_code)]

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use super::{Cluster, SCENARIO_LABEL, shapes};

impl Cluster {
    /// A Ready, untainted node `name` with `labels` and `resources` (capacity =
    /// allocatable, 32 CPUs, 128 GiB and 110 pods unless given), labelled as this
    /// scenario's.
    pub async fn create_node_with(&self, name: &str, labels: Value, resources: Value) {
        let mut labels = labels;
        labels[SCENARIO_LABEL] = json!(self.scenario);
        let node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("creating node {name}: {e}"));
        let mut resources = resources;
        for (key, value) in [("cpu", "32"), ("memory", "128Gi"), ("pods", "110")] {
            if resources.get(key).is_none() {
                resources[key] = json!(value);
            }
        }
        let status = json!({
            "status": shapes::ready_node_status(&resources, "e2e test node (no kubelet)"),
        });
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

    /// `resource.k8s.io/v1` objects of `kind` (namespaced ones in the scenario's namespace).
    pub fn dra(&self, kind: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
        let plural = match kind {
            "DeviceClass" => "deviceclasses".to_string(),
            _ => format!("{}s", kind.to_lowercase()),
        };
        let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
        match kind {
            "ResourceClaim" | "ResourceClaimTemplate" => {
                Api::namespaced_with(self.client.clone(), &self.ns, &resource)
            }
            _ => Api::all_with(self.client.clone(), &resource),
        }
    }

    /// Creates pod `pod` (the GPU scheduler's) using claim `claim`, waits for it to be
    /// bound and for the claim to be allocated, and returns the allocation's results.
    pub async fn run_pod_on_claim(&self, pod: &str, claim: &str) -> Vec<Value> {
        let user: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": pod},
            "spec": {"schedulerName": super::scheduler_name(),
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [{"name": "cuda", "image": "registry.invalid/never-pulled:e2e",
                    "resources": {"claims": [{"name": "gpu"}]}}]},
        }))
        .unwrap();
        self.try_create(&user).await.unwrap();
        self.wait_bound(pod).await;
        let claims = self.dra("ResourceClaim");
        let what = format!("claim `{claim}` to be allocated");
        super::wait_for(&what, super::BIND_TIMEOUT, || {
            let claims = claims.clone();
            async move { allocated(&claims.get(claim).await.ok()?) }
        })
        .await
    }

    /// Creates a `resource.k8s.io/v1` object (replacing a cluster-scoped one left over).
    pub async fn create_dra(
        &self,
        kind: &str,
        object: Value,
    ) -> Result<DynamicObject, kube::Error> {
        let mut object = object;
        object["apiVersion"] = json!("resource.k8s.io/v1");
        object["kind"] = json!(kind);
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        let api = self.dra(kind);
        if !kind.starts_with("ResourceClaim") {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await
    }
}

/// The devices allocated to `claim`, once there are any.
pub fn allocated(claim: &DynamicObject) -> Option<Vec<Value>> {
    let results = &claim.data["status"]["allocation"]["devices"]["results"];
    results.as_array().filter(|r| !r.is_empty()).cloned()
}

/// A claim `name` for `count` devices of DeviceClass `class`, with CEL `selectors`.
pub fn claim(name: &str, class: &str, count: u32, selectors: &[&str]) -> Value {
    let selectors: Vec<Value> = selectors
        .iter()
        .map(|e| json!({"cel": {"expression": e}}))
        .collect();
    let mut exactly = json!({"deviceClassName": class, "count": count});
    if !selectors.is_empty() {
        exactly["selectors"] = json!(selectors);
    }
    json!({"metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
}

/// The CEL selector of NVIDIA's DRA driver for a product name.
pub fn product_selector(product: &str) -> String {
    format!(r#"device.attributes["gpu.nvidia.com"].productName == "{product}""#)
}
