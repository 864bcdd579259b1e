#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::classes::{ClassInfo, DeviceClass, DeviceClasses};
use super::slices::{DeviceIndex, ResourceSlice, gpu_devices};
use super::*;
use crate::placement::quantity::Milli;

fn claim(requests: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "team-a"},
        "spec": {"devices": {"requests": requests}}
    }))
    .unwrap()
}

fn amounts(pairs: &[(&str, u64)]) -> ModelAmounts {
    pairs
        .iter()
        .map(|(k, m)| (k.to_string(), Milli(*m)))
        .collect()
}

const A100: &str = r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB""#;
const T4: &str = r#"device.attributes["gpu.nvidia.com"]["productName"] == 'Tesla T4'"#;

/// A node's slice: `devices` of (name, productName, type, profile, memory).
fn slice(node: &str, devices: &[(&str, &str, &str, Option<&str>, &str)]) -> ResourceSlice {
    let devices: Vec<serde_json::Value> = devices
        .iter()
        .map(|(name, product, kind, profile, memory)| {
            let mut attributes = json!({
                "productName": {"string": product},
                "type": {"string": kind},
                "uuid": {"string": format!("GPU-{node}-{name}")},
                "driverVersion": {"version": "550.54.15"},
            });
            if let Some(profile) = profile {
                attributes["profile"] = json!({"string": profile});
            }
            json!({"name": name, "attributes": attributes,
                "capacity": {"memory": {"value": memory}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu")},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": node}, "nodeName": node,
            "devices": devices}
    }))
    .unwrap()
}

fn nvidia_classes() -> DeviceClasses {
    let class = |kind: &str| ClassInfo {
        selectors: vec![format!(
            r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "{kind}""#
        )],
        extended_resource: None,
    };
    [
        ("gpu.nvidia.com".to_string(), class("gpu")),
        ("mig.nvidia.com".to_string(), class("mig")),
    ]
    .into()
}

/// A cluster publishing an A100 node (two GPUs, one cut into 1g.10gb slices) and a T4
/// node; quotas know A100-SXM4-80GB and Tesla-T4.
fn cluster() -> Catalog {
    let dra = Dra::default();
    let mut index = DeviceIndex::default();
    for slice in [
        slice(
            "a100-node",
            &[
                ("gpu-0", "NVIDIA A100-SXM4-80GB", "gpu", None, "80Gi"),
                ("gpu-1", "NVIDIA A100-SXM4-80GB", "gpu", None, "80Gi"),
                (
                    "gpu-2-mig-0",
                    "NVIDIA A100-SXM4-80GB",
                    "mig",
                    Some("1g.10gb"),
                    "10Gi",
                ),
            ],
        ),
        slice("t4-node", &[("gpu-0", "Tesla T4", "gpu", None, "16Gi")]),
    ] {
        index.apply(
            slice.metadata.name.as_deref().unwrap(),
            gpu_devices(&slice, &dra),
        );
    }
    let known = ["A100-SXM4-80GB".to_string(), "Tesla-T4".to_string()];
    Catalog::new(&dra, &nvidia_classes(), &index, known)
}

/// A cluster that publishes no device yet.
fn unpublished(known: &[&str]) -> Catalog {
    let known = known.iter().map(|k| k.to_string());
    Catalog::new(
        &Dra::default(),
        &nvidia_classes(),
        &DeviceIndex::default(),
        known,
    )
}

fn asks(requests: serde_json::Value, catalog: &Catalog) -> ClaimAsks {
    ClaimAsks::of(&claim(requests), catalog).unwrap()
}

fn charge(requests: serde_json::Value, default: Option<&str>) -> ModelAmounts {
    asks(requests, &cluster()).charge(default, &MigResources::default())
}

fn gpu_request(expression: &str) -> serde_json::Value {
    json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": expression}}]}}])
}

/// The model one request is charged for, with the namespace's default.
fn model(expression: &str, default: Option<&str>, catalog: &Catalog) -> Resolved {
    let asks = asks(gpu_request(expression), catalog);
    asks.exact[0].resolve(default)
}

fn is(label: &str) -> Resolved {
    Resolved::Model(label.into())
}

#[test]
fn exact_count_is_charged_per_device_to_the_selected_model() {
    let two = json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "count": 2, "selectors": [{"cel": {"expression": A100}}]}}]);
    assert_eq!(charge(two, None), amounts(&[("A100-SXM4-80GB", 2000)]));
    assert_eq!(
        charge(gpu_request(T4), None),
        amounts(&[("Tesla-T4", 1000)])
    );
}

#[test]
fn all_is_charged_as_the_most_devices_a_claim_can_get() {
    let all = json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "allocationMode": "All", "selectors": [{"cel": {"expression": A100}}]}}]);
    assert_eq!(charge(all, None), amounts(&[("A100-SXM4-80GB", 32_000)]));
}

#[test]
fn alternatives_are_charged_the_largest_per_key() {
    let prioritized = json!([{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2,
            "selectors": [{"cel": {"expression": A100}}]},
        {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1,
            "selectors": [{"cel": {"expression": A100}}]},
        {"name": "other", "deviceClassName": "gpu.nvidia.com", "count": 3,
            "selectors": [{"cel": {"expression": T4}}]}]}]);
    assert_eq!(
        charge(prioritized, None),
        amounts(&[("A100-SXM4-80GB", 2000), ("Tesla-T4", 3000)])
    );
}

#[test]
fn mig_devices_cost_their_slice_and_other_classes_nothing() {
    let slices = json!([
        {"name": "slice", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 2}},
        {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com", "count": 4}}]);
    assert_eq!(
        charge(slices, None),
        amounts(&[("A100-SXM4-80GB", 284), ("A100-SXM4-80GB/1g.10gb", 2000)])
    );
}

#[test]
fn a_request_matching_several_models_takes_the_default_or_none() {
    let catalog = cluster();
    let any = json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]);
    let asks = asks(any.clone(), &catalog);
    assert_eq!(
        asks.exact[0].resolve(None),
        Resolved::Ambiguous(vec!["A100-SXM4-80GB".into(), "Tesla-T4".into()])
    );
    assert_eq!(asks.exact[0].resolve(Some("Tesla-T4")), is("Tesla-T4"));
    assert_eq!(
        asks.exact[0].resolve(Some("H100")),
        Resolved::Ambiguous(vec!["A100-SXM4-80GB".into(), "Tesla-T4".into()])
    );
    assert_eq!(
        charge(any, Some("Tesla-T4")),
        amounts(&[("Tesla-T4", 1000)])
    );
}

#[test]
fn a_device_class_can_imply_a_model() {
    let mut dra = Dra::default();
    dra.device_classes
        .insert("a100.example.com".into(), "A100-SXM4-80GB".into());
    let catalog = Catalog::new(&dra, &DeviceClasses::new(), &DeviceIndex::default(), []);
    let request = json!([{"name": "gpu", "exactly": {"deviceClassName": "a100.example.com"}}]);
    assert_eq!(
        asks(request, &catalog).charge(None, &MigResources::default()),
        amounts(&[("A100-SXM4-80GB", 1000)])
    );
}

/// Issue 18, item 1: whatever a selector's text mentions, the model is what it matches
/// as CEL (a namespace whose only model, and default, is Tesla-T4).
#[test]
fn selectors_are_charged_for_what_they_match_not_what_they_mention() {
    let catalog = cluster();
    let t4 = Some("Tesla-T4");
    let a100 = is("A100-SXM4-80GB");
    let p = r#"device.attributes["gpu.nvidia.com"].productName"#;
    let cases = [
        (format!(r#"{p} == "Tesla T4" || true"#), is("Tesla-T4")),
        (
            format!(r#"{p} == "Tesla T4" || {p} != "Tesla T4""#),
            is("Tesla-T4"),
        ),
        (format!(r#"!({p} == "Tesla T4")"#), a100.clone()),
        (
            format!(r#"{p} != "Tesla T4" && "Tesla T4" != """#),
            a100.clone(),
        ),
        (format!(r#"{p}.startsWith("NVIDIA A")"#), a100.clone()),
        (
            format!(r#"{p}.matches("A100") || "Tesla T4" == "x""#),
            a100.clone(),
        ),
        (format!(r#"{p} == "Tesla T4" ? false : true"#), a100.clone()),
        (format!(r#"({p} == ("Tesla T4")) == false"#), a100.clone()),
        (
            format!(r#"{p} in ["Tesla T4", "NVIDIA A100-SXM4-80GB"] && !{p}.contains("T4")"#),
            a100.clone(),
        ),
        (
            r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) > 0"#
                .to_string(),
            a100.clone(),
        ),
        (
            r#"device.attributes["gpu.nvidia.com"].uuid.startsWith("GPU-a100")"#.to_string(),
            a100.clone(),
        ),
        (format!(r#"{p} == "Tesla T4""#), is("Tesla-T4")),
    ];
    for (expression, want) in cases {
        assert_eq!(model(&expression, t4, &catalog), want, "{expression}");
        assert_eq!(
            model(&expression, None, &catalog).clone(),
            match want.clone() {
                Resolved::Model(m) if m == "Tesla-T4" && expression.contains("||") =>
                    Resolved::Ambiguous(vec!["A100-SXM4-80GB".into(), "Tesla-T4".into()]),
                other => other,
            },
            "{expression} without a default"
        );
    }
    // Another domain's attribute: the device has none, so that clause fails (and CEL's
    // `||` is true when either side is).
    let other = format!(r#"device.attributes["other.example.com"].x == 1 || {p} == "Tesla T4""#);
    assert_eq!(model(&other, None, &catalog), is("Tesla-T4"));
    let other = format!(r#"device.attributes["other.example.com"].x == 1 && {p} == "Tesla T4""#);
    assert_eq!(model(&other, None, &catalog), Resolved::Unnamed);
    let alternative = json!([{"name": "gpu", "firstAvailable": [
        {"name": "t4", "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": format!(r#"{p} == "Tesla T4""#)}}]},
        {"name": "sneaky", "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": format!(r#"!({p} == "Tesla T4")"#)}}]}]}]);
    let asks = asks(alternative, &catalog);
    let models: Vec<Resolved> = asks.alternatives[0].iter().map(|a| a.resolve(t4)).collect();
    assert_eq!(models, [is("Tesla-T4"), a100]);
}

#[test]
fn without_published_devices_the_selectors_pin_a_known_model_or_take_the_default() {
    let catalog = unpublished(&["A100-SXM4-80GB", "Tesla-T4"]);
    assert_eq!(model(A100, None, &catalog), is("A100-SXM4-80GB"));
    assert_eq!(model(T4, None, &catalog), is("Tesla-T4"));
    let p = r#"device.attributes["gpu.nvidia.com"].productName"#;
    let either = format!(r#"{p} != "x""#);
    assert_eq!(
        model(&either, None, &catalog),
        Resolved::Ambiguous(vec!["A100-SXM4-80GB".into(), "Tesla-T4".into()])
    );
    assert_eq!(model(&either, Some("Tesla-T4"), &catalog), is("Tesla-T4"));
    let unknown = format!(r#"{p} == "NVIDIA H100 80GB HBM3""#);
    assert_eq!(model(&unknown, Some("Tesla-T4"), &catalog), is("Tesla-T4"));
    assert_eq!(model(&unknown, None, &catalog), Resolved::Unnamed);
    // The pin of a model selects its made-up devices, and only those.
    let pin = catalog.pin(&Pin::whole("Tesla-T4"));
    assert_eq!(model(&pin, None, &catalog), is("Tesla-T4"));
    assert_eq!(
        model(&format!("{pin} && {A100}"), None, &catalog),
        Resolved::Unnamed
    );
}

#[test]
fn a_mig_profile_is_matched_on_made_up_slices_of_known_profile_keys() {
    let catalog = unpublished(&["A100-SXM4-80GB", "A100-SXM4-80GB/1g.10gb"]);
    let expression =
        format!(r#"{A100} && device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#);
    let slices = json!([{"name": "slice", "exactly": {"deviceClassName": "mig.nvidia.com",
        "count": 2, "selectors": [{"cel": {"expression": expression}}]}}]);
    assert_eq!(
        asks(slices, &catalog).charge(None, &MigResources::default()),
        amounts(&[("A100-SXM4-80GB", 284), ("A100-SXM4-80GB/1g.10gb", 2000)])
    );
}

#[test]
fn a_pin_is_recognised_only_when_it_names_one_model_and_whole_gpus_or_one_profile() {
    let dra = Dra::default();
    let a100 = ["NVIDIA A100-SXM4-80GB".to_string()];
    let whole = dra.pin_expression(&Pin::whole("A100-SXM4-80GB"), &a100);
    assert_eq!(
        whole,
        r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA A100-SXM4-80GB"] && !has(device.attributes["gpu.nvidia.com"].profile)"#
    );
    assert_eq!(dra.pinned(&whole), Some(Pin::whole("A100-SXM4-80GB")));
    let slice = Pin {
        label: "A100-SXM4-80GB".into(),
        profile: Some("1g.10gb".into()),
        shared: false,
    };
    let sliced = dra.pin_expression(&slice, &a100);
    assert_eq!(
        sliced,
        r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA A100-SXM4-80GB"] && has(device.attributes["gpu.nvidia.com"].profile) && device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#
    );
    assert_eq!(dra.pinned(&sliced), Some(slice.clone()));
    // A shared pin ends with the clause only shareable devices satisfy.
    let shared = Pin {
        shared: true,
        ..slice
    };
    let text = dra.pin_expression(&shared, &a100);
    assert_eq!(text, format!("{sliced} && device.allowMultipleAllocations"));
    assert_eq!(dra.pinned(&text), Some(shared));
    assert_eq!(dra.pinned(&format!("{text} && true")), None);
    let unpublished = dra.pin_expression(&Pin::whole("Tesla-T4"), &[]);
    assert_eq!(
        unpublished,
        r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA Tesla T4", "NVIDIA Tesla-T4", "Tesla T4", "Tesla-T4"] && !has(device.attributes["gpu.nvidia.com"].profile)"#
    );
    assert_eq!(dra.pinned(&unpublished), Some(Pin::whole("Tesla-T4")));
    let p = r#"device.attributes["gpu.nvidia.com"]"#;
    let not_pins = [
        // Two models.
        format!(r#"{p}.productName in ["Tesla T4", "NVIDIA A100-SXM4-80GB"] && !has({p}.profile)"#),
        // The model only (an earlier version's pin): any slice or whole GPU of it.
        format!(r#"{p}.productName in ["NVIDIA A100-SXM4-80GB"]"#),
        format!("{whole} || true"),
        format!("{sliced} || true"),
        format!(
            r#"{p}.productName in ["NVIDIA A100-SXM4-80GB"] && has({p}.profile) && {p}.profile == "1g.10gb" || true"#
        ),
        format!(
            r#"{p}.productName in ["NVIDIA A100-SXM4-80GB"] && has({p}.profile) && {p}.profile != "1g.10gb""#
        ),
    ];
    for expression in not_pins {
        assert_eq!(dra.pinned(&expression), None, "{expression}");
    }
    assert_eq!(
        dra.label_of_product("NVIDIA H100 80GB HBM3"),
        "H100-80GB-HBM3"
    );
}

#[test]
fn device_classes_that_can_select_gpus_are_gpu_classes() {
    let class = |selector: &str, extended: Option<&str>| -> ClassInfo {
        let class: DeviceClass = serde_json::from_value(json!({"metadata": {"name": "x"},
            "spec": {"selectors": [{"cel": {"expression": selector}}],
                "extendedResourceName": extended}}))
        .unwrap();
        ClassInfo::of(&class)
    };
    let classes: DeviceClasses = [
        ("vfio.gpu.nvidia.com".to_string(), class(r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "vfio""#, None)),
        ("any-t4".to_string(), class(r#"device.attributes["gpu.nvidia.com"].productName == "Tesla T4""#, Some("example.com/t4"))),
        ("rdma.example.com".to_string(), class(r#"device.driver == "rdma.example.com""#, None)),
    ]
    .into();
    for devices in [DeviceIndex::default(), {
        let mut index = DeviceIndex::default();
        let published = slice("n", &[("gpu-0", "Tesla T4", "gpu", None, "16Gi")]);
        index.apply("n", gpu_devices(&published, &Dra::default()));
        index
    }] {
        let catalog = Catalog::new(&Dra::default(), &classes, &devices, []);
        assert!(catalog.is_gpu_class("vfio.gpu.nvidia.com"));
        assert!(catalog.is_gpu_class("any-t4"));
        assert!(catalog.is_gpu_class("gpu.nvidia.com"), "configured");
        assert!(!catalog.is_gpu_class("rdma.example.com"));
    }
}

#[test]
fn oversized_or_hostile_claims_are_refused() {
    let requests: Vec<serde_json::Value> = (0..65)
        .map(|i| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "gpu.nvidia.com"}}))
        .collect();
    let body = json!({"spec": {"devices": {"requests": requests}}}).to_string();
    let error = crate::wire::claim::decode("request.object", &body).unwrap_err();
    assert_eq!(error.kind(), "over_limit");
    let error = error.to_string();
    assert!(error.contains("more than 64 items"), "{error}");
    let nested = "[1,2].all(x, [1,2].all(y, x == y))";
    let error = ClaimAsks::of(&claim(gpu_request(nested)), &cluster()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "ResourceClaim request gpu: CEL selector nests a comprehension in another"
    );
}

#[test]
fn a_claims_evaluations_are_bounded_by_its_budget() {
    let p = r#"device.attributes["gpu.nvidia.com"].productName"#;
    let list = (0..60)
        .map(|i| format!("\"{i}\""))
        .collect::<Vec<_>>()
        .join(",");
    let costly = format!("[{list}].exists(x, {p}.contains(x + x + x)) || true");
    let selectors: Vec<serde_json::Value> = (0..32)
        .map(|_| json!({"cel": {"expression": costly}}))
        .collect();
    let requests: Vec<serde_json::Value> = (0..32)
        .map(|i| {
            json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": selectors}})
        })
        .collect();
    let error = ClaimAsks::of(&claim(json!(requests)), &cluster()).unwrap_err();
    assert_eq!(error, AskError::OverBudget(cel::OverBudget));
}

/// The pins select, among every device of the driver, exactly the model and whole GPUs
/// or the profile they name, and evaluate on each of them (Kubernetes aborts an
/// allocation on a selector that fails on a device).
#[test]
fn a_pin_selects_its_model_and_whole_gpus_or_its_profile_and_fails_on_no_device() {
    let dra = Dra::default();
    let node = slice(
        "a100-node",
        &[
            ("gpu-0", "NVIDIA A100-SXM4-80GB", "gpu", None, "80Gi"),
            (
                "gpu-1-mig-0",
                "NVIDIA A100-SXM4-80GB",
                "mig",
                Some("1g.10gb"),
                "10Gi",
            ),
            (
                "gpu-1-mig-1",
                "NVIDIA A100-SXM4-80GB",
                "mig",
                Some("3g.40gb"),
                "40Gi",
            ),
            ("gpu-2", "Tesla T4", "gpu", None, "16Gi"),
        ],
    );
    let devices = gpu_devices(&node, &dra);
    let a100 = ["NVIDIA A100-SXM4-80GB".to_string()];
    let slice_of = |profile: &str| Pin {
        label: "A100-SXM4-80GB".into(),
        profile: Some(profile.into()),
        shared: false,
    };
    let cases = [
        (Pin::whole("A100-SXM4-80GB"), vec!["gpu-0"]),
        (slice_of("1g.10gb"), vec!["gpu-1-mig-0"]),
        (slice_of("3g.40gb"), vec!["gpu-1-mig-1"]),
        (slice_of("7g.80gb"), vec![]),
    ];
    for (pin, want) in cases {
        let selector = cel::Selector::compile(&dra.pin_expression(&pin, &a100)).unwrap();
        let mut matched = Vec::new();
        for ((_, name), device) in &devices {
            let value = selector.evaluate(&device.cel);
            assert!(value.is_some(), "{pin:?} fails on {name}");
            if value == Some(true) {
                matched.push(name.as_str());
            }
        }
        assert_eq!(matched, want, "{pin:?}");
    }
}

/// A request is pinned to the dearest of what its selectors matched of its model, and a
/// pinned request is charged by its pin.
#[test]
fn a_request_is_pinned_to_the_dearest_it_matched_and_charged_by_the_pin() {
    let catalog = cluster();
    let mig = MigResources::default();
    let p = r#"device.attributes["gpu.nvidia.com"]"#;
    let any_a100 = json!([{"name": "gpu", "exactly": {"deviceClassName": "vfio.example.com",
        "count": 2, "selectors": [{"cel": {"expression": A100}}]}}]);
    let classes: DeviceClasses = [(
        "vfio.example.com".to_string(),
        ClassInfo {
            selectors: vec![r#"device.driver == "gpu.nvidia.com""#.into()],
            extended_resource: None,
        },
    )]
    .into();
    let mut index = DeviceIndex::default();
    let published = slice(
        "a100-node",
        &[
            ("gpu-0", "NVIDIA A100-SXM4-80GB", "gpu", None, "80Gi"),
            (
                "gpu-1-mig-0",
                "NVIDIA A100-SXM4-80GB",
                "mig",
                Some("1g.10gb"),
                "10Gi",
            ),
        ],
    );
    index.apply("a100-node", gpu_devices(&published, &Dra::default()));
    let both = Catalog::new(&Dra::default(), &classes, &index, []);
    // Whole GPUs and slices match: whole GPUs, the dearest.
    let ask = &asks(any_a100, &both).exact[0];
    assert_eq!(ask.pin(None), Some(Pin::whole("A100-SXM4-80GB")));
    // Slices only: that profile.
    let slices = json!([{"name": "slice", "exactly": {"deviceClassName": "mig.nvidia.com",
        "count": 3, "selectors": [{"cel": {"expression": format!("{p}.uuid != \"\"")}}]}}]);
    let ask = asks(slices, &catalog).exact[0].clone();
    let pin = ask.pin(None).unwrap();
    assert_eq!(pin.profile.as_deref(), Some("1g.10gb"));
    // Charged by the pin it carries, whatever else its selectors say.
    let pinned = json!([{"name": "slice", "exactly": {"deviceClassName": "mig.nvidia.com",
        "count": 3, "selectors": [{"cel": {"expression": format!("{p}.uuid != \"\"")}},
            {"cel": {"expression": catalog.pin(&pin)}}]}}]);
    let asks = asks(pinned, &catalog);
    assert_eq!(asks.exact[0].pinned, Some(pin.clone()));
    assert_eq!(
        asks.charge(None, &mig),
        amounts(&[("A100-SXM4-80GB", 426), ("A100-SXM4-80GB/1g.10gb", 3000)])
    );
    assert_eq!(asks.charge(None, &mig), pin.charge(3, &mig));
}

/// A `matches` pattern that compiles past the size limit (Unicode `\w` repeated 200
/// times) is refused before anything runs, naming the request and the pattern.
#[test]
fn a_pattern_over_the_compiled_size_limit_is_refused_naming_the_request() {
    let catalog = Catalog::new(
        &Dra::default(),
        &DeviceClasses::new(),
        &DeviceIndex::default(),
        ["Tesla-T4".to_string()],
    );
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "spec": {"devices": {"requests": [{"name": "big", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": r#"device.attributes["gpu.nvidia.com"].productName.matches("\\w{1,200}")"#}}]}}]}}
    }))
    .unwrap();
    let error = ClaimAsks::of(&claim, &catalog).unwrap_err().to_string();
    assert_eq!(
        error,
        r#"ResourceClaim request big: CEL selector matches "\\w{1,200}", which is not a regular expression compiling within 65536 bytes"#
    );
}

/// Partitionable devices (KEP-4815, beta in Kubernetes 1.36) as NVIDIA's driver publishes
/// dynamic MIG: a slice of shared counters (one set per physical GPU) and a slice of
/// devices each consuming from it, the whole GPU and every profile placement. A device's
/// charge depends on its attributes alone (model, and a MIG profile), not on the counters
/// it consumes, so such a device is charged, pinned and counted as a static one: the
/// whole GPU a GPU, a placement its profile's slice and one `<model>/<profile>` unit.
#[test]
fn partitionable_devices_are_charged_by_profile_like_static_ones() {
    let counters = json!({
        "metadata": {"name": "node-a-counters"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "node-a"}, "nodeName": "node-a",
            "sharedCounters": [{"name": "gpu-0-counter-set", "counters": {
                "memory": {"value": "80Gi"}, "multiprocessors": {"value": "98"},
                "memory-slice-0": {"value": "1"}, "memory-slice-1": {"value": "1"}}}]}
    });
    let attributes = |profile: Option<&str>| {
        let mut a = json!({
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "type": {"string": if profile.is_some() { "mig" } else { "gpu" }},
            "uuid": {"string": "GPU-0"},
        });
        if let Some(profile) = profile {
            a["profile"] = json!({"string": profile});
        }
        a
    };
    let consumes = |memory: &str, slices: &[u32]| {
        let mut counters = json!({"memory": {"value": memory}});
        for s in slices {
            counters[format!("memory-slice-{s}")] = json!({"value": "1"});
        }
        json!([{"counterSet": "gpu-0-counter-set", "counters": counters}])
    };
    let devices = json!({
        "metadata": {"name": "node-a-gpus"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "node-a"}, "nodeName": "node-a",
            "devices": [
                {"name": "gpu-0", "attributes": attributes(None),
                 "capacity": {"memory": {"value": "80Gi"}}, "consumesCounters": consumes("80Gi", &[0, 1])},
                {"name": "gpu-0-mig-1g10gb-0", "attributes": attributes(Some("1g.10gb")),
                 "capacity": {"memory": {"value": "10Gi"}}, "consumesCounters": consumes("10Gi", &[0])},
                {"name": "gpu-0-mig-1g10gb-1", "attributes": attributes(Some("1g.10gb")),
                 "capacity": {"memory": {"value": "10Gi"}}, "consumesCounters": consumes("10Gi", &[1])},
            ]}
    });
    let dra = Dra::default();
    let mut index = DeviceIndex::default();
    for slice in [counters, devices] {
        let slice: ResourceSlice = serde_json::from_value(slice).unwrap();
        index.apply(
            slice.metadata.name.as_deref().unwrap(),
            gpu_devices(&slice, &dra),
        );
    }
    let known = ["A100-SXM4-80GB".to_string()];
    let catalog = Catalog::new(&dra, &nvidia_classes(), &index, known);
    let mig = MigResources::default();
    let slices =
        json!([{"name": "s", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 2}}]);
    assert_eq!(
        asks(slices, &catalog).charge(None, &mig),
        amounts(&[("A100-SXM4-80GB", 284), ("A100-SXM4-80GB/1g.10gb", 2000)])
    );
    let whole = json!([{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]);
    assert_eq!(
        asks(whole, &catalog).charge(None, &mig),
        amounts(&[("A100-SXM4-80GB", 1000)])
    );
}
