#![allow(clippy::unwrap_used)]

use crate::cache::parse_objects;
use crate::config::Config;
use crate::placement::defrag::Limits;

use super::report::{Output, Report};
use crate::snapshot::{Snapshot, World};

const EXAMPLE: &str = include_str!("../../examples/fragmented.yaml");

fn plan_text(text: &str, only: Option<&str>) -> Report {
    let objects = parse_objects(text, "test").unwrap();
    super::plan_objects(
        &objects,
        "test",
        &Config::default(),
        Limits::default(),
        only,
    )
    .unwrap()
}

/// What carrying the example's plan out holds: t4-a's two GPUs for the pending pod,
/// the moved pod's destination GPU for a pod of its ReplicaSet and shape; and a pod
/// whose controller moved a pod lately stays (the mover's cooldown).
#[test]
fn a_plan_holds_the_freed_gpus_and_the_destination_and_cooling_controllers_stay() {
    let report = plan_text(EXAMPLE, Some("team-a/train-0"));
    let plan = &report.plans[0];
    let hold = plan.hold.as_ref().unwrap();
    assert_eq!(hold.target.node, "t4-a");
    let held: Vec<(u8, u32)> = hold.target.gpus.iter().map(|g| (g.index, g.core)).collect();
    assert_eq!(held, [(0, 100), (1, 100)]);
    let slot = &hold.slots[0];
    let step = &plan.moves[0];
    assert_eq!(step.pod, "team-b/infer-a-7f9-x2");
    let owner = "0b1a0000-0000-4000-8000-00000000000a";
    assert_eq!(step.owner.as_deref(), Some(owner));
    let objects = parse_objects(EXAMPLE, "test").unwrap();
    let projection = crate::cache::Projection::from_config(&Config::default());
    let cache = crate::cache::CacheWriter::from_objects(&objects, "test", projection).unwrap();
    let request = cache.read(|s| s.pod("team-b/infer-a-7f9-x2").unwrap().request.clone());
    let expected =
        crate::cache::plan_hold::Slot::new("team-b", &step.uid, owner, &request, slot.held.clone());
    assert_eq!(
        slot, &expected,
        "the slot keeps the digests of the moved pod and its replacement"
    );
    assert_eq!(slot.held.node, plan.moves[0].to);
    assert_eq!(slot.held.gpus.len(), 1);
    assert_eq!(slot.held.gpus[0].index, plan.moves[0].gpus[0]);

    let mut snapshot = Snapshot::of(&objects, "test", &Config::default()).unwrap();
    snapshot.world.cooling.insert(owner.to_string());
    let limits = Limits::default();
    let report = super::plan_in(&snapshot, limits, Some("team-a/train-0")).unwrap();
    assert!(report.plans.is_empty(), "{report:?}");
    assert_eq!(report.kept.get("cooldown"), Some(&1), "{report:?}");
}

fn moved(report: &Report, pod: &str) -> Vec<String> {
    let plan = report.plans.iter().find(|p| p.pod == pod).unwrap();
    plan.moves.iter().map(|m| m.pod.clone()).collect()
}

fn reason<'r>(report: &'r Report, pod: &str) -> &'r str {
    let no = report.unplanned.iter().find(|u| u.pod == pod);
    &no.unwrap_or_else(|| panic!("{pod} has a plan: {report:?}"))
        .reason
}

#[test]
fn the_example_moves_the_one_pod_that_may_move() {
    let report = plan_text(EXAMPLE, None);
    let plan = &report.plans[0];
    assert_eq!(plan.pod, "team-a/train-0");
    assert_eq!(
        (plan.node.as_str(), plan.gpus.as_slice()),
        ("t4-a", &[0, 1][..])
    );
    assert_eq!(moved(&report, "team-a/train-0"), ["team-b/infer-a-7f9-x2"]);
    let step = &plan.moves[0];
    assert_eq!(step.from, "t4-a");
    // The PDB-guarded pod's node or the other one; never the cordoned t4-d.
    assert!(["t4-b", "t4-c"].contains(&step.to.as_str()), "{step:?}");
    assert_eq!(step.gpus, [1]);
    assert!(
        reason(&report, "team-a/train-big").contains("needs 400"),
        "{report:?}"
    );
    let kept: Vec<(&str, usize)> = report.kept.iter().map(|(k, n)| (*k, *n)).collect();
    assert_eq!(
        kept,
        [
            ("disruption_budget", 1),
            ("movable", 1),
            ("not_opted_in", 1)
        ]
    );
}

#[test]
fn a_plan_reads_as_one_line_for_the_pending_pods_event() {
    let report = plan_text(EXAMPLE, Some("team-a/train-0"));
    let sentence = report.plans[0].sentence();
    // Told on team-a's pod: team-b's pod is not named.
    assert!(
        sentence.starts_with(
            "fits on t4-a (GPUs 0,1) after moving a pod of another namespace (t4-a → t4-"
        ),
        "{sentence}"
    );
    assert!(!sentence.contains("team-b"), "{sentence}");
}

#[test]
fn the_json_report_has_the_documented_fields() {
    let report = plan_text(EXAMPLE, None);
    let json: serde_json::Value =
        serde_json::from_str(&report.render(Output::Json).unwrap()).unwrap();
    let plan = &json["plans"][0];
    assert_eq!(plan["pod"], "team-a/train-0");
    assert_eq!(plan["node"], "t4-a");
    assert_eq!(plan["moves"][0]["pod"], "team-b/infer-a-7f9-x2");
    assert_eq!(plan["moves"][0]["from"], "t4-a");
    assert!(plan["moves"][0]["to"].is_string());
    assert_eq!(json["unplanned"][0]["pod"], "team-a/train-big");
    assert!(json["unplanned"][0]["reason"].is_string());
    let text = report.render(Output::Text).unwrap();
    assert!(
        text.contains("team-a/train-0: fits on t4-a (GPUs 0,1) after 1 move:"),
        "{text}"
    );
    assert!(
        text.contains("move team-b/infer-a-7f9-x2 from t4-a to t4-"),
        "{text}"
    );
}

/// The example with `from` replaced by `to` (once; it must be there).
fn edited(from: &str, to: &str) -> String {
    assert!(EXAMPLE.contains(from), "{from}");
    EXAMPLE.replacen(from, to, 1)
}

#[test]
fn a_pod_that_did_not_opt_in_or_lost_its_controller_never_moves() {
    let not_opted = edited(
        "    gpu-admission.io/movable: \"true\"\n    tencent.com/predicate-node: t4-a",
        "    tencent.com/predicate-node: t4-a",
    );
    let report = plan_text(&not_opted, Some("team-a/train-0"));
    assert!(report.plans.is_empty(), "{report:?}");
    assert!(
        reason(&report, "team-a/train-0").contains("movable"),
        "{report:?}"
    );

    let orphan = edited(
        "kind: ReplicaSet\nmetadata: {name: infer-a-7f9,",
        "kind: ReplicaSet\nmetadata: {name: someone-else,",
    );
    let report = plan_text(&orphan, Some("team-a/train-0"));
    assert!(report.plans.is_empty(), "{report:?}");
    assert_eq!(report.kept.get("controller_absent"), Some(&1));
}

#[test]
fn a_pod_of_higher_priority_never_moves_for_a_lower_one() {
    let higher = edited(
        "spec:\n  nodeName: t4-a\n",
        "spec:\n  nodeName: t4-a\n  priority: 1000\n",
    );
    let report = plan_text(&higher, Some("team-a/train-0"));
    assert!(report.plans.is_empty(), "{report:?}");
}

/// A pod on t4-b's GPU 0 that did not opt in to moves.
const STAY_ON_B: &str = r#"---
apiVersion: v1
kind: Pod
metadata:
  name: stay-b
  namespace: team-c
  annotations: {tencent.com/predicate-gpu-idx-0: "0"}
spec:
  nodeName: t4-b
  containers:
  - name: w
    resources: {limits: {tencent.com/vcuda-core: "100", tencent.com/vcuda-memory: "64"}}
"#;

#[test]
fn a_budget_that_allows_one_disruption_is_never_drawn_twice() {
    // t4-a runs two movable pods of the same app under one budget, one GPU each; t4-b
    // and t4-c have one free GPU each, beside pods that did not opt in. Room for the
    // pending pod's two GPUs takes both moves.
    let two_on_a = |allowed: u32| {
        let mut text = edited(
            "  labels: {app: infer-b}\n  annotations:\n    gpu-admission.io/movable: \"true\"\n    tencent.com/predicate-node: t4-b\n    tencent.com/predicate-gpu-idx-0: \"0\"",
            "  labels: {app: infer-a}\n  annotations:\n    gpu-admission.io/movable: \"true\"\n    tencent.com/predicate-node: t4-a\n    tencent.com/predicate-gpu-idx-0: \"1\"",
        )
        .replacen("  nodeName: t4-b", "  nodeName: t4-a", 1)
        .replacen("name: infer-b-5c4, uid", "name: infer-a-7f9, uid", 1);
        text = text.replacen(
            "metadata: {name: infer-b, namespace: team-b}\nspec:\n  maxUnavailable: 0\n  selector: {matchLabels: {app: infer-b}}",
            &format!(
                "metadata: {{name: infer-a, namespace: team-b}}\nspec:\n  maxUnavailable: {allowed}\n  selector: {{matchLabels: {{app: infer-a}}}}"
            ),
            1,
        );
        text + STAY_ON_B
    };
    let report = plan_text(&two_on_a(2), Some("team-a/train-0"));
    assert_eq!(moved(&report, "team-a/train-0").len(), 2, "{report:?}");

    let report = plan_text(&two_on_a(1), Some("team-a/train-0"));
    assert!(report.plans.is_empty(), "{report:?}");
}

#[test]
fn a_queued_or_placed_pod_gets_no_plan() {
    let report = plan_text(EXAMPLE, Some("team-b/infer-a-7f9-x2"));
    assert!(reason(&report, "team-b/infer-a-7f9-x2").contains("bound to node t4-a"));
    let gated = edited(
        "  name: train-0\n  namespace: team-a\nspec:\n",
        "  name: train-0\n  namespace: team-a\nspec:\n  schedulingGates: [{name: gpu-admission.io/quota}]\n",
    );
    let report = plan_text(&gated, Some("team-a/train-0"));
    assert!(reason(&report, "team-a/train-0").contains("quota queue"));
}

#[test]
fn a_pod_not_in_the_cluster_is_an_error() {
    let objects = parse_objects(EXAMPLE, "test").unwrap();
    let error = super::plan_objects(
        &objects,
        "test",
        &Config::default(),
        Limits::default(),
        Some("team-a/nobody"),
    )
    .unwrap_err();
    assert!(error.to_string().contains("team-a/nobody"), "{error}");
}

#[test]
fn pods_count_their_sidecars_init_peak_and_overhead() {
    let text = r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: n}
spec:
  nodeName: node-1
  overhead: {cpu: 100m}
  initContainers:
  - {name: setup, resources: {requests: {cpu: "6", memory: 1Gi}}}
  - {name: proxy, restartPolicy: Always, resources: {requests: {cpu: 500m, memory: 256Mi}}}
  containers:
  - {name: a, resources: {requests: {cpu: "1"}, limits: {cpu: "2", memory: 2Gi}}}
  - {name: b, resources: {limits: {cpu: 250m, memory: 512Mi}}}
---
apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {allocatable: {cpu: "8", memory: 16Gi}}
"#;
    let world = World::read(&parse_objects(text, "test").unwrap()).unwrap();
    let pod = &world.pods["n/p"];
    // CPU: the setup container (6) beats proxy + a + b (0.5 + 1 + 0.25); memory: the
    // running set (256 + 2048 + 512 MiB) beats setup (1024 on top of nothing before it).
    assert_eq!(pod.host.cpu_milli, 6_000 + 100);
    assert_eq!(pod.host.memory_mib, 256 + 2048 + 512);
    let room = world.room("node-1").unwrap();
    assert_eq!((room.cpu_milli, room.memory_mib), (1_900, 16 * 1024 - 2816));
}

#[test]
fn a_bad_quantity_names_the_pod_and_resource() {
    let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: n}\nspec:\n  containers: [{name: a, resources: {requests: {cpu: lots}}}]\n";
    let error = World::read(&parse_objects(text, "test").unwrap()).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("Pod n/p cpu") && message.contains("lots"),
        "{message}"
    );
}

#[test]
fn a_budget_without_status_counts_its_healthy_pods() {
    // Three healthy pods of app x, minAvailable 2: one disruption allowed; 67% rounds
    // up to 3 (none allowed).
    let pods: String = (0..3)
        .map(|i| format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: x-{i}, namespace: n, labels: {{app: x}}}}\nspec: {{nodeName: node-1, containers: []}}\nstatus: {{phase: Running}}\n---\n"))
        .collect();
    let budget = |spec: &str| {
        let text = format!(
            "{pods}apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: b, namespace: n}}\nspec: {{{spec}, selector: {{matchLabels: {{app: x}}}}}}\n"
        );
        let world = World::read(&parse_objects(&text, "test").unwrap()).unwrap();
        world.budgets[0].allowed
    };
    assert_eq!(budget("minAvailable: 2"), 1);
    assert_eq!(budget("minAvailable: 67%"), 0);
    assert_eq!(budget("maxUnavailable: 2"), 2);
    assert_eq!(budget("maxUnavailable: 34%"), 2);
}

/// A plan is made around the GPUs other plans hold: with another pending pod's
/// standing hold keeping t4-a's free GPU, train-0's plan (t4-a, once infer-a moves) is
/// no longer possible there; without the hold, or with the mover off, it is.
#[test]
fn a_plan_never_counts_on_gpus_another_plan_holds() {
    use crate::cache::plan_hold::{GpuKept, GpusKept, PlanHold};
    let now = crate::quota::pending::now_second();
    let hold = PlanHold {
        model: "Tesla-T4".into(),
        since: now - 5,
        until: now + 55,
        target: GpusKept {
            node: "t4-a".into(),
            gpus: vec![GpuKept {
                index: 1,
                core: 100,
                memory: 64,
            }],
        },
        slots: Vec::new(),
    };
    let holder = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "holder", "namespace": "team-c", "uid": "u-holder",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"gpu-admission.io/defrag-hold": hold.to_text()}},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c",
            "resources": {"limits": {"tencent.com/vcuda-core": "100", "tencent.com/vcuda-memory": "64"}}}]},
        "status": {"phase": "Pending"}});
    let text = format!(
        "{EXAMPLE}\n---\n{}",
        serde_yaml::to_string(&holder).unwrap()
    );
    let objects = parse_objects(&text, "test").unwrap();
    let plan = |config: &Config| {
        let report = super::plan_objects(
            &objects,
            "test",
            config,
            Limits::default(),
            Some("team-a/train-0"),
        )
        .unwrap();
        report.plans.first().map(|p| p.node.clone())
    };
    assert_eq!(
        plan(&Config::default()).as_deref(),
        Some("t4-a"),
        "holds are read only under Evict"
    );
    let evict = Config::parse("defrag: {mode: Evict}").unwrap();
    let node = plan(&evict);
    assert_ne!(
        node.as_deref(),
        Some("t4-a"),
        "t4-a's GPU 1 is held for team-c/holder"
    );
}

/// Two models, one GPU each: team-b's pod on the A100 accepts both (its quota lists
/// both, it names none), team-a's pending pod wants the A100. The only plan moves
/// team-b's pod to the T4, where its quota has room for it.
const TWO_MODELS: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: a100-a, labels: {nvidia.com/gpu.product: A100-SXM4-40GB}}
status:
  allocatable: {cpu: "16", memory: 64Gi, tencent.com/vcuda-core: "100", tencent.com/vcuda-memory: "64"}
---
apiVersion: v1
kind: Node
metadata: {name: t4-a, labels: {nvidia.com/gpu.product: Tesla-T4}}
status:
  allocatable: {cpu: "16", memory: 64Gi, tencent.com/vcuda-core: "100", tencent.com/vcuda-memory: "64"}
---
apiVersion: v1
kind: Pod
metadata:
  name: infer-0
  namespace: team-b
  annotations:
    gpu-admission.io/movable: "true"
    tencent.com/predicate-node: a100-a
    tencent.com/predicate-gpu-idx-0: "0"
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: infer, uid: 0b1a0000-0000-4000-8000-00000000000a, controller: true}
spec:
  nodeName: a100-a
  containers:
  - name: serve
    image: registry.example/infer:1
    resources:
      limits: {tencent.com/vcuda-core: "100", tencent.com/vcuda-memory: "64"}
status: {phase: Running}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: infer, namespace: team-b, uid: 0b1a0000-0000-4000-8000-00000000000a}
spec:
  selector: {matchLabels: {app: infer}}
  template:
    metadata: {labels: {app: infer}}
    spec: {containers: [{name: serve, image: registry.example/infer:1}]}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-b}
spec:
  hard: {A100-SXM4-40GB: "1", Tesla-T4: "1"}
---
apiVersion: v1
kind: Pod
metadata:
  name: train-0
  namespace: team-a
  annotations: {gpu-admission.io/gpu-type: A100-SXM4-40GB}
spec:
  schedulerName: gpu-scheduler
  containers:
  - name: train
    image: registry.example/train:1
    resources:
      limits: {tencent.com/vcuda-core: "100", tencent.com/vcuda-memory: "64"}
status: {phase: Pending}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-a}
spec:
  hard: {A100-SXM4-40GB: "1"}
"#;

/// [`TWO_MODELS`] with team-b's quota `hard` as given.
fn team_b_hard(hard: &str) -> String {
    let from = r#"hard: {A100-SXM4-40GB: "1", Tesla-T4: "1"}"#;
    assert!(TWO_MODELS.contains(from));
    TWO_MODELS.replacen(from, &format!("hard: {hard}"), 1)
}

/// A pod that accepts several models may be moved to another where its quota has room
/// (its charge follows it); where the quota has none, it keeps its model.
#[test]
fn a_pod_that_accepts_two_models_moves_to_the_other_where_its_quota_has_room() {
    let report = plan_text(TWO_MODELS, Some("team-a/train-0"));
    let plan = report.plans.first().unwrap_or_else(|| panic!("{report:?}"));
    assert_eq!(plan.node, "a100-a");
    let steps: Vec<(&str, &str, &str)> = (plan.moves.iter())
        .map(|m| (&*m.pod, &*m.from, &*m.to))
        .collect();
    assert_eq!(steps, [("team-b/infer-0", "a100-a", "t4-a")]);

    let no_room = team_b_hard(r#"{A100-SXM4-40GB: "1", Tesla-T4: "0"}"#);
    // A tenant naming a model its quota does not list gains no way onto it.
    let named = team_b_hard(r#"{A100-SXM4-40GB: "1"}"#).replacen(
        "    gpu-admission.io/movable: \"true\"\n",
        "    gpu-admission.io/movable: \"true\"\n    gpu-admission.io/gpu-type: A100-SXM4-40GB,Tesla-T4\n",
        1,
    );
    assert!(named.contains("gpu-type: A100-SXM4-40GB,Tesla-T4"));
    for text in [no_room, named] {
        let report = plan_text(&text, Some("team-a/train-0"));
        assert!(report.plans.is_empty(), "{report:?}");
        assert!(
            reason(&report, "team-a/train-0").contains("0 vcuda-core free"),
            "{report:?}"
        );
    }
}

/// Two of a plan's moves that take one namespace's pods to one other model (or one to
/// the pending pod's namespace and model) may overdraw its quota together: the second
/// stays. Moves within a model, or into other namespaces or models, charge nothing new.
#[test]
fn two_charges_on_one_namespaces_model_in_one_plan_keep_the_second_pod() {
    use crate::cache::PodKey;
    use crate::placement::defrag::{Move, Plan, Site};
    let site = |name: &str, model: &str| {
        let mut gpus = crate::placement::testing::node(name, 1, 64);
        gpus.model = Some(model.into());
        Site::<PodKey> {
            gpus,
            room: None,
            residents: Vec::new(),
        }
    };
    let sites = [site("a", "A100"), site("t1", "T4"), site("t2", "T4")];
    let step = |pod: &str, from: usize, to: usize| Move {
        pod: PodKey::from(pod),
        from,
        to,
        assignment: Default::default(),
    };
    let plan = |moves| Plan {
        node: 0,
        assignment: Default::default(),
        moves,
        core_moved: 0,
        fragmentation: 0.0,
    };
    let pending = PodKey::from("team-a/train");
    let shared = |moves| super::shared_charge(&sites, &pending, &plan(moves));
    assert_eq!(
        shared(vec![step("team-b/x", 0, 1), step("team-c/y", 0, 2)]),
        None
    );
    assert_eq!(
        shared(vec![step("team-b/x", 1, 2), step("team-b/y", 1, 2)]),
        None
    );
    assert_eq!(
        shared(vec![step("team-b/x", 0, 1), step("team-b/y", 0, 2)]),
        Some(PodKey::from("team-b/y"))
    );
    assert_eq!(
        shared(vec![step("team-a/z", 1, 0)]),
        Some(PodKey::from("team-a/z")),
        "the pending pod's namespace is charged on the target's model"
    );
}

/// The cluster controller plans for a pod whose models have too little free in all only
/// while a pod that accepts several runs on them: team-a's pod is planned for beside
/// team-b's two-model pod, not once team-b's quota lists one model.
#[test]
fn a_pod_short_of_gpus_is_planned_for_only_beside_a_pod_that_may_change_model() {
    let helps = |text: &str| {
        let objects = parse_objects(text, "test").unwrap();
        let projection = crate::cache::Projection::from_config(&Config::default());
        let cache = crate::cache::CacheWriter::from_objects(&objects, "test", projection).unwrap();
        cache.read(|state| {
            let key = crate::cache::PodKey::from("team-a/train-0");
            let pod = state.pod(&key).unwrap();
            super::model_change_helps(state, &key, pod)
        })
    };
    assert!(helps(TWO_MODELS));
    assert!(!helps(&team_b_hard(r#"{A100-SXM4-40GB: "1"}"#)));
}
