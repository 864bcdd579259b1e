//! What each fuzz target does with its input, shared by the fuzz targets
//! (`fuzz/fuzz_targets/*.rs`) and the stable regression test
//! (`tests/fuzz_regressions.rs`, which includes this file by path). Only the crate's
//! public API and its own dependencies (`k8s-openapi`, `serde_json`) are used here, so
//! the root crate's tests can compile it without any fuzzing dependency.
//!
//! Every function must not panic on any input; a panic (or a failed property
//! assertion) is a finding.

use std::sync::OnceLock;

use gpu_admission::admission::review::Review;
use gpu_admission::cache::{CachedPod, Projection};
use gpu_admission::config::Config;
use gpu_admission::dra::cel::{Budget, CLAIM_BUDGET, CelDevice, Selector};
use gpu_admission::dra::classes::DeviceClasses;
use gpu_admission::dra::slices::{DeviceIndex, ResourceSlice, gpu_devices};
use gpu_admission::dra::{Catalog, ClaimAsks, Dra, ResourceClaim};
use gpu_admission::extender::ExtenderArgs;
use gpu_admission::extender::volcano::PredicateArgs;
use gpu_admission::placement::models::WantedModels;
use gpu_admission::placement::quantity::Milli;
use gpu_admission::placement::{GpuRequest, ResourceNames};
use k8s_openapi::api::core::v1::Pod;

/// The targets, by name (the directory names under `fuzz/seeds` and `fuzz/regressions`).
pub const TARGETS: [&str; 7] = [
    "extender_args",
    "volcano_predicate",
    "admission_review",
    "quantity",
    "pod_annotations",
    "config",
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
        let mut budget = Budget::default();
        let bare = CelDevice::new("gpu.nvidia.com", &Default::default(), &Default::default());
        let _ = selector.matches(&bare, &mut budget);
        assert!(budget.0 < CLAIM_BUDGET, "an evaluation costs something");
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
