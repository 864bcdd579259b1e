#![allow(clippy::unwrap_used)]

use super::*;

fn gpu(product: &str) -> CelDevice {
    let attributes = [(
        "gpu.nvidia.com".to_string(),
        [
            (
                "productName".to_string(),
                AttributeValue::String(product.into()),
            ),
            ("type".to_string(), AttributeValue::String("gpu".into())),
            ("index".to_string(), AttributeValue::Int(0)),
            (
                "driverVersion".to_string(),
                AttributeValue::Version("550.54.15".into()),
            ),
        ]
        .into(),
    )]
    .into();
    let capacity = [(
        "gpu.nvidia.com".to_string(),
        [("memory".to_string(), Milli::parse("80Gi").unwrap())].into(),
    )]
    .into();
    CelDevice::new("gpu.nvidia.com", &attributes, &capacity)
}

fn eval(expression: &str, device: &CelDevice) -> Option<bool> {
    Selector::compile(expression).unwrap().evaluate(device)
}

#[test]
fn selectors_are_evaluated_with_the_device_environment() {
    let a100 = gpu("NVIDIA A100-SXM4-80GB");
    let cases = [
        (r#"device.driver == "gpu.nvidia.com""#, Some(true)),
        (
            r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB""#,
            Some(true),
        ),
        (
            r#"device.attributes["gpu.nvidia.com"]["productName"] != 'NVIDIA A100-SXM4-80GB'"#,
            Some(false),
        ),
        (
            r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A")"#,
            Some(true),
        ),
        (
            r#"device.attributes["gpu.nvidia.com"].productName.matches("^NVIDIA A[0-9]+")"#,
            Some(true),
        ),
        (
            r#"device.attributes["gpu.nvidia.com"].index == 0 ? true : false"#,
            Some(true),
        ),
        (
            r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
            Some(true),
        ),
        (
            r#"device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("40Gi"))"#,
            Some(false),
        ),
        (
            r#"device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("535.0.0"))"#,
            Some(true),
        ),
        (
            r#"device.attributes["gpu.nvidia.com"].missing == "x""#,
            None,
        ),
        (
            r#"device.attributes["other.example.com"].productName == "x""#,
            None,
        ),
        (r#"["a", "b"].exists(x, x == "b")"#, Some(true)),
        (r#"1"#, None),
    ];
    for (expression, want) in cases {
        assert_eq!(eval(expression, &a100), want, "{expression}");
    }
}

#[test]
fn hostile_selectors_are_refused_before_they_run() {
    let long = format!("{}true", "true && ".repeat(2000));
    assert_eq!(Selector::compile(&long).unwrap_err(), CelError::TooLong);
    let deep = format!("{}true{}", "(".repeat(200), ")".repeat(200));
    assert_eq!(Selector::compile(&deep).unwrap_err(), CelError::TooDeep);
    let chain = format!("1{} == 1", " + 1".repeat(400));
    assert_eq!(Selector::compile(&chain).unwrap_err(), CelError::TooDeep);
    let nested = "[1,2].all(x, [1,2].all(y, x == y))";
    assert_eq!(
        Selector::compile(nested).unwrap_err(),
        CelError::NestedComprehension
    );
    let list = (0..1000)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let wide = format!("[{list}].map(x, [{list}]).size() > 0");
    assert_eq!(Selector::compile(&wide).unwrap_err(), CelError::TooCostly);
    let pattern = r#""a".matches("(a{100}){100}{100}")"#;
    assert_eq!(Selector::compile(pattern).unwrap_err(), CelError::Pattern);
    let computed = r#""a".matches("a" + "b")"#;
    assert_eq!(Selector::compile(computed).unwrap_err(), CelError::Pattern);
    assert!(matches!(
        Selector::compile("device.("),
        Err(CelError::Parse(_))
    ));
}

#[test]
fn a_claims_evaluations_share_one_budget() {
    let selector = Selector::compile("true").unwrap();
    let mut budget = Budget(selector.cost * 2);
    let device = gpu("x");
    assert_eq!(selector.matches(&device, &mut budget), Ok(true));
    assert_eq!(selector.matches(&device, &mut budget), Ok(true));
    assert_eq!(selector.matches(&device, &mut budget), Err(OverBudget));
}

#[test]
fn versions_order_semantically() {
    let v = |s: &str| Version::parse(s).unwrap();
    assert!(v("1.10.0") > v("1.9.9"));
    assert!(v("1.0.0-rc1") < v("1.0.0"));
    assert_eq!(Version::parse("1.0"), None);
}

/// Chains the parser nests one level per link (members, indexes, calls, unary
/// operators) are refused before parsing; the longest allowed parse on a test thread's
/// stack (2 MiB, debug build).
#[test]
fn long_chains_are_refused_before_the_parser_recurses() {
    for link in [".a", "[0]", ".size()", "!", "-", " + 1"] {
        let chain = |n: usize| format!("device{}", link.repeat(n));
        assert_eq!(
            Selector::compile(&chain(1200)).err(),
            Some(CelError::TooDeep),
            "{link}"
        );
        // The longest chain allowed is parsed (or refused for another reason).
        let longest = (1..=MAX_OPERATORS).rev().map(chain);
        let mut allowed = longest.skip_while(|c| check_shape(c).is_err());
        let _ = Selector::compile(&allowed.next().unwrap());
    }
    let nested = format!(
        "{}device{}{}",
        "(".repeat(MAX_NESTING),
        ".a".repeat(MAX_OPERATORS - MAX_NESTING),
        ")".repeat(MAX_NESTING)
    );
    let _ = Selector::compile(&nested);
}
