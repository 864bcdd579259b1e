//! MIG charging: what a slice costs its model and its profile's key, in both of the
//! device plugin's strategies, and profile caps at admission and placement.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::config::UntypedPods;
use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;
use crate::placement::testing::pod_with;
use crate::placement::{GpuRequest, MigResources, ResourceNames};
use crate::quota::OnExceed;

const RULES: AdmitRules = AdmitRules {
    untyped: UntypedPods::Allow,
    quota_required: false,
};

fn request(resources: &[(&str, &str)]) -> GpuRequest {
    GpuRequest::from_pod(&pod_with(&[resources]), &ResourceNames::default())
        .unwrap()
        .unwrap()
}

fn amounts(pairs: &[(&str, u64)]) -> ModelAmounts {
    pairs
        .iter()
        .map(|(k, milli)| (k.to_string(), Milli(*milli)))
        .collect()
}

fn quota(hard: &[(&str, u64)], used: &[(&str, u64)]) -> QuotaView {
    QuotaView {
        namespace: "team-a".into(),
        name: "gpus".into(),
        hard: amounts(hard),
        used: amounts(used),
        on_exceed: OnExceed::Deny,
        cohort: None,
    }
}

#[test]
fn mixed_strategy_slices_cost_their_fraction_and_one_each_on_the_profile() {
    let mig = MigResources::default();
    let two = request(&[("nvidia.com/mig-1g.10gb", "2")]);
    assert_eq!(
        charge_on(&two, "A100-SXM4-80GB", &mig),
        amounts(&[("A100-SXM4-80GB", 284), ("A100-SXM4-80GB/1g.10gb", 2000)])
    );
    let mixed = request(&[("nvidia.com/mig-3g.40gb", "1"), ("nvidia.com/gpu", "1")]);
    assert_eq!(
        charge_on(&mixed, "A100-SXM4-80GB", &mig),
        amounts(&[("A100-SXM4-80GB", 1428), ("A100-SXM4-80GB/3g.40gb", 1000)])
    );
}

#[test]
fn single_strategy_gpus_on_a_mig_node_are_slices_of_its_profile() {
    let mig = MigResources::default();
    let one = request(&[("nvidia.com/gpu", "1")]);
    assert_eq!(
        charge_on(&one, "A100-SXM4-40GB-MIG-1g.5gb", &mig),
        amounts(&[("A100-SXM4-40GB", 142), ("A100-SXM4-40GB/1g.5gb", 1000)])
    );
    // The same pod on a whole GPU of the model: one GPU.
    assert_eq!(
        charge_on(&one, "A100-SXM4-40GB", &mig),
        amounts(&[("A100-SXM4-40GB", 1000)])
    );
    // A pod that wants the model is charged the slice once it is on a slice node.
    let wanted = ["A100-SXM4-40GB".to_string()];
    assert_eq!(
        ChargedAt::of(&wanted).label(Some("A100-SXM4-40GB-MIG-1g.5gb"), |m| m),
        Some("A100-SXM4-40GB-MIG-1g.5gb")
    );
    assert_eq!(
        ChargedAt::of(&wanted).label(Some("Tesla-T4"), |m| m),
        Some("A100-SXM4-40GB")
    );
}

#[test]
fn seven_slices_fit_a_quota_of_one_gpu_and_a_profile_cap_holds() {
    let mig = MigResources::default();
    let label = "A100-SXM4-40GB-MIG-1g.5gb";
    let one = request(&[("nvidia.com/gpu", "1")]);
    let costs = Costs::of(&one, &[label.to_string()], &mig);
    // Quota of one GPU, no profile cap: seven 1g slices are admitted, the eighth is not.
    let mut gpu = [quota(&[("A100-SXM4-40GB", 1000)], &[])];
    let mut admitted = 0;
    while let Ok(Charge::Model { charge, .. }) =
        admit("team-a", &gpu, &WantedModels::one(label), &costs, RULES)
    {
        for (key, amount) in charge {
            let used = gpu[0].used.entry(key).or_default();
            used.0 += amount.0;
        }
        admitted += 1;
    }
    assert_eq!(admitted, 7);
    // A cap of two 1g.5gb slices: the third is refused, naming the profile.
    let capped = [quota(
        &[("A100-SXM4-40GB", 4000), ("A100-SXM4-40GB/1g.5gb", 2000)],
        &[("A100-SXM4-40GB", 284), ("A100-SXM4-40GB/1g.5gb", 2000)],
    )];
    let denial = admit("team-a", &capped, &WantedModels::one(label), &costs, RULES).unwrap_err();
    assert_eq!(
        denial.to_string(),
        r#"GPU quota exceeded in namespace "team-a" for A100-SXM4-40GB/1g.5gb: requested 1, used 2 of 2 (GPUQuota team-a/gpus)"#
    );
}

#[test]
fn a_profile_key_alone_does_not_allow_a_model() {
    let mig = MigResources::default();
    let slice = request(&[("nvidia.com/mig-1g.10gb", "1")]);
    let label = "H100-80GB-HBM3";
    let costs = Costs::of(&slice, &[label.to_string()], &mig);
    let only_profile = [quota(&[("H100-80GB-HBM3/1g.10gb", 4000)], &[])];
    let denial = admit(
        "team-a",
        &only_profile,
        &WantedModels::one(label),
        &costs,
        RULES,
    )
    .unwrap_err();
    assert!(
        denial
            .to_string()
            .contains("GPU model H100-80GB-HBM3 is not in any GPUQuota"),
        "{denial}"
    );
    let both = [quota(
        &[("H100-80GB-HBM3", 1000), ("H100-80GB-HBM3/1g.10gb", 4000)],
        &[],
    )];
    assert!(matches!(
        admit("team-a", &both, &WantedModels::one(label), &costs, RULES),
        Ok(Charge::Model { .. })
    ));
}

#[test]
fn unlisted_profile_keys_are_not_reported_but_listed_ones_are() {
    let usage = amounts(&[
        ("A100", 428),
        ("A100/1g.10gb", 3000),
        ("A100/3g.40gb", 1000),
    ]);
    let listed = ["A100".to_string()];
    let reported = reported_usage(&usage, |k| k == "A100" || k == "A100/1g.10gb", &listed);
    assert_eq!(reported, amounts(&[("A100", 428), ("A100/1g.10gb", 3000)]));
}

#[test]
fn a_pending_pod_is_charged_by_the_dearest_label_of_its_model_that_could_take_it() {
    let mig = MigResources::default();
    let one = request(&[("nvidia.com/gpu", "1")]);
    let free = crate::quota::NamespaceLimits::default();
    let model = "A100-SXM4-40GB";
    let pick = |labels: &[&'static str], limits| {
        pending_label(&one, model, labels.iter().copied(), limits, &mig)
    };
    // No node of the model: whole GPUs; a whole-GPU node among slices: whole GPUs.
    assert_eq!(pick(&["Tesla-T4"], &free), model);
    let mixed = ["A100-SXM4-40GB-MIG-1g.5gb", model];
    assert_eq!(pick(&mixed, &free), model);
    // Sliced only: the dearest slice.
    let sliced = [
        "A100-SXM4-40GB-MIG-1g.5gb",
        "A100-SXM4-40GB-MIG-3g.20gb",
        "Tesla-T4",
    ];
    assert_eq!(pick(&sliced, &free), "A100-SXM4-40GB-MIG-3g.20gb");
    // A capped profile takes only pods that name it.
    let capped = crate::quota::NamespaceLimits {
        profile_caps: vec!["A100-SXM4-40GB/3g.20gb".into()],
        ..Default::default()
    };
    assert_eq!(pick(&sliced, &capped), "A100-SXM4-40GB-MIG-1g.5gb");
    // A pod that names a slice label is charged by it.
    let named = pending_label(&one, "A100-SXM4-40GB-MIG-1g.5gb", [model], &free, &mig);
    assert_eq!(named, "A100-SXM4-40GB-MIG-1g.5gb");
}

#[test]
fn excess_is_what_a_node_costs_beyond_the_charge_per_key() {
    let charged = amounts(&[("A100-SXM4-40GB", 142), ("A100-SXM4-40GB/1g.5gb", 1000)]);
    let whole = amounts(&[("A100-SXM4-40GB", 1000)]);
    assert_eq!(
        excess(&whole, &charged),
        amounts(&[("A100-SXM4-40GB", 858)])
    );
    assert!(excess(&charged, &charged).is_empty());
    let other = amounts(&[("A100-SXM4-40GB", 142), ("A100-SXM4-40GB/2g.10gb", 1000)]);
    assert_eq!(
        excess(&other, &charged),
        amounts(&[("A100-SXM4-40GB/2g.10gb", 1000)])
    );
}

/// The ledger holds what a pod was surely charged: one that wants a model, its slice
/// charge by its pending label plus what the whole GPU it landed on costs beyond that;
/// one that accepts several, nothing until it is bound (the extender may not have
/// charged it yet), then its node's cost.
#[test]
fn the_ledger_holds_the_pending_charge_plus_a_dearer_node_and_a_placed_charge_once_bound() {
    let mig = MigResources::default();
    let one = request(&[("nvidia.com/gpu", "1")]);
    let slice = "A100-SXM4-40GB-MIG-1g.5gb";
    let wanted = ["A100-SXM4-40GB".to_string()];
    let at = ChargedAt::of(&wanted);
    assert_eq!(
        at.in_ledger(&one, None, false, &mig, |_| slice),
        Some(amounts(&[
            ("A100-SXM4-40GB", 142),
            ("A100-SXM4-40GB/1g.5gb", 1000)
        ]))
    );
    assert_eq!(
        at.in_ledger(&one, Some("A100-SXM4-40GB"), true, &mig, |_| slice),
        Some(amounts(&[
            ("A100-SXM4-40GB", 1000),
            ("A100-SXM4-40GB/1g.5gb", 1000)
        ]))
    );
    assert_eq!(
        at.charged(&one, &mig, |_| slice),
        Charged::Admitted(amounts(&[
            ("A100-SXM4-40GB", 142),
            ("A100-SXM4-40GB/1g.5gb", 1000)
        ]))
    );
    let several = ["Tesla-T4".to_string(), "A100-SXM4-40GB".to_string()];
    let at = ChargedAt::of(&several);
    assert_eq!(
        at.in_ledger(&one, Some("Tesla-T4"), false, &mig, |m| m),
        None
    );
    assert_eq!(
        at.in_ledger(&one, Some("Tesla-T4"), true, &mig, |m| m),
        Some(amounts(&[("Tesla-T4", 1000)]))
    );
    assert_eq!(at.charged(&one, &mig, |m| m), Charged::AtPlacement);
    assert_eq!(ChargedAt::of(&[]).charged(&one, &mig, |m| m), Charged::Free);
}
