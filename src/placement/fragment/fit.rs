//! Fragment-aware fitting: the GPU for each share container that leaves the node least
//! fragmented under the request mix.

use crate::placement::fit::{Assignment, GpuChoice, fit_held, pick_whole};
use crate::placement::node::{GpuUse, NodeGpus};
use crate::placement::request::{GpuDemand, GpuRequest};

use super::mix::TaskMix;
use super::shape::HostRoom;

/// Fit `request` on `node` choosing, for each share container, the GPU whose use
/// leaves the node least fragmented under `mix` (ties: gpu-manager's own order);
/// whole GPUs as gpu-manager takes them (any wholly free GPU is as good as another).
/// `None` if some container finds no GPU. Not gpu-manager compatible: see `Placer`.
pub(crate) fn least_fragmenting_fit(
    node: &NodeGpus,
    request: &GpuRequest,
    mix: &TaskMix,
    room_after: Option<&HostRoom>,
) -> Option<Assignment> {
    let mut scratch = node.clone();
    let mut assignment = Assignment::default();
    for container in &request.containers {
        let gpus = match container.demand {
            GpuDemand::Share { core, memory } => {
                vec![least_fragmenting_gpu(
                    &scratch, core, memory, mix, room_after,
                )?]
            }
            GpuDemand::Whole { gpus } => pick_whole(&scratch, gpus).ok()?,
        };
        let choice = Assignment {
            choices: vec![GpuChoice {
                container: container.container,
                demand: container.demand,
                gpus,
            }],
            held: Vec::new(),
        };
        choice.occupy(&mut scratch);
        assignment.choices.extend(choice.choices);
    }
    assignment.held = fit_held(&scratch, request).ok()?;
    Some(assignment)
}

fn least_fragmenting_gpu(
    node: &NodeGpus,
    core: u32,
    memory: u32,
    mix: &TaskMix,
    room_after: Option<&HostRoom>,
) -> Option<u8> {
    // The room is the same whichever GPU is chosen, so the growth with `room_after`
    // on both sides orders the GPUs as the fragmentation after would.
    (0..node.gpu_count())
        .filter(|&i| node.free_core(i) >= core && node.free_memory(i) >= memory)
        .map(|i| {
            let charge = GpuUse { core, memory };
            let growth = mix.growth(node, [(i, charge)], room_after, room_after);
            let fragments = (growth * 1e6).round() as i64;
            ((fragments, node.free_core(i), node.free_memory(i), i), i)
        })
        .min()
        .and_then(|(_, i)| u8::try_from(i).ok())
}
