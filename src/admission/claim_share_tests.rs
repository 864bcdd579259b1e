//! Claims that share a GPU by its capacity, and claims of alternatives, through both
//! claim webhooks in turn, against one namespace's quota (docs/devices.md): what is
//! admitted, what is refused, and what the pinned claim can then be allocated.
#![allow(clippy::unwrap_used)]

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use super::{mutate_claim, validate_claim};
use crate::admission::verdict::{Reason, Verdict};
use crate::backend::Backend;
use crate::cache::{CacheWriter, Projection};
use crate::config::Config;
use crate::dra::cel::Selector;
use crate::dra::slices::{ResourceSlice, gpu_devices};
use crate::dra::{Dra, ResourceClaim};
use crate::placement::quantity::Milli;
use crate::quota::{GPUQuota, GpuQuotaSpec};
use crate::wire::review::UserInfo;

const A100: &str = "NVIDIA A100-SXM4-80GB";
const H100: &str = "NVIDIA H100 80GB HBM3";

/// A GPU device of `product`; with `policy`, shareable, its 80Gi of memory under it.
fn device(name: &str, product: &str, policy: Option<Value>) -> Value {
    let mut device = json!({"name": name, "attributes": {"productName": {"string": product}},
        "capacity": {"memory": {"value": "80Gi"}}});
    if let Some(policy) = policy {
        device["allowMultipleAllocations"] = json!(true);
        device["capacity"]["memory"]["requestPolicy"] = policy;
    }
    device
}

/// NVIDIA's driver's `memory` mode: the whole memory by default, on a 1Mi step.
fn nvidia_memory() -> Value {
    json!({"default": "80Gi", "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}})
}

/// Offline, namespace team with a quota of `hard` and the devices `devices` on node n1.
fn quota_of(hard: &[(&str, &str)], devices: Vec<Value>) -> Backend {
    let config = Config::default();
    let cache = CacheWriter::in_memory(Projection::from_config(&config));
    let mut quota = GPUQuota::new(
        "gpus",
        GpuQuotaSpec {
            hard: (hard.iter())
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
            ..Default::default()
        },
    );
    quota.metadata.namespace = Some("team".into());
    let slice: ResourceSlice = serde_json::from_value(json!({"metadata": {"name": "n1-gpus"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1"},
            "devices": devices}}))
    .unwrap();
    let devices = gpu_devices(&slice, &Dra::default());
    cache.write(|state| {
        state.apply_quota(quota);
        state.apply_slice("n1-gpus", devices);
    });
    Backend::offline(cache)
}

fn claim(name: &str, requests: Value) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": {"requests": requests}}}))
    .unwrap()
}

/// A claim of one shared A100 asking `memory` of it (none: nothing).
fn memory_claim(name: &str, memory: Option<&str>) -> ResourceClaim {
    let mut exact = json!({"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel":
        {"expression": format!(r#"device.attributes["gpu.nvidia.com"].productName == "{A100}""#)}}]});
    if let Some(memory) = memory {
        exact["capacity"] = json!({"requests": {"memory": memory}});
    }
    claim(name, json!([{"name": "gpu", "exactly": exact}]))
}

/// The claim through the mutating webhook then the validating one, as the API server
/// calls them; the claim as stored, and the verdict.
async fn create(backend: &Backend, claim: ResourceClaim) -> (ResourceClaim, Verdict, Vec<String>) {
    let config = Config::default();
    let user = UserInfo::default();
    let pinned = mutate_claim(
        backend.cache(),
        &config,
        ("team", &user),
        Box::new(claim.clone()),
    );
    let pinned = pinned.await.unwrap();
    let mut stored = serde_json::to_value(&claim).unwrap();
    json_patch::patch(&mut stored, &pinned.patch).unwrap();
    let stored: ResourceClaim = serde_json::from_value(stored).unwrap();
    let verdict = validate_claim(backend, &config, ("team", &user), &stored, false).await;
    (stored, verdict.unwrap(), pinned.warnings)
}

fn used(backend: &Backend, key: &str) -> Milli {
    let usage = backend.cache().read(|s| s.usage("team"));
    usage.get(key).copied().unwrap_or_default()
}

fn refused(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Deny(Reason::Quota(denial)) => denial.to_string(),
        other => panic!("refused expected: {other:?}"),
    }
}

#[tokio::test]
async fn four_quarters_of_a_shared_gpu_fit_a_quota_of_one_and_a_fifth_does_not() {
    let devices = (0..2)
        .map(|i| device(&format!("gpu-{i}"), A100, Some(nvidia_memory())))
        .collect();
    let backend = quota_of(&[("A100-SXM4-80GB", "1")], devices);
    for i in 0..4 {
        let (stored, verdict, _) =
            create(&backend, memory_claim(&format!("q{i}"), Some("20Gi"))).await;
        assert_eq!(verdict, Verdict::Allow, "quarter {i}");
        let pin = &stored.requests()[0].exactly.as_ref().unwrap().selectors;
        let text = serde_json::to_string(pin).unwrap();
        assert!(text.contains("device.allowMultipleAllocations"), "{text}");
        assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(250 * (i + 1)));
    }
    let (_, verdict, _) = create(&backend, memory_claim("q4", Some("20Gi"))).await;
    let message = refused(&verdict);
    assert!(
        message.contains("for A100-SXM4-80GB: requested 0.25, used 1 of 1"),
        "{message}"
    );
}

/// Two shareable A100s of one model whose policies differ (CEL cannot tell them apart,
/// and the allocator may take either): a 20Gi claim is charged what the coarser takes,
/// 30Gi of 80Gi, not the 20Gi the finer one would; an ask only the finer can take is
/// charged by it. A T4 published beside them changes nothing.
#[tokio::test]
async fn a_share_is_charged_by_the_dearest_policy_its_model_publishes() {
    let coarse = json!({"validValues": ["30Gi", "40Gi"], "default": "40Gi"});
    let devices = vec![
        device("fine", A100, Some(nvidia_memory())),
        device("coarse", A100, Some(coarse)),
        device("t4", "Tesla T4", Some(nvidia_memory())),
    ];
    let backend = quota_of(&[("A100-SXM4-80GB", "1")], devices);
    let (_, verdict, _) = create(&backend, memory_claim("q", Some("20Gi"))).await;
    assert_eq!(verdict, Verdict::Allow);
    assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(375));
    // 50Gi is past every valid value of the coarse device: only the fine one takes it.
    let (_, verdict, _) = create(&backend, memory_claim("r", Some("50Gi"))).await;
    assert_eq!(verdict, Verdict::Allow);
    assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(1000));
    let (_, verdict, _) = create(&backend, memory_claim("s", Some("1Mi"))).await;
    let message = refused(&verdict);
    assert!(message.contains("used 1 of 1"), "{message}");
}

/// A tenant's hostile asks: nothing, a negative amount, a capacity the device does not
/// have, or the shared pin written by hand on a request that asks nothing. Each costs a
/// whole GPU (the last, on NVIDIA's `unlimited` mode, consumes nothing: nothing bounds
/// how many such claims share a GPU).
#[tokio::test]
async fn hostile_capacity_asks_are_charged_a_whole_gpu() {
    let unlimited = json!({"default": "0", "validRange": {"min": "0", "step": "1Mi"}});
    for ask in ["0", "-1Gi", "cores"] {
        let backend = quota_of(
            &[("A100-SXM4-80GB", "4")],
            vec![device("gpu-0", A100, Some(unlimited.clone()))],
        );
        let requests = match ask {
            "cores" => json!({"cores": "1"}),
            amount => json!({"memory": amount}),
        };
        let claim = claim(
            "c",
            json!([{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "capacity": {"requests": requests},
            "selectors": [{"cel": {"expression":
                format!(r#"device.attributes["gpu.nvidia.com"].productName == "{A100}""#)}}]}}]),
        );
        let (_, verdict, _) = create(&backend, claim).await;
        assert_eq!(verdict, Verdict::Allow, "{ask}");
        assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(1000), "{ask}");
    }
    let backend = quota_of(
        &[("A100-SXM4-80GB", "4")],
        vec![device("gpu-0", A100, Some(unlimited))],
    );
    let catalog = backend
        .cache()
        .read(|s| crate::dra::Catalog::from_source(s.catalog_source("team")));
    let shared = crate::dra::Pin {
        shared: true,
        ..crate::dra::Pin::whole("A100-SXM4-80GB")
    };
    let by_hand = claim(
        "by-hand",
        json!([{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": catalog.pin(&shared)}}]}}]),
    );
    let (_, verdict, _) = create(&backend, by_hand).await;
    assert_eq!(verdict, Verdict::Allow);
    assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(1000));
}

/// A share request created without the mutating webhook is refused, naming the shared
/// pin it needs.
#[tokio::test]
async fn an_unpinned_share_request_is_refused_naming_its_shared_pin() {
    let devices = vec![device("gpu-0", A100, Some(nvidia_memory()))];
    let backend = quota_of(&[("A100-SXM4-80GB", "1")], devices);
    let config = Config::default();
    let user = UserInfo::default();
    let claim = memory_claim("unpinned", Some("20Gi"));
    let verdict = validate_claim(&backend, &config, ("team", &user), &claim, false).await;
    let Verdict::Deny(Reason::Claim(denial)) = verdict.unwrap() else {
        panic!("an unpinned request is refused");
    };
    let message = denial.to_string();
    assert!(
        message.contains("whole GPUs that can be shared (allowMultipleAllocations)")
            && message.contains("&& device.allowMultipleAllocations"),
        "{message}"
    );
}

#[tokio::test]
async fn a_claim_asking_no_capacity_costs_a_whole_gpu_and_a_rounded_ask_its_rounding() {
    // Any amount by default, in 10Gi steps from 10Gi.
    let tens = json!({"validRange": {"min": "10Gi", "step": "10Gi"}});
    let backend = quota_of(
        &[("A100-SXM4-80GB", "2")],
        vec![device("gpu-0", A100, Some(tens))],
    );
    let (_, verdict, _) = create(&backend, memory_claim("all", None)).await;
    assert_eq!(verdict, Verdict::Allow);
    assert_eq!(
        used(&backend, "A100-SXM4-80GB"),
        Milli(1000),
        "no ask: the whole GPU"
    );
    let (_, verdict, _) = create(&backend, memory_claim("tiny", Some("1Gi"))).await;
    assert_eq!(verdict, Verdict::Allow);
    assert_eq!(
        used(&backend, "A100-SXM4-80GB"),
        Milli(1125),
        "1Gi is consumed as 10Gi: 10/80 of the GPU"
    );
    // NVIDIA's `unlimited` mode: a claim asking nothing consumes nothing, and so is
    // bounded by nothing: a whole GPU.
    let unlimited = json!({"default": "0", "validRange": {"min": "0", "step": "1Mi"}});
    let free = quota_of(
        &[("A100-SXM4-80GB", "1")],
        vec![device("gpu-0", A100, Some(unlimited))],
    );
    let (_, verdict, _) = create(&free, memory_claim("free-ride", None)).await;
    assert_eq!(verdict, Verdict::Allow);
    assert_eq!(used(&free, "A100-SXM4-80GB"), Milli(1000));
}

/// Whether the claim's request `alternative` (its index) can be allocated `device`: its
/// own selectors evaluate to true on it (the class here has none).
fn can_get(claim: &ResourceClaim, alternative: usize, device: &Value) -> bool {
    let subs = claim.requests()[0].first_available.as_ref().unwrap();
    let slice: ResourceSlice = serde_json::from_value(json!({"metadata": {"name": "x"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "x"}, "devices": [device]}}))
    .unwrap();
    let devices = gpu_devices(&slice, &Dra::default());
    let cel = &devices[0].1.cel;
    let expressions = subs[alternative].request.expressions();
    expressions
        .iter()
        .all(|e| Selector::compile(e).unwrap().evaluate(cel) == Some(true))
}

#[tokio::test]
async fn alternatives_are_charged_the_one_the_quota_keeps_and_can_only_get_it() {
    let devices = vec![device("a100", A100, None), device("h100", H100, None)];
    let backend = quota_of(
        &[("A100-SXM4-80GB", "1"), ("H100-80GB-HBM3", "1")],
        devices.clone(),
    );
    let product = |p: &str| json!([{"cel": {"expression": format!(r#"device.attributes["gpu.nvidia.com"].productName == "{p}""#)}}]);
    let either = |name: &str| {
        claim(
            name,
            json!([{"name": "gpu", "firstAvailable": [
            {"name": "a100", "deviceClassName": "gpu.nvidia.com", "selectors": product(A100)},
            {"name": "h100", "deviceClassName": "gpu.nvidia.com", "selectors": product(H100)}]}]),
        )
    };
    // Room for both: the first is kept, the other made unmatchable, one A100 charged.
    let (first, verdict, warnings) = create(&backend, either("first")).await;
    assert_eq!(verdict, Verdict::Allow);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(can_get(&first, 0, &devices[0]) && !can_get(&first, 1, &devices[1]));
    assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(1000));
    assert_eq!(used(&backend, "H100-80GB-HBM3"), Milli(0));
    // A100 full: admitted on H100, and it can only be allocated an H100.
    let (second, verdict, warnings) = create(&backend, either("second")).await;
    assert_eq!(verdict, Verdict::Allow);
    assert!(
        !can_get(&second, 0, &devices[0]),
        "the A100 alternative is unmatchable"
    );
    assert!(can_get(&second, 1, &devices[1]));
    assert_eq!(used(&backend, "H100-80GB-HBM3"), Milli(1000));
    assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(1000));
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].starts_with(
            "ResourceClaim request gpu: the quota chose alternative gpu/h100 (H100-80GB-HBM3); alternative gpu/a100 (A100-SXM4-80GB) was made unmatchable: GPU quota exceeded"
        ),
        "{warnings:?}"
    );
    // Both full: refused, charged the largest alternative as before.
    let (_, verdict, _) = create(&backend, either("third")).await;
    let message = refused(&verdict);
    assert!(message.contains("GPU quota exceeded"), "{message}");
}

/// A tenant who writes the pins by hand, both alternatives matchable, is charged both.
#[tokio::test]
async fn alternatives_pinned_by_hand_are_charged_the_largest_of_each() {
    let backend = quota_of(
        &[("A100-SXM4-80GB", "1"), ("H100-80GB-HBM3", "1")],
        vec![device("a100", A100, None), device("h100", H100, None)],
    );
    let catalog = backend
        .cache()
        .read(|s| crate::dra::Catalog::from_source(s.catalog_source("team")));
    let pin =
        |label: &str| json!([{"cel": {"expression": catalog.pin(&crate::dra::Pin::whole(label))}}]);
    let both = claim(
        "both",
        json!([{"name": "gpu", "firstAvailable": [
        {"name": "a100", "deviceClassName": "gpu.nvidia.com", "selectors": pin("A100-SXM4-80GB")},
        {"name": "h100", "deviceClassName": "gpu.nvidia.com", "selectors": pin("H100-80GB-HBM3")}]}]),
    );
    let config = Config::default();
    let user = UserInfo::default();
    let verdict = validate_claim(&backend, &config, ("team", &user), &both, false).await;
    assert_eq!(verdict.unwrap(), Verdict::Allow);
    assert_eq!(used(&backend, "A100-SXM4-80GB"), Milli(1000));
    assert_eq!(used(&backend, "H100-80GB-HBM3"), Milli(1000));
}
