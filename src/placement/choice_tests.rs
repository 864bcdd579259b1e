#![allow(clippy::unwrap_used)]
use super::*;
use crate::placement::fragment::GpuShape;
use crate::placement::policy::place_with_host;
use crate::placement::request::{GpuDemand, GpuRequest};
use crate::placement::testing::{node, with_used};
use crate::placement::{Placer, Policy, place};

fn shape(gpus: u32, models: &[&str]) -> TaskShape {
    TaskShape::gpu_only(GpuShape::Whole { gpus }).with_models(models)
}

fn of_model(name: &str, model: &str, gpus: usize) -> NodeGpus {
    let mut n = node(name, gpus, 100);
    n.model = Some(model.into());
    n
}

/// Demand seen: 4 GPUs pinned to T4, 2 to V100, 2 to either V100 model, 8 free to go
/// anywhere (16 in all).
fn seen() -> PinnedDemand {
    let shapes = [
        (shape(1, &["T4"]), 4),
        (shape(2, &["V100"]), 1),
        (shape(1, &["V100", "V100S"]), 2),
        (shape(8, &[]), 1),
    ];
    PinnedDemand::of_counts(shapes.iter().map(|(s, n)| (s, *n)))
}

#[test]
fn a_sets_share_counts_the_demand_pinned_inside_it_over_all_demand() {
    let pinned = seen();
    let share = |models: &[&str]| {
        let models: Vec<Arc<str>> = models.iter().map(|&m| Arc::from(m)).collect();
        let set = pinned.sets.iter().find(|s| *s.models == *models).unwrap();
        set.share
    };
    assert_eq!(share(&["T4"]), 4.0 / 16.0);
    assert_eq!(share(&["V100"]), 2.0 / 16.0);
    // Pods pinned to V100 alone must land inside {V100, V100S} too.
    assert_eq!(share(&["V100", "V100S"]), 4.0 / 16.0);
    assert_eq!(pinned.sets.len(), 3, "unpinned demand forms no set");
    assert!(PinnedDemand::of_counts([]).is_empty());
}

#[test]
fn a_model_is_short_while_its_free_room_is_below_its_share_of_all_free_room() {
    let pinned = seen();
    // 16 GPUs free in all: T4 needs 4 of them, V100 2, the V100 pair 4.
    let t4 = of_model("t4", "T4", 4);
    let v100 = of_model("v100", "V100", 2);
    let v100s = of_model("v100s", "V100S", 2);
    let g2 = of_model("g2", "G2", 8);
    let pressure = ModelPressure::of(&pinned, [&t4, &v100, &v100s, &g2]);
    assert!(
        pressure.short().is_empty(),
        "every set has exactly its room"
    );
    // One T4 GPU taken: 3 free against 15/4 needed.
    let busy = with_used(t4.clone(), 0, 100, 100);
    let pressure = ModelPressure::of(&pinned, [&busy, &v100, &v100s, &g2]);
    assert_eq!(pressure.short(), [Arc::from("T4")]);
    assert_eq!(
        (pressure.tier(&busy, None), pressure.tier(&g2, None)),
        (1, 0)
    );
    // The V100S GPUs taken instead: the pair has 2 free against 14/4.
    let full = with_used(with_used(v100s.clone(), 0, 100, 100), 1, 100, 100);
    let pressure = ModelPressure::of(&pinned, [&t4, &v100, &full, &g2]);
    assert_eq!(pressure.short(), [Arc::from("V100"), Arc::from("V100S")]);
    // Nothing learnt: nothing is short.
    let none = ModelPressure::of(&PinnedDemand::default(), [&busy, &full]);
    assert!(none.short().is_empty());
}

/// A pod that accepts every model leaves the short one to the pods pinned to it, even
/// where the policy alone would take it, and takes it when nothing else fits.
#[test]
fn placement_leaves_short_models_to_pinned_pods_but_never_refuses_for_them() {
    let placer = Placer::new(Policy::Binpack).with_pinned(Arc::new(seen()));
    // Binpack prefers the T4 node, already in use; T4 is short (2 of 10 GPUs free,
    // a quarter of the demand pinned to it).
    let t4 = with_used(with_used(of_model("t4", "T4", 4), 0, 100, 100), 1, 100, 100);
    let g2 = of_model("g2", "G2", 8);
    let nodes = [t4.clone(), g2.clone()];
    let whole = GpuRequest::one(GpuDemand::Whole { gpus: 1 });
    let chosen = |placer: &Placer, request: &GpuRequest, nodes: &[NodeGpus]| {
        let outcome = place(placer, request, nodes, |_| Ok(()));
        outcome.chosen.map(|(i, _)| nodes[i].name.to_string())
    };
    assert_eq!(chosen(&placer, &whole, &nodes).as_deref(), Some("g2"));
    let plain = Placer::new(Policy::Binpack);
    assert_eq!(chosen(&plain, &whole, &nodes).as_deref(), Some("t4"));
    // Only the short model has room: the pod gets it.
    let g2_full = (0..8).fold(g2, |n, i| with_used(n, i, 100, 100));
    let nodes = [t4, g2_full];
    assert_eq!(chosen(&placer, &whole, &nodes).as_deref(), Some("t4"));
}

/// `milli` CPU free beside a node's GPUs, as `simulate` and the planner see it.
fn cpu(milli: u64) -> Option<HostRoom> {
    Some(HostRoom {
        cpu_milli: milli,
        memory_mib: 1 << 20,
    })
}

/// Demand seen: T4-pinned pods of one GPU and 16 CPUs each (160 milli per vcuda-core),
/// 8 GPUs free to go anywhere.
fn cpu_hungry_t4() -> PinnedDemand {
    let mut t4 = shape(1, &["T4"]);
    t4.host.cpu_milli = 16_000;
    let shapes = [(t4, 4), (shape(8, &[]), 1)];
    PinnedDemand::of_counts(shapes.iter().map(|(s, n)| (s, *n)))
}

/// A model in several short sets is judged by the hungriest of their pinned demands:
/// pods pinned to T4 alone ask 20 milli a core, the set {L4, T4} (its own pods at 160,
/// T4's inside it) 113.
#[test]
fn a_model_in_two_short_sets_is_judged_by_the_hungrier() {
    let mut t4 = shape(1, &["T4"]);
    t4.host.cpu_milli = 2_000;
    let mut either = shape(1, &["L4", "T4"]);
    either.host.cpu_milli = 16_000;
    let shapes = [(t4, 2), (either, 4), (shape(2, &[]), 1)];
    let pinned = PinnedDemand::of_counts(shapes.iter().map(|(s, n)| (s, *n)));
    // T4 has 1 of 2 GPUs free, L4 none; 9 free in all: both sets are short.
    let busy_t4 = with_used(of_model("t4", "T4", 2), 0, 100, 100);
    let l4 = (0..2).fold(of_model("l4", "L4", 2), |n, i| with_used(n, i, 100, 100));
    let g2 = of_model("g2", "G2", 8);
    let pressure = ModelPressure::of(&pinned, [&busy_t4, &l4, &g2]);
    assert_eq!(pressure.short(), [Arc::from("L4"), Arc::from("T4")]);
    // 4 CPUs for T4's free GPU: 40 a core. T4's own pinned pods (20 a core) would fit,
    // the pair's (113) would not: the node opens to a pod asking 40.
    let one_gpu = GpuRequest::one(GpuDemand::Whole { gpus: 1 });
    let host = HostRoom {
        cpu_milli: 4_000,
        memory_mib: 0,
    };
    let ask = CpuAsk::on(cpu(4_000), cpu_per_core(&one_gpu, &host));
    assert_eq!(pressure.tier(&busy_t4, ask), 0);
}

#[test]
fn a_sets_cpu_per_core_is_that_of_the_demand_pinned_inside_it() {
    let mut v100 = shape(2, &["V100"]);
    v100.host.cpu_milli = 8_000;
    let mut pair = shape(1, &["V100", "V100S"]);
    pair.host.cpu_milli = 16_000;
    let shapes = [(v100, 1), (pair, 2), (shape(4, &[]), 1)];
    let pinned = PinnedDemand::of_counts(shapes.iter().map(|(s, n)| (s, *n)));
    let cpu_of = |models: &[&str]| {
        let models: Vec<Arc<str>> = models.iter().map(|&m| Arc::from(m)).collect();
        let set = pinned.sets.iter().find(|s| *s.models == *models).unwrap();
        set.cpu_per_core
    };
    // V100 alone: 8 CPUs over 2 GPUs; the pair holds both: 40 CPUs over 4 GPUs.
    assert_eq!(cpu_of(&["V100"]), 8_000.0 / 200.0);
    assert_eq!(cpu_of(&["V100", "V100S"]), 40_000.0 / 400.0);
}

/// A short model's node whose free CPU would run out before its free GPUs for the pods
/// pinned to it opens to a pod asking no more CPU per GPU than the node has; it stays
/// kept for a hungrier pod, where the node has CPU enough, and where no CPU is tracked.
#[test]
fn a_short_models_node_opens_where_its_pinned_pods_would_run_out_of_cpu() {
    let pinned = cpu_hungry_t4();
    // 2 of 4 T4 GPUs free against 4 needed of 10: T4 is short.
    let t4 = with_used(with_used(of_model("t4", "T4", 4), 0, 100, 100), 1, 100, 100);
    let g2 = of_model("g2", "G2", 8);
    let pressure = ModelPressure::of(&pinned, [&t4, &g2]);
    assert_eq!(pressure.short(), [Arc::from("T4")]);
    let one_gpu = GpuRequest::one(GpuDemand::Whole { gpus: 1 });
    let asking = |cpu_milli| {
        cpu_per_core(
            &one_gpu,
            &HostRoom {
                cpu_milli,
                memory_mib: 0,
            },
        )
    };
    let tier = |room, pod_cpu| pressure.tier(&t4, CpuAsk::on(room, asking(pod_cpu)));
    // 8 CPUs for 2 free GPUs: 40 per vcuda-core, where the pinned pods ask 160.
    assert_eq!(tier(cpu(8_000), 4_000), 0, "asks 40 per core: opens");
    assert_eq!(
        tier(cpu(8_000), 4_001),
        1,
        "asks more than the node has per core"
    );
    assert_eq!(tier(None, 4_000), 1, "no CPU tracked (the extender)");
    // 40 CPUs for 2 GPUs: 200 per core, so pinned pods (160) are not CPU-bound there.
    assert_eq!(tier(cpu(40_000), 4_000), 1);
    // The pinned pods ask 1.25 times the node's 128 per core, no more: still kept.
    assert_eq!(tier(cpu(25_600), 4_000), 1);
    assert_eq!(tier(cpu(25_599), 4_000), 0);
    // Per GPU core, whatever the pod's shape: half a GPU with 2 CPUs asks 40 a core,
    // two GPUs with 8 CPUs too; half a GPU with 4 CPUs asks 80.
    let room = |cpu_milli| HostRoom {
        cpu_milli,
        memory_mib: 0,
    };
    let half = GpuRequest::one(GpuDemand::Share {
        core: 50,
        memory: 4,
    });
    let two = GpuRequest::one(GpuDemand::Whole { gpus: 2 });
    let on_t4 = |request: &GpuRequest, cpu_milli| {
        let ask = CpuAsk::on(cpu(8_000), cpu_per_core(request, &room(cpu_milli)));
        pressure.tier(&t4, ask)
    };
    assert_eq!((on_t4(&half, 2_000), on_t4(&two, 8_000)), (0, 0));
    assert_eq!((on_t4(&half, 4_000), on_t4(&two, 8_001)), (1, 1));
    // A model that is not short is open whatever the CPU.
    assert_eq!(pressure.tier(&g2, CpuAsk::on(None, asking(64_000))), 0);
    assert_eq!(
        cpu_per_core(&GpuRequest::default(), &HostRoom::default()),
        None
    );
}

/// A node with its free CPU and memory, as `simulate` and the planner offer them.
struct Hosted(NodeGpus, Option<HostRoom>);

impl crate::placement::Candidate for Hosted {
    fn gpus(&self) -> &NodeGpus {
        &self.0
    }
    fn room(&self) -> Option<HostRoom> {
        self.1
    }
}

/// Through placement: a low-CPU pod that names no model takes the CPU-bound T4 node's
/// GPUs, which binpack prefers, where a hungrier one goes to the model that is not short.
#[test]
fn placement_gives_a_cpu_bound_short_node_to_a_pod_that_fits_its_cpu() {
    let placer = Placer::new(Policy::Binpack).with_pinned(Arc::new(cpu_hungry_t4()));
    let t4 = with_used(with_used(of_model("t4", "T4", 4), 0, 100, 100), 1, 100, 100);
    let nodes = [
        Hosted(t4, cpu(8_000)),
        Hosted(of_model("g2", "G2", 8), cpu(64_000)),
    ];
    let whole = GpuRequest::one(GpuDemand::Whole { gpus: 1 });
    let chosen = |cpu_milli| {
        let host = HostRoom {
            cpu_milli,
            memory_mib: 0,
        };
        let outcome = place_with_host(&placer, &whole, &host, &nodes, |_| Ok(()));
        outcome.chosen.map(|(i, _)| nodes[i].0.name.to_string())
    };
    assert_eq!(chosen(4_000).as_deref(), Some("t4"));
    assert_eq!(chosen(6_000).as_deref(), Some("g2"));
}
