//! The mover's safety, whatever the cluster answers: no eviction without the holds
//! written and the move re-checked, none beyond the plan, each pod at most once, in
//! the plan's order; the first failure ends the plan and frees its holds.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::cache::plan_hold::{GpusKept, Slot};

/// What the fake cluster answers, in order, and what was asked of it.
#[derive(Debug, Default)]
struct Script {
    hold: bool,
    rechecks: Vec<bool>,
    evictions: Vec<u8>,
    asked: Vec<Call>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Hold,
    Recheck(usize),
    Evict(usize),
    Release,
}

impl Hands for Script {
    async fn hold(&mut self, _: &Carried) -> bool {
        self.asked.push(Call::Hold);
        self.hold
    }
    async fn recheck(&mut self, _: &Carried, index: usize) -> Result<(), Stale> {
        self.asked.push(Call::Recheck(index));
        match self.rechecks.get(index).copied().unwrap_or(true) {
            true => Ok(()),
            false => Err(Stale::Gone("team-b/moved".into())),
        }
    }
    async fn evict(&mut self, _: &Carried, index: usize) -> Evicted {
        self.asked.push(Call::Evict(index));
        match self.evictions.get(index).copied().unwrap_or(0) {
            0 => Evicted::Yes,
            1 => Evicted::Refused("429".into()),
            _ => Evicted::Failed("timeout".into()),
        }
    }
    async fn release(&mut self, _: &Carried) {
        self.asked.push(Call::Release);
    }
}

fn held(node: &str) -> GpusKept {
    GpusKept {
        node: node.into(),
        gpus: Vec::new(),
    }
}

fn carried(moves: usize) -> Carried {
    let request = crate::placement::GpuRequest::default();
    let slots =
        (0..moves).map(|i| Slot::new("team-b", &format!("u-{i}"), "rs-1", &request, held("n2")));
    Carried {
        pod: "team-a/train".into(),
        uid: "u-train".into(),
        moves: (0..moves)
            .map(|i| Move {
                pod: format!("team-b/moved-{i}"),
                from: "n1".into(),
                uid: format!("u-{i}"),
                owner: "rs-1".into(),
            })
            .collect(),
        hold: PlanHold {
            model: "T4".into(),
            since: 1,
            until: 61,
            target: held("n1"),
            slots: slots.collect(),
        },
    }
}

fn run(plan: &Carried, script: &mut Script) -> Ended {
    futures::executor::block_on(carry_out(script, plan))
}

proptest! {
    #[test]
    fn evictions_follow_the_plan_and_the_first_failure_frees_every_hold(
        moves in 1usize..=4,
        hold in prop::bool::weighted(0.9),
        rechecks in prop::collection::vec(prop::bool::weighted(0.8), 4),
        evictions in prop::collection::vec(prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)], 4),
    ) {
        let plan = carried(moves);
        let mut script = Script { hold, rechecks, evictions, asked: Vec::new() };
        let ended = run(&plan, &mut script);
        let asked = &script.asked;
        prop_assert_eq!(&asked[0], &Call::Hold, "the holds come first");
        let evicted: Vec<usize> = asked.iter().filter_map(|c| match c {
            Call::Evict(i) => Some(*i),
            _ => None,
        }).collect();
        // In the plan's order, each move at most once, never beyond the plan.
        prop_assert!(evicted.iter().copied().eq(0..evicted.len()), "{:?}", asked);
        prop_assert!(evicted.len() <= moves);
        for (at, call) in asked.iter().enumerate() {
            if let Call::Evict(i) = call {
                prop_assert!(hold, "no eviction without the holds written");
                prop_assert_eq!(&asked[at - 1], &Call::Recheck(*i), "each eviction right after its re-check");
                prop_assert!(script.rechecks[*i], "a move that no longer stands is never made");
            }
        }
        let releases = asked.iter().filter(|c| **c == Call::Release).count();
        match &ended {
            Ended::Moved => {
                prop_assert_eq!(evicted.len(), moves);
                prop_assert_eq!(releases, 0, "the holds stand for the pending pod");
            }
            Ended::Aborted { after, .. } => {
                prop_assert_eq!(releases, 1, "an aborted plan frees its holds");
                prop_assert_eq!(asked.last(), Some(&Call::Release), "and does nothing after");
                let made = (0..*after).all(|i| script.evictions[i] == 0);
                prop_assert!(made, "`after` counts the evictions made");
                prop_assert!(evicted.len() == *after || evicted.len() == after + 1);
            }
        }
        let all_fine = hold && (0..moves).all(|i| script.rechecks[i] && script.evictions[i] == 0);
        prop_assert_eq!(all_fine, ended == Ended::Moved);
    }
}

#[test]
fn a_plan_whose_moves_and_holds_differ_touches_nothing() {
    let mut plan = carried(2);
    plan.hold.slots.pop();
    let mut script = Script::default();
    assert!(matches!(
        run(&plan, &mut script),
        Ended::Aborted { after: 0, .. }
    ));
    assert!(script.asked.is_empty());
}

/// The live pending pod and moved pod of `carried(1)`, as the plan was made for them.
fn live(plan: &Carried) -> (serde_json::Value, serde_json::Value) {
    let pending = json!({
        "metadata": {"name": "train", "namespace": "team-a", "uid": "u-train",
            "annotations": {PLAN_HOLD_ANNOTATION: plan.hold.to_text()}},
        "spec": {"containers": [], "priority": 10},
    });
    let moved = json!({
        "metadata": {"name": "moved-0", "namespace": "team-b", "uid": "u-0",
            "annotations": {MOVABLE_ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "rs-1", "controller": true}]},
        "spec": {"containers": [], "nodeName": "n1", "priority": 10},
    });
    (pending, moved)
}

fn stands(pending: &serde_json::Value, moved: &serde_json::Value) -> Result<(), Stale> {
    let plan = carried(1);
    let pod = |v: &serde_json::Value| serde_json::from_value::<Pod>(v.clone()).unwrap();
    still_stands(&plan, 0, &pod(pending), &pod(moved))
}

#[test]
fn a_move_stands_only_while_the_rules_that_allowed_it_still_hold() {
    let plan = carried(1);
    let (pending, moved) = live(&plan);
    assert_eq!(stands(&pending, &moved), Ok(()));
    type Edit = fn(&mut serde_json::Value, &mut serde_json::Value);
    let edits: [(&str, Edit); 10] = [
        ("pending pod recreated", |p, _| {
            p["metadata"]["uid"] = json!("u-new")
        }),
        ("moved pod recreated", |_, m| {
            m["metadata"]["uid"] = json!("u-new")
        }),
        ("moved pod being deleted", |_, m| {
            m["metadata"]["deletionTimestamp"] = json!("2026-11-29T00:00:00Z")
        }),
        ("pending pod bound", |p, _| {
            p["spec"]["nodeName"] = json!("n3")
        }),
        ("holds taken off", |p, _| {
            p["metadata"]["annotations"] = json!({})
        }),
        ("holds changed", |p, _| {
            p["metadata"]["annotations"][PLAN_HOLD_ANNOTATION] = json!("{}")
        }),
        ("moved elsewhere", |_, m| {
            m["spec"]["nodeName"] = json!("n2")
        }),
        ("opted out", |_, m| {
            m["metadata"]["annotations"][MOVABLE_ANNOTATION] = json!("false")
        }),
        ("another controller", |_, m| {
            m["metadata"]["ownerReferences"][0]["uid"] = json!("rs-2")
        }),
        ("priority above the pending pod's", |_, m| {
            m["spec"]["priority"] = json!(11)
        }),
    ];
    for (what, edit) in edits {
        let (mut pending, mut moved) = live(&plan);
        edit(&mut pending, &mut moved);
        let stale = stands(&pending, &moved).expect_err(what);
        // Told in an Event on team-a's pod: team-b's pod is not named.
        let told = stale.to_string();
        assert!(
            !told.contains("team-b") && !told.contains("moved-0"),
            "{what}: {told}"
        );
    }
    let (pending, mut moved) = live(&plan);
    moved["spec"]["priority"] = json!(10);
    assert_eq!(stands(&pending, &moved), Ok(()), "equal priority may move");
}
