#![allow(clippy::unwrap_used)]

use k8s_openapi::api::apps::v1::ReplicaSet;
use serde_json::json;

use super::*;

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn node(name: &str, cpu: &str) -> Node {
    object(
        json!({"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": "8Gi"}}}),
    )
}

fn pod(name: &str, node: &str, cpu: &str, movable: bool) -> Pod {
    object(json!({
        "metadata": {
            "name": name, "namespace": "team", "labels": {"app": "x"},
            "annotations": {"gpu-admission.io/movable": movable.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                 "uid": "u1", "controller": true}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }))
}

fn budget(name: &str, allowed: Option<i32>) -> PodDisruptionBudget {
    let status = allowed.map(|n| json!({"disruptionsAllowed": n, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}));
    object(json!({
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "x"}}},
        "status": status,
    }))
}

type Sets = Controllers<ReplicaSet>;
fn replica_sets() -> Sets {
    Controllers(0, PhantomData)
}

fn replica_set(name: &str) -> PartialObjectMeta<ReplicaSet> {
    object(json!({"metadata": {"name": name, "namespace": "team"}}))
}

/// List `objects` as a watch's first list does.
fn list<S: WorldKind>(live: &LiveWorld, slot: &S, objects: Vec<S::Object>) {
    let mut buffer = Vec::new();
    live.apply(slot, Event::Init, &mut buffer);
    for object in objects {
        live.apply(slot, Event::InitApply(object), &mut buffer);
    }
    live.apply(slot, Event::InitDone, &mut buffer);
}

fn event<S: WorldKind>(live: &LiveWorld, slot: &S, event: Event<S::Object>) {
    live.apply(slot, event, &mut Vec::new());
}

/// A world whose every kind listed: one node of 4 CPUs, nothing else.
fn listed() -> LiveWorld {
    let live = LiveWorld::default();
    list(&live, &Nodes, vec![node("n1", "4")]);
    list(&live, &Pods, vec![]);
    list(&live, &Budgets, vec![]);
    list(&live, &replica_sets(), vec![]);
    list(&live, &Controllers::<StatefulSet>(1, PhantomData), vec![]);
    list(&live, &Controllers::<Job>(2, PhantomData), vec![]);
    live
}

#[test]
fn the_world_is_read_only_once_every_kind_has_listed() {
    let live = LiveWorld::default();
    list(&live, &Nodes, vec![node("n1", "4")]);
    list(&live, &Pods, vec![]);
    assert!(
        live.world().is_none() && !live.listed(),
        "four kinds never listed"
    );
    let live = listed();
    assert!(live.listed());
    assert_eq!(live.world().unwrap().nodes.len(), 1);
}

#[test]
fn a_node_s_room_follows_its_pods_as_they_come_and_go() {
    let live = listed();
    let room = |live: &LiveWorld| live.world().unwrap().room("n1").unwrap().cpu_milli;
    event(&live, &Pods, Event::Apply(pod("a", "n1", "1", false)));
    event(&live, &Pods, Event::Apply(pod("b", "n1", "500m", false)));
    assert_eq!(room(&live), 2500);
    event(&live, &Pods, Event::Apply(pod("a", "n1", "2", false)));
    assert_eq!(room(&live), 1500, "a changed pod counts once, as it is now");
    event(&live, &Pods, Event::Delete(pod("a", "n1", "2", false)));
    assert_eq!(room(&live), 3500);
    list(&live, &Pods, vec![pod("c", "n1", "3", false)]);
    assert_eq!(room(&live), 1000, "a relist replaces every pod");
}

#[test]
fn a_pod_that_moves_or_finishes_leaves_its_node_s_room() {
    let live = listed();
    event(&live, &Nodes, Event::Apply(node("n2", "8")));
    let rooms = |live: &LiveWorld| {
        let world = live.world().unwrap();
        let cpu = |n: &str| world.room(n).unwrap().cpu_milli;
        (cpu("n1"), cpu("n2"))
    };
    event(&live, &Pods, Event::Apply(pod("a", "n1", "1", true)));
    event(&live, &Pods, Event::Apply(pod("b", "n2", "2", false)));
    assert_eq!(rooms(&live), (3000, 6000));
    event(&live, &Pods, Event::Apply(pod("a", "n2", "1", true)));
    assert_eq!(rooms(&live), (4000, 5000), "counted where it is now, once");
    let mut finished = pod("b", "n2", "2", false);
    finished.status = Some(object(json!({"phase": "Succeeded"})));
    event(&live, &Pods, Event::Apply(finished));
    assert_eq!(rooms(&live), (4000, 7000), "a finished pod holds nothing");
    let mut unreadable = pod("c", "n1", "1", false);
    let spec = unreadable.spec.as_mut().unwrap();
    spec.containers[0].resources = Some(object(json!({"requests": {"cpu": "lots"}})));
    event(&live, &Pods, Event::Apply(unreadable));
    assert_eq!(
        rooms(&live),
        (4000, 7000),
        "a pod whose CPU cannot be read is left out"
    );
}

#[test]
fn only_a_pod_that_opted_in_keeps_its_owner_and_labels() {
    let live = listed();
    event(&live, &Pods, Event::Apply(pod("kept", "n1", "1", true)));
    event(&live, &Pods, Event::Apply(pod("still", "n1", "1", false)));
    let world = live.world().unwrap();
    let kept = &world.pods["team/kept"];
    assert_eq!(kept.owner.as_ref().unwrap().name, "rs");
    assert_eq!(kept.labels["app"], "x");
    let still = &world.pods["team/still"];
    assert!(still.owner.is_none() && still.labels.is_empty());
    assert_eq!(
        still.host.cpu_milli, 1000,
        "its CPU still counts on its node"
    );
}

#[test]
fn a_budget_not_yet_counted_by_the_disruption_controller_allows_nothing() {
    let live = listed();
    event(&live, &Budgets, Event::Apply(budget("counted", Some(2))));
    event(&live, &Budgets, Event::Apply(budget("new", None)));
    let world = live.world().unwrap();
    let allowed: Vec<_> = (world.budgets.iter())
        .map(|b| (b.name.as_str(), b.allowed))
        .collect();
    assert_eq!(allowed, [("team/counted", 2), ("team/new", 0)]);
}

#[test]
fn controllers_are_known_while_they_exist() {
    let live = listed();
    event(&live, &replica_sets(), Event::Apply(replica_set("rs")));
    let id = (
        "team".to_string(),
        "ReplicaSet".to_string(),
        "rs".to_string(),
    );
    assert!(live.world().unwrap().controllers.contains(&id));
    event(&live, &replica_sets(), Event::Delete(replica_set("rs")));
    assert!(!live.world().unwrap().controllers.contains(&id));
}
