//! A defragmentation plan's holds in the filter transaction: the GPUs a plan freed go to
//! its pending pod and to each moved pod's replacement, to nobody else, until they lapse.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::plan_hold::{GpuKept, GpusKept, PLAN_HOLD_ANNOTATION, PlanHold, Slot};
use super::state::{ClusterState, Subject};
use super::{CachedPod, PodKey, Projection, pod_key};
use crate::config::Config;
use crate::placement::testing::{node, pod_with};
use crate::placement::{Placer, Policy, place};

/// The holds of these tests stand from 10 s ago for `defrag.holdSeconds` (60 s): a
/// filter call reads the clock.
fn now() -> i64 {
    crate::quota::pending::now_second()
}

/// A hold's `until` while it stands.
fn standing() -> i64 {
    now() + 50
}

/// The projection of a cluster whose mover runs (`defrag.mode: Evict`): holds are read.
fn evicting() -> Projection {
    let config = Config::parse("defrag: {mode: Evict, holdSeconds: 60}").unwrap();
    Projection::from_config(&config)
}

/// A 1-GPU pod of `team`, owned by controller `owner`, carrying `hold` if given.
fn pod(
    key: &str,
    uid: &str,
    owner: &str,
    node_name: Option<&str>,
    hold: Option<&PlanHold>,
) -> (PodKey, CachedPod) {
    asking(&[("nvidia.com/gpu", "1")], key, uid, owner, node_name, hold)
}

/// [`pod`] asking for `resources` in its one container.
fn asking(
    resources: &[(&str, &str)],
    key: &str,
    uid: &str,
    owner: &str,
    node_name: Option<&str>,
    hold: Option<&PlanHold>,
) -> (PodKey, CachedPod) {
    let mut pod = pod_with(&[resources]);
    let (namespace, name) = key.split_once('/').unwrap();
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some(namespace.into());
    pod.metadata.uid = Some(uid.into());
    // Before the plan's `since`.
    let created = k8s_openapi::jiff::Timestamp::from_second(now() - 100).unwrap();
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        created,
    ));
    pod.metadata.owner_references = Some(vec![OwnerReference {
        uid: owner.into(),
        controller: Some(true),
        kind: "ReplicaSet".into(),
        name: owner.into(),
        api_version: "apps/v1".into(),
        ..Default::default()
    }]);
    if let Some(hold) = hold {
        pod.metadata.annotations =
            Some([(PLAN_HOLD_ANNOTATION.to_string(), hold.to_text())].into());
    }
    pod.spec.as_mut().unwrap().node_name = node_name.map(str::to_string);
    (
        pod_key(&pod),
        CachedPod::from_pod(&pod, &evicting()).unwrap(),
    )
}

fn gpu(index: u8) -> GpuKept {
    GpuKept {
        index,
        core: 100,
        memory: 8,
    }
}

/// Team-a/train's plan: n1's GPU 0 for it, n2's GPU 0 for the replacement of
/// team-b/infer-1 (controller rs-1), standing until `until`.
fn plan(until: i64) -> PlanHold {
    let one_gpu = pod("team-b/x", "u", "rs-1", None, None).1.request;
    PlanHold {
        model: "T4".into(),
        since: now() - 10,
        until,
        target: GpusKept {
            node: "n1".into(),
            gpus: vec![gpu(0)],
        },
        slots: vec![Slot::new(
            "team-b",
            "u-moved",
            "rs-1",
            &one_gpu,
            GpusKept {
                node: "n2".into(),
                gpus: vec![gpu(0)],
            },
        )],
    }
}

/// n1, n2, n3 with one GPU each, and team-a/train pending with `hold`.
fn cluster(hold: &PlanHold) -> ClusterState {
    let mut state = ClusterState::default();
    for name in ["n1", "n2", "n3"] {
        state.apply_node(node(name, 1, 8));
    }
    let (key, train) = pod("team-a/train", "u-train", "job-1", None, Some(hold));
    state.apply_pod(key, train);
    state
}

/// Where the filter places pod `key` (which the cache holds) among `candidates`.
fn placed(state: &mut ClusterState, key: &str, candidates: &[&str]) -> Option<String> {
    let placer = Placer::new(Policy::Binpack);
    let uid = state.pod(key).unwrap().uid.clone();
    let decision = state
        .hold(
            &PodKey::from(key),
            Subject::Known { uid },
            candidates,
            |pod, nodes| place(&placer, &pod.request, nodes.iter().copied(), |_| Ok(())),
            Instant::now(),
        )
        .unwrap();
    decision.hold.map(|h| h.node.to_string())
}

#[test]
fn the_freed_gpus_go_to_the_pending_pod_and_to_nobody_else() {
    let mut state = cluster(&plan(standing()));
    let (other, pod_) = pod("team-c/other", "u-o", "rs-9", None, None);
    state.apply_pod(other.clone(), pod_);
    assert_eq!(
        placed(&mut state, &other, &["n1"]),
        None,
        "n1's GPU is held"
    );
    assert_eq!(
        placed(&mut state, &other, &["n2"]),
        None,
        "n2's is held too"
    );
    assert_eq!(
        placed(&mut state, &other, &["n1", "n2", "n3"]).as_deref(),
        Some("n3")
    );
    // The pending pod is placed on its target, though n2 is as good a node for it.
    let train = "team-a/train";
    assert_eq!(
        placed(&mut state, train, &["n2", "n1"]).as_deref(),
        Some("n1")
    );
}

#[test]
fn a_moved_pods_destination_goes_to_its_replacement_then_frees_up() {
    let mut state = cluster(&plan(standing()));
    // Another pod of the same controller and shape is a replacement; the moved pod's
    // namesake with its old uid is not, nor a pod of another controller.
    let (stranger, p) = pod("team-b/stranger", "u-s", "rs-2", None, None);
    state.apply_pod(stranger.clone(), p);
    assert_eq!(placed(&mut state, &stranger, &["n2"]), None);
    let (new, p) = pod("team-b/infer-2", "u-new", "rs-1", None, None);
    state.apply_pod(new.clone(), p);
    assert_eq!(
        placed(&mut state, &new, &["n3", "n2"]).as_deref(),
        Some("n2")
    );
    // Bound there, the slot is filled: nothing more is kept on n2 (whose one GPU the
    // replacement now uses), and the target is still kept.
    let (new, mut p) = pod("team-b/infer-2", "u-new", "rs-1", Some("n2"), None);
    p.created = now(); // created since the plan began
    state.apply_pod(new, p);
    let reserved = state.reserved_against(&stranger, now());
    let kept: Vec<&str> = reserved.nodes.keys().map(|n| &**n).collect();
    assert_eq!(kept, ["n1"]);
}

#[test]
fn holds_lapse_at_their_until_and_with_the_pod_that_carries_them() {
    let mut state = cluster(&plan(now() - 1));
    let (other, p) = pod("team-c/other", "u-o", "rs-9", None, None);
    state.apply_pod(other.clone(), p);
    assert_eq!(
        placed(&mut state, &other, &["n1"]).as_deref(),
        Some("n1"),
        "lapsed"
    );

    let mut state = cluster(&plan(standing()));
    state.apply_pod(
        other.clone(),
        pod("team-c/other", "u-o", "rs-9", None, None).1,
    );
    state.delete_pod("team-a/train");
    assert_eq!(
        placed(&mut state, &other, &["n2"]).as_deref(),
        Some("n2"),
        "holder gone"
    );
}

#[test]
fn once_the_pending_pod_is_placed_its_own_use_keeps_its_gpus() {
    let mut state = cluster(&plan(standing()));
    assert_eq!(
        placed(&mut state, "team-a/train", &["n1"]).as_deref(),
        Some("n1")
    );
    let reserved = state.reserved_against("team-c/none", now());
    assert!(reserved.nodes.is_empty(), "unknown subjects see no holds");
    let (other, p) = pod("team-c/other", "u-o", "rs-9", None, None);
    state.apply_pod(other.clone(), p);
    let kept = state.reserved_against(&other, now());
    let mut kept: Vec<&str> = kept.nodes.keys().map(|n| &**n).collect();
    kept.sort();
    assert_eq!(
        kept,
        ["n2"],
        "the target counts once: as the placed pod's use"
    );
}

/// A move keeps the pod's model (the planner's rule), so once the evicted pod is gone and
/// its replacement is bound at the destination, its namespace is charged what it was.
#[test]
fn a_move_leaves_the_moved_pods_namespace_charged_the_same() {
    let mut state = ClusterState::default();
    for name in ["n1", "n2"] {
        let mut gpus = node(name, 1, 8);
        gpus.model = Some("T4".into());
        state.apply_node(gpus);
    }
    let (old, moved) = pod("team-b/infer-1", "u-moved", "rs-1", Some("n1"), None);
    state.apply_pod(old.clone(), moved);
    let before = state.usage("team-b");
    assert_eq!(before.len(), 1, "{before:?}");
    state.delete_pod(&old);
    let (new, replacement) = pod("team-b/infer-2", "u-new", "rs-1", Some("n2"), None);
    state.apply_pod(new, replacement);
    assert_eq!(state.usage("team-b"), before);
}

/// A hold keeps its own GPUs, no more: on a 2-GPU node whose GPU 0 is held, a share
/// still lands on GPU 1, and a 2-GPU pod does not fit.
#[test]
fn a_hold_keeps_only_its_gpus_and_a_share_still_fits_beside_it() {
    let mut state = ClusterState::default();
    state.apply_node(node("n1", 2, 8));
    let mut hold = plan(standing());
    hold.slots.clear();
    let (key, train) = pod("team-a/train", "u-train", "job-1", None, Some(&hold));
    state.apply_pod(key, train);
    let share = [
        ("tencent.com/vcuda-core", "50"),
        ("tencent.com/vcuda-memory", "2"),
    ];
    let (shared, p) = asking(&share, "team-c/shared", "u-s", "rs-9", None, None);
    state.apply_pod(shared.clone(), p);
    let two = [("nvidia.com/gpu", "2")];
    let (wide, p) = asking(&two, "team-c/wide", "u-w", "rs-8", None, None);
    state.apply_pod(wide.clone(), p);
    assert_eq!(placed(&mut state, &wide, &["n1"]), None, "GPU 0 is held");
    assert_eq!(placed(&mut state, &shared, &["n1"]).as_deref(), Some("n1"));
    let gpus = state.pod(&shared).unwrap().assignment.clone().unwrap();
    assert_eq!(gpus.choices[0].gpus, [1], "beside the held GPU, not on it");
}

/// A hold counts only while it can be honest: read only when the mover runs
/// (`defrag.mode: Evict`) and only if it stands at most `defrag.holdSeconds` from a
/// `since` not before its pod; and only while its pod is charged (not waiting in the
/// quota queue, charged nothing; not being deleted). A new plan is made around what the
/// standing holds keep (`held_from_others`).
#[test]
fn a_hold_counts_only_while_it_can_be_honest() {
    let other = |state: &mut ClusterState| {
        let (other, p) = pod("team-c/other", "u-o", "rs-9", None, None);
        state.apply_pod(other.clone(), p);
        placed(state, &other, &["n1"])
    };
    let mut state = cluster(&plan(standing()));
    assert_eq!(state.plan_holds(now()).count(), 1);
    let from_others = state.held_from_others(now());
    let mut held: Vec<&str> = from_others.keys().map(|n| &**n).collect();
    held.sort();
    assert_eq!(held, ["n1", "n2"], "a new plan is made around both");
    assert_eq!(other(&mut state), None, "an honest hold keeps n1");

    // Read with the defrag mode off: no hold.
    let mut pod_ = pod_with(&[&[("nvidia.com/gpu", "1")]]);
    pod_.metadata.namespace = Some("team-a".into());
    pod_.metadata.name = Some("train".into());
    let created = k8s_openapi::jiff::Timestamp::from_second(now() - 100).unwrap();
    pod_.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        created,
    ));
    pod_.metadata.annotations =
        Some([(PLAN_HOLD_ANNOTATION.to_string(), plan(standing()).to_text())].into());
    let off = Projection::from_config(&Config::default());
    assert!(
        CachedPod::from_pod(&pod_, &off)
            .unwrap()
            .plan_hold()
            .is_none(),
        "mode Off"
    );
    assert!(
        CachedPod::from_pod(&pod_, &evicting())
            .unwrap()
            .plan_hold()
            .is_some(),
        "mode Evict"
    );

    // Longer than holdSeconds, or ten years ahead: never read.
    for until in [now() + 61, now() + 10 * 365 * 86_400] {
        let mut state = cluster(&plan(until));
        assert_eq!(state.plan_holds(now()).count(), 0, "until {until}");
        assert_eq!(other(&mut state).as_deref(), Some("n1"));
    }

    // Its pod waits in the quota queue (charged nothing), or is being deleted.
    for edit in [
        (|p: &mut CachedPod| p.gated = true) as fn(&mut CachedPod),
        |p: &mut CachedPod| p.set_terminating(i64::MAX),
    ] {
        let mut state = cluster(&plan(standing()));
        let mut train = state.pod("team-a/train").unwrap().clone();
        edit(&mut train);
        state.apply_pod("team-a/train".into(), train);
        assert_eq!(state.plan_holds(now()).count(), 0);
        assert_eq!(other(&mut state).as_deref(), Some("n1"));
    }

    // Placed, its target is its own use; the slot it keeps for the moved pod's
    // replacement stands until its `until`.
    let mut state = cluster(&plan(standing()));
    assert_eq!(
        placed(&mut state, "team-a/train", &["n1"]).as_deref(),
        Some("n1")
    );
    let from_others = state.held_from_others(now());
    let held: Vec<&str> = from_others.keys().map(|n| &**n).collect();
    assert_eq!(held, ["n2"]);
}
