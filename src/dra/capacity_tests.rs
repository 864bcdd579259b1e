#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

const GI: u64 = 1 << 30;

/// `n` GiB, in the capacity's units (bytes) as thousandths.
fn gib(n: u64) -> Milli {
    Milli(n * GI * 1000)
}

fn range(min: u64, max: Option<u64>, step: Option<u64>) -> RequestPolicy {
    RequestPolicy {
        default: None,
        valid: Valid::Range {
            min: gib(min),
            max: max.map(gib),
            step: step.map(gib),
        },
    }
}

#[test]
fn four_quarters_of_a_gpu_are_one_gpu() {
    // NVIDIA's driver: an 80Gi memory capacity on a 1Mi step.
    let policy = RequestPolicy {
        default: None,
        valid: Valid::Range {
            min: Milli((1 << 20) * 1000),
            max: None,
            step: Some(Milli((1 << 20) * 1000)),
        },
    };
    let quarter = consumed(Some(gib(20)), gib(80), Some(&policy)).unwrap();
    assert_eq!(quarter, gib(20));
    assert_eq!(share(quarter, gib(80)), Milli(250));
}

#[test]
fn a_request_that_names_no_amount_takes_the_default_or_the_whole_device() {
    let whole = consumed(None, gib(80), None).unwrap();
    assert_eq!(share(whole, gib(80)), Milli(1000));
    let with_default = RequestPolicy {
        default: Some(gib(10)),
        valid: Valid::Any,
    };
    let default = consumed(None, gib(80), Some(&with_default)).unwrap();
    assert_eq!(share(default, gib(80)), Milli(125));
    let without_default = range(1, None, None);
    let all = consumed(None, gib(80), Some(&without_default)).unwrap();
    assert_eq!(all, gib(80));
}

#[test]
fn the_ask_is_rounded_up_as_the_allocator_rounds_it() {
    // Below min: min. Between: min plus whole steps.
    let tens = range(10, None, Some(10));
    assert_eq!(consumed(Some(gib(1)), gib(80), Some(&tens)), Some(gib(10)));
    assert_eq!(consumed(Some(gib(11)), gib(80), Some(&tens)), Some(gib(20)));
    let odd = range(1, None, Some(2));
    assert_eq!(consumed(Some(gib(4)), gib(80), Some(&odd)), Some(gib(5)));
    // Past max, or past the capacity, after rounding: no such device for it.
    let capped = range(10, Some(40), Some(10));
    assert_eq!(consumed(Some(gib(41)), gib(80), Some(&capped)), None);
    assert_eq!(consumed(Some(gib(81)), gib(80), None), None);
    let values = RequestPolicy {
        default: None,
        valid: Valid::Values(vec![gib(10), gib(20), gib(40)]),
    };
    assert_eq!(
        consumed(Some(gib(15)), gib(80), Some(&values)),
        Some(gib(20))
    );
    assert_eq!(consumed(Some(gib(50)), gib(80), Some(&values)), None);
}

#[test]
fn a_policy_is_read_as_published_and_bad_ones_are_named() {
    let wire: WirePolicy = serde_json::from_value(serde_json::json!(
        {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Mi"}}
    ))
    .unwrap();
    let policy = RequestPolicy::from_wire(&wire).unwrap();
    assert_eq!(policy.default, Some(gib(1)));
    assert!(matches!(policy.valid, Valid::Range { max: None, .. }));
    let zero: WirePolicy =
        serde_json::from_value(serde_json::json!({"validRange": {"step": "0"}})).unwrap();
    assert_eq!(RequestPolicy::from_wire(&zero), Err(PolicyError::ZeroStep));
    let many: WirePolicy = serde_json::from_value(serde_json::json!(
        {"validValues": (1..=20).map(|i| format!("{i}Gi")).collect::<Vec<_>>()}
    ))
    .unwrap();
    assert_eq!(
        RequestPolicy::from_wire(&many),
        Err(PolicyError::TooManyValues(20))
    );
    let bad: WirePolicy = serde_json::from_value(serde_json::json!({"default": "x"})).unwrap();
    let error = RequestPolicy::from_wire(&bad).unwrap_err();
    assert!(error.to_string().contains("default"), "{error}");
}

fn policies() -> impl Strategy<Value = Option<RequestPolicy>> {
    let amount = (0u64..200).prop_map(|n| Milli(n * 1000));
    let valid = prop_oneof![
        Just(Valid::Any),
        (
            amount.clone(),
            proptest::option::of(amount.clone()),
            proptest::option::of((1u64..50).prop_map(|n| Milli(n * 1000)))
        )
            .prop_map(|(min, max, step)| Valid::Range { min, max, step }),
        proptest::collection::vec(amount.clone(), 1..10).prop_map(|mut v| {
            v.sort();
            v.dedup();
            Valid::Values(v)
        }),
    ];
    proptest::option::of((proptest::option::of(amount), valid))
        .prop_map(|p| p.map(|(default, valid)| RequestPolicy { default, valid }))
}

proptest! {
    /// Whatever is asked, what is consumed is at least the ask, within the device, and an
    /// amount the policy allows; and the share charged is at least what it takes of the
    /// device.
    #[test]
    fn what_is_consumed_is_never_less_than_asked_and_always_allowed(
        ask in proptest::option::of((0u64..250).prop_map(|n| Milli(n * 1000))),
        value in (1u64..250).prop_map(|n| Milli(n * 1000)),
        policy in policies(),
    ) {
        let Some(taken) = consumed(ask, value, policy.as_ref()) else {
            return Ok(());
        };
        prop_assert!(taken <= value);
        if let Some(ask) = ask {
            prop_assert!(taken >= ask);
        }
        match policy.as_ref().map(|p| &p.valid) {
            Some(Valid::Values(values)) => prop_assert!(values.contains(&taken)),
            Some(Valid::Range { min, max, step }) => {
                prop_assert!(taken >= *min);
                prop_assert!(max.is_none_or(|max| taken <= max));
                if let Some(step) = step {
                    prop_assert_eq!((taken.0 - min.0) % step.0, 0);
                }
            }
            _ => {}
        }
        let charged = share(taken, value);
        prop_assert!(u128::from(charged.0) * u128::from(value.0) >= u128::from(taken.0) * 1000);
        prop_assert!(charged <= Milli(1000));
    }
}
