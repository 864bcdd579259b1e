//! What a pod asks of GPUs: per container, a share of one GPU or some whole GPUs.

use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::ResourceNames;
use super::quantity::{Milli, QuantityError};

/// vcuda-core units in one whole GPU.
pub const CORE_PER_GPU: u32 = 100;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerGpu {
    pub container: u16,
    pub demand: GpuDemand,
}

/// MIG slices of one profile (mixed strategy: `nvidia.com/mig-<profile>`), the pod's
/// effective request: max(largest init container, sum of app containers).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigDemand {
    pub profile: Box<str>,
    /// Compute slices of one slice of the profile (`3g.40gb` → 3).
    pub compute: u32,
    pub count: u32,
}

/// A pod's GPU request: the app containers that need GPUs, in order, the native
/// sidecars' demands (held beside them for the pod's life), the regular init container
/// that weighs most by the effective-request rule, and MIG slices by profile.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuRequest {
    pub containers: Vec<ContainerGpu>,
    /// GPU demands of the native sidecars (init containers with `restartPolicy:
    /// Always`), in order. They run beside the app containers for the pod's whole
    /// life, so Kubernetes adds them to the app containers' sum.
    pub sidecars: Vec<GpuDemand>,
    /// The regular init container whose demand plus the sidecars started before it
    /// ([`init_beside`](Self::init_beside)) is the largest, if any asks for a GPU.
    pub init: Option<GpuDemand>,
    /// How many of [`sidecars`](Self::sidecars) run beside [`init`](Self::init): those
    /// declared before it.
    pub init_beside: usize,
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

    pub fn is_empty(&self) -> bool {
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
pub fn is_sidecar(container: &Container) -> bool {
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
pub fn asks_for_gpu(pod: &Pod, names: &ResourceNames) -> bool {
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
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::testing::pod_with;

    fn names() -> ResourceNames {
        ResourceNames::default()
    }

    #[test]
    fn reads_share_and_whole_containers_in_order() {
        let pod = pod_with(&[
            &[
                ("tencent.com/vcuda-core", "10"),
                ("tencent.com/vcuda-memory", "1"),
            ],
            &[],
            &[
                ("tencent.com/vcuda-core", "200"),
                ("tencent.com/vcuda-memory", "8"),
            ],
        ]);
        let request = GpuRequest::from_pod(&pod, &names()).unwrap().unwrap();
        assert_eq!(
            request.containers,
            vec![
                ContainerGpu {
                    container: 0,
                    demand: GpuDemand::Share {
                        core: 10,
                        memory: 1
                    }
                },
                ContainerGpu {
                    container: 2,
                    demand: GpuDemand::Whole { gpus: 2 }
                },
            ]
        );
        assert_eq!(request.core_units(), 210);
    }

    #[test]
    fn whole_gpu_resource_counts_gpus() {
        let pod = pod_with(&[&[("nvidia.com/gpu", "2")]]);
        let request = GpuRequest::from_pod(&pod, &names()).unwrap().unwrap();
        assert_eq!(request.containers[0].demand, GpuDemand::Whole { gpus: 2 });
    }

    #[test]
    fn pod_without_gpu_is_none() {
        let pod = pod_with(&[&[("cpu", "2")]]);
        assert_eq!(GpuRequest::from_pod(&pod, &names()).unwrap(), None);
        assert!(!asks_for_gpu(&pod, &names()));
    }

    #[test]
    fn bad_requests_name_the_container_and_problem() {
        let cases: [(&[(&str, &str)], &str); 6] = [
            (
                &[("tencent.com/vcuda-core", "abc")],
                "\"abc\" is not a Kubernetes quantity",
            ),
            (&[("tencent.com/vcuda-core", "-3")], "\"-3\" is negative"),
            (
                &[("tencent.com/vcuda-core", "1e100")],
                "\"1e100\" is out of range",
            ),
            (
                &[("tencent.com/vcuda-core", "150")],
                "150 is not a whole number of GPUs",
            ),
            (
                &[("tencent.com/vcuda-core", "50")],
                "also needs tencent.com/vcuda-memory",
            ),
            // gpu-manager assigns no GPU without vcuda-core: not a request of nothing.
            (
                &[("tencent.com/vcuda-memory", "4")],
                "asks for tencent.com/vcuda-memory without tencent.com/vcuda-core",
            ),
        ];
        for (resources, message) in cases {
            let err = GpuRequest::from_pod(&pod_with(&[resources]), &names()).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(message), "{text}");
            assert!(text.contains("container \"c0\""), "{text}");
        }
    }

    #[test]
    fn init_containers_follow_effective_request_rule() {
        let mut pod = pod_with(&[&[("nvidia.com/gpu", "1")]]);
        let init = pod_with(&[&[("nvidia.com/gpu", "3")]]);
        pod.spec.as_mut().unwrap().init_containers = Some(init.spec.unwrap().containers);
        let request = GpuRequest::from_pod(&pod, &names()).unwrap().unwrap();
        assert_eq!(request.core_units(), 300);
        assert_eq!(request.whole_gpus(), 1);
    }

    #[test]
    fn the_largest_init_container_is_kept_with_its_shape() {
        let init = |containers: &[&[(&str, &str)]]| {
            let mut pod = pod_with(&[&[("cpu", "1")]]);
            pod.spec.as_mut().unwrap().init_containers =
                pod_with(containers).spec.unwrap().containers.into();
            GpuRequest::from_pod(&pod, &names()).unwrap().unwrap().init
        };
        let share = |core: &'static str, memory: &'static str| {
            [
                ("tencent.com/vcuda-core", core),
                ("tencent.com/vcuda-memory", memory),
            ]
        };
        assert_eq!(
            init(&[
                &share("30", "8"),
                &[("nvidia.com/gpu", "2")],
                &share("30", "1")
            ]),
            Some(GpuDemand::Whole { gpus: 2 })
        );
        assert_eq!(
            init(&[&share("30", "1"), &share("30", "8"), &share("20", "9")]),
            Some(GpuDemand::Share {
                core: 30,
                memory: 8
            })
        );
    }

    #[test]
    fn the_init_hold_makes_the_node_hold_the_effective_request() {
        let share = |core, memory| GpuDemand::Share { core, memory };
        let whole = |gpus| GpuDemand::Whole { gpus };
        let cases = [
            // (init, app containers, held beyond the apps)
            (whole(4), vec![], vec![whole(4)]),
            (whole(3), vec![whole(1)], vec![whole(2)]),
            (whole(1), vec![whole(2)], vec![]),
            (whole(1), vec![share(50, 2)], vec![share(50, 0)]),
            (whole(2), vec![share(30, 1)], vec![whole(1), share(70, 0)]),
            (share(60, 4), vec![], vec![share(60, 4)]),
            (share(60, 4), vec![share(20, 1)], vec![share(40, 3)]),
            (share(50, 2), vec![whole(1)], vec![]),
            (share(50, 2), vec![share(50, 2)], vec![]),
        ];
        for (init, apps, held) in cases {
            let request = GpuRequest {
                containers: apps
                    .into_iter()
                    .enumerate()
                    .map(|(i, demand)| ContainerGpu {
                        container: i as u16,
                        demand,
                    })
                    .collect(),
                init: Some(init),
                ..Default::default()
            };
            assert_eq!(request.held_for_init(), held, "{request:?}");
            let on_node: u64 = request
                .containers
                .iter()
                .map(|c| c.demand)
                .chain(held)
                .map(|d| d.core_units())
                .sum();
            assert_eq!(on_node, request.core_units(), "{request:?}");
        }
    }

    #[test]
    fn mig_slices_follow_the_effective_request_rule_per_profile() {
        let mut pod = pod_with(&[
            &[("nvidia.com/mig-1g.10gb", "2")],
            &[
                ("nvidia.com/mig-1g.10gb", "1"),
                ("nvidia.com/mig-3g.40gb", "1"),
            ],
        ]);
        let init = pod_with(&[&[("nvidia.com/mig-1g.10gb", "5")]])
            .spec
            .unwrap()
            .containers;
        pod.spec.as_mut().unwrap().init_containers = Some(init);
        let request = GpuRequest::from_pod(&pod, &names()).unwrap().unwrap();
        let slices: Vec<(&str, u32, u32)> = request
            .mig
            .iter()
            .map(|d| (&*d.profile, d.compute, d.count))
            .collect();
        assert_eq!(slices, [("1g.10gb", 1, 5), ("3g.40gb", 3, 1)]);
        assert!(!request.has_gpu_demand());
        assert!(asks_for_gpu(&pod, &names()));
    }

    #[test]
    fn a_mig_resource_that_names_no_profile_is_refused_by_name() {
        let pod = pod_with(&[&[("nvidia.com/mig-big", "1")]]);
        let error = GpuRequest::from_pod(&pod, &names()).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"container "c0": nvidia.com/mig-big: "big" is not a MIG profile (expected <compute slices>g.<memory>gb, e.g. 1g.10gb)"#
        );
    }
}

#[cfg(test)]
mod sidecar_tests {
    //! Native sidecars (issue 18, item 2): an init container with `restartPolicy:
    //! Always` is counted beside the app containers, by Kubernetes' rule.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::testing::pod_with;

    /// A pod whose app containers are `apps` and whose init containers are `inits`,
    /// each `(sidecar, resources)`.
    fn pod(apps: &[&[(&str, &str)]], inits: &[(bool, &[(&str, &str)])]) -> Pod {
        let mut pod = pod_with(apps);
        let resources: Vec<&[(&str, &str)]> = inits.iter().map(|(_, r)| *r).collect();
        let mut containers = pod_with(&resources).spec.unwrap().containers;
        for (container, (sidecar, _)) in containers.iter_mut().zip(inits) {
            container.name = format!("init-{}", container.name);
            if *sidecar {
                container.restart_policy = Some("Always".into());
            }
        }
        pod.spec.as_mut().unwrap().init_containers = Some(containers);
        pod
    }

    fn request(pod: &Pod) -> GpuRequest {
        GpuRequest::from_pod(pod, &ResourceNames::default())
            .unwrap()
            .unwrap()
    }

    const GPU: &str = "nvidia.com/gpu";

    #[test]
    fn a_sidecars_gpus_are_added_to_the_app_containers() {
        // The finding: 2 app GPUs and a 2-GPU sidecar were charged 2, the max.
        let pod = pod(&[&[(GPU, "2")]], &[(true, &[(GPU, "2")])]);
        let request = request(&pod);
        assert_eq!(request.core_units(), 400);
        assert_eq!(request.held_for_init(), vec![GpuDemand::Whole { gpus: 2 }]);
        // A plain init container of the same size stays the max.
        let plain = self::pod(&[&[(GPU, "2")]], &[(false, &[(GPU, "2")])]);
        assert_eq!(self::request(&plain).core_units(), 200);
    }

    #[test]
    fn a_plain_init_container_counts_the_sidecars_started_before_it() {
        type Inits<'a> = &'a [(bool, &'a [(&'a str, &'a str)])];
        let cases: [(Inits, u64); 4] = [
            // sidecar 1, then init 3: 3 + 1 beside it; apps + sidecar = 2.
            (&[(true, &[(GPU, "1")]), (false, &[(GPU, "3")])], 400),
            // init 3 first: nothing beside it.
            (&[(false, &[(GPU, "3")]), (true, &[(GPU, "1")])], 300),
            // Two sidecars, a small init after both: 1 + 2 + 1 > apps 1 + 2.
            (
                &[
                    (true, &[(GPU, "1")]),
                    (true, &[(GPU, "1")]),
                    (false, &[(GPU, "2")]),
                ],
                400,
            ),
            // The later, smaller init wins by what runs beside it.
            (
                &[
                    (false, &[(GPU, "2")]),
                    (true, &[(GPU, "2")]),
                    (false, &[(GPU, "1")]),
                ],
                300,
            ),
        ];
        for (inits, units) in cases {
            let request = request(&pod(&[&[(GPU, "1")]], inits));
            assert_eq!(request.core_units(), units, "{request:?}");
            let held: u64 = request.held_for_init().iter().map(|d| d.core_units()).sum();
            assert_eq!(
                request.app_core_units() + held,
                units,
                "the node holds what the quota charges: {request:?}"
            );
        }
    }

    #[test]
    fn a_sidecar_alone_is_a_gpu_pod() {
        let share = [
            ("tencent.com/vcuda-core", "30"),
            ("tencent.com/vcuda-memory", "2"),
        ];
        let request = request(&pod(&[&[("cpu", "1")]], &[(true, &share)]));
        assert!(request.containers.is_empty());
        assert!(request.has_gpu_demand());
        assert_eq!(request.core_units(), 30);
        assert_eq!(
            request.held_for_init(),
            vec![GpuDemand::Share {
                core: 30,
                memory: 2
            }]
        );
    }

    #[test]
    fn a_share_init_keeps_its_memory_beside_the_sidecars_before_it() {
        let share = |core, memory| {
            [
                ("tencent.com/vcuda-core", core),
                ("tencent.com/vcuda-memory", memory),
            ]
        };
        let (sidecar, init) = (share("20", "3"), share("50", "4"));
        let request = request(&pod(
            &[&[("cpu", "1")]],
            &[(true, &sidecar), (false, &init)],
        ));
        assert_eq!(request.core_units(), 70);
        assert_eq!(
            request.held_for_init(),
            vec![
                GpuDemand::Share {
                    core: 20,
                    memory: 3
                },
                GpuDemand::Share {
                    core: 50,
                    memory: 4
                }
            ]
        );
    }

    #[test]
    fn mig_slices_of_sidecars_are_added_per_profile() {
        let slice = "nvidia.com/mig-1g.10gb";
        let request = request(&pod(
            &[&[(slice, "1")]],
            &[(true, &[(slice, "2")]), (false, &[(slice, "2")])],
        ));
        // apps 1 + sidecar 2 = 3; the init: 2 + 2 beside it = 4.
        assert_eq!(request.mig[0].count, 4);
        let request = self::request(&pod(&[&[(slice, "1")]], &[(true, &[(slice, "2")])]));
        assert_eq!(request.mig[0].count, 3);
        assert!(!request.has_gpu_demand());
    }
}
