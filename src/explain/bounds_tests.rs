//! What a judgment costs, counted in node fits, not seconds: a judgment whose caller
//! has left fits nothing more; the search for another model fits each open node at most
//! once and tries at most `SEARCH_MODELS` models, however many the cluster has.
#![allow(clippy::unwrap_used)]

use std::fmt::Write;

use crate::cache::parse_objects;
use crate::config::Config;
use crate::snapshot::Snapshot;

use super::effort::{Cancel, Effort};
use super::other_model::SEARCH_MODELS;
use super::{Code, ExplainError, Explanation, Judge, Judged};

/// 2026-11-29T01:00:00Z
const NOW: i64 = 1_796_000_400;
/// Tesla-T4 nodes of one GPU each: too small for the pod, which asks for two.
const T4_NODES: usize = 50;

fn node(text: &mut String, name: &str, model: &str, gpus: u32) {
    let core = 100 * gpus;
    let memory = 16 * gpus;
    write!(
        text,
        "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{nvidia.com/gpu.product: {model}}}}}\n\
         status: {{allocatable: {{cpu: \"32\", memory: 128Gi, tencent.com/vcuda-core: \"{core}\", tencent.com/vcuda-memory: \"{memory}\"}}}}\n"
    )
    .unwrap();
}

/// [`T4_NODES`] Tesla-T4 nodes, one node of one GPU for each of `models` other models,
/// the nodes of two GPUs `roomy` names (model, count), and a pending pod `NS/big`
/// asking for 2 whole Tesla-T4 GPUs in each namespace of `namespaces`, plus `extra`.
fn cluster(models: usize, roomy: &[(&str, usize)], namespaces: &[&str], extra: &str) -> String {
    let mut text = String::new();
    for i in 0..T4_NODES {
        node(&mut text, &format!("t4-{i}"), "Tesla-T4", 1);
    }
    for m in 0..models {
        node(&mut text, &format!("m-{m}"), &format!("Model-{m:04}"), 1);
    }
    for (model, count) in roomy {
        for i in 0..*count {
            node(&mut text, &format!("{model}-{i}"), model, 2);
        }
    }
    for namespace in namespaces {
        write!(
            text,
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: big, namespace: {namespace}, \
             creationTimestamp: \"2026-11-29T00:00:00Z\", annotations: {{gpu-admission.io/gpu-type: Tesla-T4}}}}\n\
             spec: {{schedulerName: gpu-scheduler, containers: [{{name: c, resources: {{limits: {{tencent.com/vcuda-core: \"200\"}}}}}}]}}\n"
        )
        .unwrap();
    }
    text + extra
}

/// Judge `key` on `text`'s cluster with `effort`: the verdict, and the node fits spent.
fn judge(text: &str, key: &str, effort: Effort) -> (Result<Explanation, ExplainError>, u64) {
    let config = Config::default();
    let objects = parse_objects(text, "test").unwrap();
    let Snapshot { cache, placer, .. } = Snapshot::of(&objects, "test", &config).unwrap();
    let mig = cache.projection().names.mig.clone();
    cache.read(|state| {
        let pod = state.pod(key).unwrap();
        let subject = Judged {
            key,
            pod,
            exists: true,
        };
        let judge = Judge::new(state, &placer, &mig, &config, NOW).for_caller(effort);
        let explanation = judge.explain(&subject);
        (explanation, judge.effort.fits())
    })
}

fn other_models(explanation: &Explanation) -> Vec<&str> {
    let found = explanation.counterfactuals.iter();
    let found = found.filter(|c| c.kind == "other_model");
    found.map(|c| c.message.as_str()).collect()
}

#[test]
fn a_judgment_whose_caller_has_left_fits_no_node() {
    let text = cluster(20, &[("Roomy", 1)], &["lab"], "");
    let (judged, fits) = judge(&text, "lab/big", Effort::default());
    assert_eq!(judged.unwrap().code, Code::NoNodeOfModel);
    assert!(
        fits > T4_NODES as u64,
        "the waiting caller's judgment fits {fits}"
    );

    let (cancel, raise_on_drop) = Cancel::on_drop();
    drop(raise_on_drop);
    let (judged, fits) = judge(&text, "lab/big", Effort::new(cancel));
    assert!(
        matches!(judged, Err(ExplainError::Abandoned(_))),
        "{judged:?}"
    );
    assert_eq!(fits, 0, "a judgment nobody waits for fits nothing");
}

/// 2,000 other models without a GPUQuota (every model may be used): the stage fits
/// every open node once, the search at most `SEARCH_MODELS` models' nodes, the one that
/// fits (most free GPU) among them. Before the bound it fitted every open node once per
/// model: 2,000 × 2,051 fits.
#[test]
fn the_search_for_another_model_costs_at_most_its_bound_with_two_thousand_models() {
    let models = 2_000;
    let text = cluster(models, &[("Roomy", 1)], &["lab"], "");
    let (judged, fits) = judge(&text, "lab/big", Effort::default());
    let judged = judged.unwrap();
    let open = (T4_NODES + models + 1) as u64;
    let searched = fits - open;
    assert!(
        searched <= SEARCH_MODELS as u64,
        "the search fitted {searched} nodes"
    );
    assert_eq!(
        searched, SEARCH_MODELS as u64,
        "one node for each model tried"
    );
    let found = other_models(&judged);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("fits now as model Roomy"), "{found:?}");
}

/// An enforcing quota lists Tesla-T4 and Roomy only: the 2,000 other models are no
/// candidates, and Roomy's nodes are the only ones the search fits.
#[test]
fn with_an_enforcing_quota_only_the_models_it_lists_are_searched() {
    let quota = "---\napiVersion: gpu-admission.io/v1alpha1\nkind: GPUQuota\n\
                 metadata: {name: default, namespace: team}\n\
                 spec: {hard: {Tesla-T4: \"10\", Roomy: \"10\"}}\n";
    let text = cluster(2_000, &[("Roomy", 3)], &["team"], quota);
    let (judged, fits) = judge(&text, "team/big", Effort::default());
    let open = (T4_NODES + 2_000 + 3) as u64;
    assert_eq!(fits - open, 3, "only Roomy's three nodes are searched");
    let judged = judged.unwrap();
    assert_eq!(other_models(&judged).len(), 1, "{judged:?}");
}

/// The search stops when its node fits are spent: with room for one fit, it finds
/// only the model with the most free GPU.
#[test]
fn the_search_stops_when_its_budget_is_spent() {
    let text = cluster(0, &[("Roomy", 2), ("Spare", 1)], &["lab"], "");
    let (judged, _) = judge(&text, "lab/big", Effort::default());
    let found = other_models(judged.as_ref().unwrap());
    assert_eq!(found.len(), 2, "{found:?}");

    let effort = Effort::default().with_search_budget(1);
    let (judged, fits) = judge(&text, "lab/big", effort);
    let found = other_models(judged.as_ref().unwrap());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("fits now as model Roomy"), "{found:?}");
    assert_eq!(fits, (T4_NODES + 3 + 1) as u64);
}
