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

/// A pod's GPU request: the app containers that need GPUs, in order, plus the largest
/// init-container demand (which counts by the effective-request rule), and MIG slices
/// by profile.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuRequest {
    pub containers: Vec<ContainerGpu>,
    /// The largest GPU demand of an init container, if any asks for a GPU.
    pub init: Option<GpuDemand>,
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
        for container in spec.init_containers.iter().flatten() {
            if let Some(demand) = container_demand(container, names)?
                && request
                    .init
                    .is_none_or(|largest| init_order(&demand) > init_order(&largest))
            {
                request.init = Some(demand);
            }
        }
        request.mig = mig_demands(spec, names)?;
        Ok((!request.is_empty()).then_some(request))
    }

    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.init.is_none() && self.mig.is_empty()
    }

    /// Whether the pod needs GPUs by index on its node (vcuda or whole GPUs), as
    /// opposed to MIG slices only.
    pub fn has_gpu_demand(&self) -> bool {
        !self.containers.is_empty() || self.init.is_some()
    }

    /// The app containers' demand in vcuda-core units.
    fn app_core_units(&self) -> u64 {
        self.containers.iter().map(|c| c.demand.core_units()).sum()
    }

    /// The pod's GPU amount in vcuda-core units: max(largest init container, sum of app
    /// containers), the Kubernetes effective-request rule. 100 = one GPU.
    pub fn core_units(&self) -> u64 {
        let init = self.init.map_or(0, |d| d.core_units());
        self.app_core_units().max(init)
    }

    /// What a node must hold for the pod beyond its app containers, so that it holds
    /// exactly [`core_units`](Self::core_units), what the quota charges. An init
    /// container runs before the app containers, but Kubernetes counts a pod at the
    /// larger of the two for its whole life (as kube-scheduler does for every
    /// resource); a GPU that placement gave away meanwhile would not be there when the
    /// pod restarts its init containers. With `d` = core units − app core units > 0:
    /// - a share init container (`core`, `memory`): a share of `d` cores and the init's
    ///   memory beyond the app shares' (no app container can hold a whole GPU here);
    /// - a whole-GPU init container: `d / 100` whole GPUs (init `k` GPUs, apps `w < k`
    ///   whole GPUs: hold `k - w` more) and, when app shares leave a remainder, a share
    ///   of `d % 100` cores without memory (the quota counts cores, not memory).
    ///
    /// No container index goes with these: gpu-manager gets no annotation for them.
    pub fn held_for_init(&self) -> Vec<GpuDemand> {
        let Some(init) = self.init else {
            return Vec::new();
        };
        let extra = init.core_units().saturating_sub(self.app_core_units());
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

    /// vcuda-memory the app containers in share mode ask for.
    fn share_memory(&self) -> u32 {
        self.containers
            .iter()
            .map(|c| match c.demand {
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

/// The pod's MIG slices per profile: max(largest init container, sum of app containers).
fn mig_demands(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    names: &ResourceNames,
) -> Result<Vec<MigDemand>, RequestError> {
    let mut apps: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    let mut inits: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    for (container, is_init) in spec.containers.iter().map(|c| (c, false)).chain(init) {
        for (profile, compute, count) in container_mig(container, names)? {
            let into = if is_init { &mut inits } else { &mut apps };
            let entry = into.entry(profile).or_insert((compute, 0));
            entry.1 = match is_init {
                true => entry.1.max(count),
                false => entry.1.saturating_add(count),
            };
        }
    }
    for (profile, (compute, count)) in inits {
        let entry = apps.entry(profile).or_insert((compute, 0));
        entry.1 = entry.1.max(count);
    }
    Ok(apps
        .into_iter()
        .filter(|(_, (_, count))| *count > 0)
        .map(|(profile, (compute, count))| MigDemand {
            profile: profile.into(),
            compute,
            count: count.min(MAX_GPUS_PER_CONTAINER) as u32,
        })
        .collect())
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

/// Init demands by size: cores, then memory (of two equal shares, the larger holds).
fn init_order(demand: &GpuDemand) -> (u64, u32) {
    match *demand {
        GpuDemand::Share { memory, .. } => (demand.core_units(), memory),
        GpuDemand::Whole { .. } => (demand.core_units(), 0),
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
                mig: Vec::new(),
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
