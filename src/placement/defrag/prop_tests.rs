//! Every plan over random small clusters, carried out step by step, is valid: each
//! moved pod may move, keeps its model and fits where it goes after the earlier moves
//! (a chain's moves included: a move may take a pod off any node), no pod moves twice,
//! the pending pod fits at the end, no GPU, CPU or memory is over-committed, and there
//! are no more moves than allowed.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use proptest::prelude::*;

use super::testing::{MEMORY, Site, cpu_only, host, share, site, whole};
use super::*;
use crate::placement::fit::fit;
use crate::placement::fragment::{GpuShape, TaskMix, TaskShape};
use crate::placement::policy::Policy;

/// A pod to place: its request, CPU, memory (GiB), priority, whether it may move and
/// the node it is offered first.
type PodSpec = (GpuRequest, u64, u64, i32, bool, usize);

fn request() -> impl Strategy<Value = GpuRequest> {
    prop_oneof![
        3 => (1u32..=9).prop_map(|tenths| share(tenths * 10)),
        2 => (1u32..=2).prop_map(whole),
        1 => Just(cpu_only()),
    ]
}

fn pod() -> impl Strategy<Value = PodSpec> {
    (
        request(),
        0u64..=16,
        0u64..=64,
        0i32..3,
        any::<bool>(),
        0usize..8,
    )
        .prop_map(|(r, cpu, gib, priority, movable, node)| {
            (r, cpu * 1_000, gib * 1_024, priority, movable, node)
        })
}

/// 2-5 nodes of model A or B, 1-4 GPUs, 8-32 cores, 32-128 GiB; then up to 14 pods,
/// each on the first node from its offer on where it fits (or nowhere).
fn cluster() -> impl Strategy<Value = (Vec<Site>, Vec<String>)> {
    let node = (any::<bool>(), 1usize..=4, 1u64..=4, 1u64..=4);
    (
        prop::collection::vec(node, 2..=5),
        prop::collection::vec(pod(), 0..=14),
    )
        .prop_map(|(nodes, pods)| {
            let mut sites: Vec<Site> = nodes
                .iter()
                .enumerate()
                .map(|(i, &(b, gpus, cpu, mem))| {
                    let model = if b { "B" } else { "A" };
                    site(&format!("n{i}"), model, gpus, cpu * 8_000, mem * 32_768)
                })
                .collect();
            let mut movable = Vec::new();
            for (p, (request, cpu, memory, priority, may_move, offer)) in
                pods.into_iter().enumerate()
            {
                let name = format!("p{p}");
                let count = sites.len();
                let spot = (0..count).map(|k| (offer + k) % count).find(|&n| {
                    let room = sites[n].room.unwrap();
                    fit(&sites[n].gpus, &request).is_ok()
                        && room.cpu_milli >= cpu
                        && room.memory_mib >= memory
                });
                let Some(n) = spot else { continue };
                let assignment = fit(&sites[n].gpus, &request).unwrap();
                put(
                    &mut sites[n],
                    Resident {
                        pod: name.clone(),
                        request,
                        host: host(cpu, memory),
                        assignment,
                        priority,
                        pools: Arc::from(Vec::new()),
                        other_models: Arc::from(Vec::new()),
                    },
                );
                if may_move {
                    movable.push(name);
                }
            }
            (sites, movable)
        })
}

/// No GPU beyond its cores or memory (the builders never over-commit, so any excess
/// is the plan's).
fn assert_not_over_committed(cluster: &[Site]) {
    for site in cluster {
        for used in &site.gpus.used {
            assert!(used.core <= 100 && used.memory <= MEMORY, "{site:?}");
        }
    }
}

fn fits_room(site: &Site, need: &HostRoom) -> bool {
    host_admits(site.room, need).is_ok()
}

/// Carry `plan` out on a copy of `cluster`, checking every step.
fn check(
    cluster: &[Site],
    plan: &Plan<String>,
    ask: &Ask<'_>,
    movable: &[String],
    max_moves: usize,
) -> Vec<Site> {
    assert!(plan.moves.len() <= max_moves, "{plan:?}");
    for (i, step) in plan.moves.iter().enumerate() {
        let again = plan.moves[..i].iter().any(|m| m.pod == step.pod);
        assert!(!again, "{} moves twice: {plan:?}", step.pod);
    }
    let mut state = cluster.to_vec();
    for step in &plan.moves {
        assert_ne!(step.from, step.to);
        let at = state[step.from]
            .residents
            .iter()
            .position(|r| r.pod == step.pod)
            .expect("the moved pod runs where the move takes it from");
        let moved = state[step.from].residents[at].clone();
        assert!(movable.contains(&moved.pod) && moved.priority <= ask.priority);
        if moved.request.has_gpu_demand() {
            assert_eq!(state[step.to].gpus.model, state[step.from].gpus.model);
        }
        let from = &mut state[step.from];
        from.residents.remove(at);
        moved.assignment.vacate(&mut from.gpus);
        from.room = from.room.map(|r| r.plus(&moved.host));
        let to = &state[step.to];
        assert!(
            fits_room(to, &moved.host),
            "{step:?} short of CPU or memory"
        );
        assert_eq!(fit(&to.gpus, &moved.request).as_ref(), Ok(&step.assignment));
        let mut landed = moved;
        landed.assignment = step.assignment.clone();
        put(&mut state[step.to], landed);
        assert_not_over_committed(&state);
    }
    let target = &state[plan.node];
    assert!(fits_room(target, &ask.host));
    assert_eq!(
        fit(&target.gpus, ask.request).as_ref(),
        Ok(&plan.assignment)
    );
    let seated = Resident {
        pod: "pending".to_string(),
        request: ask.request.clone(),
        host: ask.host,
        assignment: plan.assignment.clone(),
        priority: ask.priority,
        pools: Arc::from(Vec::new()),
        other_models: Arc::from(Vec::new()),
    };
    put(&mut state[plan.node], seated);
    assert_not_over_committed(&state);
    state
}

fn placer(fgd: bool) -> Placer {
    if !fgd {
        return Placer::new(Policy::Binpack);
    }
    let shapes = [
        (
            GpuShape::Share {
                core: 30,
                memory: 30,
            },
            2.0,
        ),
        (GpuShape::Whole { gpus: 1 }, 1.0),
    ];
    let mix = TaskMix::weighted(shapes.map(|(s, w)| (TaskShape::gpu_only(s), w)));
    Placer::new(Policy::Fgd).with_mix(Arc::new(mix))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_is_valid_step_by_step(
        (cluster, movable) in cluster(),
        (request, cpu, memory, priority, _, _) in pod(),
        model_b in any::<bool>(),
        max_moves in 0usize..=4,
        fgd in any::<bool>(),
    ) {
        let placer = placer(fgd);
        let planner = Planner { placer: &placer, limits: Limits { max_moves, budget: 5_000 } };
        let ask = Ask { request: &request, host: host(cpu, memory), priority };
        let wanted = if model_b { "B" } else { "A" };
        let allowed = |gpus: &NodeGpus| match gpus.model.as_deref() {
            Some(m) if m == wanted => Ok(()),
            _ => Err(Misfit::NotCached),
        };
        let may_move = |r: &Resident<String>| movable.contains(&r.pod);
        let Ok(plan) = planner.plan(&cluster, &ask, allowed, may_move) else {
            return Ok(());
        };
        prop_assert!(allowed(&cluster[plan.node].gpus).is_ok());
        let checked = check(&cluster, &plan, &ask, &movable, max_moves);
        // `Plan::apply` does exactly what was checked.
        let mut applied = cluster.clone();
        let pending = Resident {
            pod: "pending".to_string(),
            request: request.clone(),
            host: ask.host,
            assignment: Assignment::default(),
            priority,
            pools: Arc::from(Vec::new()),
            other_models: Arc::from(Vec::new()),
        };
        plan.apply(&mut applied, pending).unwrap();
        for (a, c) in applied.iter().zip(&checked) {
            prop_assert_eq!(&a.gpus, &c.gpus);
            prop_assert_eq!(a.room, c.room);
        }
        assert_not_over_committed(&applied);
    }
}

/// The clusters above do give chain plans (a move off a node other than the target),
/// so the property covers them: at least one in the first 2,000 deterministic cases.
#[test]
fn the_random_clusters_give_chain_plans() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let placer = placer(false);
    let planner = Planner {
        placer: &placer,
        limits: Limits {
            max_moves: 3,
            budget: 5_000,
        },
    };
    let mut chains = 0;
    for _ in 0..2_000 {
        let (cluster, movable) = cluster().new_tree(&mut runner).unwrap().current();
        let (request, cpu, memory, _, _, _) = pod().new_tree(&mut runner).unwrap().current();
        let ask = Ask {
            request: &request,
            host: host(cpu, memory),
            priority: 2,
        };
        let may_move = |r: &Resident<String>| movable.contains(&r.pod);
        let Ok(plan) = planner.plan(&cluster, &ask, |_| Ok(()), may_move) else {
            continue;
        };
        if plan.moves.iter().any(|m| m.from != plan.node) {
            chains += 1;
            check(&cluster, &plan, &ask, &movable, 3);
        }
    }
    assert!(chains > 0, "no chain plan in 2,000 random clusters");
}
