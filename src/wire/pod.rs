//! A pod as requests carry it, decoded into only the fields gpu-admission reads:
//! identity, annotations, GPU resources of (init) containers, where it may and does
//! run, its scheduling gates, and its phase. Everything else in the body is skipped without being stored.
//!
//! The result is a `k8s_openapi` `Pod` with just those fields set, so the core keeps
//! one pod type. The mutating webhook's JSON Patch is a diff of two such pods, which is
//! exact for the fields it changes (scheduler name, annotations, node affinity): each
//! of them is carried whole.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, Pod, PodSchedulingGate, PodSpec, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;

use super::{DecodeError, MAX_POD_VALUES, check_budget, decode_raw};

/// Decode the pod in `raw` (its JSON text); `what` names the part in errors.
pub fn decode(what: &str, raw: &str) -> Result<Pod, DecodeError> {
    check_budget(what, raw.as_bytes(), MAX_POD_VALUES)?;
    let lite: PodLite = decode_raw(what, raw)?;
    Ok(lite.into())
}

/// A pod decoded as [`decode`] decodes one, as a part of a larger body decoded in one
/// pass. It has no value budget of its own: the caller checks the whole body's first
/// (`crate::wire::within_budget`), which bounds every part of it.
/// Boxed: a `Pod` is 2 KiB, moved several times on its way to the handler.
#[derive(Debug)]
pub(super) struct Lite(pub(super) Box<Pod>);

impl<'de> Deserialize<'de> for Lite {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        PodLite::deserialize(deserializer).map(|lite| Lite(Box::new(lite.into())))
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct PodLite {
    metadata: MetaLite,
    spec: Option<SpecLite>,
    status: Option<StatusLite>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct MetaLite {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct SpecLite {
    containers: Vec<ContainerLite>,
    init_containers: Option<Vec<ContainerLite>>,
    node_name: Option<String>,
    node_selector: Option<BTreeMap<String, String>>,
    affinity: Option<AffinityLite>,
    scheduler_name: Option<String>,
    /// Whether the quota queue holds the pod (`gpu-admission.io/quota`).
    scheduling_gates: Option<Vec<PodSchedulingGate>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ContainerLite {
    name: String,
    resources: Option<ResourcesLite>,
    /// `Always` on an init container makes it a native sidecar, counted beside the
    /// app containers.
    restart_policy: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ResourcesLite {
    limits: Option<BTreeMap<String, Quantity>>,
    requests: Option<BTreeMap<String, Quantity>>,
}

/// Only the node affinity: pod (anti-)affinity is the scheduler's business, and the
/// patch the mutating webhook computes never touches it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct AffinityLite {
    node_affinity: Option<NodeAffinity>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StatusLite {
    phase: Option<String>,
}

impl From<ContainerLite> for Container {
    fn from(c: ContainerLite) -> Container {
        Container {
            name: c.name,
            resources: c.resources.map(|r| ResourceRequirements {
                limits: r.limits,
                requests: r.requests,
                ..Default::default()
            }),
            restart_policy: c.restart_policy,
            ..Default::default()
        }
    }
}

impl From<PodLite> for Pod {
    fn from(lite: PodLite) -> Pod {
        let m = lite.metadata;
        Pod {
            metadata: ObjectMeta {
                name: m.name,
                generate_name: m.generate_name,
                namespace: m.namespace,
                uid: m.uid,
                annotations: m.annotations,
                creation_timestamp: m.creation_timestamp,
                deletion_timestamp: m.deletion_timestamp,
                deletion_grace_period_seconds: m.deletion_grace_period_seconds,
                ..Default::default()
            },
            spec: lite.spec.map(|s| PodSpec {
                containers: s.containers.into_iter().map(Container::from).collect(),
                init_containers: s
                    .init_containers
                    .map(|c| c.into_iter().map(Container::from).collect()),
                node_name: s.node_name,
                node_selector: s.node_selector,
                scheduling_gates: s.scheduling_gates,
                affinity: s.affinity.map(|a| Affinity {
                    node_affinity: a.node_affinity,
                    ..Default::default()
                }),
                scheduler_name: s.scheduler_name,
                ..Default::default()
            }),
            status: lite.status.map(|s| PodStatus {
                phase: s.phase,
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keeps_what_gpu_admission_reads_and_drops_the_rest() {
        let raw = serde_json::json!({
            "metadata": {"name": "p", "namespace": "team-a", "uid": "u1",
                "annotations": {"gpu-admission.io/gpu-type": "T4"}, "labels": {"app": "x"}},
            "spec": {
                "schedulerName": "gpu-scheduler", "nodeName": "n1",
                "nodeSelector": {"nvidia.com/gpu.product": "T4"},
                "containers": [{"name": "c0", "image": "busybox", "env": [{"name": "A"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "i0", "resources": {"requests": {"nvidia.com/gpu": "2"}}},
                    {"name": "s0", "restartPolicy": "Always"}],
                "affinity": {"podAffinity": {}, "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
                "volumes": [{}, {}, {}]
            },
            "status": {"phase": "Running", "conditions": [{}]}
        })
        .to_string();
        let pod = decode("Pod", &raw).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("u1"));
        assert!(pod.metadata.labels.is_none());
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.containers[0].image, None);
        assert_eq!(
            spec.containers[0]
                .resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()["nvidia.com/gpu"],
            Quantity("1".into())
        );
        let init = spec.init_containers.as_ref().unwrap();
        assert_eq!(init[0].name, "i0");
        assert_eq!(init[0].restart_policy, None);
        // A native sidecar stays one: its GPUs are counted beside the app containers.
        assert_eq!(init[1].restart_policy.as_deref(), Some("Always"));
        assert!(spec.affinity.as_ref().unwrap().node_affinity.is_some());
        assert!(spec.volumes.is_none());
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));
    }

    #[test]
    fn errors_name_the_part_and_the_path() {
        let err = decode("Pod", r#"{"spec": {"containers": 5}}"#).unwrap_err();
        assert_eq!(err.kind(), "wrong_type");
        let err = err.to_string();
        assert!(
            err.starts_with("Pod at spec.containers: invalid type"),
            "{err}"
        );
        let huge = format!(
            r#"{{"spec": {{"volumes": [{}]}}}}"#,
            vec!["{}"; 200_000].join(",")
        );
        let err = decode("task.Pod", &huge).unwrap_err().to_string();
        assert!(err.contains("more than 100000 JSON values"), "{err}");
    }
}
