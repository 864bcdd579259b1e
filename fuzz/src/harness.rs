//! What each fuzz target does with its input, shared by the fuzz targets
//! (`fuzz/fuzz_targets/*.rs`) and the stable regression test
//! (`tests/fuzz_regressions.rs`, which includes this file by path). Only the crate's
//! public API and its own dependencies (`k8s-openapi`, `serde_json`) are used here, so
//! the root crate's tests can compile it without any fuzzing dependency.
//!
//! Every function must not panic on any input; a panic (or a failed property
//! assertion) is a finding.

use std::sync::OnceLock;

use gpu_admission::cache::{CachedPod, Projection};
use gpu_admission::config::Config;
use gpu_admission::dra::cel::{CLAIM_BUDGET, CelDevice, CostBudget, Selector};
use gpu_admission::dra::classes::DeviceClasses;
use gpu_admission::dra::slices::{DeviceIndex, ResourceSlice, gpu_devices};
use gpu_admission::dra::{Catalog, ClaimAsks, Dra, ResourceClaim};
use gpu_admission::placement::models::WantedModels;
use gpu_admission::placement::quantity::Milli;
use gpu_admission::placement::{GpuRequest, ResourceNames};
use gpu_admission::wire::extender::ExtenderArgs;
use gpu_admission::wire::review::Review;
use gpu_admission::wire::volcano::PredicateArgs;
use k8s_openapi::api::core::v1::Pod;

/// The targets, by name (the directory names under `fuzz/seeds` and `fuzz/regressions`).
pub const TARGETS: [&str; 8] = [
    "extender_args",
    "volcano_predicate",
    "admission_review",
    "quantity",
    "pod_annotations",
    "config",
    "pod_cost",
    "cel_selector",
];

fn names() -> &'static ResourceNames {
    static NAMES: OnceLock<ResourceNames> = OnceLock::new();
    NAMES.get_or_init(ResourceNames::default)
}

fn projection() -> &'static Projection {
    static PROJECTION: OnceLock<Projection> = OnceLock::new();
    PROJECTION.get_or_init(|| Projection::from_config(&Config::default()))
}

/// A decoded pod's GPU request, as every route reads it next, with the relation
/// `GpuRequest::held_for_init` documents: the app containers plus what is held for
/// the init containers come to exactly `core_units`.
fn gpu_request(pod: &Pod) {
    let Ok(Some(request)) = GpuRequest::from_pod(pod, names()) else {
        return;
    };
    let apps: u64 = request
        .containers
        .iter()
        .map(|c| c.demand.core_units())
        .sum();
    let held: u64 = request.held_for_init().iter().map(|d| d.core_units()).sum();
    assert_eq!(apps + held, request.core_units(), "{request:?}");
    let _ = request.whole_gpus();
}

/// The scheduler extender's filter request body, its candidates' names, the node
/// objects an answer echoes (each exactly a JSON value of the body), and the decoded
/// pod's GPU request.
pub fn extender_args(data: &[u8]) {
    if let Ok(args) = ExtenderArgs::from_json(data) {
        let _ = args.candidate_names();
        if let Some(items) = args.echo(|_| true) {
            assert_eq!(items.len(), args.nodes.as_ref().map_or(0, Vec::len));
            for text in items.texts() {
                let echoed = serde_json::from_str::<&serde_json::value::RawValue>(text);
                assert!(echoed.is_ok(), "echoed node is not a JSON value: {text:?}");
            }
        }
        gpu_request(&args.pod);
    }
}

/// Volcano's predicate request body, and the GPU requests of the decoded pod and of the
/// pods of the node's holding tasks.
pub fn volcano_predicate(data: &[u8]) {
    if let Ok(args) = PredicateArgs::from_json(data) {
        gpu_request(&args.pod);
        args.node_pods.iter().for_each(gpu_request);
    }
}

/// An AdmissionReview body; when it decodes, its `request.object` and
/// `request.oldObject` as pods (`Review::pod`, the webhooks' own bounded decoder; the
/// objects stay raw JSON until then), and those pods' GPU requests. The webhooks'
/// one-pass decoder (`Review::decode`, then `Review::take_pod`) must give the same
/// review and pods, or the same error.
pub fn admission_review(data: &[u8]) {
    let reference = Review::from_json(data);
    match (&reference, Review::decode(data)) {
        (Err(reference), Err(decoded)) => assert_eq!(reference, &decoded),
        (Ok(reference), Ok(mut decoded)) => {
            let (a, b) = (&reference.request, &decoded.request);
            assert_eq!(reference.api_version, decoded.api_version);
            assert_eq!(
                (&a.uid, &a.namespace, &a.name, &a.operation, a.dry_run),
                (&b.uid, &b.namespace, &b.name, &b.operation, b.dry_run)
            );
            for old in [false, true] {
                assert_eq!(reference.pod(old), decoded.take_pod(old).map(|pod| *pod));
            }
        }
        (reference, decoded) => panic!("from_json: {reference:?}, decode: {decoded:?}"),
    }
    let Ok(review) = reference else {
        return;
    };
    for old in [false, true] {
        if let Ok(pod) = review.pod(old) {
            gpu_request(&pod);
        }
    }
}

/// A resource quantity string, with the relations `src/placement/quantity.rs`
/// documents: `parse_whole` is `parse` in whole units (refusing fractions), and
/// `Display` is the canonical form of a value, so it parses back to the same value.
pub fn quantity(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let milli = Milli::parse(text);
    let whole = Milli::parse_whole(text);
    if let (Ok(milli), Ok(whole)) = (&milli, &whole) {
        assert_eq!(
            u128::from(*whole) * 1000,
            u128::from(milli.0),
            "parse_whole({text:?}) * 1000 != parse({text:?})"
        );
    }
    if let Ok(milli) = milli {
        let canonical = milli.to_string();
        assert_eq!(
            Milli::parse(&canonical),
            Ok(milli),
            "parse({text:?}) displays as {canonical:?}, which parses differently"
        );
    }
}

/// A pod (built from fuzzed annotations and resource quantities by the
/// `pod_annotations` target) projected for the cache, and its wanted GPU models.
pub fn pod_annotations(pod: &Pod) {
    let _ = CachedPod::from_pod(pod, projection());
    gpu_request(pod);
    let _ = WantedModels::of_pod(
        pod,
        "gpu-admission.io/gpu-type",
        "nvidia.com/gpu.product",
        None,
        &[],
    );
}

/// The pod-cost path: a pod (JSON, through the webhooks' bounded decoder, so native
/// sidecars' `restartPolicy` is kept) read as a GPU request, then charged and placed.
/// Properties, each what a user would notice were it broken:
/// - the request's vcuda-core units and MIG slices per profile are Kubernetes' rule
///   (KEP-753), recomputed here from each container read alone: max(app containers +
///   sidecars, each regular init container + the sidecars declared before it);
/// - the node holds exactly what the quota charges: app containers plus
///   `held_for_init` come to `core_units`, and a fit on a node charges that much;
/// - on a whole-GPU label the charge is `core_units` GPUs;
/// - the pending label is the dearest of the labels offered for its model.
pub fn pod_cost(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(pod) = gpu_admission::wire::pod::decode("Pod", text) else {
        return;
    };
    gpu_request(&pod);
    let Ok(Some(request)) = GpuRequest::from_pod(&pod, names()) else {
        return;
    };
    let (units, slices) = kubernetes_rule(&pod);
    assert_eq!(request.core_units(), units, "{request:?}");
    let mig: Vec<(&str, u64)> = request
        .mig
        .iter()
        .map(|d| (&*d.profile, u64::from(d.count)))
        .collect();
    let expected: Vec<(&str, u64)> = slices
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(profile, count)| (profile.as_str(), (*count).min(1024)))
        .collect();
    assert_eq!(mig, expected, "{request:?}");
    charges(&request);
    placement(&request);
}

/// A container's vcuda-core units and MIG slices, read alone as an app container.
fn alone(
    pod: &Pod,
    container: &k8s_openapi::api::core::v1::Container,
) -> (u64, Vec<(String, u64)>) {
    let mut single = pod.clone();
    if let Some(spec) = single.spec.as_mut() {
        let mut container = container.clone();
        container.restart_policy = None;
        spec.containers = vec![container];
        spec.init_containers = None;
    }
    match GpuRequest::from_pod(&single, names()) {
        Ok(Some(request)) => {
            let slices = request.mig.iter();
            let slices = slices.map(|d| (d.profile.to_string(), u64::from(d.count)));
            (request.core_units(), slices.collect())
        }
        _ => (0, Vec::new()),
    }
}

/// KEP-753's pod request from [`alone`]'s figures: (core units, slices per profile).
fn kubernetes_rule(pod: &Pod) -> (u64, std::collections::BTreeMap<String, u64>) {
    use std::collections::BTreeMap;
    let Some(spec) = pod.spec.as_ref() else {
        return (0, BTreeMap::new());
    };
    let (mut lifelong, mut sidecars, mut init) = (0u64, 0u64, 0u64);
    let mut slices_lifelong: BTreeMap<String, u64> = BTreeMap::new();
    let mut slices_sidecars: BTreeMap<String, u64> = BTreeMap::new();
    let mut slices_init: BTreeMap<String, u64> = BTreeMap::new();
    for container in &spec.containers {
        let (units, slices) = alone(pod, container);
        lifelong += units;
        for (profile, count) in slices {
            *slices_lifelong.entry(profile).or_default() += count;
        }
    }
    for container in spec.init_containers.iter().flatten() {
        let (units, slices) = alone(pod, container);
        if container.restart_policy.as_deref() == Some("Always") {
            lifelong += units;
            sidecars += units;
            for (profile, count) in slices {
                *slices_lifelong.entry(profile.clone()).or_default() += count;
                *slices_sidecars.entry(profile).or_default() += count;
            }
        } else {
            init = init.max(units + sidecars);
            for (profile, count) in slices {
                let beside = slices_sidecars.get(&profile).copied().unwrap_or(0);
                let entry = slices_init.entry(profile).or_default();
                *entry = (*entry).max(count + beside);
            }
        }
    }
    for (profile, count) in slices_init {
        let entry = slices_lifelong.entry(profile).or_default();
        *entry = (*entry).max(count);
    }
    (lifelong.max(init), slices_lifelong)
}

/// What the request is charged on a whole-GPU label, and which label a pending pod of
/// the model is charged by.
fn charges(request: &GpuRequest) {
    use gpu_admission::quota::NamespaceLimits;
    use gpu_admission::quota::{charge_on, pending_label};
    let mig = &names().mig;
    let model = "A100-SXM4-40GB";
    if request.mig.is_empty() {
        let whole = charge_on(request, model, mig);
        let milli = whole.get(model).map_or(0, |m| m.0);
        assert_eq!(
            milli,
            request.core_units().saturating_mul(10),
            "{request:?}"
        );
    }
    let labels = [
        "A100-SXM4-40GB-MIG-1g.5gb",
        "A100-SXM4-40GB-MIG-3g.20gb",
        "Tesla-T4",
        model,
    ];
    let limits = NamespaceLimits::default();
    let cost = |l: &str| charge_on(request, l, mig).get(model).map_or(0, |m| m.0);
    for offered in [&labels[..2], &labels[..3], &labels[..]] {
        let label = pending_label(request, model, offered.iter().copied(), &limits, mig);
        for other in offered.iter().filter(|l| l.starts_with(model)) {
            assert!(cost(label) >= cost(other), "{label} < {other}: {request:?}");
        }
    }
}

/// A fit on an empty 8-GPU node charges the node exactly what the quota charges.
fn placement(request: &GpuRequest) {
    use gpu_admission::placement::fit::fit;
    use gpu_admission::placement::node::{GpuUse, NodeGpus};
    let node = NodeGpus {
        name: "n".into(),
        model: None,
        pool: None,
        memory_per_gpu: 64,
        used: vec![GpuUse::default(); 8],
        mig_slices: Vec::new(),
        created: 0,
        closed: None,
    };
    if !request.has_gpu_demand() {
        return;
    }
    if let Ok(assignment) = fit(&node, request) {
        let charged: u64 = assignment
            .charges(node.memory_per_gpu)
            .map(|(_, each)| u64::from(each.core))
            .sum();
        assert_eq!(charged, request.core_units(), "{request:?}");
    }
}

/// The configuration file's text.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Config::parse(text);
    }
}

/// How long one `cel_selector` input may take at most in the fuzz build: compiling it
/// and judging a claim of 32 requests carrying it against the published devices
/// (generous: that build has AddressSanitizer and debug assertions on; on stable the
/// replay asserts no time).
#[cfg(fuzzing)]
const CEL_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// A cluster publishing an A100 (whole and a MIG slice) and a T4, the devices a
/// selector is evaluated against, and the models its quotas know.
fn cel_catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let dra = Dra::default();
        let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-1"},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "node-1"}, "nodeName": "node-1",
                "devices": [
                    {"name": "gpu-0", "attributes": {"productName": {"string": "NVIDIA A100-SXM4-80GB"},
                        "type": {"string": "gpu"}, "index": {"int": 0}, "cudaDriverVersion": {"version": "12.4.0"}},
                        "capacity": {"memory": {"value": "80Gi"}}},
                    {"name": "gpu-1-mig", "attributes": {"productName": {"string": "NVIDIA A100-SXM4-80GB"},
                        "type": {"string": "mig"}, "profile": {"string": "1g.10gb"}},
                        "capacity": {"memory": {"value": "10Gi"}}},
                    {"name": "gpu-2", "attributes": {"productName": {"string": "Tesla T4"},
                        "type": {"string": "gpu"}, "other.example.com/flag": {"bool": true}},
                        "capacity": {"memory": {"value": "16Gi"}}}]}
        }))
        .expect("the fuzz cluster's slice");
        let mut index = DeviceIndex::default();
        index.apply("node-1", gpu_devices(&slice, &dra));
        let known = ["A100-SXM4-80GB", "A100-SXM4-80GB/1g.10gb", "Tesla-T4", "H100"];
        Catalog::new(&dra, &DeviceClasses::new(), &index, known.map(String::from))
    })
}

/// A CEL selector (UTF-8): compiled within its bounds or refused, never a panic; a
/// claim of 32 requests carrying it judged (`ClaimAsks::of`: every evaluation charged to
/// the claim's budget, which is then never overdrawn), within `CEL_BOUND`.
pub fn cel_selector(data: &[u8]) {
    let Ok(expression) = std::str::from_utf8(data) else {
        return;
    };
    #[cfg(fuzzing)]
    let started = std::time::Instant::now();
    if let Ok(selector) = Selector::compile(expression) {
        let mut budget = CostBudget::default();
        let bare = CelDevice::new("gpu.nvidia.com", &Default::default(), &Default::default());
        let _ = selector.matches(&bare, &mut budget);
        assert!(
            budget.left() < CLAIM_BUDGET,
            "an evaluation costs something"
        );
    }
    let requests: Vec<serde_json::Value> = (0..32)
        .map(|i| {
            serde_json::json!({"name": format!("r{i}"), "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": expression}}]}})
        })
        .collect();
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "spec": {"devices": {"requests": requests}}
    }))
    .expect("a claim of 32 requests");
    let _ = ClaimAsks::of(&claim, cel_catalog());
    #[cfg(fuzzing)]
    {
        let elapsed = started.elapsed();
        assert!(elapsed < CEL_BOUND, "{expression:?} took {elapsed:?}");
    }
}
