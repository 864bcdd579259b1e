//! Fitting a pod's GPU containers onto one node's GPUs, the way gpu-manager will.

use std::fmt;
use std::sync::Arc;

use super::node::{GpuUse, NodeGpus};
use super::request::{CORE_PER_GPU, GpuDemand, GpuRequest};

/// The GPUs chosen for one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuChoice {
    pub(crate) container: u16,
    pub(crate) demand: GpuDemand,
    pub gpus: Vec<u8>,
}

/// GPUs a pod holds for its init containers beyond what its app containers hold
/// ([`GpuRequest::held_for_init`]). They belong to no container, so gpu-manager gets
/// no annotation for them: only our accounting of the node counts them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HeldGpus {
    demand: GpuDemand,
    pub(crate) gpus: Vec<u8>,
}

/// The GPUs chosen for every GPU container of a pod on one node, and those it holds
/// for its init containers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Assignment {
    pub choices: Vec<GpuChoice>,
    pub(crate) held: Vec<HeldGpus>,
}

impl Assignment {
    /// What each chosen GPU is charged: (index, use). A whole GPU is charged completely.
    pub fn charges(&self, memory_per_gpu: u32) -> impl Iterator<Item = (usize, GpuUse)> + '_ {
        let containers = self.choices.iter().map(|c| (c.demand, &c.gpus));
        let held = self.held.iter().map(|h| (h.demand, &h.gpus));
        containers.chain(held).flat_map(move |(demand, gpus)| {
            let each = charge_of(demand, memory_per_gpu);
            gpus.iter().map(move |&gpu| (usize::from(gpu), each))
        })
    }

    /// Whether the init-container hold is what `request` calls for (an assignment read
    /// back from the pod's annotations has none: the node's accounting adds it).
    pub(crate) fn holds_init_of(&self, request: &GpuRequest) -> bool {
        self.held
            .iter()
            .map(|h| h.demand)
            .eq(request.held_for_init())
    }

    /// Add this assignment's use to the node. Indices the node lacks are ignored.
    pub(crate) fn occupy(&self, node: &mut NodeGpus) {
        for (gpu, each) in self.charges(node.memory_per_gpu) {
            if let Some(used) = node.used.get_mut(gpu) {
                used.core += each.core;
                used.memory += each.memory;
            }
        }
    }

    /// Take this assignment's use off the node again.
    pub(crate) fn vacate(&self, node: &mut NodeGpus) {
        for (gpu, each) in self.charges(node.memory_per_gpu) {
            if let Some(used) = node.used.get_mut(gpu) {
                used.core = used.core.saturating_sub(each.core);
                used.memory = used.memory.saturating_sub(each.memory);
            }
        }
    }

    /// The GPU indices of the container at `container`, comma-separated ("0,1").
    pub(crate) fn indices_text(choice: &GpuChoice) -> String {
        let parts: Vec<String> = choice.gpus.iter().map(u8::to_string).collect();
        parts.join(",")
    }
}

fn charge_of(demand: GpuDemand, memory_per_gpu: u32) -> GpuUse {
    match demand {
        GpuDemand::Share { core, memory } => GpuUse { core, memory },
        GpuDemand::Whole { .. } => GpuUse {
            core: CORE_PER_GPU,
            memory: memory_per_gpu,
        },
    }
}

/// Why a pod does not fit a node. `is_unresolvable` tells the scheduler whether
/// preemption or waiting could ever help.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Misfit {
    NoGpus,
    TooFewGpus {
        need: u32,
        have: u32,
    },
    MemoryTooLarge {
        need: u32,
        per_gpu: u32,
    },
    /// Shared, not copied: a filter call gives thousands of nodes the same reason.
    ModelNotWanted {
        model: Option<Arc<str>>,
        wanted: Arc<[String]>,
    },
    PoolNotAllowed {
        pool: Option<Arc<str>>,
        allowed: Arc<[String]>,
    },
    NotCached,
    NoShareFit {
        core: u32,
        memory: u32,
        largest_core: u32,
        largest_memory: u32,
    },
    NotEnoughFreeGpus {
        need: u32,
        free: u32,
    },
    /// The node advertises fewer slices of a MIG profile than the pod asks for.
    TooFewMigSlices {
        profile: String,
        need: u32,
        have: u32,
    },
    /// The namespace's quota for this node's model has no room for the pod.
    QuotaFull {
        model: String,
        detail: String,
    },
    /// Not enough of a non-GPU resource (CPU, memory) left; `simulate` tracks these.
    HostShort {
        resource: &'static str,
        need: u64,
        free: u64,
    },
}

impl Misfit {
    pub(crate) fn is_unresolvable(&self) -> bool {
        !matches!(
            self,
            Misfit::NoShareFit { .. }
                | Misfit::NotEnoughFreeGpus { .. }
                | Misfit::QuotaFull { .. }
                | Misfit::HostShort { .. }
        )
    }
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misfit::NoGpus => write!(f, "node has no GPUs"),
            Misfit::TooFewGpus { need, have } => {
                write!(f, "pod needs {need} whole GPUs, node has {have} GPUs")
            }
            Misfit::MemoryTooLarge { need, per_gpu } => write!(
                f,
                "pod needs {need} vcuda-memory on one GPU, node's GPUs have {per_gpu}"
            ),
            Misfit::ModelNotWanted {
                model: Some(m),
                wanted,
            } => {
                write!(
                    f,
                    "GPU model {m} is not one the pod accepts ({})",
                    wanted.join(",")
                )
            }
            Misfit::ModelNotWanted {
                model: None,
                wanted,
            } => write!(
                f,
                "node has no GPU model label (pod accepts {})",
                wanted.join(",")
            ),
            Misfit::PoolNotAllowed {
                pool: Some(p),
                allowed,
            } => write!(
                f,
                "node pool {p} is not allowed for the namespace ({})",
                allowed.join(",")
            ),
            Misfit::PoolNotAllowed {
                pool: None,
                allowed,
            } => write!(
                f,
                "node has no pool label (namespace may use {})",
                allowed.join(",")
            ),
            Misfit::NotCached => write!(f, "node is not in gpu-admission's cache"),
            Misfit::NoShareFit {
                core,
                memory,
                largest_core,
                largest_memory,
            } => {
                if largest_core < core {
                    write!(
                        f,
                        "no single GPU has {core} free vcuda-core (largest free: {largest_core})"
                    )
                } else {
                    write!(
                        f,
                        "no GPU with {core} free vcuda-core has {memory} free vcuda-memory (largest free: {largest_memory})"
                    )
                }
            }
            Misfit::NotEnoughFreeGpus { need, free } => {
                write!(f, "pod needs {need} free whole GPUs, node has {free}")
            }
            Misfit::TooFewMigSlices {
                profile,
                need,
                have,
            } => write!(
                f,
                "pod needs {need} MIG slices of profile {profile}, node has {have}"
            ),
            Misfit::QuotaFull { model, detail } => {
                write!(f, "namespace GPU quota for {model} has no room ({detail})")
            }
            Misfit::HostShort {
                resource,
                need,
                free,
            } => write!(f, "pod needs {need} {resource}, node has {free} free"),
        }
    }
}

/// Fit every GPU container of `request` onto `node`, in container order, each on
/// the GPUs gpu-manager itself would pick, then what the pod holds for its init
/// containers. The node is not changed.
pub fn fit(node: &NodeGpus, request: &GpuRequest) -> Result<Assignment, Misfit> {
    check_mig(node, request)?;
    if !request.has_gpu_demand() {
        // MIG slices only: kube-scheduler counts them; no GPU index to choose.
        return Ok(Assignment::default());
    }
    check_static(node, request)?;
    let held = request.held_for_init();
    if let ([container], true) = (request.containers.as_slice(), held.is_empty()) {
        // One container (the common case): nothing to charge between containers.
        return Ok(Assignment {
            choices: vec![GpuChoice {
                container: container.container,
                demand: container.demand,
                gpus: pick(node, container.demand)?,
            }],
            held: Vec::new(),
        });
    }
    let mut scratch = node.clone();
    let mut assignment = Assignment::default();
    for container in &request.containers {
        let gpus = pick(&scratch, container.demand)?;
        let choice = GpuChoice {
            container: container.container,
            demand: container.demand,
            gpus,
        };
        Assignment {
            choices: vec![choice.clone()],
            held: Vec::new(),
        }
        .occupy(&mut scratch);
        assignment.choices.push(choice);
    }
    // After the app containers: their GPUs must be the ones gpu-manager picks on the
    // node as it is, and gpu-manager knows nothing of this hold.
    assignment.held = hold(&mut scratch, &held)?;
    Ok(assignment)
}

/// Whether the node advertises enough slices of every MIG profile the pod asks for.
fn check_mig(node: &NodeGpus, request: &GpuRequest) -> Result<(), Misfit> {
    for demand in &request.mig {
        let have = node.mig_capacity(&demand.profile);
        if have < demand.count {
            return Err(Misfit::TooFewMigSlices {
                profile: demand.profile.to_string(),
                need: demand.count,
                have,
            });
        }
    }
    Ok(())
}

/// Place the init-container hold of `request` on `node` as it is (its app containers
/// already charged there), the way [`fit`] would.
pub(crate) fn fit_held(node: &NodeGpus, request: &GpuRequest) -> Result<Vec<HeldGpus>, Misfit> {
    let held = request.held_for_init();
    if held.is_empty() {
        return Ok(Vec::new());
    }
    hold(&mut node.clone(), &held)
}

/// Pick GPUs for each held demand in turn, charging `scratch` as it goes.
fn hold(scratch: &mut NodeGpus, demands: &[GpuDemand]) -> Result<Vec<HeldGpus>, Misfit> {
    let mut held = Vec::with_capacity(demands.len());
    for &demand in demands {
        let part = HeldGpus {
            demand,
            gpus: pick(scratch, demand)?,
        };
        Assignment {
            choices: Vec::new(),
            held: vec![part.clone()],
        }
        .occupy(scratch);
        held.push(part);
    }
    Ok(held)
}

/// The GPUs gpu-manager gives one container on `node` as it is.
fn pick(node: &NodeGpus, demand: GpuDemand) -> Result<Vec<u8>, Misfit> {
    match demand {
        GpuDemand::Share { core, memory } => Ok(vec![pick_share(node, core, memory)?]),
        GpuDemand::Whole { gpus } => pick_whole(node, gpus),
    }
}

/// Checks that depend only on the node's shape, not on its current use.
fn check_static(node: &NodeGpus, request: &GpuRequest) -> Result<(), Misfit> {
    let have = node.gpu_count() as u32;
    if have == 0 {
        return Err(Misfit::NoGpus);
    }
    let held = request.held_for_init();
    let demands = || {
        let containers = request.containers.iter().map(|c| c.demand);
        containers.chain(held.iter().copied())
    };
    let need: u32 = demands()
        .map(|d| match d {
            GpuDemand::Whole { gpus } => gpus,
            GpuDemand::Share { .. } => 0,
        })
        .sum();
    if need > have {
        return Err(Misfit::TooFewGpus { need, have });
    }
    let share_memory = demands().filter_map(|d| match d {
        GpuDemand::Share { memory, .. } => Some(memory),
        GpuDemand::Whole { .. } => None,
    });
    match share_memory.max() {
        Some(need) if need > node.memory_per_gpu => Err(Misfit::MemoryTooLarge {
            need,
            per_gpu: node.memory_per_gpu,
        }),
        _ => Ok(()),
    }
}

/// gpu-manager's share-mode evaluator: GPUs ordered by least free cores, then least
/// free memory, then lowest index; the first that fits. gpu-manager re-checks this
/// choice and fails the container if ours differs, so this order is not ours to change.
fn pick_share(node: &NodeGpus, core: u32, memory: u32) -> Result<u8, Misfit> {
    let fits = |&i: &usize| node.free_core(i) >= core && node.free_memory(i) >= memory;
    let best = (0..node.gpu_count())
        .filter(fits)
        .min_by_key(|&i| (node.free_core(i), node.free_memory(i), i));
    match best {
        Some(i) => Ok(i as u8),
        None => Err(Misfit::NoShareFit {
            core,
            memory,
            largest_core: (0..node.gpu_count())
                .map(|i| node.free_core(i))
                .max()
                .unwrap_or(0),
            largest_memory: (0..node.gpu_count())
                .filter(|&i| node.free_core(i) >= core)
                .map(|i| node.free_memory(i))
                .max()
                .unwrap_or(0),
        }),
    }
}

/// Exclusive mode: wholly free GPUs, lowest indices first (tkestack's order once
/// the busy GPUs are set aside).
pub(super) fn pick_whole(node: &NodeGpus, gpus: u32) -> Result<Vec<u8>, Misfit> {
    let free: Vec<u8> = (0..node.gpu_count())
        .filter(|&i| node.used[i].core == 0)
        .map(|i| i as u8)
        .collect();
    if (free.len() as u32) < gpus {
        return Err(Misfit::NotEnoughFreeGpus {
            need: gpus,
            free: free.len() as u32,
        });
    }
    Ok(free[..gpus as usize].to_vec())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::request::ContainerGpu;
    use crate::placement::testing::{node, with_used};

    fn request(demands: &[GpuDemand]) -> GpuRequest {
        GpuRequest {
            containers: demands
                .iter()
                .enumerate()
                .map(|(i, &demand)| ContainerGpu {
                    container: i as u16,
                    demand,
                })
                .collect(),
            init: None,
            ..Default::default()
        }
    }

    fn share(core: u32, memory: u32) -> GpuDemand {
        GpuDemand::Share { core, memory }
    }

    fn gpus(of: &Assignment) -> Vec<Vec<u8>> {
        of.choices.iter().map(|c| c.gpus.clone()).collect()
    }

    #[test]
    fn share_mode_picks_the_fullest_gpu_that_fits() {
        let n = with_used(with_used(node("n", 3, 4), 1, 50, 1), 2, 80, 1);
        let a = fit(&n, &request(&[share(20, 1)])).unwrap();
        assert_eq!(gpus(&a), vec![vec![2]]);
        let a = fit(&n, &request(&[share(30, 1)])).unwrap();
        assert_eq!(gpus(&a), vec![vec![1]]);
    }

    #[test]
    fn containers_see_each_others_charges() {
        let a = fit(&node("n", 2, 4), &request(&[share(10, 1), share(10, 1)])).unwrap();
        assert_eq!(gpus(&a), vec![vec![0], vec![0]]);
        let a = fit(
            &node("n", 2, 4),
            &request(&[GpuDemand::Whole { gpus: 1 }, share(80, 3)]),
        )
        .unwrap();
        assert_eq!(gpus(&a), vec![vec![0], vec![1]]);
    }

    #[test]
    fn exclusive_mode_ignores_memory_and_takes_free_gpus() {
        let n = with_used(node("n", 3, 4), 0, 10, 1);
        let a = fit(&n, &request(&[GpuDemand::Whole { gpus: 2 }])).unwrap();
        assert_eq!(gpus(&a), vec![vec![1, 2]]);
    }

    #[test]
    fn misfits_say_why_and_whether_it_can_change() {
        let n = with_used(node("n", 2, 4), 0, 60, 1);
        let n = with_used(n, 1, 60, 1);
        let err = fit(&n, &request(&[share(60, 1)])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no single GPU has 60 free vcuda-core (largest free: 40)"
        );
        assert!(!err.is_unresolvable());
        let err = fit(&n, &request(&[GpuDemand::Whole { gpus: 3 }])).unwrap_err();
        assert_eq!(err.to_string(), "pod needs 3 whole GPUs, node has 2 GPUs");
        assert!(err.is_unresolvable());
        let err = fit(&n, &request(&[GpuDemand::Whole { gpus: 1 }])).unwrap_err();
        assert_eq!(err.to_string(), "pod needs 1 free whole GPUs, node has 0");
        let err = fit(&node("n", 0, 0), &request(&[share(1, 1)])).unwrap_err();
        assert_eq!(err, Misfit::NoGpus);
        let err = fit(&node("n", 2, 4), &request(&[share(10, 5)])).unwrap_err();
        assert!(err.is_unresolvable(), "{err}");
        let memory_bound = with_used(node("n", 1, 4), 0, 10, 3);
        let err = fit(&memory_bound, &request(&[share(20, 2)])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no GPU with 20 free vcuda-core has 2 free vcuda-memory (largest free: 1)"
        );
    }

    fn with_init(mut request: GpuRequest, init: GpuDemand) -> GpuRequest {
        request.init = Some(init);
        request
    }

    fn core_charged(a: &Assignment, n: &NodeGpus) -> u64 {
        a.charges(n.memory_per_gpu)
            .map(|(_, u)| u64::from(u.core))
            .sum()
    }

    #[test]
    fn an_init_container_larger_than_the_apps_is_held_on_the_node() {
        // Init container: 4 whole GPUs, no app GPU. It takes the whole 4-GPU node, so a
        // second such pod (or any 4-GPU pod) no longer fits.
        let n = node("n", 4, 4);
        let init_only = with_init(request(&[]), GpuDemand::Whole { gpus: 4 });
        let a = fit(&n, &init_only).unwrap();
        assert!(a.choices.is_empty(), "no container, no annotation");
        assert_eq!(a.held[0].gpus, vec![0, 1, 2, 3]);
        assert_eq!(core_charged(&a, &n), init_only.core_units());
        let mut taken = n.clone();
        a.occupy(&mut taken);
        assert_eq!(
            fit(&taken, &init_only).unwrap_err(),
            Misfit::NotEnoughFreeGpus { need: 4, free: 0 }
        );
        assert!(fit(&taken, &request(&[GpuDemand::Whole { gpus: 4 }])).is_err());
        // A node with fewer GPUs than the init container needs can never take it.
        assert_eq!(
            fit(&node("small", 2, 4), &init_only).unwrap_err(),
            Misfit::TooFewGpus { need: 4, have: 2 }
        );
    }

    #[test]
    fn the_init_hold_comes_after_the_apps_and_matches_the_charge() {
        // The app share goes where gpu-manager puts it (the fullest GPU that fits),
        // exactly as without the init container; the hold fills up to one GPU.
        let n = with_used(node("n", 2, 4), 1, 20, 1);
        let apps = request(&[share(50, 2)]);
        let plain = fit(&n, &apps).unwrap();
        let held = with_init(apps, GpuDemand::Whole { gpus: 1 });
        let a = fit(&n, &held).unwrap();
        assert_eq!(a.choices, plain.choices);
        assert_eq!(core_charged(&a, &n), 100);
        // A share init container larger than the app share holds the difference.
        let share_init = with_init(request(&[share(20, 1)]), share(60, 3));
        let a = fit(&n, &share_init).unwrap();
        assert_eq!(core_charged(&a, &n), 60);
        assert!(a.holds_init_of(&share_init));
        assert!(!Assignment { held: vec![], ..a }.holds_init_of(&share_init));
    }

    #[test]
    fn a_sidecars_gpus_are_held_beside_the_app_containers() {
        // The finding: two pods of 2 app GPUs and a 2-GPU native sidecar each went onto
        // one 4-GPU node. Each holds 4; the second no longer fits.
        let mut pod = request(&[GpuDemand::Whole { gpus: 2 }]);
        pod.sidecars = vec![GpuDemand::Whole { gpus: 2 }];
        let n = node("n", 4, 4);
        let a = fit(&n, &pod).unwrap();
        assert_eq!(
            a.choices.len(),
            1,
            "gpu-manager annotates the app container only"
        );
        assert_eq!(a.choices[0].gpus, vec![0, 1]);
        assert_eq!(a.held[0].gpus, vec![2, 3]);
        assert_eq!(core_charged(&a, &n), pod.core_units());
        let mut taken = n.clone();
        a.occupy(&mut taken);
        assert!(fit(&taken, &pod).is_err());
        assert_eq!(
            fit(&node("small", 3, 4), &pod).unwrap_err(),
            Misfit::TooFewGpus { need: 4, have: 3 }
        );
    }

    #[test]
    fn charge_and_release_are_inverse() {
        let n = node("n", 2, 4);
        let a = fit(&n, &request(&[share(30, 2), GpuDemand::Whole { gpus: 1 }])).unwrap();
        let mut changed = n.clone();
        a.occupy(&mut changed);
        assert_eq!(
            changed.used[0],
            GpuUse {
                core: 30,
                memory: 2
            }
        );
        assert_eq!(
            changed.used[1],
            GpuUse {
                core: 100,
                memory: 4
            }
        );
        a.vacate(&mut changed);
        assert_eq!(changed, n);
    }
}
