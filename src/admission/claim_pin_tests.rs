//! The pin's rule (docs/devices.md, "The pin"): whatever the evaluation against sampled
//! devices concluded, every device a request can be allocated once the mutating webhook
//! pinned it — its DeviceClass's selectors, the tenant's and the pin all true — costs no
//! more than the validating webhook charged for it. Examples of selectors that reach
//! past the sample, then the rule as a property over random selectors and
//! ResourceSlices.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::dra::cel::Selector as Cel;
use crate::dra::classes::{ClassInfo, DeviceClasses};
use crate::dra::slices::{DeviceIndex, GpuDevice, MAX_SAMPLES, ResourceSlice, gpu_devices};
use crate::dra::{self, ALL_DEVICES, Dra};
use crate::placement::mig::MigResources;
use crate::placement::quantity::Milli;
use crate::quota::{ModelAmounts, charge_on};

const A100: &str = "NVIDIA A100-SXM4-80GB";
const H100: &str = "NVIDIA H100 80GB HBM3";
const T4: &str = "Tesla T4";
const ATTRIBUTE: &str = r#"device.attributes["gpu.nvidia.com"]"#;

/// One published device.
#[derive(Debug, Clone)]
struct Published {
    node: String,
    name: String,
    product: &'static str,
    profile: Option<&'static str>,
    driver_version: &'static str,
    index: i64,
    /// Shareable by capacity, under this memory `requestPolicy` ([`POLICIES`]).
    shared: Option<usize>,
}

/// Memory policies of shareable devices: NVIDIA's driver's `memory` and `unlimited`
/// modes, 10Gi steps from 10Gi, and three valid values.
const POLICIES: [&str; 4] = [
    r#"{"default": "80Gi", "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}}"#,
    r#"{"default": "0", "validRange": {"min": "0", "max": "80Gi", "step": "1Mi"}}"#,
    r#"{"validRange": {"min": "10Gi", "step": "10Gi"}}"#,
    r#"{"default": "16Gi", "validValues": ["8Gi", "16Gi", "40Gi"]}"#,
];

impl Published {
    fn uuid(&self) -> String {
        format!("GPU-{}-{}", self.node, self.name)
    }

    fn json(&self) -> serde_json::Value {
        let kind = if self.profile.is_some() { "mig" } else { "gpu" };
        let mut attributes = json!({
            "productName": {"string": self.product},
            "type": {"string": kind},
            "uuid": {"string": self.uuid()},
            "driverVersion": {"version": self.driver_version},
            "index": {"int": self.index},
        });
        if let Some(profile) = self.profile {
            attributes["profile"] = json!({"string": profile});
        }
        let mut device = json!({"name": self.name, "attributes": attributes,
            "capacity": {"memory": {"value": "80Gi"}}});
        if let Some(policy) = self.shared {
            device["allowMultipleAllocations"] = json!(true);
            let policy: serde_json::Value = serde_json::from_str(POLICIES[policy]).unwrap();
            device["capacity"]["memory"]["requestPolicy"] = policy;
        }
        device
    }
}

/// The ResourceSlices of a set of devices (one per node), as the cache indexes them.
struct Fleet {
    devices: Vec<GpuDevice>,
    index: DeviceIndex,
}

impl Fleet {
    fn of(published: &[Published]) -> Self {
        let dra = Dra::default();
        let mut nodes: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
        for device in published {
            nodes.entry(&device.node).or_default().push(device.json());
        }
        let mut index = DeviceIndex::default();
        let mut devices = Vec::new();
        for (node, listed) in nodes {
            let slice: ResourceSlice = serde_json::from_value(json!({
                "metadata": {"name": format!("{node}-gpus")},
                "spec": {"driver": "gpu.nvidia.com", "pool": {"name": node}, "nodeName": node,
                    "devices": listed}
            }))
            .unwrap();
            let gpus = gpu_devices(&slice, &dra);
            devices.extend(gpus.iter().map(|(_, d)| d.clone()));
            index.apply(&format!("{node}-gpus"), gpus);
        }
        Fleet { devices, index }
    }

    fn catalog(&self) -> Catalog {
        let known = ["A100-SXM4-80GB".to_string(), "Tesla-T4".to_string()];
        Catalog::new(&Dra::default(), &classes(), &self.index, known)
    }
}

/// NVIDIA's two classes, and one of the driver's devices of any type (found as a GPU
/// class: it is not in the config).
fn classes() -> DeviceClasses {
    let class = |expression: &str| ClassInfo {
        selectors: vec![expression.to_string()],
        extended_resource: None,
    };
    let typed = |kind: &str| {
        class(&format!(
            r#"device.driver == "gpu.nvidia.com" && {ATTRIBUTE}.type == "{kind}""#
        ))
    };
    [
        ("gpu.nvidia.com".to_string(), typed("gpu")),
        ("mig.nvidia.com".to_string(), typed("mig")),
        (
            "any.gpu.example.com".to_string(),
            class(r#"device.driver == "gpu.nvidia.com""#),
        ),
    ]
    .into()
}

/// The namespace the claims are judged for: a quota of A100s and T4s, `default` its
/// default model.
pub(super) fn limits(default: Option<&str>) -> NamespaceLimits {
    NamespaceLimits {
        has_quota: true,
        default_type: default.map(str::to_string),
        models: vec!["A100-SXM4-80GB".into(), "Tesla-T4".into()],
        ..Default::default()
    }
}

/// The claim as the mutating webhook leaves it, and what the validating webhook then
/// charges it (`None`: refused).
fn admitted(
    claim: &ResourceClaim,
    fleet: &Fleet,
    default: Option<&str>,
) -> (ResourceClaim, Option<ModelAmounts>) {
    admitted_with(claim, fleet, default, &[])
}

/// As [`admitted`], in a namespace whose quota has no room left for the models `full`.
fn admitted_with(
    claim: &ResourceClaim,
    fleet: &Fleet,
    default: Option<&str>,
    full: &[&str],
) -> (ResourceClaim, Option<ModelAmounts>) {
    let views = views(full);
    let mig = MigResources::default();
    let room = Room {
        views: &views,
        mig: &mig,
    };
    let patch = pin_patch(claim, &fleet.catalog(), &limits(default), Some(&room)).patch;
    let mut pinned = serde_json::to_value(claim).unwrap();
    json_patch::patch(&mut pinned, &patch).unwrap();
    let pinned: ResourceClaim = serde_json::from_value(pinned).unwrap();
    let seen = Seen {
        catalog: fleet.catalog(),
        limits: limits(default),
    };
    let Ok(asks) = ClaimAsks::of(&pinned, &seen.catalog) else {
        return (pinned, None);
    };
    let charge = match charged(&Config::default(), "team-a", &seen, &asks) {
        Ok(Some((wanted, costs))) => Some(costs.on(&wanted.models[0])),
        Ok(None) => Some(ModelAmounts::new()),
        Err(_) => None,
    };
    (pinned, charge)
}

/// The namespace's quota: room for anything of the models it lists, none for `full`.
fn views(full: &[&str]) -> Vec<crate::quota::QuotaView> {
    let models = [
        "A100-SXM4-80GB",
        "H100-80GB-HBM3",
        "Tesla-T4",
        "A100-SXM4-40GB",
    ];
    let hard: ModelAmounts = models
        .iter()
        .map(|m| (m.to_string(), Milli(1_000_000)))
        .collect();
    let used = full
        .iter()
        .map(|m| (m.to_string(), Milli(1_000_000)))
        .collect();
    vec![crate::quota::QuotaView {
        namespace: "team-a".into(),
        name: "q".into(),
        hard,
        used,
        on_exceed: Default::default(),
        cohort: None,
    }]
}

/// What one device costs `request` once allocated, per quota key: a whole one's cost,
/// times the share of it the allocator consumes for the request on a shared device;
/// `None` when the allocator cannot give it to the request (a capacity ask it cannot
/// take).
fn cost(device: &GpuDevice, request: &ExactRequest) -> Option<ModelAmounts> {
    let one = dra::devices(device.profile.as_deref(), 1);
    let whole = charge_on(&one, &device.label, &MigResources::default());
    let Some(shared) = &device.shared else {
        return Some(whole);
    };
    let asks = request.capacity_asks().unwrap_or_default();
    let share = shared.share_for(&asks)?;
    let scaled = whole.into_iter().map(|(key, amount)| {
        let part = (u128::from(amount.0) * u128::from(share.0)).div_ceil(1000);
        (key, Milli(part as u64))
    });
    Some(scaled.collect())
}

/// Every GPU request and alternative of `claim`, with how many devices it can get.
fn requests(claim: &ResourceClaim) -> Vec<(String, &ExactRequest)> {
    let mut all = Vec::new();
    for request in claim.requests() {
        all.extend(request.exactly.iter().map(|e| (request.name.clone(), e)));
        for sub in request.first_available.iter().flatten() {
            all.push((format!("{}/{}", request.name, sub.name), &sub.request));
        }
    }
    all
}

fn count(request: &ExactRequest) -> u64 {
    match request.allocation_mode.as_deref() {
        Some("All") => u64::from(ALL_DEVICES),
        _ => request.count.unwrap_or(1).clamp(0, i64::from(ALL_DEVICES)) as u64,
    }
}

/// Whether an allocator may give `device` to `request`: its class's selectors and its
/// own all evaluate to true (a selector that fails on a device does not take it).
fn allocatable(request: &ExactRequest, device: &GpuDevice) -> bool {
    let classes = classes();
    let Some(class) = classes.get(&request.device_class_name) else {
        return false;
    };
    let mut expressions = class.selectors.iter().map(String::as_str);
    let mut all = expressions.by_ref().chain(request.expressions());
    all.all(|e| Cel::compile(e).is_ok_and(|s| s.evaluate(&device.cel) == Some(true)))
}

/// The devices of `fleet` some request of the pinned claim may be given that cost more,
/// times its count, than the claim was charged, with the key they overrun.
fn overruns(pinned: &ResourceClaim, charge: &ModelAmounts, fleet: &Fleet) -> Vec<String> {
    let mut found = Vec::new();
    for (name, request) in requests(pinned) {
        let n = count(request);
        for device in fleet.devices.iter().filter(|d| allocatable(request, d)) {
            let Some(cost) = cost(device, request) else {
                continue;
            };
            for (key, amount) in cost {
                let charged = charge.get(&key).map_or(0, |m| m.0);
                if n * amount.0 > charged {
                    let (label, profile) = (&device.label, &device.profile);
                    found.push(format!(
                        "{name}: {n} × {key} {} > {charged} ({label} {profile:?})",
                        amount.0
                    ));
                }
            }
        }
    }
    found
}

/// `n` devices of one model and profile on `node`, named `<prefix>-00`...
fn devices(
    node: &str,
    prefix: &str,
    (product, profile): (&'static str, Option<&'static str>),
    n: usize,
    driver_version: &'static str,
) -> Vec<Published> {
    (0..n)
        .map(|i| Published {
            node: node.into(),
            name: format!("{prefix}-{i:02}"),
            product,
            profile,
            driver_version,
            index: i as i64,
            shared: None,
        })
        .collect()
}

/// A100 whole GPUs and 1g.10gb slices, 7g.80gb slices on another node (15: seven of
/// them past the sample, and only those on a newer driver), T4s.
fn fleet() -> (Fleet, Vec<Published>) {
    let mut published = devices("a100-a", "gpu", (A100, None), 10, "550.54.15");
    published.extend(devices(
        "a100-a",
        "mig",
        (A100, Some("1g.10gb")),
        10,
        "550.54.15",
    ));
    let mut big = devices("a100-b", "mig", (A100, Some("7g.80gb")), 15, "550.54.15");
    for device in big.iter_mut().skip(MAX_SAMPLES) {
        device.driver_version = "570.86.10";
    }
    published.extend(big);
    published.extend(devices("t4", "gpu", (T4, None), 9, "550.54.15"));
    (Fleet::of(&published), published)
}

fn claim(requests: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "team-a"},
        "spec": {"devices": {"requests": requests}}
    }))
    .unwrap()
}

fn mig_request(name: &str, count: u32, expression: &str) -> serde_json::Value {
    json!({"name": name, "deviceClassName": "mig.nvidia.com", "count": count,
        "selectors": [{"cel": {"expression": expression}}]})
}

/// The 7g.80gb devices the sample does not hold.
fn unsampled_big(published: &[Published]) -> Vec<String> {
    let big = published.iter().filter(|d| d.profile == Some("7g.80gb"));
    big.skip(MAX_SAMPLES)
        .map(|d| format!("{:?}", d.uuid()))
        .collect()
}

/// The escape: seven devices charged as seven 1g.10gb slices (under one A100) whose
/// selector also reaches seven whole-GPU 7g.80gb slices the sample does not hold, by
/// UUID or by driver version. Pinned to 1g.10gb, it can be allocated only those.
#[test]
fn a_selector_reaching_past_the_sample_is_pinned_to_what_it_is_charged_for() {
    let (fleet, published) = fleet();
    let uuids = unsampled_big(&published).join(", ");
    assert_eq!(uuids.matches("GPU-").count(), 7);
    let small = format!(r#"{ATTRIBUTE}.profile == "1g.10gb""#);
    for reach in [
        format!("{ATTRIBUTE}.uuid in [{uuids}]"),
        format!(r#"{ATTRIBUTE}.driverVersion.isGreaterThan(semver("560.0.0"))"#),
    ] {
        let claim = claim(json!([{"name": "gpus", "exactly": {
            "deviceClassName": "mig.nvidia.com", "count": 7,
            "selectors": [{"cel": {"expression": format!("{small} || {reach}")}}]}}]));
        let (pinned, charge) = admitted(&claim, &fleet, None);
        let charge = charge.unwrap();
        assert_eq!(
            charge,
            [
                ("A100-SXM4-80GB".to_string(), Milli(994)),
                ("A100-SXM4-80GB/1g.10gb".to_string(), Milli(7000))
            ]
            .into(),
            "{reach}"
        );
        let exact = pinned.requests()[0].exactly.as_ref().unwrap();
        let reachable: Vec<_> = fleet
            .devices
            .iter()
            .filter(|d| allocatable(exact, d))
            .map(|d| d.profile.clone())
            .collect();
        assert_eq!(reachable, vec![Some("1g.10gb".to_string()); 10], "{reach}");
        assert_eq!(overruns(&pinned, &charge, &fleet), Vec::<String>::new());
    }
}

/// A request whose sampled devices are of several profiles is pinned to the dearest and
/// charged for it: it cannot take a smaller slice past that profile's cap.
#[test]
fn a_request_matching_several_profiles_is_pinned_to_the_dearest() {
    let (fleet, _) = fleet();
    let any_slice = claim(json!([{"name": "slice", "exactly": {
        "deviceClassName": "mig.nvidia.com", "count": 2}}]));
    let (pinned, charge) = admitted(&any_slice, &fleet, None);
    let charge = charge.unwrap();
    assert_eq!(
        charge,
        [
            ("A100-SXM4-80GB".to_string(), Milli(2000)),
            ("A100-SXM4-80GB/7g.80gb".to_string(), Milli(2000))
        ]
        .into()
    );
    let exact = pinned.requests()[0].exactly.as_ref().unwrap();
    let profiles: BTreeSet<_> = fleet
        .devices
        .iter()
        .filter(|d| allocatable(exact, d))
        .map(|d| d.profile.clone())
        .collect();
    assert_eq!(profiles, [Some("7g.80gb".to_string())].into());
    // Whole GPUs and slices alike (a class of any of the driver's devices): whole GPUs.
    let any_a100 = claim(json!([{"name": "gpu", "exactly": {
        "deviceClassName": "any.gpu.example.com",
        "selectors": [{"cel": {"expression": format!("{ATTRIBUTE}.productName == {A100:?}")}}]}}]));
    let (pinned, charge) = admitted(&any_a100, &fleet, None);
    let exact = pinned.requests()[0].exactly.as_ref().unwrap();
    assert!(
        fleet
            .devices
            .iter()
            .filter(|d| allocatable(exact, d))
            .all(|d| d.profile.is_none() && d.label == "A100-SXM4-80GB")
    );
    assert_eq!(
        charge.unwrap(),
        [("A100-SXM4-80GB".to_string(), Milli(1000))].into()
    );
}

/// Alternatives and `All`: the alternative the quota keeps pinned and charged the same
/// way, the others unmatchable; `All` pinned too and charged 32 of its pin.
#[test]
fn alternatives_and_all_are_pinned_and_charged_by_their_pins() {
    let (fleet, published) = fleet();
    let uuids = unsampled_big(&published).join(", ");
    let sneaky = format!(r#"{ATTRIBUTE}.profile == "1g.10gb" || {ATTRIBUTE}.uuid in [{uuids}]"#);
    let alternatives = claim(json!([{"name": "gpu", "firstAvailable": [
        mig_request("slices", 7, &sneaky),
        {"name": "t4", "deviceClassName": "gpu.nvidia.com", "count": 2,
            "selectors": [{"cel": {"expression": format!("{ATTRIBUTE}.productName == {T4:?}")}}]}]}]));
    let (pinned, charge) = admitted(&alternatives, &fleet, None);
    let charge = charge.unwrap();
    assert_eq!(
        charge,
        [
            ("A100-SXM4-80GB".to_string(), Milli(994)),
            ("A100-SXM4-80GB/1g.10gb".to_string(), Milli(7000)),
        ]
        .into(),
        "the first alternative has room: kept, the T4s made unmatchable"
    );
    assert_eq!(overruns(&pinned, &charge, &fleet), Vec::<String>::new());
    // With no room for A100s, the T4s are kept and charged.
    let (pinned, charge) = admitted_with(&alternatives, &fleet, None, &["A100-SXM4-80GB"]);
    let charge = charge.unwrap();
    assert_eq!(charge, [("Tesla-T4".to_string(), Milli(2000))].into());
    assert_eq!(overruns(&pinned, &charge, &fleet), Vec::<String>::new());
    let all = claim(
        json!([{"name": "gpus", "exactly": {"deviceClassName": "mig.nvidia.com",
        "allocationMode": "All", "selectors": [{"cel": {"expression": sneaky}}]}}]),
    );
    let (pinned, charge) = admitted(&all, &fleet, None);
    let charge = charge.unwrap();
    assert_eq!(
        charge,
        [
            ("A100-SXM4-80GB".to_string(), Milli(32 * 142)),
            ("A100-SXM4-80GB/1g.10gb".to_string(), Milli(32_000))
        ]
        .into()
    );
    assert_eq!(overruns(&pinned, &charge, &fleet), Vec::<String>::new());
}

/// A request pinned to its model only (an earlier version's pin, or written by hand) is
/// refused, naming the pin it needs; with that pin it is admitted.
#[test]
fn a_request_pinned_to_its_model_only_is_refused_naming_its_pin() {
    let (fleet, _) = fleet();
    let model_only = format!(r#"{ATTRIBUTE}.productName in [{A100:?}]"#);
    let request = |expression: &str| {
        claim(
            json!([{"name": "slice", "exactly": {"deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": format!(r#"{ATTRIBUTE}.profile == "1g.10gb""#)}},
                {"cel": {"expression": expression}}]}}]),
        )
    };
    let seen = Seen {
        catalog: fleet.catalog(),
        limits: limits(None),
    };
    let asks = ClaimAsks::of(&request(&model_only), &seen.catalog).unwrap();
    let error = charged(&Config::default(), "team-a", &seen, &asks)
        .unwrap_err()
        .to_string();
    let pin = format!(
        r#"{ATTRIBUTE}.productName in [{A100:?}] && has({ATTRIBUTE}.profile) && {ATTRIBUTE}.profile == "1g.10gb""#
    );
    assert_eq!(
        error,
        format!(
            "ResourceClaim request slice is not pinned to the model it is charged for (A100-SXM4-80GB), MIG 1g.10gb slices: gpu-admission's mutating webhook adds the CEL selector {pin} (a claim created while the webhook was not called, or pinned by an earlier version to its model only, lacks it; or another webhook removed it)"
        )
    );
    let asks = ClaimAsks::of(&request(&pin), &seen.catalog).unwrap();
    assert!(matches!(
        charged(&Config::default(), "team-a", &seen, &asks),
        Ok(Some(_))
    ));
}

// ---- The property.

/// A CEL term over the attributes NVIDIA's driver publishes.
fn term(uuids: Vec<String>) -> impl Strategy<Value = String> {
    let products = prop::sample::select(vec![A100, H100, T4, "NVIDIA A100-SXM4-40GB"]);
    let profiles = prop::sample::select(vec!["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]);
    let versions = prop::sample::select(vec!["535.0.0", "550.54.15", "560.0.0", "570.86.10"]);
    let some_uuids = prop::sample::subsequence(uuids.clone(), 1..=4);
    let a = ATTRIBUTE;
    prop_oneof![
        products
            .clone()
            .prop_map(move |p| format!("{a}.productName == {p:?}")),
        prop::sample::subsequence(vec![A100, H100, T4], 1..=2)
            .prop_map(move |ps| format!("{a}.productName in {ps:?}")),
        profiles.prop_map(move |p| format!("{a}.profile == {p:?}")),
        some_uuids.prop_map(move |us| format!("{a}.uuid in {us:?}")),
        prop::sample::select(uuids).prop_map(move |u| format!("{a}.uuid == {u:?}")),
        versions.prop_map(move |v| format!("{a}.driverVersion.isGreaterThan(semver({v:?}))")),
        (0i64..12).prop_map(move |i| format!("{a}.index == {i}")),
        (0i64..12).prop_map(move |i| format!("{a}.index < {i}")),
        prop::sample::select(vec!["gpu", "mig"]).prop_map(move |t| format!("{a}.type == {t:?}")),
        Just("device.allowMultipleAllocations".to_string()),
        Just(
            r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0"#
                .to_string()
        ),
        Just("true".to_string()),
    ]
}

/// A selector: terms joined by `||`, `&&` and `!`.
fn selector(uuids: Vec<String>) -> impl Strategy<Value = String> {
    term(uuids).prop_recursive(3, 8, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} || {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} && {b})")),
            inner.prop_map(|a| format!("!({a})")),
        ]
    })
}

/// Whole GPUs and slices of several sizes, more than the sample holds of each, spread
/// over nodes at random (which of them the sample holds is then random too).
fn published() -> impl Strategy<Value = Vec<Published>> {
    let kinds: Vec<(&'static str, Option<&'static str>)> = vec![
        (A100, None),
        (A100, Some("1g.10gb")),
        (A100, Some("3g.40gb")),
        (A100, Some("7g.80gb")),
        (H100, None),
        (H100, Some("1g.10gb")),
        (T4, None),
    ];
    let versions = prop::sample::select(vec!["535.104.5", "550.54.15", "560.35.3", "570.86.10"]);
    let shared = prop_oneof![2 => Just(None), 1 => (0..POLICIES.len()).prop_map(Some)];
    let device = (0usize..4, versions, 0i64..8, shared);
    let group = prop::collection::vec(device, MAX_SAMPLES + 1..MAX_SAMPLES + 5);
    prop::collection::vec(group, kinds.len()).prop_map(move |groups| {
        let mut all = Vec::new();
        for ((product, profile), group) in kinds.iter().zip(groups) {
            for (node, driver_version, index, shared) in group {
                all.push(Published {
                    node: format!("node-{node}"),
                    name: format!("dev-{:03}", all.len()),
                    product,
                    profile: *profile,
                    driver_version,
                    index,
                    shared,
                });
            }
        }
        all
    })
}

/// One request or alternative: a class, a count (or `All`) and up to two selectors.
fn request(uuids: Vec<String>, name: String) -> impl Strategy<Value = serde_json::Value> {
    let classes = prop::sample::select(vec![
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "any.gpu.example.com",
    ]);
    let count = prop_oneof![4 => (1i64..8).prop_map(Some), 1 => Just(None)];
    let selectors = prop::collection::vec(selector(uuids), 0..=2);
    let memory = prop::sample::select(vec!["1Gi", "15500Mi", "20Gi", "40Gi", "81Gi"]);
    let capacity = prop_oneof![
        2 => Just(None),
        2 => memory.prop_map(|m| Some(json!({"memory": m}))),
        1 => Just(Some(json!({"cores": "1"}))),
    ];
    (classes, count, selectors, capacity).prop_map(move |(class, count, selectors, capacity)| {
        let selectors: Vec<_> = selectors
            .iter()
            .map(|e| json!({"cel": {"expression": e}}))
            .collect();
        let mut request = json!({"name": name, "deviceClassName": class, "selectors": selectors});
        match count {
            Some(n) => request["count"] = json!(n),
            None => request["allocationMode"] = json!("All"),
        }
        if let Some(asks) = capacity {
            request["capacity"] = json!({"requests": asks});
        }
        request
    })
}

/// A claim of one request: `exactly`, or one to three alternatives.
fn claims(uuids: Vec<String>) -> impl Strategy<Value = ResourceClaim> {
    let exact = request(uuids.clone(), "gpu".into())
        .prop_map(|r| claim(json!([{"name": "gpu", "exactly": r}])));
    let alternatives = (1usize..=3)
        .prop_flat_map(move |n| {
            let each: Vec<_> = (0..n)
                .map(|i| request(uuids.clone(), format!("alt-{i}")))
                .collect();
            each
        })
        .prop_map(|alternatives| claim(json!([{"name": "gpu", "firstAvailable": alternatives}])));
    prop_oneof![2 => exact, 1 => alternatives]
}

/// A case: devices, a default model, a claim whose selectors may name any of the
/// devices, and the models whose quota has no room left.
type Case = (
    Vec<Published>,
    Option<&'static str>,
    ResourceClaim,
    Vec<&'static str>,
);

fn cases() -> impl Strategy<Value = Case> {
    let defaults = prop::sample::select(vec![None, Some("A100-SXM4-80GB"), Some("Tesla-T4")]);
    let models = vec!["A100-SXM4-80GB", "H100-80GB-HBM3", "Tesla-T4"];
    let full = prop::sample::subsequence(models, 0..=2);
    (published(), defaults, full).prop_flat_map(|(published, default, full)| {
        let uuids: Vec<String> = published.iter().map(Published::uuid).collect();
        (Just(published), Just(default), claims(uuids), Just(full))
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 192,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// For every device of random ResourceSlices — whole GPUs and slices, some shareable
    /// by capacity under random policies — that a randomly selected request (capacity
    /// asks and alternatives included, the quota's room choosing among alternatives) may
    /// be given once pinned (class ∧ tenant's selectors ∧ pin), count × what the
    /// allocator takes of it is within what the validating webhook charged, per key.
    #[test]
    fn no_device_a_pinned_request_can_get_costs_more_than_its_charge(
        (published, default, claim, full) in cases()
    ) {
        let fleet = Fleet::of(&published);
        let (pinned, charge) = admitted_with(&claim, &fleet, default, &full);
        if let Some(charge) = charge {
            let found = overruns(&pinned, &charge, &fleet);
            prop_assert!(found.is_empty(), "charged {charge:?}, overruns: {found:#?}\npinned: {}",
                serde_json::to_string(&pinned).unwrap());
        }
    }
}
