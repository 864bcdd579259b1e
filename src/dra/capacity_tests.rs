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
            min: Some(gib(min)),
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
            min: Some(Milli((1 << 20) * 1000)),
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
    // The default is taken as it is, not rounded by the range.
    let odd_default = RequestPolicy {
        default: Some(gib(3)),
        ..range(0, None, Some(10))
    };
    assert_eq!(consumed(None, gib(80), Some(&odd_default)), Some(gib(3)));
    // No ask and no default: the whole capacity, which the allocator refuses when it is
    // off the range's steps (even below `min`).
    assert_eq!(
        consumed(None, gib(1), Some(&range(5, None, Some(10)))),
        None
    );
    assert_eq!(
        consumed(None, gib(15), Some(&range(5, None, Some(10)))),
        Some(gib(15))
    );
}

/// NVIDIA's driver's `memory` capacity in its `unlimited` mode: a default of zero.
fn unlimited() -> Shared {
    let policy = RequestPolicy {
        default: Some(Milli(0)),
        ..range(0, Some(80), Some(1))
    };
    let memory = Capacity {
        value: gib(80),
        policy: Some(Ok(policy)),
    };
    Shared {
        capacities: [("memory".to_string(), memory)].into(),
    }
}

#[test]
fn a_share_is_the_most_it_takes_of_any_capacity_and_taking_nothing_is_the_whole_device() {
    let device = unlimited();
    let asks = |gi: u64| Asks::from([("memory".to_string(), gib(gi))]);
    assert_eq!(device.share_for(&asks(20)), Some(Milli(250)));
    // 1.5Gi on a 1Gi step takes 2Gi.
    let half = Asks::from([("memory".to_string(), Milli(GI * 1500))]);
    assert_eq!(device.share_for(&half), Some(share(gib(2), gib(80))));
    assert_eq!(
        device.share_for(&Asks::new()),
        Some(WHOLE),
        "consumes nothing"
    );
    assert_eq!(device.share_for(&asks(81)), None, "past the device");
    let cores = Asks::from([("cores".to_string(), Milli(1000))]);
    assert_eq!(
        device.share_for(&cores),
        None,
        "a capacity it does not have"
    );
    // A second capacity with no policy is taken whole by every allocation.
    let mut two = unlimited();
    let shares = Capacity {
        value: Milli(4000),
        policy: None,
    };
    two.capacities.insert("shares".into(), shares);
    assert_eq!(two.share_for(&asks(20)), Some(WHOLE));
    let quarter = Asks::from([("memory".into(), gib(20)), ("shares".into(), Milli(1000))]);
    assert_eq!(two.share_for(&quarter), Some(Milli(250)));
    // Recorded consumption is charged the same way.
    assert_eq!(two.share_of_consumed(&quarter), Milli(250));
    assert_eq!(
        two.share_of_consumed(&asks(20)),
        WHOLE,
        "shares not recorded"
    );
    // An unreadable policy: the capacity is taken whole.
    let mut unread = unlimited();
    unread.capacities.get_mut("memory").unwrap().policy = Some(Err(PolicyError::ZeroStep));
    assert_eq!(unread.share_for(&asks(20)), Some(WHOLE));
}

#[test]
fn a_charge_scaled_by_a_share_is_rounded_up() {
    let whole = crate::quota::ModelAmounts::from([("A100".to_string(), Milli(3000))]);
    assert_eq!(scaled(&whole, Milli(333))["A100"], Milli(999));
    let one = crate::quota::ModelAmounts::from([("A100".to_string(), Milli(1000))]);
    assert_eq!(scaled(&one, Milli(1))["A100"], Milli(1));
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
            proptest::option::of(amount.clone()),
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
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

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
        // An amount the policy allows; its default always is.
        let default = policy.as_ref().and_then(|p| p.default);
        match policy.as_ref().map(|p| &p.valid).filter(|_| Some(taken) != default) {
            Some(Valid::Values(values)) => prop_assert!(values.contains(&taken)),
            Some(Valid::Range { min: Some(min), max, step }) => {
                // The allocator checks max and step; an ask is raised to min.
                prop_assert!(ask.is_none() || taken >= *min);
                prop_assert!(max.is_none_or(|max| taken <= max));
                if let Some(step) = step {
                    prop_assert_eq!(taken.0.abs_diff(min.0) % step.0, 0);
                }
            }
            _ => {}
        }
        let charged = share(taken, value);
        prop_assert!(u128::from(charged.0) * u128::from(value.0) >= u128::from(taken.0) * 1000);
        prop_assert!(charged <= Milli(1000));
    }
}
