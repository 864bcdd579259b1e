//! Tests of the fragmentation measure, the mixes and fragment-aware fitting.

#![allow(clippy::unwrap_used)]
use super::*;
use crate::placement::node::GpuUse;
use crate::placement::testing::{node, with_used};

const HALF: GpuShape = GpuShape::Share {
    core: 50,
    memory: 50,
};
const ONE: GpuShape = GpuShape::Whole { gpus: 1 };

fn mix(shapes: &[(GpuShape, f64)]) -> TaskMix {
    TaskMix::weighted(shapes.iter().map(|&(s, w)| (TaskShape::gpu_only(s), w)))
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

#[test]
fn cluster_fragmentation_is_the_unusable_share_of_free_capacity() {
    // 60 cores free on a shared GPU, 3 idle GPUs (300), a full node (nothing free).
    let shared = with_used(node("a", 4, 100), 0, 40, 40);
    let full = with_used(with_used(node("b", 2, 100), 0, 100, 100), 1, 100, 100);
    let nodes = [shared, full];
    // A half-GPU task can use 50 of the 60 (and all of the idle GPUs); a whole-GPU
    // task none of the 60: (0.5 * 10 + 0.5 * 60) of 360.
    let half_and_whole = mix(&[(HALF, 0.5), (ONE, 0.5)]);
    close(half_and_whole.cluster_fragmentation(&nodes), 35.0 / 360.0);
    // Nothing seen yet: the typical request is one whole GPU, so all 60 are lost.
    close(
        TaskMix::default().cluster_fragmentation(&nodes),
        60.0 / 360.0,
    );
    // Nothing free at all: no fragmentation.
    close(half_and_whole.cluster_fragmentation(&nodes[1..]), 0.0);
}

#[test]
fn one_gpu_thirty_percent_used_half_share_and_whole_mix() {
    // One GPU, 30 cores used: 70 free. Half-GPU task (50%): one fits, 20 are left
    // over. One-GPU task (50%): the GPU is not wholly free, so all 70 are fragments.
    // Expected: 0.5 * 20 + 0.5 * 70 = 45.
    let n = with_used(node("n", 1, 100), 0, 30, 30);
    close(
        mix(&[(HALF, 0.5), (ONE, 0.5)]).fragmentation(&n, None),
        45.0,
    );
    // At 60 used: 40 free < 50, so the half task can't use it either: 40.
    let n = with_used(node("n", 1, 100), 0, 60, 60);
    close(
        mix(&[(HALF, 0.5), (ONE, 0.5)]).fragmentation(&n, None),
        40.0,
    );
}

#[test]
fn multi_gpu_task_counts_whole_node_when_too_few_free_gpus() {
    // 4 GPUs: GPU0 80 used (20 free), GPU1 fully used, GPU2-3 free. Total free 220.
    // 2-GPU task (weight 1/4): two wholly free GPUs, fragment = the partial 20.
    // 4-GPU task (weight 1/4): only 2 free GPUs, fragment = all 220.
    // Quarter share (25 cores, weight 1/2): GPU0's 20 < 25, fragment = 20.
    // Expected: 0.25 * 20 + 0.25 * 220 + 0.5 * 20 = 70.
    let n = with_used(with_used(node("n", 4, 100), 0, 80, 80), 1, 100, 100);
    let quarter = GpuShape::Share {
        core: 25,
        memory: 25,
    };
    let m = mix(&[
        (GpuShape::Whole { gpus: 2 }, 1.0),
        (GpuShape::Whole { gpus: 4 }, 1.0),
        (quarter, 2.0),
    ]);
    close(m.fragmentation(&n, None), 70.0);
}

#[test]
fn share_tasks_strand_what_is_left_after_as_many_as_fit() {
    let thirty = mix(&[(
        GpuShape::Share {
            core: 30,
            memory: 30,
        },
        1.0,
    )]);
    // Idle GPU: three fit, 10 left over.
    close(thirty.fragmentation(&node("n", 1, 100), None), 10.0);
    // 20 used: 80 free, two fit, 20 left over.
    close(
        thirty.fragmentation(&with_used(node("n", 1, 100), 0, 20, 20), None),
        20.0,
    );
    // 10 cores but 70 memory used: memory lets one task in of the three the 90
    // free cores would hold, so 60 cores are left over.
    close(
        thirty.fragmentation(&with_used(node("n", 1, 100), 0, 10, 70), None),
        60.0,
    );
    // 90 used: 10 free, none fits, all 10.
    close(
        thirty.fragmentation(&with_used(node("n", 1, 100), 0, 90, 90), None),
        10.0,
    );
}

#[test]
fn memory_short_gpu_is_a_fragment_for_share_tasks() {
    // 10 cores used but 60 of 100 memory: 90 cores free, 40 memory free. A half task
    // needs 50 memory, so all 90 free cores are fragments.
    let n = with_used(node("n", 1, 100), 0, 10, 60);
    close(mix(&[(HALF, 1.0)]).fragmentation(&n, None), 90.0);
}

#[test]
fn host_room_and_models_decide_which_shapes_count() {
    // Node: 2 free GPUs (200 cores), model T4, 4 CPUs left.
    let mut n = node("n", 2, 100);
    n.model = Some("T4".into());
    let room = HostRoom {
        cpu_milli: 4000,
        memory_mib: 1 << 20,
    };
    let cpu_heavy = TaskShape {
        gpu: ONE,
        host: HostRoom {
            cpu_milli: 8000,
            memory_mib: 0,
        },
        models: None,
    };
    let v100_only = TaskShape::gpu_only(HALF).with_models(&["V100"]);
    let t4_half = TaskShape::gpu_only(HALF).with_models(&["T4", "V100"]);
    let m = TaskMix::weighted([(cpu_heavy, 1.0), (v100_only, 2.0), (t4_half, 1.0)]);
    // cpu_heavy (1/4) can't get its CPU: all 200 free cores are fragments = 50.
    // v100_only (1/2) can never run on a T4: all 200 too = 100. t4_half (1/4): 0.
    close(m.fragmentation(&n, Some(&room)), 150.0);
    // Without CPU tracking, the CPU-heavy task fits: only the V100 task's 100.
    close(m.fragmentation(&n, None), 100.0);
}

#[test]
fn shapes_bigger_than_the_node_count_all_free_capacity() {
    let n = with_used(node("n", 2, 100), 0, 30, 30);
    // 170 free. An 8-GPU task can never run on 2 GPUs: 170. A one-GPU task can use
    // GPU1 but not GPU0's 70. Expected: 0.5 * 170 + 0.5 * 70 = 120.
    let m = mix(&[(GpuShape::Whole { gpus: 8 }, 1.0), (ONE, 1.0)]);
    close(m.fragmentation(&n, None), 120.0);
}

#[test]
fn mix_weighs_shapes_by_frequency_over_root_size_without_memory() {
    let with_memory = |memory_mib| TaskShape {
        gpu: HALF,
        host: HostRoom {
            cpu_milli: 4000,
            memory_mib,
        },
        models: None,
    };
    let mut shapes = vec![TaskShape::gpu_only(ONE); 90];
    // Two memory sizes of the same half-GPU task are one shape: 6 of 100.
    shapes.extend(vec![with_memory(1024); 3]);
    shapes.extend(vec![with_memory(2048); 3]);
    // The rare tail is kept.
    shapes.extend(vec![TaskShape::gpu_only(GpuShape::Whole { gpus: 8 }); 4]);
    let m = TaskMix::from_shapes(shapes);
    let kept: Vec<_> = m.shapes().collect();
    assert_eq!(kept.len(), 3);
    let weight = |gpu| kept.iter().find(|(g, _, _)| *g == gpu).unwrap();
    // Frequency / sqrt(GPUs): 90 / 1, 6 / sqrt(0.5), 4 / sqrt(8), i.e. 90, 8.485
    // and 1.414 of 99.899: the 8-GPU shape weighs 1.4%, not its 4% of the pods.
    let total = 90.0 + 6.0 * 2f64.sqrt() + 4.0 / 8f64.sqrt();
    close(weight(ONE).2, 90.0 / total);
    close(
        weight(GpuShape::Whole { gpus: 8 }).2,
        4.0 / 8f64.sqrt() / total,
    );
    assert!((weight(GpuShape::Whole { gpus: 8 }).2 - 0.01416).abs() < 1e-5);
    let half = weight(HALF);
    close(half.2, 6.0 * 2f64.sqrt() / total);
    assert_eq!((half.1.cpu_milli, half.1.memory_mib), (4000, 0));
}

#[test]
fn mix_keeps_at_most_the_most_common_gpu_shapes() {
    let mut shapes = Vec::new();
    for core in 1..=(MAX_GPU_SHAPES as u32 + 5) {
        let share = GpuShape::Share { core, memory: core };
        // core 1 is the rarest: seen once; higher cores more often.
        shapes.extend(vec![TaskShape::gpu_only(share); core as usize]);
    }
    let m = TaskMix::from_shapes(shapes);
    assert_eq!(m.len(), MAX_GPU_SHAPES);
    assert!(
        m.shapes()
            .all(|(g, _, _)| matches!(g, GpuShape::Share { core, .. } if core > 5))
    );
}

#[test]
fn growth_equals_fragmentation_after_minus_before() {
    // Every charge of every share and whole shape on nodes in many states, with
    // rooms that make the CPU-heavy shape flip between runnable and not.
    let heavy = TaskShape {
        gpu: GpuShape::Whole { gpus: 2 },
        host: HostRoom {
            cpu_milli: 4000,
            memory_mib: 0,
        },
        models: None,
    };
    let quarter = GpuShape::Share {
        core: 25,
        memory: 40,
    };
    let m = TaskMix::weighted([
        (TaskShape::gpu_only(HALF), 3.0),
        (TaskShape::gpu_only(quarter), 2.0),
        (TaskShape::gpu_only(ONE), 5.0),
        (TaskShape::gpu_only(GpuShape::Whole { gpus: 4 }), 1.0),
        (TaskShape::gpu_only(GpuShape::Whole { gpus: 8 }), 1.0),
        (heavy, 2.0),
    ]);
    let room = |cpu| HostRoom {
        cpu_milli: cpu,
        memory_mib: 1 << 20,
    };
    let rooms = [
        (None, None),
        (Some(room(8000)), Some(room(6000))),
        (Some(room(5000)), Some(room(3000))),
        (Some(room(3000)), Some(room(3000))),
    ];
    let states: [&[(u32, u32)]; 4] = [
        &[(0, 0), (0, 0), (0, 0), (0, 0)],
        &[(30, 30), (100, 100), (0, 0), (60, 90)],
        &[(50, 50), (75, 20), (10, 80), (0, 0)],
        &[(100, 100), (100, 100), (90, 90), (0, 0)],
    ];
    for used in states {
        let mut n = node("n", used.len(), 100);
        for (i, &(core, memory)) in used.iter().enumerate() {
            n = with_used(n, i, core, memory);
        }
        for (gpu, add) in (0..n.gpu_count()).flat_map(|i| {
            [(10, 10), (25, 40), (50, 50), (100, 100)].map(|(c, mem)| {
                (
                    i,
                    GpuUse {
                        core: c,
                        memory: mem,
                    },
                )
            })
        }) {
            for (before, after) in rooms {
                let mut charged = n.clone();
                charged.used[gpu].core += add.core;
                charged.used[gpu].memory += add.memory;
                let expected = m.fragmentation(&charged, after.as_ref())
                    - m.fragmentation(&n, before.as_ref());
                close(
                    m.growth(&n, [(gpu, add)], before.as_ref(), after.as_ref()),
                    expected,
                );
            }
        }
        // Two GPUs at once, one of them twice.
        let add = GpuUse {
            core: 20,
            memory: 20,
        };
        let mut charged = n.clone();
        for gpu in [0, 3, 0] {
            charged.used[gpu].core += add.core;
            charged.used[gpu].memory += add.memory;
        }
        let expected = m.fragmentation(&charged, None) - m.fragmentation(&n, None);
        close(
            m.growth(&n, [(0, add), (3, add), (0, add)], None, None),
            expected,
        );
    }
}

#[test]
fn request_mix_learns_from_requests_across_threads() {
    let learnt = RequestMix::new();
    let whole = TaskShape::gpu_only(GpuShape::Whole { gpus: 1 });
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10 {
                    learnt.observe_shape(whole.clone());
                }
            });
        }
    });
    assert_eq!(learnt.observed(), 40);
    let m = learnt.snapshot();
    assert_eq!(m.len(), 1);
    close(
        m.fragmentation(&with_used(node("n", 1, 4), 0, 10, 1), None),
        90.0,
    );
}

#[test]
fn request_mix_keeps_a_bounded_number_of_shapes() {
    let learnt = RequestMix::new();
    let shape = |cpu_milli| TaskShape {
        host: HostRoom {
            cpu_milli,
            memory_mib: 0,
        },
        ..TaskShape::gpu_only(ONE)
    };
    // Forged filter calls, each a new shape: only the first MAX_SHAPES are kept.
    for cpu in 0..(MAX_SHAPES as u64 + 500) {
        learnt.observe_shape(shape(cpu));
    }
    assert_eq!(learnt.counts.lock().len(), MAX_SHAPES);
    assert_eq!(learnt.observed(), MAX_SHAPES as u64);
    // A known shape keeps counting once the mix is full; an unseen one does not.
    learnt.observe_shape(shape(0));
    learnt.observe_shape(shape(u64::MAX));
    assert_eq!(learnt.counts.lock()[&shape(0)], 2);
    assert!(!learnt.counts.lock().contains_key(&shape(u64::MAX)));
}
