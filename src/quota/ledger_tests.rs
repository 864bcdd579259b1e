#![allow(clippy::unwrap_used)]
use super::ledger::*;
use crate::config::UntypedPods;
use crate::placement::models::{ModelSource, WantedModels};
use crate::placement::quantity::Milli;
use crate::placement::{ContainerGpu, GpuDemand, GpuRequest};

const RULES: AdmitRules = AdmitRules {
    untyped: UntypedPods::Allow,
    quota_required: false,
};

fn gpus(text: &str) -> Milli {
    Milli::parse(text).unwrap()
}

fn quota(name: &str, hard: &[(&str, &str)], used: &[(&str, &str)]) -> QuotaView {
    let amounts = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(m, a)| (m.to_string(), gpus(a)))
            .collect()
    };
    QuotaView {
        namespace: "team-a".into(),
        name: name.into(),
        hard: amounts(hard),
        used: amounts(used),
    }
}

fn wants(models: &[&str]) -> WantedModels {
    let source = if models.is_empty() {
        ModelSource::Untyped
    } else {
        ModelSource::Annotation
    };
    WantedModels {
        models: models.iter().map(|m| m.to_string()).collect(),
        source,
    }
}

#[test]
fn amounts_follow_the_effective_request_rule_and_count_fractions() {
    let share = |core| ContainerGpu {
        container: 0,
        demand: GpuDemand::Share { core, memory: 1 },
    };
    let cases = [
        (vec![share(50)], None, "0.5"),
        (vec![share(25), share(25)], None, "0.5"),
        (
            vec![ContainerGpu {
                container: 0,
                demand: GpuDemand::Whole { gpus: 2 },
            }],
            None,
            "2",
        ),
        // an init container asking for 3 GPUs dominates
        (vec![share(50)], Some(GpuDemand::Whole { gpus: 3 }), "3"),
        (vec![], Some(GpuDemand::Whole { gpus: 1 }), "1"),
    ];
    for (containers, init, expected) in cases {
        let request = GpuRequest { containers, init };
        assert_eq!(amount_of(&request), gpus(expected), "{request:?}");
    }
}

#[test]
fn single_model_admission_table() {
    struct Case {
        quotas: Vec<QuotaView>,
        model: &'static str,
        amount: &'static str,
        expect: Result<(), &'static str>,
    }
    let cases = [
        Case {
            quotas: vec![quota("default", &[("T4", "2")], &[("T4", "1")])],
            model: "T4",
            amount: "1",
            expect: Ok(()),
        },
        Case {
            quotas: vec![quota("default", &[("T4", "2")], &[("T4", "2")])],
            model: "T4",
            amount: "1",
            expect: Err(
                r#"GPU quota exceeded in namespace "team-a" for T4: requested 1, used 2 of 2 (GPUQuota team-a/default)"#,
            ),
        },
        Case {
            quotas: vec![quota("default", &[("T4", "1.5")], &[("T4", "1")])],
            model: "T4",
            amount: "0.5",
            expect: Ok(()),
        },
        Case {
            quotas: vec![quota("default", &[("T4", "1.5")], &[("T4", "1.25")])],
            model: "T4",
            amount: "0.5",
            expect: Err(
                r#"GPU quota exceeded in namespace "team-a" for T4: requested 0.5, used 1.25 of 1.5 (GPUQuota team-a/default)"#,
            ),
        },
        Case {
            quotas: vec![quota("default", &[("T4", "4")], &[])],
            model: "A100",
            amount: "1",
            expect: Err(
                r#"GPU model A100 is not in any GPUQuota of namespace "team-a" (allowed: T4)"#,
            ),
        },
        // Several quotas: each that lists the model must hold.
        Case {
            quotas: vec![
                quota("team", &[("T4", "10"), ("A100", "2")], &[("T4", "3")]),
                quota("burst", &[("T4", "3")], &[("T4", "3")]),
            ],
            model: "T4",
            amount: "1",
            expect: Err(
                r#"GPU quota exceeded in namespace "team-a" for T4: requested 1, used 3 of 3 (GPUQuota team-a/burst)"#,
            ),
        },
        Case {
            quotas: vec![
                quota("team", &[("T4", "10"), ("A100", "2")], &[]),
                quota("burst", &[("T4", "3")], &[("T4", "3")]),
            ],
            model: "A100",
            amount: "2",
            expect: Ok(()),
        },
    ];
    for case in cases {
        let result = admit(
            "team-a",
            &case.quotas,
            &wants(&[case.model]),
            gpus(case.amount),
            RULES,
        );
        match case.expect {
            Ok(()) => assert_eq!(
                result,
                Ok(Charge::Model {
                    model: case.model.into(),
                    amount: gpus(case.amount)
                })
            ),
            Err(message) => assert_eq!(result.unwrap_err().to_string(), message),
        }
    }
}

#[test]
fn multi_model_pods_are_charged_at_placement_to_a_model_with_room() {
    let quotas = [quota(
        "default",
        &[("V100M16", "1"), ("V100M32", "2")],
        &[("V100M16", "1")],
    )];
    let result = admit(
        "team-a",
        &quotas,
        &wants(&["V100M16", "V100M32"]),
        gpus("1"),
        RULES,
    );
    assert_eq!(
        result,
        Ok(Charge::AtPlacement {
            models: vec!["V100M32".into()]
        })
    );
    let full = [quota(
        "default",
        &[("V100M16", "1"), ("V100M32", "2")],
        &[("V100M16", "1"), ("V100M32", "2")],
    )];
    let err = admit(
        "team-a",
        &full,
        &wants(&["V100M16", "V100M32"]),
        gpus("1"),
        RULES,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"GPU quota exceeded in namespace "team-a" for every model the pod accepts: requested 1; V100M16: used 1 of 1; V100M32: used 2 of 2"#
    );
}

#[test]
fn namespaces_without_quota_follow_the_rules() {
    let deny_untyped = AdmitRules {
        untyped: UntypedPods::Deny,
        quota_required: false,
    };
    assert_eq!(
        admit("free", &[], &wants(&["T4"]), gpus("8"), deny_untyped),
        Ok(Charge::Unlimited)
    );
    assert!(matches!(
        admit("free", &[], &wants(&[]), gpus("1"), deny_untyped),
        Err(Denial::UntypedDenied { .. })
    ));
    assert_eq!(
        admit("free", &[], &wants(&[]), gpus("1"), RULES),
        Ok(Charge::Unlimited)
    );
    let required = AdmitRules {
        untyped: UntypedPods::Allow,
        quota_required: true,
    };
    let err = admit("free", &[], &wants(&["T4"]), gpus("1"), required).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"namespace "free" has no GPUQuota, and GPU pods need one here (quotaRequired)"#
    );
}

#[test]
fn usage_counts_live_pods_of_the_namespace_by_charged_model() {
    let pod = |namespace, model, amount, live| PodCharge {
        namespace,
        model,
        amount: gpus(amount),
        live,
    };
    let used = usage(
        "team-a",
        [
            pod("team-a", Some("T4"), "0.5", true),
            pod("team-a", Some("T4"), "1", true),
            pod("team-a", Some("T4"), "4", false), // finished: no longer charged
            pod("team-a", None, "1", true),        // multi-model, not placed yet
            pod("team-b", Some("T4"), "2", true),
            pod("team-a", Some("A100"), "2", true),
        ],
    );
    assert_eq!(used.get("T4"), Some(&gpus("1.5")));
    assert_eq!(used.get("A100"), Some(&gpus("2")));
    assert_eq!(used.len(), 2);
}

#[test]
fn charged_model_is_the_only_one_or_the_nodes() {
    let one = vec!["T4".to_string()];
    let several = vec!["V100M16".to_string(), "V100M32".to_string()];
    assert_eq!(charged_model(&one, None), Some("T4"));
    assert_eq!(charged_model(&several, None), None);
    assert_eq!(charged_model(&several, Some("V100M32")), Some("V100M32"));
    assert_eq!(charged_model(&several, Some("T4")), None);
    assert_eq!(charged_model(&[], Some("T4")), Some("T4"));
}
