#![allow(clippy::unwrap_used)]

use serde_json::json;

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

fn charge(requests: serde_json::Value, default: Option<&str>) -> ModelAmounts {
    ClaimAsks::of(&claim(requests), &Dra::default()).charge(default, &MigResources::default())
}

#[test]
fn exact_count_is_charged_per_device_to_the_selected_model() {
    let two = json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "count": 2, "selectors": [{"cel": {"expression": A100}}]}}]);
    assert_eq!(charge(two, None), amounts(&[("A100-SXM4-80GB", 2000)]));
    let one = json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": T4}}]}}]);
    assert_eq!(charge(one, None), amounts(&[("Tesla-T4", 1000)]));
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
    let expression =
        format!(r#"{A100} && device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#);
    let slices = json!([
        {"name": "slice", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 2,
            "selectors": [{"cel": {"expression": expression}}]}},
        {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com", "count": 4}}]);
    assert_eq!(
        charge(slices, None),
        amounts(&[("A100-SXM4-80GB", 284), ("A100-SXM4-80GB/1g.10gb", 2000)])
    );
}

#[test]
fn a_request_naming_no_model_takes_the_default_or_nothing() {
    let untyped = json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]);
    assert_eq!(charge(untyped.clone(), None), ModelAmounts::new());
    assert_eq!(
        charge(untyped.clone(), Some("Tesla-T4")),
        amounts(&[("Tesla-T4", 1000)])
    );
    let asks = ClaimAsks::of(&claim(untyped), &Dra::default());
    let names: Vec<&str> = asks.untyped().map(|a| a.request.as_str()).collect();
    assert_eq!(names, ["gpu"]);
}

#[test]
fn a_device_class_can_imply_a_model() {
    let mut dra = Dra::default();
    dra.device_classes
        .insert("a100.example.com".into(), "A100-SXM4-80GB".into());
    let request = json!([{"name": "gpu", "exactly": {"deviceClassName": "a100.example.com"}}]);
    let asks = ClaimAsks::of(&claim(request), &dra);
    assert_eq!(
        asks.charge(None, &MigResources::default()),
        amounts(&[("A100-SXM4-80GB", 1000)])
    );
}

#[test]
fn only_equalities_on_the_model_attribute_name_a_model() {
    let dra = Dra::default();
    let model = |e: &str| dra.required_label(e);
    assert_eq!(model(A100).as_deref(), Some("A100-SXM4-80GB"));
    assert_eq!(
        model(r#""Tesla T4" == device.attributes["gpu.nvidia.com"].productName"#).as_deref(),
        Some("Tesla-T4")
    );
    let pinned = dra.pin_expression("Tesla-T4", &[]);
    assert_eq!(model(&pinned).as_deref(), Some("Tesla-T4"));
    assert_eq!(
        model(
            r#"device.attributes["gpu.nvidia.com"].productName in ["Tesla T4", "NVIDIA A100-SXM4-80GB"]"#
        ),
        None,
        "two models: the selector does not name one"
    );
    assert_eq!(
        model(r#"device.attributes["gpu.nvidia.com"].productName != "NVIDIA A100-SXM4-80GB""#),
        None
    );
    assert_eq!(
        model(r#"device.attributes["other.com"].productName == "NVIDIA A100-SXM4-80GB""#),
        None
    );
    assert_eq!(
        model(r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA")"#),
        None
    );
    assert_eq!(
        dra.label_of_product("NVIDIA H100 80GB HBM3"),
        "H100-80GB-HBM3"
    );
}

#[test]
fn the_pin_selects_the_published_products_of_a_label() {
    let dra = Dra::default();
    assert_eq!(
        dra.pin_expression("A100-SXM4-80GB", &["NVIDIA A100-SXM4-80GB".into()]),
        r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA A100-SXM4-80GB"]"#
    );
    assert_eq!(
        dra.pin_expression("Tesla-T4", &[]),
        r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA Tesla-T4", "Tesla-T4"]"#
    );
}

#[test]
fn oversized_claims_are_refused_while_decoding() {
    let requests: Vec<serde_json::Value> = (0..65)
        .map(|i| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "gpu.nvidia.com"}}))
        .collect();
    let body = json!({"spec": {"devices": {"requests": requests}}}).to_string();
    let error = ResourceClaim::decode("request.object", &body).unwrap_err();
    assert!(error.contains("more than 64 items"), "{error}");
}
