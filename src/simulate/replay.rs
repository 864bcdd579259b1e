//! One simulated run: the workload placed pod by pod through the extender's own
//! `place_with_host()`, CPU and memory checked by the `allowed` callback.

use std::sync::Arc;
use std::time::Instant;

use crate::placement::defrag::{Ask, Ground, Limits, NodeParts, Planner, Resident, put};
use crate::placement::fit::{Assignment, Misfit};
use crate::placement::fragment::{GpuShape, HostRoom, RequestMix, TaskMix, TaskShape};
use crate::placement::request::{CORE_PER_GPU, GpuDemand, GpuRequest};
use crate::placement::{Candidate, GpuUse, NodeGpus, Placer, place_with_host};

use super::defrag::DefragStats;
use super::trace::{NodeRow, PodRow};

/// vcuda-memory per GPU in the simulation: 100, so a share's memory equals its cores
/// and memory stays exactly proportional to the GPU share (docs/design.md).
const MEMORY_PER_GPU: u32 = 100;

/// Where FGD's request mix comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum MixSource {
    /// Known in advance: the shapes of the trace's GPU pods (the paper's setup).
    Known,
    /// Learnt from the pods seen so far, as the extender must.
    Online,
}

/// A trace pod read once into what placement needs.
#[derive(Debug, Clone)]
pub(super) struct SimPod {
    pub(super) request: GpuRequest,
    pub(super) host: HostRoom,
    pub(super) models: Vec<Arc<str>>,
    pub(super) demand_milli: u64,
    /// `None` for CPU-only pods, which take no part in the mix.
    shape: Option<TaskShape>,
}

impl SimPod {
    pub(super) fn of(row: &PodRow) -> SimPod {
        let request = gpu_request(row);
        let host = HostRoom {
            cpu_milli: row.cpu_milli,
            memory_mib: row.memory_mib,
        };
        let shape = GpuShape::of_request(&request).map(|gpu| {
            TaskShape {
                gpu,
                host,
                models: None,
            }
            .with_models(&row.models)
        });
        SimPod {
            request,
            host,
            models: {
                // In the trace's order, without repeats: `V100M32|V100M32` is one model.
                let mut models: Vec<Arc<str>> = Vec::new();
                for model in &row.models {
                    if !models.iter().any(|m| **m == **model) {
                        models.push(model.as_str().into());
                    }
                }
                models
            },
            demand_milli: row.gpu_demand_milli(),
            shape,
        }
    }
}

/// share mode below one GPU (`gpu_milli / 10` vcuda-core, rounded up), else whole GPUs.
fn gpu_request(row: &PodRow) -> GpuRequest {
    let demand = match row.num_gpu {
        0 => None,
        1 if row.gpu_milli < 1000 => {
            let core = row.gpu_milli.div_ceil(1000 / CORE_PER_GPU);
            Some(GpuDemand::Share { core, memory: core })
        }
        gpus => Some(GpuDemand::Whole { gpus }),
    };
    demand.map(GpuRequest::one).unwrap_or_default()
}

/// A node during the run: its GPUs, its free CPU and memory and, in the placement
/// protocol, the pods placed on it (by arrival step), which `--defrag` may move.
#[derive(Debug, Clone)]
pub(super) struct SimNode {
    pub(super) gpus: NodeGpus,
    pub(super) room: HostRoom,
    pub(super) residents: Vec<Resident<usize>>,
}

impl SimNode {
    pub(super) fn of(row: &NodeRow) -> SimNode {
        SimNode {
            gpus: NodeGpus {
                name: row.name.as_str().into(),
                model: Some(row.model.as_str().into()),
                pool: None,
                memory_per_gpu: MEMORY_PER_GPU,
                used: vec![GpuUse::default(); row.gpus as usize],
                mig_slices: Vec::new(),
                created: 0,
                closed: None,
            },
            room: HostRoom {
                cpu_milli: row.cpu_milli,
                memory_mib: row.memory_mib,
            },
            residents: Vec::new(),
        }
    }

    /// The scheduler's own filters: GPU model, CPU, memory.
    fn admits(&self, pod: &SimPod) -> Result<(), Misfit> {
        model_admits(&self.gpus, pod)?;
        self.host_admits(pod)
    }

    /// [`admits`](Self::admits), with the models the pod may go to (those its quota has
    /// room on) in place of the pod's own.
    pub(super) fn admits_models(&self, pod: &SimPod, models: &[String]) -> Result<(), Misfit> {
        let model = self.gpus.model.as_deref();
        if !models.iter().any(|m| Some(m.as_str()) == model) {
            return Err(Misfit::ModelNotWanted {
                model: self.gpus.model.clone(),
                wanted: models.into(),
            });
        }
        self.host_admits(pod)
    }

    fn host_admits(&self, pod: &SimPod) -> Result<(), Misfit> {
        let short = |resource, need, free| Misfit::HostShort {
            resource,
            need,
            free,
        };
        if pod.host.cpu_milli > self.room.cpu_milli {
            return Err(short("milli-CPU", pod.host.cpu_milli, self.room.cpu_milli));
        }
        if pod.host.memory_mib > self.room.memory_mib {
            return Err(short(
                "MiB memory",
                pod.host.memory_mib,
                self.room.memory_mib,
            ));
        }
        Ok(())
    }
}

/// Whether `pod` accepts the GPU model of `gpus` (any, when it names none).
fn model_admits(gpus: &NodeGpus, pod: &SimPod) -> Result<(), Misfit> {
    let model = gpus.model.as_deref();
    if !pod.models.is_empty() && !pod.models.iter().any(|m| Some(&**m) == model) {
        return Err(Misfit::ModelNotWanted {
            model: gpus.model.clone(),
            wanted: pod.models.iter().map(|m| m.to_string()).collect(),
        });
    }
    Ok(())
}

impl Candidate for SimNode {
    fn gpus(&self) -> &NodeGpus {
        &self.gpus
    }
    fn room(&self) -> Option<HostRoom> {
        Some(self.room)
    }
}

impl Ground for SimNode {
    type Pod = usize;

    fn residents(&self) -> &[Resident<usize>] {
        &self.residents
    }

    fn parts_mut(&mut self) -> NodeParts<'_, usize> {
        NodeParts {
            gpus: &mut self.gpus,
            room: Some(&mut self.room),
            residents: &mut self.residents,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub(super) struct RunResult {
    pub(super) pods: usize,
    pub(super) failed: usize,
    /// The GPU pods among `failed`, by shape.
    pub(super) refused: Refused,
    pub(super) capacity_milli: u64,
    pub(super) allocated_milli: u64,
    /// Allocated share (%) when the arrived GPU demand first reached 100% of capacity.
    pub(super) allocated_pct_at_100: Option<f64>,
    /// (arrived demand %, allocated %) after each GPU pod, thinned for plotting.
    pub(super) curve: Vec<(f64, f64)>,
    /// What `--defrag`'s planner did (nothing without it).
    pub(super) defrag: DefragStats,
}

/// GPU pods that found no place, by shape: a share of one GPU, one whole GPU, several.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(super) struct Refused {
    pub(super) share: usize,
    pub(super) one_gpu: usize,
    pub(super) several_gpus: usize,
}

impl Refused {
    /// Count `request` (nothing for a pod without GPUs).
    fn count(&mut self, request: &GpuRequest) {
        match GpuShape::of_request(request) {
            Some(GpuShape::Share { .. }) => self.share += 1,
            Some(GpuShape::Whole { gpus: 1 }) => self.one_gpu += 1,
            Some(GpuShape::Whole { .. }) => self.several_gpus += 1,
            None => {}
        }
    }

    pub(super) fn total(&self) -> usize {
        self.share + self.one_gpu + self.several_gpus
    }
}

impl RunResult {
    pub(super) fn allocated_pct(&self) -> f64 {
        percent(self.allocated_milli, self.capacity_milli)
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Place `order` (indices into `pods`) on fresh `nodes`, one by one, never removing;
/// with `defrag`, a GPU pod that fits nowhere is seated by a plan of moves if one exists.
pub(super) fn run(
    placer: &Placer,
    mix: MixSource,
    nodes: &[SimNode],
    pods: &[SimPod],
    order: &[usize],
    defrag: Option<Limits>,
) -> RunResult {
    let mut cluster = nodes.to_vec();
    let mut placer = placer.clone();
    let learnt = RequestMix::new();
    let capacity_milli = cluster
        .iter()
        .map(|n| n.gpus.gpu_count() as u64 * 1000)
        .sum();
    let mut result = RunResult {
        capacity_milli,
        pods: order.len(),
        ..RunResult::default()
    };
    let mut any_model: Vec<Arc<str>> = cluster
        .iter()
        .filter_map(|n| n.gpus.model.clone())
        .collect();
    any_model.sort();
    any_model.dedup();
    let any_model: Arc<[Arc<str>]> = any_model.into();
    let mut arrived = 0u64;
    let thin = (order.len() / 500).max(1);
    for (step, &index) in order.iter().enumerate() {
        let pod = &pods[index];
        learn(&mut placer, mix, &learnt, pod);
        let plan_for = defrag.filter(|_| pod.request.has_gpu_demand());
        let seat = Seat {
            pod,
            step,
            any_model: &any_model,
        };
        let seated = place_one(&placer, &mut cluster, seat)
            || plan_for.is_some_and(|limits| {
                seat_by_plan(&placer, limits, &mut cluster, seat, &mut result.defrag)
            });
        if seated {
            result.allocated_milli += pod.demand_milli;
        } else {
            result.failed += 1;
            result.refused.count(&pod.request);
        }
        arrived += pod.demand_milli;
        if result.allocated_pct_at_100.is_none() && arrived >= capacity_milli {
            result.allocated_pct_at_100 = Some(result.allocated_pct());
        }
        if step % thin == 0 || step + 1 == order.len() {
            result
                .curve
                .push((percent(arrived, capacity_milli), result.allocated_pct()));
        }
    }
    result
}

/// Place the pod and charge the node it gets; false if no node can take it.
fn place_one(placer: &Placer, cluster: &mut [SimNode], seat: Seat<'_>) -> bool {
    let pod = seat.pod;
    let outcome = place_with_host(placer, &pod.request, &pod.host, &*cluster, |n| {
        n.admits(pod)
    });
    let Some((chosen, assignment)) = outcome.chosen else {
        return false;
    };
    put(&mut cluster[chosen], seat.resident(assignment));
    true
}

/// A pod as it is seated: its arrival `step`, and every GPU model of the cluster (where
/// a move may land a pod that names none).
#[derive(Clone, Copy)]
struct Seat<'a> {
    pod: &'a SimPod,
    step: usize,
    any_model: &'a Arc<[Arc<str>]>,
}

impl Seat<'_> {
    /// The pod running on the GPUs `assignment` names. The trace has no priorities or
    /// pools: every pod has priority 0 and may go to any pool. A pod that accepts
    /// several models (none named, or a list) may be moved to any of them.
    fn resident(&self, assignment: Assignment) -> Resident<usize> {
        let pod = self.pod;
        let other_models = match pod.models.len() {
            0 => self.any_model.clone(),
            1 => Arc::from(Vec::new()),
            _ => pod.models.iter().cloned().collect(),
        };
        Resident {
            pod: self.step,
            request: pod.request.clone(),
            host: pod.host,
            assignment,
            priority: 0,
            pools: Arc::from(Vec::new()),
            other_models,
        }
    }
}

/// The pod is seen (as the extender sees it when asked to filter it) before it is
/// placed: the demand pinned to models is always learnt so (model choice never reads
/// the trace's future), FGD's mix only in online mode.
fn learn(placer: &mut Placer, mix: MixSource, learnt: &RequestMix, pod: &SimPod) {
    let Some(shape) = &pod.shape else { return };
    if learnt.observe_shape(shape.clone()) {
        placer.pinned = Arc::new(learnt.pinned());
        if mix == MixSource::Online {
            placer.mix = Arc::new(learnt.snapshot());
        }
    }
}

/// The mix FGD knows in advance: the trace's own GPU pods.
pub(super) fn known_mix(pods: &[SimPod]) -> TaskMix {
    TaskMix::from_shapes(pods.iter().filter_map(|p| p.shape.clone()))
}

/// `--defrag`: seat `pod` (arrival `step`), which fits on no node as the cluster is,
/// by the planner's plan, carried out here (the moves in order, then the pod); false
/// if there is none. The trace has no priorities and no opt-in: every pod may move.
fn seat_by_plan(
    placer: &Placer,
    limits: Limits,
    cluster: &mut [SimNode],
    seat: Seat<'_>,
    stats: &mut DefragStats,
) -> bool {
    let pod = seat.pod;
    let planner = Planner { placer, limits };
    let ask = Ask {
        request: &pod.request,
        host: pod.host,
        priority: 0,
    };
    let started = Instant::now();
    let plan = planner.plan(&*cluster, &ask, |gpus| model_admits(gpus, pod), |_| true);
    stats.plan_ms.push(started.elapsed().as_secs_f64() * 1e3);
    let plan = match plan {
        Ok(plan) => plan,
        Err(why) => {
            *stats.unplanned.entry(why.kind()).or_default() += 1;
            return false;
        }
    };
    // The plan was made for this very cluster, so carrying it out cannot go stale.
    let seated = plan
        .apply(cluster, seat.resident(Assignment::default()))
        .is_ok();
    stats.moves += plan.moves.len();
    stats.seated += usize::from(seated);
    seated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Policy;

    fn node(name: &str, cpu_milli: u64) -> SimNode {
        SimNode::of(&NodeRow {
            name: name.into(),
            cpu_milli,
            memory_mib: 262_144,
            gpus: 2,
            model: "T4".into(),
        })
    }

    fn row(cpu_milli: u64, num_gpu: u32) -> PodRow {
        PodRow {
            name: "p".into(),
            cpu_milli,
            memory_mib: 1_024,
            num_gpu,
            gpu_milli: if num_gpu == 0 { 0 } else { 1000 },
            models: Vec::new(),
            life: None,
        }
    }

    fn pod(cpu_milli: u64, num_gpu: u32) -> SimPod {
        SimPod::of(&row(cpu_milli, num_gpu))
    }

    /// One GPU pod that names no model runs on the A100 node; a 2-GPU pod pinned to
    /// A100 finds one GPU free there until `--defrag` moves the first pod to the T4
    /// node (it accepts any model). Pinned to A100 itself, the first pod stays.
    #[test]
    fn defrag_moves_a_pod_that_names_no_model_to_another_model() {
        let on = |name: &str, model: &str| {
            SimNode::of(&NodeRow {
                name: name.into(),
                cpu_milli: 32_000,
                memory_mib: 262_144,
                gpus: 2,
                model: model.into(),
            })
        };
        let nodes = [on("a", "A100"), on("t", "T4")];
        let pinned = |num_gpu: u32| {
            SimPod::of(&PodRow {
                models: vec!["A100".into()],
                ..row(1_000, num_gpu)
            })
        };
        let placer = Placer::new(Policy::Binpack);
        let limits = Some(Limits::default());
        let free = [SimPod::of(&row(1_000, 1)), pinned(2)];
        let moved = run(&placer, MixSource::Known, &nodes, &free, &[0, 1], limits);
        assert_eq!((moved.failed, moved.defrag.moves), (0, 1));
        let kept = [pinned(1), pinned(2)];
        let stays = run(&placer, MixSource::Known, &nodes, &kept, &[0, 1], limits);
        assert_eq!((stays.failed, stays.defrag.moves), (1, 0));
    }

    /// A batch job takes n0's CPU; the first 2-GPU pod goes to n1, the second finds
    /// n0's GPUs free but no CPU there, until `--defrag` moves the batch job to n1.
    #[test]
    fn defrag_seats_a_pod_by_moving_a_cpu_pod_off_its_node() {
        let nodes = [node("n0", 32_000), node("n1", 64_000)];
        let pods = [pod(30_000, 0), pod(4_000, 2)];
        let order = [0, 1, 1];
        let placer = Placer::new(Policy::Binpack);
        let plain = run(&placer, MixSource::Known, &nodes, &pods, &order, None);
        assert_eq!((plain.failed, plain.allocated_milli), (1, 2000));
        assert_eq!((plain.refused.several_gpus, plain.refused.total()), (1, 1));
        assert!(plain.defrag.plan_ms.is_empty());
        let limits = Some(Limits::default());
        let moved = run(&placer, MixSource::Known, &nodes, &pods, &order, limits);
        assert_eq!((moved.failed, moved.allocated_milli), (0, 4000));
        assert_eq!(moved.refused.total(), 0);
        assert_eq!((moved.defrag.seated, moved.defrag.moves), (1, 1));
        assert_eq!(moved.defrag.plan_ms.len(), 1);
    }
}
