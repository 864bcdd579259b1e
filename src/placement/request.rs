//! What a pod asks of GPUs: per container, a share of one GPU or some whole GPUs.

use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::ResourceNames;
use super::quantity::{Milli, QuantityError};

/// vcuda-core units in one whole GPU.
pub(crate) const CORE_PER_GPU: u32 = 100;

/// One container's GPU demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuDemand {
    /// Share mode: part of one GPU (`core` < 100 vcuda-core, `memory` in 256 MiB units).
    Share { core: u32, memory: u32 },
    /// Exclusive mode: this many whole GPUs.
    Whole { gpus: u32 },
}

impl GpuDemand {
    /// The demand in vcuda-core units (100 per GPU).
    pub fn core_units(&self) -> u64 {
        match *self {
            GpuDemand::Share { core, .. } => u64::from(core),
            GpuDemand::Whole { gpus } => u64::from(gpus) * u64::from(CORE_PER_GPU),
        }
    }
}

/// A GPU container: its index in `spec.containers` (gpu-manager's annotation key) and demand.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerGpu {
    pub(crate) container: u16,
    pub demand: GpuDemand,
}

/// MIG slices of one profile (mixed strategy: `nvidia.com/mig-<profile>`), the pod's
/// effective request: max(largest init container, sum of app containers).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigDemand {
    pub profile: Box<str>,
    /// Compute slices of one slice of the profile (`3g.40gb` → 3).
    pub(crate) compute: u32,
    pub count: u32,
}

/// A pod's GPU request: the app containers that need GPUs, in order, the native
/// sidecars' demands (held beside them for the pod's life), the regular init container
/// that weighs most by the effective-request rule, and MIG slices by profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GpuRequest {
    pub containers: Vec<ContainerGpu>,
    /// GPU demands of the native sidecars (init containers with `restartPolicy:
    /// Always`), in order. They run beside the app containers for the pod's whole
    /// life, so Kubernetes adds them to the app containers' sum.
    pub(crate) sidecars: Vec<GpuDemand>,
    /// The regular init container whose demand plus the sidecars started before it
    /// ([`init_beside`](Self::init_beside)) is the largest, if any asks for a GPU.
    pub(crate) init: Option<GpuDemand>,
    /// How many of [`sidecars`](Self::sidecars) run beside [`init`](Self::init): those
    /// declared before it.
    pub(crate) init_beside: usize,
    /// MIG slices by profile (mixed strategy), in profile order.
    pub mig: Vec<MigDemand>,
}

/// A pod's GPU resources could not be read. Every variant names the container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("container {container:?}: {resource}: {source}")]
    Quantity {
        container: String,
        resource: String,
        source: QuantityError,
    },
    #[error(
        "container {container:?}: {resource} {core} is not a whole number of GPUs (use less than 100, or a multiple of 100)"
    )]
    NotWholeGpus {
        container: String,
        resource: String,
        core: u64,
    },
    #[error(
        "container {container:?}: a share of a GPU ({core} {core_resource}) also needs {memory_resource}"
    )]
    ShareWithoutMemory {
        container: String,
        core: u64,
        core_resource: String,
        memory_resource: String,
    },
    #[error(
        "container {container:?}: asks for both {first} and {second}; use one GPU resource per container"
    )]
    MixedResources {
        container: String,
        first: String,
        second: String,
    },
    #[error(
        "container {container:?}: asks for {memory_resource} without {core_resource}; gpu-manager assigns a GPU by {core_resource}, so add it (or drop {memory_resource})"
    )]
    MemoryWithoutCore {
        container: String,
        memory_resource: String,
        core_resource: String,
    },
    #[error("container {container:?}: {amount} GPUs is more than any node has")]
    TooLarge { container: String, amount: u64 },
    #[error("pod has more than {max} containers", max = u16::MAX)]
    TooManyContainers,
    #[error("container {container:?}: {resource}: {source}")]
    MigProfile {
        container: String,
        resource: String,
        source: super::mig::ProfileError,
    },
}

/// Upper bound on whole GPUs per container; anything larger is a typo, not a request.
const MAX_GPUS_PER_CONTAINER: u64 = 1024;

impl GpuRequest {
    /// A pod of one GPU container (index 0) asking for `demand`.
    pub fn one(demand: GpuDemand) -> Self {
        GpuRequest {
            containers: vec![ContainerGpu {
                container: 0,
                demand,
            }],
            ..Default::default()
        }
    }

    /// Read the pod's GPU request. `Ok(None)` for a pod that asks for no GPU at all.
    pub fn from_pod(pod: &Pod, names: &ResourceNames) -> Result<Option<Self>, RequestError> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(None);
        };
        let mut request = GpuRequest::default();
        for (index, container) in spec.containers.iter().enumerate() {
            let index = u16::try_from(index).map_err(|_| RequestError::TooManyContainers)?;
            if let Some(demand) = container_demand(container, names)? {
                request.containers.push(ContainerGpu {
                    container: index,
                    demand,
                });
            }
        }
        // Kubernetes' walk (KEP-753): a sidecar joins the running sidecars for good; a
        // regular init container costs its own request plus the sidecars before it.
        let mut beside = 0u64;
        let mut largest = (0u64, 0u32);
        for container in spec.init_containers.iter().flatten() {
            let Some(demand) = container_demand(container, names)? else {
                continue;
            };
            if is_sidecar(container) {
                beside = beside.saturating_add(demand.core_units());
                request.sidecars.push(demand);
            } else if request.init.is_none() || init_order(&demand, beside) > largest {
                largest = init_order(&demand, beside);
                request.init = Some(demand);
                request.init_beside = request.sidecars.len();
            }
        }
        request.mig = mig_demands(spec, names)?;
        Ok((!request.is_empty()).then_some(request))
    }

    fn is_empty(&self) -> bool {
        !self.has_gpu_demand() && self.mig.is_empty()
    }

    /// Whether the pod needs GPUs by index on its node (vcuda or whole GPUs), as
    /// opposed to MIG slices only.
    pub fn has_gpu_demand(&self) -> bool {
        !self.containers.is_empty() || !self.sidecars.is_empty() || self.init.is_some()
    }

    /// The app containers' demand in vcuda-core units.
    fn app_core_units(&self) -> u64 {
        self.containers.iter().map(|c| c.demand.core_units()).sum()
    }

    /// What runs for the pod's whole life: app containers and sidecars, in core units.
    fn lifelong_core_units(&self) -> u64 {
        let sidecars = self.sidecars.iter().map(GpuDemand::core_units);
        sidecars.fold(self.app_core_units(), u64::saturating_add)
    }

    /// The pod's GPU amount in vcuda-core units, the Kubernetes effective-request rule:
    /// max(app containers + sidecars, largest regular init container + the sidecars
    /// before it). 100 = one GPU.
    pub fn core_units(&self) -> u64 {
        let init = self.init.map_or(0, |d| {
            let beside = self.sidecars.iter().take(self.init_beside);
            beside
                .map(GpuDemand::core_units)
                .fold(d.core_units(), u64::saturating_add)
        });
        self.lifelong_core_units().max(init)
    }

    /// What a node must hold for the pod beyond its app containers, so that it holds
    /// exactly [`core_units`](Self::core_units), what the quota charges: first each
    /// sidecar's demand as it is (it runs for the pod's life), then what the largest
    /// regular init container needs beyond. An init container runs before the app
    /// containers, but Kubernetes counts a pod at the larger of the two for its whole
    /// life (as kube-scheduler does for every resource); a GPU that placement gave
    /// away meanwhile would not be there when the pod restarts its init containers.
    /// With `d` = core units − (app + sidecar core units) > 0:
    /// - a share init container (`core`, `memory`): a share of `d` cores and the init's
    ///   memory beyond the app shares' (no app container can hold a whole GPU here);
    /// - a whole-GPU init container: `d / 100` whole GPUs (init `k` GPUs, apps `w < k`
    ///   whole GPUs: hold `k - w` more) and, when app shares leave a remainder, a share
    ///   of `d % 100` cores without memory (the quota counts cores, not memory).
    ///
    /// No container index goes with these: gpu-manager gets no annotation for them
    /// (it annotates `spec.containers` by index only; docs/devices.md).
    pub fn held_for_init(&self) -> Vec<GpuDemand> {
        let mut held = self.sidecars.clone();
        held.extend(self.held_for_regular_init());
        held
    }

    /// The part of [`held_for_init`](Self::held_for_init) beyond the sidecars.
    fn held_for_regular_init(&self) -> Vec<GpuDemand> {
        let Some(init) = self.init else {
            return Vec::new();
        };
        let extra = self.core_units().saturating_sub(self.lifelong_core_units());
        if extra == 0 {
            return Vec::new();
        }
        let core_per_gpu = u64::from(CORE_PER_GPU);
        let (whole, rest) = (extra / core_per_gpu, (extra % core_per_gpu) as u32);
        let memory = match init {
            GpuDemand::Share { memory, .. } => memory.saturating_sub(self.share_memory()),
            GpuDemand::Whole { .. } => 0,
        };
        let mut held = Vec::new();
        if whole > 0 {
            held.push(GpuDemand::Whole { gpus: whole as u32 });
        }
        if rest > 0 {
            held.push(GpuDemand::Share { core: rest, memory });
        }
        held
    }

    /// vcuda-memory that the init container can reuse: what the app containers and the
    /// sidecars started after it ask for in share mode (not running yet while it runs).
    fn share_memory(&self) -> u32 {
        let apps = self.containers.iter().map(|c| c.demand);
        let after = self.sidecars.iter().skip(self.init_beside).copied();
        apps.chain(after)
            .map(|demand| match demand {
                GpuDemand::Share { memory, .. } => memory,
                GpuDemand::Whole { .. } => 0,
            })
            .fold(0, u32::saturating_add)
    }

    /// Whole GPUs the app containers need in total.
    pub fn whole_gpus(&self) -> u32 {
        self.containers
            .iter()
            .map(|c| match c.demand {
                GpuDemand::Whole { gpus } => gpus,
                GpuDemand::Share { .. } => 0,
            })
            .sum()
    }
}

/// The pod's MIG slices per profile, by the effective-request rule: max(app containers
/// + sidecars, largest regular init container + the sidecars before it).
fn mig_demands(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    names: &ResourceNames,
) -> Result<Vec<MigDemand>, RequestError> {
    // Per profile: (compute, lifelong sum, running sidecar sum, largest init figure).
    let mut profiles: BTreeMap<&str, (u32, u64, u64, u64)> = BTreeMap::new();
    for container in &spec.containers {
        for (profile, compute, count) in container_mig(container, names)? {
            let entry = profiles.entry(profile).or_insert((compute, 0, 0, 0));
            entry.1 = entry.1.saturating_add(count);
        }
    }
    for container in spec.init_containers.iter().flatten() {
        let sidecar = is_sidecar(container);
        for (profile, compute, count) in container_mig(container, names)? {
            let entry = profiles.entry(profile).or_insert((compute, 0, 0, 0));
            if sidecar {
                entry.1 = entry.1.saturating_add(count);
                entry.2 = entry.2.saturating_add(count);
            } else {
                entry.3 = entry.3.max(count.saturating_add(entry.2));
            }
        }
    }
    Ok(profiles
        .into_iter()
        .map(|(profile, (compute, lifelong, _, init))| (profile, compute, lifelong.max(init)))
        .filter(|(_, _, count)| *count > 0)
        .map(|(profile, compute, count)| MigDemand {
            profile: profile.into(),
            compute,
            count: count.min(MAX_GPUS_PER_CONTAINER) as u32,
        })
        .collect())
}

/// A native sidecar: an init container with `restartPolicy: Always` (the only value
/// the API server accepts there), which keeps running beside the app containers.
fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// A container's MIG resources: (profile, its compute slices, count).
fn container_mig<'a>(
    container: &'a Container,
    names: &ResourceNames,
) -> Result<Vec<(&'a str, u32, u64)>, RequestError> {
    let Some(resources) = container.resources.as_ref() else {
        return Ok(Vec::new());
    };
    let limits = resources.limits.iter().flatten();
    let requests = resources.requests.iter().flatten();
    let mut found: Vec<(&str, u32, u64)> = Vec::new();
    for (resource, quantity) in limits.chain(requests) {
        let Some(profile) = names.mig.profile_of_resource(resource) else {
            continue;
        };
        if found.iter().any(|(p, _, _)| *p == profile) {
            continue; // the limit, read first, wins over the request
        }
        let fail = |e| RequestError::Quantity {
            container: container.name.clone(),
            resource: resource.clone(),
            source: e,
        };
        let count = Milli::parse_whole(&quantity.0).map_err(fail)?;
        if count > MAX_GPUS_PER_CONTAINER {
            return Err(RequestError::TooLarge {
                container: container.name.clone(),
                amount: count,
            });
        }
        let compute =
            super::mig::compute_slices(profile).map_err(|source| RequestError::MigProfile {
                container: container.name.clone(),
                resource: resource.clone(),
                source,
            })?;
        found.push((profile, compute, count));
    }
    Ok(found)
}

/// Regular init demands by weight: cores plus those of the sidecars beside it, then
/// memory (of two equal shares, the larger holds).
fn init_order(demand: &GpuDemand, beside: u64) -> (u64, u32) {
    let cores = demand.core_units().saturating_add(beside);
    match *demand {
        GpuDemand::Share { memory, .. } => (cores, memory),
        GpuDemand::Whole { .. } => (cores, 0),
    }
}

/// Whether the pod asks for any GPU resource at all (cheap; no quantity parsing).
pub(crate) fn asks_for_gpu(pod: &Pod, names: &ResourceNames) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    containers.into_iter().any(|c| {
        let Some(resources) = c.resources.as_ref() else {
            return false;
        };
        let limits = resources.limits.iter().flatten();
        let requests = resources.requests.iter().flatten();
        limits.chain(requests).any(|(name, _)| names.is_gpu(name))
    })
}

fn container_demand(
    container: &Container,
    names: &ResourceNames,
) -> Result<Option<GpuDemand>, RequestError> {
    let amount = |resource: &str| -> Result<u64, RequestError> {
        match resource_text(container, resource) {
            None => Ok(0),
            Some(text) => Milli::parse_whole(text).map_err(|source| RequestError::Quantity {
                container: container.name.clone(),
                resource: resource.to_string(),
                source,
            }),
        }
    };
    let core = amount(&names.vcuda_core)?;
    let mut whole = None;
    for name in &names.whole_gpu {
        let gpus = amount(name)?;
        if gpus == 0 {
            continue;
        }
        if core > 0 || whole.is_some() {
            let first = whole.map_or(names.vcuda_core.clone(), |(n, _): (&String, u64)| n.clone());
            return Err(RequestError::MixedResources {
                container: container.name.clone(),
                first,
                second: name.clone(),
            });
        }
        whole = Some((name, gpus));
    }
    if let Some((_, gpus)) = whole {
        return whole_gpus(container, gpus).map(Some);
    }
    match core {
        0 if amount(&names.vcuda_memory)? > 0 => Err(RequestError::MemoryWithoutCore {
            container: container.name.clone(),
            memory_resource: names.vcuda_memory.clone(),
            core_resource: names.vcuda_core.clone(),
        }),
        0 => Ok(None),
        core if core < u64::from(CORE_PER_GPU) => {
            let memory = amount(&names.vcuda_memory)?;
            if memory == 0 {
                return Err(RequestError::ShareWithoutMemory {
                    container: container.name.clone(),
                    core,
                    core_resource: names.vcuda_core.clone(),
                    memory_resource: names.vcuda_memory.clone(),
                });
            }
            let memory = u32::try_from(memory).map_err(|_| RequestError::TooLarge {
                container: container.name.clone(),
                amount: memory,
            })?;
            Ok(Some(GpuDemand::Share {
                core: core as u32,
                memory,
            }))
        }
        core if core % u64::from(CORE_PER_GPU) != 0 => Err(RequestError::NotWholeGpus {
            container: container.name.clone(),
            resource: names.vcuda_core.clone(),
            core,
        }),
        core => whole_gpus(container, core / u64::from(CORE_PER_GPU)).map(Some),
    }
}

fn whole_gpus(container: &Container, gpus: u64) -> Result<GpuDemand, RequestError> {
    if gpus > MAX_GPUS_PER_CONTAINER {
        return Err(RequestError::TooLarge {
            container: container.name.clone(),
            amount: gpus,
        });
    }
    Ok(GpuDemand::Whole { gpus: gpus as u32 })
}

/// The container's amount of `resource`: its limit, else its request (extended resources
/// must have equal requests and limits; either one alone is enough).
fn resource_text<'a>(container: &'a Container, resource: &str) -> Option<&'a str> {
    let resources = container.resources.as_ref()?;
    let pick = |map: &'a Option<std::collections::BTreeMap<String, Quantity>>| {
        map.as_ref()
            .and_then(|m| m.get(resource))
            .map(|q| q.0.as_str())
    };
    pick(&resources.limits).or_else(|| pick(&resources.requests))
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "request_sidecar_tests.rs"]
mod sidecar_tests;
