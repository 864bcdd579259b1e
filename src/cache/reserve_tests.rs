//! The filter transaction's identity checks: which pod a call may place.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use super::state::{ClusterState, PlanError, Subject};
use super::{CachedPod, PodKey, Projection, pod_key};
use crate::config::Config;
use crate::placement::testing::{node, pod_with};
use crate::placement::{Placer, Policy, place};

fn cached(name: &str, uid: &str, node_name: Option<&str>) -> (PodKey, CachedPod) {
    let mut pod = pod_with(&[&[("nvidia.com/gpu", "1")]]);
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some("team-a".into());
    pod.metadata.uid = Some(uid.into());
    pod.spec.as_mut().unwrap().node_name = node_name.map(str::to_string);
    let projection = Projection::from_config(&Config::default());
    (
        pod_key(&pod),
        CachedPod::from_pod(&pod, &projection).unwrap(),
    )
}

fn cluster() -> ClusterState {
    let mut state = ClusterState::default();
    state.apply_node(node("n1", 2, 8));
    state
}

fn reserve(state: &mut ClusterState, key: &PodKey, subject: Subject) -> Result<bool, PlanError> {
    let placer = Placer::new(Policy::Binpack);
    state
        .reserve(
            key,
            subject,
            &["n1"],
            |pod, nodes| place(&placer, &pod.request, nodes.iter().copied(), |_| Ok(())),
            Instant::now(),
        )
        .map(|decision| decision.reservation.is_some())
}

fn used_gpus(state: &ClusterState) -> u32 {
    state
        .node("n1")
        .unwrap()
        .used
        .iter()
        .map(|u| u.core)
        .sum::<u32>()
        / 100
}

#[test]
fn a_known_pod_is_placed_only_with_its_own_uid_and_only_while_unbound() {
    let mut state = cluster();
    let (key, pod) = cached("p", "uid-1", None);
    let known = |uid: &str| Subject::Known { uid: uid.into() };

    assert_eq!(
        reserve(&mut state, &key, known("uid-1")),
        Err(PlanError::NotInCluster {
            pod: "team-a/p".into()
        }),
        "a pod the watch has not shown is not placed"
    );
    assert_eq!(state.pod_count(), 0, "and not added");

    state.apply_pod(key.clone(), pod);
    for forged in ["uid-2", ""] {
        assert!(matches!(
            reserve(&mut state, &key, known(forged)),
            Err(PlanError::OtherUid { .. })
        ));
    }
    assert_eq!(used_gpus(&state), 0, "a forged uid books nothing");
    assert_eq!(reserve(&mut state, &key, known("uid-1")), Ok(true));
    assert_eq!(used_gpus(&state), 1);

    let (bound_key, bound) = cached("running", "uid-3", Some("n1"));
    state.apply_pod(bound_key.clone(), bound);
    assert_eq!(used_gpus(&state), 2);
    assert_eq!(
        reserve(&mut state, &bound_key, known("uid-3")),
        Err(PlanError::AlreadyBound {
            pod: "team-a/running".into(),
            node: "n1".into()
        }),
        "a running pod is never re-placed (its GPUs moved, its old ones freed)"
    );
    assert_eq!(used_gpus(&state), 2);
}

#[test]
fn an_offered_pod_joins_the_cache_only_once_placed_and_never_bound() {
    let mut state = cluster();
    state.apply_pod(
        cached("a", "uid-a", Some("n1")).0,
        cached("a", "uid-a", Some("n1")).1,
    );
    state.apply_pod(
        cached("b", "uid-b", Some("n1")).0,
        cached("b", "uid-b", Some("n1")).1,
    );
    let (key, pod) = cached("late", "uid-l", None);
    assert_eq!(reserve(&mut state, &key, Subject::Offered(pod)), Ok(false));
    assert!(state.pod(&key).is_none(), "an unplaced offer is not kept");

    let (key, pod) = cached("claims-bound", "uid-c", Some("n9"));
    assert!(matches!(
        reserve(&mut state, &key, Subject::Offered(pod)),
        Err(PlanError::AlreadyBound { .. })
    ));
    assert!(state.pod(&key).is_none());
}

#[test]
fn a_bound_pods_gpus_do_not_move_when_its_annotations_are_edited() {
    let projection = Projection::from_config(&Config::default());
    let mut pod = pod_with(&[&[("nvidia.com/gpu", "1")]]);
    pod.metadata.name = Some("p".into());
    pod.metadata.namespace = Some("team-a".into());
    pod.metadata.uid = Some("u".into());
    pod.spec.as_mut().unwrap().node_name = Some("n1".into());
    let annotate = |pod: &mut k8s_openapi::api::core::v1::Pod, gpu: &str| {
        pod.metadata.annotations = Some(
            [(
                "tencent.com/predicate-gpu-idx-0".to_string(),
                gpu.to_string(),
            )]
            .into(),
        );
    };
    let mut state = cluster();
    annotate(&mut pod, "0");
    state.apply_pod(
        pod_key(&pod),
        CachedPod::from_pod(&pod, &projection).unwrap(),
    );
    annotate(&mut pod, "1");
    state.apply_pod(
        pod_key(&pod),
        CachedPod::from_pod(&pod, &projection).unwrap(),
    );
    let used: Vec<u32> = state
        .node("n1")
        .unwrap()
        .used
        .iter()
        .map(|u| u.core)
        .collect();
    assert_eq!(
        used,
        [100, 0],
        "GPU 0 stays held; GPU 1 is not taken from someone else"
    );
}
