//! The bytes the cache keeps per cached pod, and the most a load of a cluster file
//! holds at once, counted by a counting allocator (every allocation of this test binary
//! goes through it): deterministic, unlike the resident set, which
//! `hack/bench/rss.sh` measures on the real binary (docs/benchmarks.md, "Memory per
//! cached pod"). Two ways pods arrive: a cluster file, and one by one as the watch
//! applies them. The pods are heterogeneous, as real pods are: shares, whole
//! GPUs, device-plugin GPUs, MIG slices, init containers and native sidecars, owners,
//! labels and annotations, status, some pending and waiting, some being deleted, some
//! naming ResourceClaims.
//!
//! One test in this binary, so no other test's allocations land in the count.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;

use gpu_admission::backend::Backend;
use gpu_admission::cache::{CachedPod, Projection, pod_key};
use gpu_admission::config::Config;
use k8s_openapi::api::core::v1::Pod;
use peak_alloc::PeakAlloc;
use serde_json::{Value, json};

#[global_allocator]
static COUNTING: PeakAlloc = PeakAlloc;

/// The most a cached pod may cost, all the cache's structures included.
const BUDGET_PER_POD: f64 = 1024.0;
/// The most a load of a cluster file may hold at once, beyond the file's text, per
/// pod: what it keeps and the one object it is reading (a load that parsed every
/// object before projecting any held tens of kilobytes a pod).
const LOAD_PEAK_PER_POD: f64 = 4096.0;
const NODES: usize = 312;
const GPUS: usize = 8;
/// 8 a node, as in the benchmark's cluster (5,000 nodes, 40,000 pods); the hash tables
/// are as full as there (2,496 and 40,000 pods both fill 61% of the pod table).
const PODS: usize = NODES * GPUS;

/// Bytes allocated and not freed, by every thread, now.
fn live_bytes() -> isize {
    COUNTING.current_usage() as isize
}

/// Node `i`: gpu-manager nodes of three models, every tenth a device-plugin node, some
/// A100s cut into MIG slices (mixed strategy).
fn node(i: usize) -> Value {
    let (model, memory) = [
        ("Tesla-T4", 64),
        ("Tesla-V100-SXM2-32GB", 128),
        ("A100-SXM4-40GB", 160),
    ][i % 3];
    let mut allocatable = json!({"cpu": "95", "memory": "1031718340Ki", "pods": "110"});
    match kind_of(i) {
        NodeKind::Share => {
            allocatable["tencent.com/vcuda-core"] = json!((100 * GPUS).to_string());
            allocatable["tencent.com/vcuda-memory"] = json!((memory * GPUS).to_string());
        }
        NodeKind::Whole => allocatable["nvidia.com/gpu"] = json!(GPUS.to_string()),
        NodeKind::Mig => allocatable["nvidia.com/mig-1g.5gb"] = json!((7 * GPUS).to_string()),
    }
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(i), "creationTimestamp": "2026-10-01T08:00:00Z",
            "labels": {"nvidia.com/gpu.product": model, "kubernetes.io/hostname": node_name(i),
                "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
        "status": {"capacity": allocatable, "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}]}})
}

enum NodeKind {
    Share,
    Whole,
    Mig,
}

fn kind_of(node: usize) -> NodeKind {
    match node % 10 {
        9 => NodeKind::Whole,
        8 if node % 3 == 2 => NodeKind::Mig,
        _ => NodeKind::Share,
    }
}

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

/// Pod `i`, on node `i / 8`, GPU `i % 8` of it (a whole pod takes one GPU; the pods of
/// one node never overlap).
fn pod(i: usize) -> Value {
    let node = i / GPUS;
    let gpu = i % GPUS;
    let team = ["team-q", "team-a", "team-b", "research", "inference"][i % 5];
    let app = ["trainer", "infer", "embed", "rerank", "asr", "detector"][i % 6];
    let hash = format!(
        "{:010x}",
        (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24
    );
    let (owner_kind, owner) = match i % 10 {
        0..=6 => ("ReplicaSet", format!("{app}-{}", &hash[..8])),
        7 | 8 => ("Job", format!("{app}-job-{}", i % 97)),
        _ => ("StatefulSet", app.to_string()),
    };
    let name = format!("{owner}-{}", &hash[5..]);
    let mut limits = json!({"cpu": "8", "memory": "32Gi"});
    let mut annotations = json!({"kubectl.kubernetes.io/default-container": "main",
        "prometheus.io/scrape": "true", "prometheus.io/port": "9400"});
    let mut placed = |indices: &str| {
        annotations["tencent.com/predicate-node"] = json!(node_name(node));
        annotations["tencent.com/predicate-gpu-idx-0"] = json!(indices);
        annotations["tencent.com/predicate-time"] =
            json!((1_795_600_000_000u64 + i as u64).to_string());
        annotations["tencent.com/gpu-assigned"] = json!("true");
    };
    match kind_of(node) {
        NodeKind::Whole => limits["nvidia.com/gpu"] = json!("1"),
        NodeKind::Mig => limits["nvidia.com/mig-1g.5gb"] = json!("1"),
        NodeKind::Share if i % 4 == 3 => {
            limits["tencent.com/vcuda-core"] = json!("100");
            placed(&gpu.to_string());
        }
        NodeKind::Share => {
            let core = [10, 30, 50][i % 3];
            limits["tencent.com/vcuda-core"] = json!(core.to_string());
            limits["tencent.com/vcuda-memory"] = json!((core / 5).to_string());
            placed(&gpu.to_string());
        }
    }
    if i.is_multiple_of(3) {
        annotations["gpu-admission.io/gpu-type"] =
            json!(["Tesla-T4", "Tesla-V100-SXM2-32GB", "A100-SXM4-40GB"][node % 3]);
    }
    let main = json!({"name": "main", "image": format!("registry.example.com/ml/{app}:2.4.{}", i % 9),
        "command": ["python", "-m", format!("{app}.serve")],
        "env": [{"name": "MODEL_NAME", "value": format!("{app}-v{}", i % 7)},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": limits},
        "volumeMounts": [{"name": "models", "mountPath": "/models"}]});
    let mut spec = json!({"containers": [main], "schedulerName": "gpu-scheduler",
        "nodeName": node_name(node), "restartPolicy": "Always", "priority": i % 3,
        "serviceAccountName": "default", "volumes": [{"name": "models", "emptyDir": {}}],
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
            "effect": "NoExecute", "tolerationSeconds": 300}]});
    match i % 8 {
        1 => {
            spec["initContainers"] = json!([{"name": "fetch-model", "image": "registry.example.com/tools/fetch:1.3",
                "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}])
        }
        5 => {
            spec["initContainers"] = json!([{"name": "log-shipper", "image": "registry.example.com/tools/vector:0.41",
                "restartPolicy": "Always", "resources": {"limits": {"cpu": "200m", "memory": "256Mi"}}}])
        }
        _ => {}
    }
    if i % 50 == 7 {
        spec["resourceClaims"] =
            json!([{"name": "scratch", "resourceClaimName": format!("{name}-scratch")}]);
    }
    let mut status = json!({"phase": "Running", "podIP": format!("10.{}.{}.{}", i / 65_000 + 100, i / 250 % 250, i % 250 + 1),
        "startTime": "2026-11-28T07:00:00Z", "qosClass": "Burstable",
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "x",
            "imageID": "", "state": {"running": {"startedAt": "2026-11-28T07:01:00Z"}}}]});
    let mut metadata = json!({"name": name, "generateName": format!("{owner}-"), "namespace": team,
        "uid": format!("{:08x}-0000-4000-8000-{i:012}", hash.len() * i),
        "resourceVersion": (1_000_000 + i).to_string(), "creationTimestamp": "2026-11-28T07:00:00Z",
        "labels": {"app": app, "team": team, "pod-template-hash": &hash[..10], "version": format!("v{}", i % 7)},
        "annotations": annotations,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner,
            "uid": format!("{:08x}-1111-4000-8000-{:012}", i % 97, i % 1000), "controller": true, "blockOwnerDeletion": true}]});
    // One in forty pending: not bound, the scheduler could not place it, gpu-admission
    // told it why; one in a hundred being deleted.
    if i % 40 == 11 {
        spec.as_object_mut().unwrap().remove("nodeName");
        status = json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/312 nodes are available", "lastTransitionTime": "2026-11-28T07:00:05Z"},
            {"type": "gpu-admission.io/Waiting", "status": "True", "reason": "Fragmented",
                "message": "no node has the GPUs free together"}]});
    }
    if i % 100 == 13 {
        metadata["deletionTimestamp"] = json!("2026-11-28T08:00:00Z");
        metadata["deletionGracePeriodSeconds"] = json!(30);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status})
}

fn quotas() -> Vec<Value> {
    ["team-q", "team-a", "research"]
        .iter()
        .map(|ns| {
            json!({"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
                "metadata": {"name": "default", "namespace": ns},
                "spec": {"hard": {"Tesla-T4": "100000", "Tesla-V100-SXM2-32GB": "100000",
                    "A100-SXM4-40GB": "100000"}}})
        })
        .collect()
}

/// A cluster file of the quotas, the nodes and `pods`, one JSON document each.
fn cluster_file(pods: &[Value]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let nodes = (0..NODES).map(node);
    for doc in quotas()
        .into_iter()
        .chain(nodes)
        .chain(pods.iter().cloned())
    {
        writeln!(file, "{doc}\n---").unwrap();
    }
    file.flush().unwrap();
    file
}

/// What a load of `file` keeps once it is done, and the most it held at once beyond
/// the file's text, in bytes; the backend it made.
fn load(file: &tempfile::NamedTempFile, projection: &Projection) -> (isize, isize, Backend) {
    let text = std::fs::metadata(file.path()).unwrap().len() as isize;
    let before = live_bytes();
    COUNTING.reset_peak_usage();
    let backend = Backend::from_file(file.path(), projection.clone()).unwrap();
    let peak = COUNTING.peak_usage() as isize - before - text;
    (live_bytes() - before, peak, backend)
}

#[test]
fn a_cached_pod_keeps_under_a_kibibyte_from_a_file_and_from_the_watch() {
    let projection = Projection::from_config(&Config::default());
    let pods: Vec<Value> = (0..PODS).map(pod).collect();
    let full = cluster_file(&pods);
    let empty = cluster_file(&[]);

    // From a file: what the load keeps with the pods, less what it keeps without them.
    let (with_pods, peak, backend) = load(&full, &projection);
    let cached = backend.cache().read(|s| s.pod_count());
    drop(backend);
    let (without_pods, _, backend) = load(&empty, &projection);
    let from_file = (with_pods - without_pods) as f64 / cached as f64;
    let load_peak = peak as f64 / cached as f64;

    // From the watch: each pod decoded, projected and applied as an event brings it,
    // the Pod object dropped after, into the cache loaded without pods.
    let texts: Vec<String> = pods.iter().map(Value::to_string).collect();
    drop(pods);
    let before = live_bytes();
    for text in &texts {
        let pod: Pod = serde_json::from_str(text).unwrap();
        let key = pod_key(&pod);
        let cached = CachedPod::from_pod(&pod, &projection).unwrap();
        backend.writer().write(|s| s.apply_pod(key, cached));
    }
    let from_watch = (live_bytes() - before) as f64 / cached as f64;
    let watched = backend.cache().read(|s| s.pod_count());

    println!(
        "bytes per cached pod ({cached} pods): kept from a file {from_file:.0}, from the watch {from_watch:.0}; held at once while loading the file, beyond its text: {load_peak:.0}"
    );
    // Every pod of the file is cached (none is terminal or without a GPU), and the
    // watch's are the same ones.
    assert_eq!(cached, PODS);
    assert_eq!(watched, PODS);
    assert!(
        from_file <= BUDGET_PER_POD,
        "a pod loaded from a file keeps {from_file:.0} bytes (budget {BUDGET_PER_POD})"
    );
    assert!(
        from_watch <= BUDGET_PER_POD,
        "a pod applied from the watch keeps {from_watch:.0} bytes (budget {BUDGET_PER_POD})"
    );
    assert!(
        load_peak <= LOAD_PEAK_PER_POD,
        "loading the file held {load_peak:.0} bytes a pod at once (budget {LOAD_PEAK_PER_POD})"
    );
}
