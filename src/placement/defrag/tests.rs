//! The planner on small clusters an operator would recognise.
#![allow(clippy::unwrap_used)]

use super::testing::{Site, cpu_only, share, site, whole};
use super::*;
use crate::placement::policy::DEFAULT_POLICY;

const GB: u64 = 1024;

/// How a test asks: at most `max_moves`, a generous budget, V100 nodes only, every pod
/// movable, the pending pod at priority 0.
fn plan_with(
    cluster: &[Site],
    request: &GpuRequest,
    cpu: u64,
    limits: Limits,
    movable: impl Fn(&Resident<String>) -> bool,
) -> Result<Plan<String>, NoPlan> {
    plan_by(
        &Placer::new(DEFAULT_POLICY),
        cluster,
        request,
        cpu,
        limits,
        movable,
    )
}

/// [`plan_with`] under `placer`.
fn plan_by(
    placer: &Placer,
    cluster: &[Site],
    request: &GpuRequest,
    cpu: u64,
    limits: Limits,
    movable: impl Fn(&Resident<String>) -> bool,
) -> Result<Plan<String>, NoPlan> {
    let planner = Planner { placer, limits };
    let ask = Ask {
        request,
        host: HostRoom {
            cpu_milli: cpu,
            memory_mib: 0,
        },
        priority: 0,
    };
    let v100 = |gpus: &NodeGpus| match gpus.model.as_deref() {
        Some("V100") => Ok(()),
        _ => Err(Misfit::ModelNotWanted {
            model: gpus.model.clone(),
            wanted: vec!["V100".to_string()].into(),
        }),
    };
    planner.plan(cluster, &ask, v100, movable)
}

fn plan(cluster: &[Site], request: &GpuRequest, max_moves: usize) -> Result<Plan<String>, NoPlan> {
    let limits = Limits {
        max_moves,
        ..Limits::default()
    };
    plan_with(cluster, request, 1_000, limits, |_| true)
}

fn v100(name: &str, gpus: usize) -> Site {
    site(name, "V100", gpus, 32_000, 256 * GB)
}

/// Each move as "pod: from -> to", by node name.
fn moves(plan: &Plan<String>, cluster: &[Site]) -> Vec<String> {
    let name = |i: usize| &cluster[i].gpus.name;
    let steps = plan.moves.iter();
    steps
        .map(|m| format!("{}: {} -> {}", m.pod, name(m.from), name(m.to)))
        .collect()
}

fn gpus_of(assignment: &Assignment) -> Vec<u8> {
    assignment
        .choices
        .iter()
        .flat_map(|c| c.gpus.clone())
        .collect()
}

/// Two 2-GPU nodes, one GPU busy on each: a 2-GPU pod fits nowhere.
fn half_busy() -> Vec<Site> {
    vec![
        v100("a", 2).with("x", whole(1), 1_000),
        v100("b", 2).with("y", whole(1), 1_000),
    ]
}

#[test]
fn a_pod_that_fits_nowhere_fits_after_one_move() {
    let cluster = half_busy();
    let plan = plan(&cluster, &whole(2), 2).unwrap();
    // Either move works and changes the same; the tie goes to the target's name.
    assert_eq!(moves(&plan, &cluster), ["x: a -> b"]);
    assert_eq!(gpus_of(&plan.moves[0].assignment), [1]);
    assert_eq!((plan.node, gpus_of(&plan.assignment)), (0, vec![0, 1]));
    assert_eq!(plan.core_moved, 100);
}

#[test]
fn a_pod_may_need_two_moves_and_gets_none_with_one() {
    // a's two GPUs are held by two movable pods; c and d have one free GPU each next
    // to a pod of higher priority. Emptying a takes both moves.
    let cluster = vec![
        v100("a", 2)
            .with("x", whole(1), 1_000)
            .with("y", whole(1), 1_000),
        v100("c", 2).with_priority("z", whole(1), 1_000, 5),
        v100("d", 2).with_priority("w", whole(1), 1_000, 5),
    ];
    let plan = plan(&cluster, &whole(2), 2).unwrap();
    assert_eq!(moves(&plan, &cluster), ["x: a -> c", "y: a -> d"]);
    assert_eq!(plan.node, 0);
    assert_eq!(
        self::plan(&cluster, &whole(2), 1).unwrap_err(),
        NoPlan::TooManyMoves { max_moves: 1 }
    );
}

#[test]
fn a_node_short_of_cpu_is_freed_by_moving_a_cpu_pod() {
    // a has both GPUs free but a batch job holds 28 of its 32 cores; b has CPU to
    // spare and no free GPU. Moving the GPU share off a would free nothing it lacks.
    let cluster = vec![
        v100("a", 2)
            .with("batch", cpu_only(), 28_000)
            .with("share", share(20), 0),
        site("b", "V100", 1, 64_000, 256 * GB).with_priority("t", whole(1), 1_000, 5),
    ];
    let limits = Limits::default();
    let plan = plan_with(&cluster, &whole(1), 8_000, limits, |_| true).unwrap();
    assert_eq!(moves(&plan, &cluster), ["batch: a -> b"]);
    assert_eq!((plan.node, plan.core_moved), (0, 0));
    // Not movable, the batch job leaves no plan: the GPUs alone do not help.
    let pinned = plan_with(&cluster, &whole(1), 8_000, limits, |r| r.pod != "batch");
    assert_eq!(pinned.unwrap_err(), NoPlan::NoNode);
}

#[test]
fn a_pod_that_may_not_move_is_never_chosen() {
    let cluster = half_busy();
    let limits = Limits::default();
    let plan = plan_with(&cluster, &whole(2), 1_000, limits, |r| r.pod != "x").unwrap();
    assert_eq!(moves(&plan, &cluster), ["y: b -> a"]);
    assert_eq!(plan.node, 1);
}

#[test]
fn a_pod_of_higher_priority_is_never_moved() {
    let cluster = vec![
        v100("a", 2).with_priority("x", whole(1), 1_000, 1),
        v100("b", 2).with("y", whole(1), 1_000),
    ];
    let plan = plan(&cluster, &whole(2), 2).unwrap();
    assert_eq!(moves(&plan, &cluster), ["y: b -> a"]);
    let both = vec![
        v100("a", 2).with_priority("x", whole(1), 1_000, 1),
        v100("b", 2).with_priority("y", whole(1), 1_000, 1),
    ];
    assert_eq!(self::plan(&both, &whole(2), 2).unwrap_err(), NoPlan::NoNode);
}

#[test]
fn a_moved_pod_keeps_its_model() {
    // x could go to the idle T4 node, but it runs on a V100 and is charged for one;
    // the V100s' other free capacity is in shares too small for it.
    let mut cluster = vec![
        v100("a", 2).with("x", whole(1), 1_000),
        site("b", "T4", 2, 32_000, 256 * GB),
        v100("c", 1).with_priority("y", whole(1), 1_000, 5),
    ];
    // Only one V100 GPU is free in all: no move can make room for two.
    assert_eq!(
        plan(&cluster, &whole(2), 2).unwrap_err(),
        NoPlan::TooLittleFree {
            need: 200,
            free: 100
        }
    );
    let mut shared = v100("e", 3);
    for s in ["s1", "s2", "s3"] {
        shared = shared.with_priority(s, share(60), 0, 5);
    }
    cluster.push(shared);
    assert_eq!(
        plan(&cluster, &whole(2), 2).unwrap_err(),
        NoPlan::NoDestination { max_moves: 2 }
    );
    cluster.push(v100("d", 1));
    let plan = plan(&cluster, &whole(2), 2).unwrap();
    assert_eq!(moves(&plan, &cluster), ["x: a -> d"]);
}

#[test]
fn the_fewest_gpus_are_moved() {
    // Room for an 80% share on a (move x, half a GPU) or on b (move y, 30%).
    let cluster = vec![
        v100("a", 1).with("x", share(50), 0),
        v100("b", 1).with("y", share(30), 0),
        v100("d", 1).with_priority("z", share(40), 0, 5),
    ];
    let plan = plan(&cluster, &share(80), 2).unwrap();
    assert_eq!(moves(&plan, &cluster), ["y: b -> a"]);
    assert_eq!((plan.node, plan.core_moved), (1, 30));
}

#[test]
fn a_spent_budget_is_an_answer_not_a_hang() {
    let cluster: Vec<Site> = (0..40)
        .map(|i| v100(&format!("n{i:02}"), 2).with(&format!("p{i}"), whole(1), 1_000))
        .collect();
    let tight = Limits {
        max_moves: 2,
        budget: 3,
    };
    let spent = plan_with(&cluster, &whole(2), 1_000, tight, |_| true);
    assert_eq!(spent.unwrap_err(), NoPlan::BudgetSpent { budget: 3 });
    assert_eq!(plan(&cluster, &whole(2), 2).unwrap().moves.len(), 1);
}

#[test]
fn no_moves_are_made_with_a_limit_of_zero() {
    assert_eq!(
        plan(&half_busy(), &whole(2), 0).unwrap_err(),
        NoPlan::TooManyMoves { max_moves: 0 }
    );
    // A pod that fits as the cluster is gets a plan without moves, whatever the limit.
    let plan = plan(&half_busy(), &whole(1), 0).unwrap();
    assert!(plan.moves.is_empty());
}

#[test]
fn applying_a_plan_moves_the_pods_and_seats_the_pending_one() {
    let mut cluster = half_busy();
    let plan = plan(&cluster, &whole(2), 2).unwrap();
    let pending = Resident {
        pod: "new".to_string(),
        request: whole(2),
        host: HostRoom::default(),
        assignment: Assignment::default(),
        priority: 0,
        pools: Arc::from(Vec::new()),
        other_models: Arc::from(Vec::new()),
    };
    plan.apply(&mut cluster, pending.clone()).unwrap();
    let names = |s: &Site| {
        s.residents
            .iter()
            .map(|r| r.pod.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&cluster[0]), ["new"]);
    assert_eq!(names(&cluster[1]), ["y", "x"]);
    assert!(cluster.iter().all(|s| s.gpus.free_whole_gpus() == 0));
    // The same plan again finds x gone from a.
    assert_eq!(plan.apply(&mut cluster, pending), Err(Stale::PodGone(0)));
}

/// A V100 node with little CPU: the pending pods of the chain tests (16 cores) never
/// fit there, whatever moves.
fn small(name: &str, gpus: usize, cpu: u64) -> Site {
    site(name, "V100", gpus, cpu, 256 * GB)
}

/// A whole GPU and 16 cores: only a, the one node with the CPU, can take it.
fn plan_big(cluster: &[Site], max_moves: usize) -> Result<Plan<String>, NoPlan> {
    let limits = Limits {
        max_moves,
        ..Limits::default()
    };
    plan_with(cluster, &whole(1), 16_000, limits, |_| true)
}

/// a's only GPU is held by x, which fits on no other node as the cluster is: b's two
/// GPUs carry shares of 70 and 50, c has 55 free next to a pod of higher priority.
/// Only a chain seats the pending pod: w to c, then x to b's GPU w left.
fn chain_of_two() -> Vec<Site> {
    vec![
        v100("a", 1).with("x", whole(1), 1_000),
        small("b", 2, 8_000)
            .with("z", share(70), 0)
            .with("w", share(50), 0),
        small("c", 1, 8_000).with_priority("v", share(45), 0, 5),
    ]
}

#[test]
fn a_chain_moves_a_pod_off_the_destination_first() {
    let cluster = chain_of_two();
    let plan = plan_big(&cluster, 2).unwrap();
    assert_eq!(moves(&plan, &cluster), ["w: b -> c", "x: a -> b"]);
    assert_eq!((plan.node, gpus_of(&plan.assignment)), (0, vec![0]));
    assert_eq!(gpus_of(&plan.moves[1].assignment), [1]);
    assert_eq!(plan.core_moved, 150);
    // One move is not enough: x has nowhere to go without the chain.
    assert_eq!(
        plan_big(&cluster, 1).unwrap_err(),
        NoPlan::NoDestination { max_moves: 1 }
    );
}

#[test]
fn a_chain_moves_no_pod_that_may_not_move() {
    let cluster = chain_of_two();
    let limits = Limits::default();
    let pinned = plan_with(&cluster, &whole(1), 16_000, limits, |r| r.pod != "w");
    assert_eq!(pinned.unwrap_err(), NoPlan::NoDestination { max_moves: 2 });
    let mut above = chain_of_two();
    above[1] = small("b", 2, 8_000)
        .with("z", share(70), 0)
        .with_priority("w", share(50), 0, 1);
    assert_eq!(
        plan_big(&above, 2).unwrap_err(),
        NoPlan::NoDestination { max_moves: 2 }
    );
}

#[test]
fn a_chain_may_run_through_several_nodes() {
    // x (6 cores) can only open b, by moving w (60%, 4 cores); w can only open c (4
    // cores, too few for x), by moving u; u fits on d as it is. Three moves, in the
    // order they must happen; two are not enough.
    let cluster = vec![
        v100("a", 1).with("x", whole(1), 6_000),
        small("b", 1, 8_000).with("w", share(60), 4_000),
        small("c", 1, 4_000).with("u", share(50), 0),
        small("d", 1, 8_000).with_priority("v", share(50), 0, 5),
    ];
    assert_eq!(
        plan_big(&cluster, 2).unwrap_err(),
        NoPlan::NoDestination { max_moves: 2 }
    );
    let plan = plan_big(&cluster, 3).unwrap();
    assert_eq!(
        moves(&plan, &cluster),
        ["u: c -> d", "w: b -> c", "x: a -> b"]
    );
    assert_eq!((plan.node, plan.core_moved), (0, 210));
    let mut applied = cluster.clone();
    let pending = Resident {
        pod: "new".to_string(),
        request: whole(1),
        host: HostRoom {
            cpu_milli: 16_000,
            memory_mib: 0,
        },
        assignment: Assignment::default(),
        priority: 0,
        pools: Arc::from(Vec::new()),
        other_models: Arc::from(Vec::new()),
    };
    plan.apply(&mut applied, pending).unwrap();
    let names = |s: &Site| {
        s.residents
            .iter()
            .map(|r| r.pod.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&applied[0]), ["new"]);
    assert_eq!(names(&applied[1]), ["x"]);
    assert_eq!(names(&applied[2]), ["w"]);
    assert_eq!(names(&applied[3]), ["v", "u"]);
}

/// A moved GPU pod stays on its model, unless it accepts others (its charge follows
/// it): then it may make room on the model the pending pod needs by going to another.
#[test]
fn a_pod_that_accepts_another_model_moves_to_it() {
    let mut cluster = vec![
        v100("a", 1).with("x", whole(1), 1_000),
        site("t", "T4", 1, 32_000, 256 * GB),
    ];
    assert_eq!(
        plan(&cluster, &whole(1), 2).unwrap_err(),
        NoPlan::TooLittleFree { need: 100, free: 0 },
        "x keeps V100: no move frees one"
    );
    cluster[0].residents[0].other_models = Arc::from(vec![Arc::from("T4")]);
    let plan = plan(&cluster, &whole(1), 2).unwrap();
    assert_eq!(moves(&plan, &cluster), ["x: a -> t"]);
    assert_eq!(cluster[plan.node].gpus.name.as_ref(), "a");
    let pinned = plan_with(&cluster, &whole(1), 1_000, Limits::default(), |r| {
        r.other_models.is_empty()
    });
    assert!(
        pinned.is_err(),
        "only movable pods change model: {pinned:?}"
    );
}

/// A moved pod that accepts several models lands as placement would place it: on a
/// model pods pinned to it are short of only when no other takes it.
#[test]
fn a_moved_pod_leaves_a_short_model_to_the_pods_pinned_to_it() {
    use crate::placement::choice::PinnedDemand;
    use crate::placement::{GpuShape, TaskShape};
    let mut cluster = vec![
        v100("a", 1).with("x", whole(1), 1_000),
        site("t", "T4", 1, 32_000, 256 * GB),
        site("u", "A100", 1, 32_000, 256 * GB),
    ];
    let others = vec![Arc::from("A100"), Arc::from("T4")];
    cluster[0].residents[0].other_models = Arc::from(others);
    let limits = Limits::default();
    let plain = Placer::new(DEFAULT_POLICY);
    let chosen = |placer: &Placer| {
        let plan = plan_by(placer, &cluster, &whole(1), 1_000, limits, |_| true).unwrap();
        moves(&plan, &cluster)
    };
    assert_eq!(
        chosen(&plain),
        ["x: a -> t"],
        "equal scores: the name decides"
    );
    // Four GPUs of every five seen were pinned to T4: with 2 free, T4 needs 1.6 of
    // them and has 1.
    let one =
        |models: &[&str]| TaskShape::gpu_only(GpuShape::Whole { gpus: 1 }).with_models(models);
    let seen = [(one(&["T4"]), 4), (one(&[]), 1)];
    let pinned = PinnedDemand::of_counts(seen.iter().map(|(s, n)| (s, *n)));
    let protecting = Placer::new(DEFAULT_POLICY).with_pinned(Arc::new(pinned));
    assert_eq!(chosen(&protecting), ["x: a -> u"]);
}
