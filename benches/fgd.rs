//! CPU time of one FGD placement (`place()`, as the extender's filter calls it) over
//! 5,000 nodes × 8 GPUs, part used, with realistic 10- and 40-shape request mixes.
//! Run: `cargo bench --bench fgd`.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Instant;

use gpu_admission::placement::{
    GpuDemand, GpuRequest, GpuShape, GpuUse, HostRoom, NodeGpus, Placer, Policy, TaskMix,
    TaskShape, fit, place,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The server's allocator, as the binary declares it (`src/main.rs`): what a benchmark
/// measures in process is what the server runs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const NODES: usize = 5_000;
const GPUS: usize = 8;
/// vcuda-memory per GPU (a 32 GiB card in 256 MiB units).
const MEMORY: u32 = 128;
const CALLS: usize = 40;

/// 5,000 nodes: a fifth idle, the rest with each GPU idle, full or partly shared.
fn cluster(rng: &mut ChaCha8Rng) -> Vec<NodeGpus> {
    (0..NODES)
        .map(|i| {
            let idle = rng.random_range(0..5) == 0;
            let used = (0..GPUS)
                .map(|_| {
                    if idle {
                        return GpuUse::default();
                    }
                    match rng.random_range(0..4) {
                        0 => GpuUse::default(),
                        1 => GpuUse {
                            core: 100,
                            memory: MEMORY,
                        },
                        _ => {
                            let core = rng.random_range(1..10) * 10;
                            GpuUse {
                                core,
                                memory: core * MEMORY / 100,
                            }
                        }
                    }
                })
                .collect();
            NodeGpus {
                name: format!("gpu-node-{i:05}").into(),
                model: Some(["T4", "V100M32", "A10"][i % 3].into()),
                pool: None,
                memory_per_gpu: MEMORY,
                used,
                mig_slices: Vec::new(),
                created: 0,
                closed: None,
            }
        })
        .collect()
}

fn share(core: u32) -> GpuShape {
    GpuShape::Share {
        core,
        memory: core * MEMORY / 100,
    }
}

/// The openb default trace's common GPU shapes: 10 of them.
fn mix10() -> TaskMix {
    let shapes = [
        (share(10), 3.0),
        (share(20), 4.0),
        (share(25), 5.0),
        (share(30), 3.0),
        (share(50), 10.0),
        (share(70), 2.0),
        (GpuShape::Whole { gpus: 1 }, 50.0),
        (GpuShape::Whole { gpus: 2 }, 8.0),
        (GpuShape::Whole { gpus: 4 }, 6.0),
        (GpuShape::Whole { gpus: 8 }, 9.0),
    ];
    TaskMix::weighted(shapes.map(|(s, w)| (TaskShape::gpu_only(s), w)))
}

/// 40 shapes, all with distinct GPU parts (the worst case for the per-shape work):
/// shares of 5 % to 95 % in two memory sizes, and whole GPUs; some model-constrained.
fn mix40() -> TaskMix {
    let mut shapes = Vec::new();
    for core in (5..100).step_by(5) {
        shapes.push((TaskShape::gpu_only(share(core)), 2.0));
        let half_memory = GpuShape::Share {
            core,
            memory: core * MEMORY / 200,
        };
        shapes.push((TaskShape::gpu_only(half_memory).with_models(&["T4"]), 1.0));
    }
    for gpus in [1, 8] {
        let mut shape = TaskShape::gpu_only(GpuShape::Whole { gpus });
        shape.host = HostRoom {
            cpu_milli: 8000,
            memory_mib: 1 << 15,
        };
        shapes.push((shape, 10.0));
    }
    TaskMix::weighted(shapes)
}

fn request(demand: GpuDemand) -> GpuRequest {
    GpuRequest::one(demand)
}

/// What `place()` cost before growth was computed from the touched GPUs only: per
/// node, fit() plus the node's whole fragmentation before and after (ms per call).
fn full_recomputation(mix: &TaskMix, req: &GpuRequest, nodes: &[NodeGpus]) -> f64 {
    let started = Instant::now();
    let mut best = f64::INFINITY;
    for _ in 0..CALLS {
        for node in nodes {
            let Ok(assignment) = fit(node, req) else {
                continue;
            };
            // A stack copy, as the old code did.
            let mut used = [GpuUse::default(); GPUS];
            used.copy_from_slice(&node.used);
            for (gpu, add) in assignment.charges(node.memory_per_gpu) {
                used[gpu].core += add.core;
                used[gpu].memory += add.memory;
            }
            let growth = mix.fragmentation_of(node, &used, None) - mix.fragmentation(node, None);
            best = best.min(growth);
        }
    }
    std::hint::black_box(best);
    started.elapsed().as_secs_f64() * 1e3 / CALLS as f64
}

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let nodes = cluster(&mut rng);
    let requests = [
        (
            "share 30%",
            request(GpuDemand::Share {
                core: 30,
                memory: 30 * MEMORY / 100,
            }),
        ),
        ("1 GPU", request(GpuDemand::Whole { gpus: 1 })),
        ("4 GPUs", request(GpuDemand::Whole { gpus: 4 })),
    ];
    for (label, mix) in [("10-shape", mix10()), ("40-shape", mix40())] {
        assert_eq!(mix.len(), if label == "10-shape" { 10 } else { 40 });
        let placer = Placer::new(Policy::Fgd).with_mix(Arc::new(mix));
        for (what, req) in &requests {
            // Warm up, then time.
            let first = place(&placer, req, &nodes, |_| Ok(()));
            assert!(first.chosen.is_some());
            let started = Instant::now();
            for _ in 0..CALLS {
                let outcome = place(&placer, req, &nodes, |_| Ok(()));
                assert_eq!(outcome.chosen, first.chosen);
            }
            let per_call = started.elapsed().as_secs_f64() * 1e3 / CALLS as f64;
            let full = full_recomputation(&placer.mix, req, &nodes);
            println!(
                "fgd place(), {NODES} nodes x {GPUS} GPUs, {label} mix, {what}: \
                 {per_call:.2} ms per call (fit + whole fragmentation before and after: {full:.2} ms)"
            );
        }
    }
}
