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
