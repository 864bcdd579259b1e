#![allow(clippy::unwrap_used)]
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::queue::*;
use super::*;
use crate::config::UntypedPods;
use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;

const RULES: QueueRules = QueueRules {
    max_pass_over: 300,
    admit: AdmitRules {
        untyped: UntypedPods::Allow,
        quota_required: false,
    },
};
const NOW: i64 = 10_000;

fn quota(model: &str, hard: u64, used: u64) -> QuotaView {
    QuotaView {
        namespace: "team".into(),
        name: "gpus".into(),
        hard: [(model.to_string(), Milli(hard * 1000))].into(),
        used: [(model.to_string(), Milli(used * 1000))].into(),
        on_exceed: OnExceed::Queue,
        cohort: None,
    }
}

/// A pod wanting `gpus` GPUs of `model`, created `age` seconds ago.
fn pod(name: &str, model: &str, gpus: u64, priority: i32, age: i64) -> Waiting {
    Waiting {
        key: format!("team/{name}"),
        uid: name.into(),
        priority,
        created: NOW - age,
        wanted: WantedModels::one(model),
        costs: Costs::single(model.into(), [(model.into(), Milli(gpus * 1000))].into()),
    }
}

/// The names the plan lets go, in line order, and the waiting ones as `name#place`.
fn outcome(turns: &[(Waiting, Turn)]) -> (Vec<String>, Vec<String>) {
    let name = |w: &Waiting| w.key.trim_start_matches("team/").to_string();
    let released = turns
        .iter()
        .filter(|(_, t)| matches!(t, Turn::LetGo(_)))
        .map(|(w, _)| name(w))
        .collect();
    let waiting = turns
        .iter()
        .filter_map(|(w, t)| match t {
            Turn::Wait { place, .. } => Some(format!("{}#{place}", name(w))),
            Turn::LetGo(_) => None,
        })
        .collect();
    (released, waiting)
}

#[test]
fn higher_priority_first_then_older_first() {
    let quotas = [quota("T4", 2, 0)];
    let line = vec![
        pod("young-low", "T4", 1, 0, 10),
        pod("old-low", "T4", 1, 0, 20),
        pod("young-high", "T4", 1, 100, 5),
    ];
    let turns = plan("team", &quotas, line, NOW, RULES);
    let (released, waiting) = outcome(&turns);
    assert_eq!(released, ["young-high", "old-low"]);
    assert_eq!(waiting, ["young-low#1"]);
}

#[test]
fn a_pod_that_does_not_fit_does_not_block_a_smaller_one_behind_it() {
    let quotas = [quota("T4", 4, 2)];
    let line = vec![pod("big", "T4", 4, 0, 60), pod("small", "T4", 2, 0, 30)];
    let turns = plan("team", &quotas, line, NOW, RULES);
    let (released, waiting) = outcome(&turns);
    assert_eq!(released, ["small"]);
    assert_eq!(waiting, ["big#1"]);
    let Turn::Wait {
        why: WaitReason::NoRoom(denial),
        ..
    } = &turns[0].1
    else {
        panic!("big waits for room: {:?}", turns[0].1);
    };
    assert!(
        denial.to_string().contains("requested 4, used 2 of 4"),
        "the reason names the usage when its turn came: {denial}"
    );
}

#[test]
fn an_overdue_pod_goes_first_and_holds_its_model_until_it_fits() {
    // big has waited past the limit: small (younger, higher priority) fits but waits
    // behind it; a pod of another model is not held.
    let quotas = [quota("T4", 4, 2), quota("V100", 1, 0)];
    let line = vec![
        pod("small", "T4", 1, 1000, 10),
        pod("big", "T4", 4, 0, 301),
        pod("other", "V100", 1, 0, 5),
    ];
    let turns = plan("team", &quotas, line, NOW, RULES);
    let (released, waiting) = outcome(&turns);
    assert_eq!(released, ["other"]);
    assert_eq!(waiting, ["big#1", "small#2"]);
    assert_eq!(
        turns[1].1,
        Turn::Wait {
            place: 2,
            why: WaitReason::Behind {
                ahead: "team/big".into()
            }
        }
    );
    // Before the limit, small would have passed big.
    let line = vec![pod("small", "T4", 1, 1000, 10), pod("big", "T4", 4, 0, 299)];
    let (released, _) = outcome(&plan("team", &quotas, line, NOW, RULES));
    assert_eq!(released, ["small"]);
}

#[test]
fn overdue_pods_go_first_whatever_their_priority_oldest_first() {
    let quotas = [quota("T4", 1, 0)];
    let line = vec![
        pod("high", "T4", 1, 1000, 1),
        pod("overdue-young", "T4", 1, -5, 400),
        pod("overdue-old", "T4", 1, -10, 500),
    ];
    let (released, waiting) = outcome(&plan("team", &quotas, line, NOW, RULES));
    assert_eq!(released, ["overdue-old"]);
    assert_eq!(waiting, ["overdue-young#1", "high#2"]);
}

#[test]
fn a_namespace_without_quota_any_more_lets_everything_go() {
    let line = vec![pod("a", "T4", 8, 0, 10), pod("b", "T4", 8, 0, 10)];
    let (released, waiting) = outcome(&plan("team", &[], line, NOW, RULES));
    assert_eq!(released, ["a", "b"]);
    assert!(waiting.is_empty());
}

#[test]
fn a_warn_quota_lets_pods_go_past_hard() {
    let mut warn = quota("T4", 1, 1);
    warn.on_exceed = OnExceed::Warn;
    let line = vec![pod("a", "T4", 2, 0, 10)];
    let (released, _) = outcome(&plan("team", &[warn], line, NOW, RULES));
    assert_eq!(released, ["a"]);
}

/// Whatever the line, what the plan lets go fits the quota together with what is used;
/// the waiting places count 1, 2, 3...; a pod waits for room only when it does not fit
/// in what is left; and nothing is let go from behind an overdue pod that waits.
#[test]
fn the_plan_never_goes_past_hard_and_wastes_no_room() {
    let mut rng = ChaCha8Rng::seed_from_u64(20);
    for _ in 0..2_000 {
        let (hard, used) = (rng.random_range(0..12), rng.random_range(0..12));
        let quotas = [quota("T4", hard, used)];
        let line: Vec<Waiting> = (0..rng.random_range(0..24))
            .map(|i| {
                let (gpus, priority) = (rng.random_range(1..5), rng.random_range(-2..3));
                pod(
                    &format!("p{i}"),
                    "T4",
                    gpus,
                    priority,
                    rng.random_range(0..600),
                )
            })
            .collect();
        let count = line.len();
        let turns = plan("team", &quotas, line, NOW, RULES);
        assert_eq!(turns.len(), count);
        let mut total = used;
        let mut places = Vec::new();
        let mut overdue_waiting = false;
        for (pod, turn) in &turns {
            let gpus = pod.costs.on("T4")["T4"].0 / 1000;
            match turn {
                Turn::LetGo(_) => {
                    assert!(!overdue_waiting, "let go past an overdue pod: {turns:?}");
                    total += gpus;
                }
                Turn::Wait { place, why } => {
                    places.push(*place);
                    overdue_waiting |= NOW - pod.created >= RULES.max_pass_over;
                    if let WaitReason::NoRoom(_) = why {
                        assert!(total + gpus > hard, "waits though it fits: {turns:?}");
                    }
                }
            }
        }
        assert!(total <= hard.max(used), "past hard: {total} of {hard}");
        assert_eq!(places, (1..=places.len()).collect::<Vec<_>>());
    }
}
