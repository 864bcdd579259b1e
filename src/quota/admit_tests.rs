#![allow(clippy::unwrap_used)]
use super::*;
use crate::config::UntypedPods;
use crate::placement::models::{ModelSource, WantedModels};
use crate::placement::quantity::Milli;
use crate::placement::{ContainerGpu, GpuDemand, GpuRequest};
use crate::placement::{MigResources, NodeGpus};
use crate::quota::{NamespaceLimits, OnExceed};

const RULES: AdmitRules = AdmitRules {
    untyped: UntypedPods::Allow,
    quota_required: false,
};

/// Costs of `amount` on each of `labels`' model keys (no MIG).
fn flat(labels: &[impl AsRef<str>], amount: Milli) -> Costs {
    Costs::from_charges(
        labels
            .iter()
            .map(|l| {
                (
                    l.as_ref().to_string(),
                    [(l.as_ref().to_string(), amount)].into(),
                )
            })
            .collect(),
    )
}

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
        on_exceed: OnExceed::Deny,
        cohort: None,
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
        let request = GpuRequest {
            containers,
            init,
            ..Default::default()
        };
        let charge = charge_on(&request, "T4", &MigResources::default());
        assert_eq!(
            charge,
            [("T4".to_string(), gpus(expected))].into(),
            "{request:?}"
        );
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
            &flat(&[case.model], gpus(case.amount)),
            RULES,
        );
        match case.expect {
            Ok(()) => assert_eq!(
                result,
                Ok(Charge::Model {
                    model: case.model.into(),
                    charge: [(case.model.to_string(), gpus(case.amount))].into(),
                    over: vec![],
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
        &flat(&["V100M16", "V100M32"], gpus("1")),
        RULES,
    );
    assert_eq!(
        result,
        Ok(Charge::AtPlacement {
            models: vec!["V100M32".into()],
            over: vec![],
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
        &flat(&["V100M16", "V100M32"], gpus("1")),
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
        admit(
            "free",
            &[],
            &wants(&["T4"]),
            &flat(&["T4"], gpus("8")),
            deny_untyped
        ),
        Ok(Charge::Unlimited)
    );
    assert!(matches!(
        admit(
            "free",
            &[],
            &wants(&[]),
            &flat(&[] as &[&str], gpus("1")),
            deny_untyped
        ),
        Err(Denial::UntypedDenied { .. })
    ));
    assert_eq!(
        admit(
            "free",
            &[],
            &wants(&[]),
            &flat(&[] as &[&str], gpus("1")),
            RULES
        ),
        Ok(Charge::Unlimited)
    );
    let required = AdmitRules {
        untyped: UntypedPods::Allow,
        quota_required: true,
    };
    let err = admit(
        "free",
        &[],
        &wants(&["T4"]),
        &flat(&["T4"], gpus("1")),
        required,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"namespace "free" has no GPUQuota, and GPU pods need one here (quotaRequired)"#
    );
}

#[test]
fn usage_counts_live_pods_of_the_namespace_by_charged_model() {
    let pod = |namespace, model: Option<&str>, amount, live| PodCharge {
        namespace,
        charge: model
            .map(|m| [(m.to_string(), gpus(amount))].into())
            .unwrap_or_default(),
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
fn a_pod_is_charged_by_its_only_model_or_by_its_nodes_label() {
    let one = vec!["T4".to_string()];
    let several = vec!["V100M16".to_string(), "V100M32".to_string()];
    assert_eq!(ChargedAt::of(&one).label(None, |m| m), Some("T4"));
    assert_eq!(ChargedAt::of(&several).label(None, |m| m), None);
    assert_eq!(
        ChargedAt::of(&several).label(Some("V100M32"), |m| m),
        Some("V100M32")
    );
    // A node of a model the pod does not accept (only around admission): usage is
    // what the pod uses.
    assert_eq!(ChargedAt::of(&several).label(Some("T4"), |m| m), Some("T4"));
    assert_eq!(ChargedAt::of(&[]).label(Some("T4"), |m| m), Some("T4"));
}

#[test]
fn a_model_no_quota_lists_has_no_room_once_the_namespace_has_a_quota() {
    // The extender asks `room` for the node's model of a pod that accepts
    // "Tesla-T4,A100-SXM4-80GB": an A100 node must not pass where only T4 is listed.
    let quotas = [quota("default", &[("Tesla-T4", "4")], &[])];
    let refused = room(
        &quotas,
        "A100-SXM4-80GB",
        &[("A100-SXM4-80GB".to_string(), gpus("1"))].into(),
    )
    .unwrap_err();
    assert_eq!((refused.hard, refused.used), (gpus("0"), gpus("0")));
    assert_eq!(
        Denial::Exceeded(refused).to_string(),
        r#"GPU quota exceeded in namespace "team-a" for A100-SXM4-80GB: requested 1, used 0 of 0 (GPUQuota team-a/default)"#
    );
    assert_eq!(
        room(
            &quotas,
            "Tesla-T4",
            &[("Tesla-T4".to_string(), gpus("4"))].into()
        ),
        Ok(())
    );
    // Several quotas, none listing the model: each is named.
    let two = [
        quota("default", &[("Tesla-T4", "4")], &[]),
        quota("burst", &[("V100", "1")], &[]),
    ];
    let refused = room(
        &two,
        "A100-SXM4-80GB",
        &[("A100-SXM4-80GB".to_string(), gpus("1"))].into(),
    )
    .unwrap_err();
    assert_eq!(refused.quota, "team-a/default, team-a/burst");
    // No quota at all: no limit.
    assert_eq!(
        room(
            &[],
            "A100-SXM4-80GB",
            &[("A100-SXM4-80GB".to_string(), gpus("8"))].into()
        ),
        Ok(())
    );
}

fn limits(pools: &[&str]) -> NamespaceLimits {
    NamespaceLimits {
        has_quota: true,
        default_type: None,
        models: vec!["Tesla-T4".into(), "A100".into()],
        profile_caps: Vec::new(),
        pools: pools.iter().map(|p| p.to_string()).collect(),
        queued_models: Vec::new(),
    }
}

fn gpu_node(model: Option<&str>, pool: Option<&str>) -> NodeGpus {
    NodeGpus {
        name: "n1".into(),
        model: model.map(Into::into),
        pool: pool.map(Into::into),
        memory_per_gpu: 4,
        used: vec![Default::default(); 4],
        mig_slices: Vec::new(),
        created: 0,
        closed: None,
    }
}

#[test]
fn a_pod_created_on_a_node_is_charged_to_that_nodes_model() {
    // Three pods accepting T4 or A100, created on an A100 node (no scheduler, so no
    // placement to charge them): each is charged to A100 at admission.
    let a100 = gpu_node(Some("A100"), None);
    let route = Arrival::Bound {
        node: "n1",
        gpus: Some(&a100),
    };
    let either = wants(&["Tesla-T4", "A100"]);
    let wanted = models_for_arrival("team-a", &limits(&[]), either.clone(), route).unwrap();
    assert_eq!(wanted.models, vec!["A100".to_string()]);
    let mut quotas = [quota("default", &[("Tesla-T4", "4"), ("A100", "1")], &[])];
    let mut verdicts = Vec::new();
    for _ in 0..3 {
        let verdict = admit(
            "team-a",
            &quotas,
            &wanted,
            &flat(&wanted.models, gpus("1")),
            RULES,
        );
        if let Ok(Charge::Model { charge, .. }) = &verdict {
            quotas[0].used.extend(charge.clone());
        }
        verdicts.push(verdict.map_err(|d| d.to_string()));
    }
    assert_eq!(
        verdicts,
        [
            Ok(Charge::Model {
                model: "A100".into(),
                charge: [("A100".to_string(), gpus("1"))].into(),
                over: vec![],
            }),
            Err(r#"GPU quota exceeded in namespace "team-a" for A100: requested 1, used 1 of 1 (GPUQuota team-a/default)"#.into()),
            Err(r#"GPU quota exceeded in namespace "team-a" for A100: requested 1, used 1 of 1 (GPUQuota team-a/default)"#.into()),
        ]
    );
}

#[test]
fn a_pod_created_on_a_node_it_cannot_be_charged_to_is_denied() {
    let refused = |wanted: &[&str], pools: &[&str], node: Option<&NodeGpus>| {
        let route = Arrival::Bound {
            node: "n1",
            gpus: node,
        };
        models_for_arrival("team-a", &limits(pools), wants(wanted), route)
            .unwrap_err()
            .to_string()
    };
    let t4 = gpu_node(Some("Tesla-T4"), Some("private"));
    assert_eq!(
        refused(&["A100"], &[], Some(&t4)),
        r#"the pod is bound to node "n1" (spec.nodeName), whose GPU model Tesla-T4 is not one the pod accepts (A100); a pod created on a node is charged to that node's GPU model"#
    );
    assert_eq!(
        refused(&["Tesla-T4"], &["public"], Some(&t4)),
        r#"the pod is bound to node "n1" (spec.nodeName), whose node pool private is not one namespace "team-a" may use (public)"#
    );
    assert_eq!(
        refused(&["Tesla-T4"], &[], Some(&gpu_node(None, None))),
        r#"the pod is bound to node "n1" (spec.nodeName), which has no GPU model label; namespace "team-a" has a GPUQuota and a pod created on a node is charged to that node's GPU model"#
    );
    assert_eq!(
        refused(&["Tesla-T4"], &[], None),
        r#"the pod is bound to node "n1" (spec.nodeName), which gpu-admission does not know as a GPU node; namespace "team-a" has a GPUQuota and a pod created on a node is charged to that node's GPU model"#
    );
    // Without a quota nothing is charged, so nothing about the node matters.
    let free = NamespaceLimits::default();
    let route = Arrival::Bound {
        node: "n1",
        gpus: None,
    };
    let either = wants(&["Tesla-T4", "A100"]);
    assert_eq!(
        models_for_arrival("free", &free, either.clone(), route),
        Ok(either)
    );
}

#[test]
fn a_multi_model_pod_must_be_placed_by_the_gpu_scheduler() {
    let other = |name| Arrival::OtherScheduler {
        name,
        gpu_scheduler: "gpu-scheduler",
        type_annotation: "gpu-admission.io/gpu-type",
    };
    let either = wants(&["Tesla-T4", "A100"]);
    for name in ["", "default-scheduler"] {
        let denial =
            models_for_arrival("team-a", &limits(&[]), either.clone(), other(name)).unwrap_err();
        assert_eq!(
            denial.to_string(),
            r#"the pod accepts several GPU models (Tesla-T4,A100) and is scheduled by "default-scheduler", so the GPU quota of namespace "team-a" cannot charge it to the model it lands on; name one model in the gpu-admission.io/gpu-type annotation, or use schedulerName "gpu-scheduler""#
        );
    }
    let one = wants(&["A100"]);
    assert_eq!(
        models_for_arrival("team-a", &limits(&[]), one.clone(), other("volcano")),
        Ok(one)
    );
    assert_eq!(
        models_for_arrival(
            "team-a",
            &limits(&[]),
            either.clone(),
            Arrival::GpuScheduler
        ),
        Ok(either.clone())
    );
    let free = NamespaceLimits::default();
    assert_eq!(
        models_for_arrival("free", &free, either.clone(), other("")),
        Ok(either)
    );
}

#[test]
fn a_quota_reports_its_models_and_those_no_quota_lists() {
    let usage: ModelAmounts = [
        ("Tesla-T4".to_string(), gpus("1")),
        ("A100".to_string(), gpus("2")),
        ("H100".to_string(), gpus("1")),
    ]
    .into();
    let listed = ["Tesla-T4".to_string(), "A100".to_string()];
    // This quota lists T4; A100 is another quota's; H100 nobody's (a bypass).
    let reported = reported_usage(&usage, |m| m == "Tesla-T4", &listed);
    assert_eq!(
        reported,
        [
            ("H100".to_string(), gpus("1")),
            ("Tesla-T4".to_string(), gpus("1"))
        ]
        .into()
    );
}

fn warn(mut view: QuotaView) -> QuotaView {
    view.on_exceed = OnExceed::Warn;
    view
}

/// [`admit`] of a pod wanting one GPU and accepting `models`.
fn one_gpu(quotas: &[QuotaView], models: &[&str]) -> Result<Charge, Denial> {
    admit(
        "team-a",
        quotas,
        &wants(models),
        &flat(models, gpus("1")),
        RULES,
    )
}

#[test]
fn a_warn_quota_admits_past_hard_and_says_by_how_much() {
    let quotas = [warn(quota("audit", &[("A100", "2")], &[("A100", "2")]))];
    let admitted = one_gpu(&quotas, &["A100"]);
    let Ok(Charge::Model { charge, over, .. }) = admitted else {
        panic!("a Warn quota must admit: {admitted:?}");
    };
    assert_eq!(charge, [("A100".to_string(), gpus("1"))].into());
    assert_eq!(
        over,
        [Exceeded {
            model: "A100".into(),
            requested: gpus("1"),
            used: gpus("2"),
            hard: gpus("2"),
            quota: "team-a/audit".into(),
            listed: true,
            cohort: None,
        }]
    );
    // Within hard: admitted, nothing to report.
    let roomy = [warn(quota("audit", &[("A100", "2")], &[]))];
    let admitted = one_gpu(&roomy, &["A100"]);
    assert!(matches!(admitted, Ok(Charge::Model { over, .. }) if over.is_empty()));
}

#[test]
fn a_deny_quota_beside_a_warn_quota_still_refuses() {
    let quotas = [
        warn(quota("audit", &[("A100", "1")], &[("A100", "1")])),
        quota("enforced", &[("A100", "4")], &[("A100", "4")]),
    ];
    let denial = one_gpu(&quotas, &["A100"]).unwrap_err();
    assert!(
        denial.to_string().contains("GPUQuota team-a/enforced"),
        "{denial}"
    );
    // The enforced quota with room: admitted, the Warn quota reported.
    let quotas = [
        warn(quota("audit", &[("A100", "1")], &[("A100", "1")])),
        quota("enforced", &[("A100", "4")], &[]),
    ];
    let Ok(Charge::Model { over, .. }) = one_gpu(&quotas, &["A100"]) else {
        panic!("the enforced quota has room");
    };
    assert_eq!(over.len(), 1);
    assert_eq!(over[0].quota, "team-a/audit");
}

#[test]
fn a_model_no_warn_quota_lists_is_admitted_and_reported_as_unlisted() {
    let quotas = [warn(quota("audit", &[("T4", "8")], &[]))];
    let admitted = one_gpu(&quotas, &["A100"]);
    let Ok(Charge::Model { model, over, .. }) = admitted else {
        panic!("all quotas say Warn: nothing is refused, {admitted:?}");
    };
    assert_eq!(model, "A100");
    assert_eq!(
        (over[0].model.as_str(), over[0].hard, over[0].listed),
        ("A100", gpus("0"), false)
    );
    // Once one quota enforces, an unlisted model is refused as before.
    let quotas = [
        warn(quota("audit", &[("T4", "8")], &[])),
        quota("enforced", &[("T4", "8")], &[]),
    ];
    let denial = one_gpu(&quotas, &["A100"]).unwrap_err();
    assert!(matches!(denial, Denial::ModelNotAllowed { .. }), "{denial}");
}

#[test]
fn a_multi_model_pod_under_a_full_warn_quota_goes_to_placement_with_its_warnings() {
    let quotas = [warn(quota(
        "audit",
        &[("T4", "1"), ("A100", "1")],
        &[("T4", "1"), ("A100", "1")],
    ))];
    let Ok(Charge::AtPlacement { models, over }) = one_gpu(&quotas, &["T4", "A100"]) else {
        panic!("a Warn quota refuses no model");
    };
    assert_eq!(models, ["T4", "A100"]);
    assert_eq!(over.len(), 2);
    // Placement's room check is the same rule: a Warn quota never takes a node away.
    assert_eq!(
        room(&quotas, "A100", &flat(&["A100"], gpus("1")).on("A100")),
        Ok(())
    );
}

/// Mixed modes per model: the T4 quota enforces and is full, the A100 quota only warns.
/// A pod accepting both may go only to A100 nodes, with the warning; a T4-only pod is
/// refused; MIG profile caps in a Warn quota do not refuse either.
#[test]
fn each_quota_keeps_its_own_mode_for_a_pod_that_accepts_several_models() {
    let quotas = [
        quota("t4", &[("T4", "1")], &[("T4", "1")]),
        warn(quota(
            "a100",
            &[("A100", "1"), ("A100/1g.10gb", "0")],
            &[("A100", "1")],
        )),
    ];
    let Ok(Charge::AtPlacement { models, over }) = one_gpu(&quotas, &["T4", "A100"]) else {
        panic!("the A100 quota only warns");
    };
    assert_eq!(models, ["A100"], "the full T4 quota enforces");
    assert_eq!((over.len(), over[0].quota.as_str()), (1, "team-a/a100"));
    assert!(one_gpu(&quotas, &["T4"]).is_err());
    let t4 = flat(&["T4"], gpus("1")).on("T4");
    assert!(
        room(&quotas, "T4", &t4).is_err(),
        "placement refuses T4 nodes"
    );
    let slice: ModelAmounts = [
        ("A100".to_string(), gpus("0.125")),
        ("A100/1g.10gb".to_string(), gpus("1")),
    ]
    .into();
    assert_eq!(room(&quotas, "A100", &slice), Ok(()), "a Warn profile cap");
    let warned = super::admit::over_warn_quotas(&quotas, "A100", &slice);
    let keys: Vec<&str> = warned.iter().map(|e| e.model.as_str()).collect();
    assert_eq!(keys, ["A100", "A100/1g.10gb"]);
}
