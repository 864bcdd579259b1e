//! Tests of reading a pod's GPU request: shares, whole GPUs, MIG slices, errors.

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
