#![allow(clippy::unwrap_used)]

use super::functions::Version;
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
    assert!(matches!(
        Selector::compile(pattern).unwrap_err(),
        CelError::Pattern(_)
    ));
    let computed = r#""a".matches("a" + "b")"#;
    assert_eq!(
        Selector::compile(computed).unwrap_err(),
        CelError::PatternNotLiteral
    );
    assert!(matches!(
        Selector::compile("device.("),
        Err(CelError::Parse(_))
    ));
}

#[test]
fn a_claims_evaluations_share_one_budget() {
    let selector = Selector::compile("true").unwrap();
    let mut budget = CostBudget::new((EVALUATION_PRICE + selector.cost) * 2);
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

/// A device whose model attribute is `product`.
fn named(product: &str) -> CelDevice {
    let attributes = [(
        "gpu.nvidia.com".to_string(),
        [(
            "productName".to_string(),
            AttributeValue::String(product.into()),
        )]
        .into(),
    )]
    .into();
    CelDevice::new("gpu.nvidia.com", &attributes, &BTreeMap::new())
}

/// What one evaluation of `expression` on `device` spends of a claim's budget.
fn spent(expression: &str, device: &CelDevice) -> u64 {
    let selector = Selector::compile(expression).unwrap();
    let mut budget = CostBudget::claim();
    selector.matches(device, &mut budget).unwrap();
    CLAIM_BUDGET - budget.left()
}

/// The issue's term: the `cel` crate compiled `\w+` (some 300 µs) on every call. A
/// pattern is compiled once per claim, charged once, and each match is charged by the
/// length of what it reads.
#[test]
fn a_pattern_is_compiled_once_per_claim_and_its_matches_priced_by_length() {
    let expression = vec![r#""".matches("\\w+")"#; 64].join(" || ");
    let parse = PARSE_PRICE + expression.len() as u64 * PARSE_UNITS_PER_BYTE;
    let mut budget = CostBudget::claim();
    Selector::compile_within(&expression, &mut budget)
        .unwrap()
        .unwrap();
    assert_eq!(CLAIM_BUDGET - budget.left(), parse + COMPILE_PRICE);
    let before = budget.left();
    Selector::compile_within(&expression, &mut budget)
        .unwrap()
        .unwrap();
    assert_eq!(before - budget.left(), parse, "compiled once per claim");
    let reads = r#"device.attributes["gpu.nvidia.com"].productName.matches("^\\w+$")"#;
    let short = spent(reads, &named("T4"));
    let long = spent(reads, &named(&"T".repeat(6400)));
    assert!(long > short + 1000, "{long} against {short}");
}

/// A selector whose syntax tree is cheap but whose values are long: the meter charges
/// what it reads while it runs, and stops it when the budget is spent.
#[test]
fn a_selectors_work_on_long_strings_is_charged_by_their_length() {
    let word = format!("\"{}\"", "w".repeat(9000));
    let compares = vec!["x == x"; 20].join(" && ");
    let expression = format!("[{word}].all(x, {compares})");
    let selector = Selector::compile(&expression).unwrap();
    let cost = spent(&expression, &named("T4"));
    // 40 reads of 9,000 bytes, at a unit per 64.
    assert!(cost > 40 * 9000 / 64, "{cost}");
    assert!(cost > 5 * selector.cost, "{cost} against {}", selector.cost);
}

#[test]
fn an_evaluation_is_stopped_by_its_budget_while_it_runs() {
    let device = named(&"T".repeat(64 * 1024));
    let expression = r#"device.attributes["gpu.nvidia.com"].productName == device.attributes["gpu.nvidia.com"].productName"#;
    let selector = Selector::compile(expression).unwrap();
    // Enough for its syntax tree, not for reading 64 KiB twice.
    let mut budget = CostBudget::new(EVALUATION_PRICE + selector.cost + 100);
    assert_eq!(selector.matches(&device, &mut budget), Err(OverBudget));
    let mut budget = CostBudget::claim();
    assert_eq!(selector.matches(&device, &mut budget), Ok(true));
    // The range of a loop is paid for before the loop runs.
    let numbers = (0..90).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let looped = Selector::compile(&format!("[{numbers}].exists(x, x < 0)")).unwrap();
    let mut budget = CostBudget::new(EVALUATION_PRICE + looped.cost + 50);
    assert_eq!(looped.matches(&device, &mut budget), Err(OverBudget));
}
