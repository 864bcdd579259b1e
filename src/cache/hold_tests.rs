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

fn hold(state: &mut ClusterState, key: &PodKey, subject: Subject) -> Result<bool, PlanError> {
    let placer = Placer::new(Policy::Binpack);
    state
        .hold(
            key,
            subject,
            &["n1"],
            |pod, nodes| place(&placer, &pod.request, nodes.iter().copied(), |_| Ok(())),
            Instant::now(),
        )
        .map(|decision| decision.hold.is_some())
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
        hold(&mut state, &key, known("uid-1")),
        Err(PlanError::NotInCluster {
            pod: "team-a/p".into()
        }),
        "a pod the watch has not shown is not placed"
    );
    assert_eq!(state.pod_count(), 0, "and not added");

    state.apply_pod(key.clone(), pod);
    for forged in ["uid-2", ""] {
        assert!(matches!(
            hold(&mut state, &key, known(forged)),
            Err(PlanError::OtherUid { .. })
        ));
    }
    assert_eq!(used_gpus(&state), 0, "a forged uid books nothing");
    assert_eq!(hold(&mut state, &key, known("uid-1")), Ok(true));
    assert_eq!(used_gpus(&state), 1);

    let (bound_key, bound) = cached("running", "uid-3", Some("n1"));
    state.apply_pod(bound_key.clone(), bound);
    assert_eq!(used_gpus(&state), 2);
    assert_eq!(
        hold(&mut state, &bound_key, known("uid-3")),
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
    assert_eq!(
        hold(&mut state, &key, Subject::Offered(Box::new(pod))),
        Ok(false)
    );
    assert!(state.pod(&key).is_none(), "an unplaced offer is not kept");

    let (key, pod) = cached("claims-bound", "uid-c", Some("n9"));
    assert!(matches!(
        hold(&mut state, &key, Subject::Offered(Box::new(pod))),
        Err(PlanError::AlreadyBound { .. })
    ));
    assert!(state.pod(&key).is_none());
}

/// Offline, the file is the cluster: a call offering a pod under the name of a running
/// one with another uid is refused, and the running pod keeps its GPUs and its charge
/// (it used to be replaced by the offer, and gone with the offer's rollback).
#[test]
fn an_offer_under_a_running_pods_name_with_another_uid_frees_nothing() {
    let mut state = cluster();
    let (key, running) = cached("train", "uid-run", Some("n1"));
    state.apply_pod(key.clone(), running);
    let usage = state.usage("team-a");
    let (_, forged) = cached("train", "uid-forged", None);
    assert!(matches!(
        hold(&mut state, &key, Subject::Offered(Box::new(forged))),
        Err(PlanError::OtherUid { .. })
    ));
    assert_eq!(&*state.pod(&key).unwrap().uid, "uid-run");
    assert_eq!(used_gpus(&state), 1, "its GPU is still held");
    assert_eq!(state.usage("team-a"), usage, "and charged");
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

fn hold_at(state: &mut ClusterState, key: &PodKey, uid: &str, now: Instant) -> bool {
    let placer = Placer::new(Policy::Binpack);
    state
        .hold(
            key,
            Subject::Known { uid: uid.into() },
            &["n1"],
            |pod, nodes| place(&placer, &pod.request, nodes.iter().copied(), |_| Ok(())),
            now,
        )
        .unwrap()
        .hold
        .is_some()
}

#[test]
fn a_hold_no_bind_confirmed_is_let_go_after_its_ttl() {
    let mut state = cluster();
    let (a, pod_a) = cached("a", "uid-a", None);
    let (b, pod_b) = cached("b", "uid-b", None);
    state.apply_pod(a.clone(), pod_a);
    state.apply_pod(b.clone(), pod_b);
    let start = Instant::now();
    assert!(hold_at(&mut state, &a, "uid-a", start));
    assert_eq!(used_gpus(&state), 1);
    // Another placement before the TTL leaves the hold alone...
    assert!(hold_at(
        &mut state,
        &b,
        "uid-b",
        start + super::state::HOLD_TTL / 2
    ));
    assert_eq!(used_gpus(&state), 2);
    // ...one after it lets go of the first hold (the second is younger).
    state.drop_hold(&b);
    let later = start + super::state::HOLD_TTL;
    assert!(hold_at(&mut state, &b, "uid-b", later));
    assert!(state.pod(&a).unwrap().node.is_none(), "a's hold released");
    assert_eq!(used_gpus(&state), 1);
}

#[test]
fn a_bound_hold_is_not_let_go() {
    let mut state = cluster();
    let (a, pod_a) = cached("a", "uid-a", None);
    state.apply_pod(a.clone(), pod_a.clone());
    let start = Instant::now();
    assert!(hold_at(&mut state, &a, "uid-a", start));
    state.mark_bound(&a);
    // The watch brings an older copy of the pod (not bound yet): the placement stays.
    state.apply_pod(a.clone(), pod_a);
    let (b, pod_b) = cached("b", "uid-b", None);
    state.apply_pod(b.clone(), pod_b);
    assert!(hold_at(
        &mut state,
        &b,
        "uid-b",
        start + super::state::HOLD_TTL * 2
    ));
    assert_eq!(used_gpus(&state), 2);
    state.drop_hold(&a);
    assert_eq!(
        used_gpus(&state),
        2,
        "a bound pod's placement is not ours to drop"
    );
}

#[test]
fn a_new_scheduling_failure_releases_the_hold() {
    let mut state = cluster();
    let (a, pod_a) = cached("a", "uid-a", None);
    state.apply_pod(a.clone(), pod_a.clone());
    assert!(hold_at(&mut state, &a, "uid-a", Instant::now()));
    // An unrelated update of the pod keeps the hold.
    state.apply_pod(a.clone(), pod_a.clone());
    assert_eq!(used_gpus(&state), 1);
    // The scheduler writes PodScheduled=False: it gave the pod up.
    let mut failed = pod_a;
    failed.set_unscheduled(42);
    state.apply_pod(a.clone(), failed);
    assert_eq!(used_gpus(&state), 0);
    assert!(state.pod(&a).unwrap().node.is_none());
}

#[test]
fn a_quota_event_older_than_the_cached_copy_is_ignored() {
    use crate::quota::{GPUQuota, GpuQuotaSpec};
    let quota = |rv: &str, hard: &str| {
        let mut q = GPUQuota::new(
            "default",
            GpuQuotaSpec {
                hard: [(
                    "T4".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(hard.into()),
                )]
                .into(),
                pools: vec![],
                default_type: None,
                on_exceed: Default::default(),
                ..Default::default()
            },
        );
        q.metadata.namespace = Some("team-a".into());
        q.metadata.resource_version = Some(rv.into());
        q
    };
    let mut state = ClusterState::default();
    state.apply_quota(quota("20", "4"));
    state.apply_quota(quota("9", "2")); // a late watch event from before our write
    let hard = |state: &ClusterState| state.quotas().next().unwrap().spec.hard["T4"].0.clone();
    assert_eq!(hard(&state), "4");
    state.apply_quota(quota("21", "8"));
    assert_eq!(hard(&state), "8");
}

#[test]
fn seen_charges_count_recent_pods_and_those_that_left() {
    use crate::quota::{GPUQuota, GpuQuotaSpec};
    let mut state = cluster();
    let mut quota = GPUQuota::new(
        "default",
        GpuQuotaSpec {
            hard: [(
                "T4".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
            )]
            .into(),
            pools: vec![],
            default_type: Some("T4".into()),
            on_exceed: Default::default(),
            ..Default::default()
        },
    );
    quota.metadata.namespace = Some("team-a".into());
    state.apply_quota(quota);
    let now = crate::quota::pending::now_second();
    for (name, created) in [("a", now - 1), ("b", now - 1), ("old", now - 500)] {
        let (key, mut pod) = cached(name, &format!("uid-{name}"), None);
        pod.created = created;
        state.apply_pod(key, pod);
    }
    state.delete_pod("team-a/b");
    let seen = state.seen_charges("team-a", now - 120);
    assert_eq!(
        seen.get(&(now - 1, "T4".to_string())),
        Some(&crate::placement::quantity::Milli(2000))
    );
    assert_eq!(seen.len(), 1, "the old pod is outside the window: {seen:?}");
}

#[test]
fn a_placement_the_filter_wrote_is_known_as_recorded_until_it_is_let_go() {
    // The bind verb charges what a placement adds only when the filter did not:
    // `placement_recorded` is what it asks.
    let mut state = cluster();
    let (key, pod) = cached("p", "uid-1", None);
    state.apply_pod(key.clone(), pod.clone());
    let known = || Subject::Known {
        uid: "uid-1".into(),
    };
    assert_eq!(hold(&mut state, &key, known()), Ok(true));
    assert!(!state.placement_recorded(&key), "held in memory only");

    state.mark_recorded(&key);
    assert!(state.placement_recorded(&key));
    // The watch shows the pod before the annotation patch comes back: still ours, and
    // still recorded.
    state.apply_pod(key.clone(), pod.clone());
    assert!(state.placement_recorded(&key));
    assert_eq!(hold(&mut state, &key, known()), Ok(true), "kept");
    assert!(
        state.placement_recorded(&key),
        "a kept placement stays recorded"
    );

    state.drop_hold(&key);
    assert!(!state.placement_recorded(&key), "let go: nothing placed");
    assert_eq!(hold(&mut state, &key, known()), Ok(true));
    assert!(
        !state.placement_recorded(&key),
        "a new hold is not recorded"
    );

    // The watch's echo of a write of ours (the annotations back, same node): recorded,
    // whether it arrives after the write returned or before.
    state.mark_recorded(&key);
    let (_, echo) = cached("p", "uid-1", Some("n1"));
    state.apply_pod(key.clone(), echo.clone());
    assert!(state.placement_recorded(&key), "our own write, seen again");
    let (early, pending) = cached("r", "uid-3", None);
    state.apply_pod(early.clone(), pending);
    let own = Subject::Known {
        uid: "uid-3".into(),
    };
    assert_eq!(hold(&mut state, &early, own), Ok(true));
    let (_, early_echo) = cached("r", "uid-3", Some("n1"));
    state.apply_pod(early.clone(), early_echo);
    state.mark_recorded(&early);
    assert!(
        state.placement_recorded(&early),
        "the echo came before the write returned"
    );
    // Placement annotations we did not write (a pod created with them, say) never
    // spare the bind its charge.
    let (other, _) = cached("q", "uid-2", None);
    state.apply_pod(other.clone(), echo);
    assert!(
        !state.placement_recorded(&other),
        "annotations alone are not a record"
    );
}
