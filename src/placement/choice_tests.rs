#![allow(clippy::unwrap_used)]
use super::*;
use crate::placement::fragment::GpuShape;
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
    assert_eq!((pressure.tier(&busy), pressure.tier(&g2)), (1, 0));
    // The V100S GPUs taken instead: the pair has 2 free against 14/4.
    let full = with_used(with_used(v100s.clone(), 0, 100, 100), 1, 100, 100);
    let pressure = ModelPressure::of(&pinned, [&t4, &v100, &full, &g2]);
    let short: Vec<&str> = pressure.short().iter().map(|m| &**m).collect();
    assert_eq!(short, ["V100", "V100S"]);
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
