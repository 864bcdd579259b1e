//! One pod for each code `explain` gives, on the fragmented example cluster plus a
//! namespace with a queueing quota in a cohort, an A100 node and a V100 quota without
//! nodes.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::cache::parse_objects;
use crate::config::Config;

use super::{Asked, Code, Explanation, explain};

const EXAMPLE: &str = include_str!("../../examples/fragmented.yaml");

const EXTRA: &str = r#"
---
apiVersion: v1
kind: Node
metadata:
  name: a100-a
  labels: {nvidia.com/gpu.product: A100}
status:
  allocatable: {cpu: "32", memory: 128Gi, tencent.com/vcuda-core: "200", tencent.com/vcuda-memory: "160"}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-q}
spec:
  hard: {Tesla-T4: "1", A100: "2", V100: "1", L4: "4"}
  onExceed: Queue
  cohort: research
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-r}
spec:
  hard: {Tesla-T4: "1"}
  cohort: research
---
apiVersion: v1
kind: Node
metadata:
  name: l4-a
  labels: {nvidia.com/gpu.product: L4}
status:
  allocatable: {cpu: "32", memory: 128Gi, tencent.com/vcuda-core: "200", tencent.com/vcuda-memory: "96"}
---
apiVersion: v1
kind: Pod
metadata:
  name: l4-run
  namespace: team-q
  annotations: {gpu-admission.io/gpu-type: L4, tencent.com/predicate-gpu-idx-0: "0"}
spec:
  nodeName: l4-a
  containers:
  - name: c
    resources: {limits: {tencent.com/vcuda-core: "100"}}
---
apiVersion: v1
kind: Pod
metadata:
  name: wait-1
  namespace: team-q
  creationTimestamp: "2026-11-29T00:00:00Z"
  annotations: {gpu-admission.io/gpu-type: Tesla-T4}
spec:
  schedulingGates: [{name: gpu-admission.io/quota}]
  containers:
  - name: c
    resources: {limits: {tencent.com/vcuda-core: "100"}}
"#;

/// 2026-11-29T01:00:00Z
const NOW: i64 = 1_796_000_400;

fn cluster() -> String {
    format!("{EXAMPLE}{EXTRA}")
}

fn existing(key: &str) -> Explanation {
    let objects = parse_objects(&cluster(), "test").unwrap();
    explain(
        &objects,
        "test",
        &Config::default(),
        Asked::Existing(key.into()),
        NOW,
    )
    .unwrap()
}

/// A manifest in `namespace` naming `model`, asking for `gpus` whole GPUs.
fn what_if(namespace: &str, model: &str, gpus: u32) -> Explanation {
    let limits = json!({"tencent.com/vcuda-core": (100 * gpus).to_string()});
    explain_new(&cluster(), namespace, model, limits)
}

/// Explain a manifest `new` not yet created in `namespace` of `text`'s cluster: one
/// container with `limits`, naming `model`.
fn explain_new(text: &str, namespace: &str, model: &str, limits: serde_json::Value) -> Explanation {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "new", "namespace": namespace,
            "annotations": {"gpu-admission.io/gpu-type": model}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }))
    .unwrap();
    let objects = parse_objects(text, "test").unwrap();
    let asked = Asked::Manifest(Box::new(pod));
    explain(&objects, "test", &Config::default(), asked, NOW).unwrap()
}

fn stage<'e>(explanation: &'e Explanation, name: &str) -> &'e super::verdict::Stage {
    explanation.stages.iter().find(|s| s.stage == name).unwrap()
}

fn says(explanation: &Explanation, kind: &str, needle: &str) -> bool {
    explanation
        .counterfactuals
        .iter()
        .any(|c| c.kind == kind && c.message.contains(needle))
}

#[test]
fn a_bound_pod_is_placed() {
    let e = existing("team-b/infer-a-7f9-x2");
    assert_eq!(e.code, Code::Placed, "{e:?}");
    assert!(stage(&e, "placement").message.contains("t4-a"));
    assert!(e.counterfactuals.is_empty());
}

#[test]
fn a_pod_with_free_gpus_spread_over_nodes_is_fragmented_and_fits_after_a_move() {
    let e = existing("team-a/train-0");
    assert_eq!(e.code, Code::Fragmented, "{e:?}");
    assert_eq!(stage(&e, "admission").code, Code::Fits);
    let message = &stage(&e, "placement").message;
    assert!(
        message.contains("3 GPUs of Tesla-T4 are free on 3 nodes, it needs 2"),
        "{message}"
    );
    // The moved pod is team-b's: told to whoever reads this pod, it is not named.
    assert!(
        says(&e, "moves", "a pod of another namespace from t4-a"),
        "{e:?}"
    );
    assert!(!format!("{e:?}").contains("team-b"), "{e:?}");
}

#[test]
fn a_pod_asking_more_than_is_free_in_all_has_insufficient_gpus() {
    // team-q's L4 quota has room for 2 more; the one L4 node has 1 of its 2 free.
    let e = what_if("team-q", "L4", 2);
    assert_eq!(e.code, Code::InsufficientGpus, "{e:?}");
    let message = &stage(&e, "placement").message;
    assert!(
        message.contains("1 GPUs of L4 are free on 1 nodes, it needs 2"),
        "{message}"
    );
    assert!(!e.counterfactuals.iter().any(|c| c.kind == "moves"));
}

#[test]
fn a_pod_bigger_than_any_node_of_its_model_has_no_node() {
    let e = existing("team-a/train-big");
    assert_eq!(e.code, Code::NoNodeOfModel, "{e:?}");
    let message = &stage(&e, "placement").message;
    assert!(
        message.contains("needs 4 whole GPUs, node has 2"),
        "{message}"
    );
}

#[test]
fn a_queued_pod_with_room_is_queued_behind() {
    let e = existing("team-q/wait-1");
    assert_eq!(e.code, Code::QueuedBehind, "{e:?}");
    assert!(
        stage(&e, "admission").message.contains("1 of 1 in line"),
        "{e:?}"
    );
}

#[test]
fn a_manifest_no_node_of_its_model_fits_is_told_of_another_model_and_of_moves() {
    // team-q may use 1 Tesla-T4 and borrows the second from team-r (cohort research);
    // no T4 node has 2 free. Its quota has 2 A100, both free on the A100 node: as A100 it
    // fits now; as T4 after moving infer-a.
    let e = what_if("team-q", "Tesla-T4", 2);
    assert_eq!(stage(&e, "admission").code, Code::Fits, "{e:?}");
    assert_eq!(e.code, Code::Fragmented, "{e:?}");
    assert!(says(&e, "other_model", "fits now as model A100"), "{e:?}");
    // The moved pod is team-b's: told to whoever reads this pod, it is not named.
    assert!(
        says(&e, "moves", "a pod of another namespace from t4-a"),
        "{e:?}"
    );
    assert!(!format!("{e:?}").contains("team-b"), "{e:?}");
}

#[test]
fn a_manifest_past_its_quota_in_a_cohort_that_lends_no_more_is_cohort_limited() {
    // team-r's own Tesla-T4 (1) is short of 2, and team-q, the only other member, lends
    // its single Tesla-T4 at most: the cohort cannot make up the rest.
    let e = what_if("team-r", "Tesla-T4", 3);
    assert_eq!(e.code, Code::CohortLimit, "{e:?}");
    assert!(
        stage(&e, "admission").message.contains("cohort research"),
        "{e:?}"
    );
    assert!(
        says(
            &e,
            "cohort",
            "cohort research can lend 2 Tesla-T4 now, not enough"
        ),
        "{e:?}"
    );
}

#[test]
fn a_manifest_past_a_quota_without_a_cohort_exceeds_it() {
    // team-a may use 8 Tesla-T4; its two pending pods are charged 6 at creation.
    let e = what_if("team-a", "Tesla-T4", 3);
    assert_eq!(e.code, Code::QuotaExceeded, "{e:?}");
    assert!(
        stage(&e, "admission").message.contains("used 6 of 8"),
        "{e:?}"
    );
}

#[test]
fn a_manifest_naming_a_model_its_quota_does_not_list_is_not_allowed() {
    let e = what_if("team-a", "A100", 1);
    assert_eq!(e.code, Code::ModelNotAllowed, "{e:?}");
}

#[test]
fn a_model_without_open_nodes_has_no_node() {
    let e = what_if("team-q", "V100", 1);
    assert_eq!(stage(&e, "admission").code, Code::Fits, "{e:?}");
    assert_eq!(e.code, Code::NoNodeOfModel, "{e:?}");
    // Nor does a node too small ever to take it: 3 whole T4s on 2-GPU nodes.
    let e = what_if("team-q", "Tesla-T4", 3);
    let placement = stage(&e, "placement");
    assert_eq!(placement.code, Code::NoNodeOfModel, "{e:?}");
    assert!(placement.message.contains("could ever take it"), "{e:?}");
}

#[test]
fn a_manifest_with_room_and_a_node_fits() {
    let e = what_if("team-q", "A100", 1);
    assert_eq!(e.code, Code::Fits, "{e:?}");
    assert!(stage(&e, "placement").message.contains("a100-a"), "{e:?}");
    assert!(e.counterfactuals.is_empty());
}

#[test]
fn a_pod_not_in_the_cluster_is_an_error() {
    let objects = parse_objects(&cluster(), "test").unwrap();
    let asked = Asked::Existing("team-a/nobody".into());
    let error = explain(&objects, "test", &Config::default(), asked, NOW).unwrap_err();
    assert!(error.to_string().contains("team-a/nobody"), "{error}");
}

#[test]
fn the_json_answer_has_the_documented_fields() {
    let e = existing("team-a/train-0");
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["pod"], "team-a/train-0");
    assert_eq!(json["code"], "Fragmented");
    assert_eq!(json["stages"][0]["stage"], "admission");
    assert_eq!(json["stages"][1]["code"], "Fragmented");
    assert!(json["stages"][1]["message"].is_string());
    assert_eq!(json["counterfactuals"][0]["kind"], "moves");
    let e = what_if("team-q", "L4", 2);
    assert_eq!(
        serde_json::to_value(&e).unwrap()["code"],
        "InsufficientGPUs"
    );
}

#[test]
fn a_pod_only_capped_mig_slices_would_take_has_a_profile_cap() {
    // The only A100 node is cut into 1g.5gb slices (single strategy), a profile team-m's
    // quota caps: a pod that names the model, not the slice, may not take one.
    let text = r#"
apiVersion: v1
kind: Node
metadata:
  name: sliced
  labels: {nvidia.com/gpu.product: A100-SXM4-40GB-MIG-1g.5gb}
status:
  allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "7"}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-m}
spec:
  hard: {A100-SXM4-40GB: "2", A100-SXM4-40GB/1g.5gb: "1"}
"#;
    let limits = json!({"nvidia.com/gpu": "1"});
    let e = explain_new(text, "team-m", "A100-SXM4-40GB", limits);
    assert_eq!(e.code, Code::ProfileCap, "{e:?}");
    assert!(stage(&e, "placement").message.contains("1g.5gb"), "{e:?}");
}

#[test]
fn a_refused_manifest_is_told_which_running_pod_of_its_namespace_makes_room() {
    // team-q's L4 quota is 4 and l4-run holds 1: 4 more are 1 too many, and l4-run's
    // end frees that one.
    let e = what_if("team-q", "L4", 4);
    assert!(!e.code.passes(), "{e:?}");
    assert!(
        says(
            &e,
            "ends",
            "fits when team-q/l4-run ends (frees 1 L4; 1 more is needed)"
        ),
        "{e:?}"
    );
    // Within its quota nothing needs to end.
    let e = what_if("team-q", "L4", 2);
    assert!(!e.counterfactuals.iter().any(|c| c.kind == "ends"), "{e:?}");
}

#[test]
fn what_a_running_pod_frees_is_what_the_ledger_charged_it_not_its_node_label() {
    // `old` was admitted for Tesla-T4 and runs on a node relabelled Tesla-V100 since: the
    // ledger charges it (and its end frees) one Tesla-T4, which a new T4 pod lacks.
    let text = r#"
apiVersion: v1
kind: Node
metadata: {name: relabelled, labels: {nvidia.com/gpu.product: Tesla-V100}}
status:
  allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "4"}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-r}
spec:
  hard: {Tesla-T4: "1", Tesla-V100: "4"}
---
apiVersion: v1
kind: Pod
metadata:
  name: old
  namespace: team-r
  annotations: {gpu-admission.io/gpu-type: Tesla-T4}
spec:
  nodeName: relabelled
  containers:
  - name: c
    resources: {limits: {nvidia.com/gpu: "1"}}
"#;
    let limits = json!({"nvidia.com/gpu": "1"});
    let e = explain_new(text, "team-r", "Tesla-T4", limits);
    assert_eq!(e.code, Code::QuotaExceeded, "{e:?}");
    assert!(
        says(
            &e,
            "ends",
            "fits when team-r/old ends (frees 1 Tesla-T4; 1 more is needed)"
        ),
        "{e:?}"
    );
}

#[test]
fn when_no_single_pod_frees_enough_the_fewest_that_do_together_are_named() {
    let text = r#"
apiVersion: v1
kind: Node
metadata: {name: t4, labels: {nvidia.com/gpu.product: Tesla-T4}}
status:
  allocatable: {cpu: "32", memory: 128Gi, tencent.com/vcuda-core: "400", tencent.com/vcuda-memory: "64"}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-z}
spec:
  hard: {Tesla-T4: "3"}
"#;
    let mut text = text.to_string();
    for (name, core) in [("z-half", 50), ("z-one", 100), ("z-two", 100)] {
        text += &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: team-z}}\n\
             spec:\n  nodeName: t4\n  containers:\n  - name: c\n    resources: \
             {{limits: {{tencent.com/vcuda-core: \"{core}\", tencent.com/vcuda-memory: \"8\"}}}}\n"
        );
    }
    let limits = json!({"tencent.com/vcuda-core": "200"});
    let e = explain_new(&text, "team-z", "Tesla-T4", limits);
    // 2.5 of 3 used, 2 asked: 1.5 too many; no single pod frees that much.
    assert_eq!(e.code, Code::QuotaExceeded, "{e:?}");
    assert!(
        says(
            &e,
            "ends",
            "fits when team-z/z-one and team-z/z-two end (they free 2 Tesla-T4 together; 1.5 more is needed)"
        ),
        "{e:?}"
    );
}

const CLAIMS: &str = r#"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: wants-h100, namespace: team-c}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: wants-a100, namespace: team-c}
spec:
  devices:
    requests:
    - name: gpu
      firstAvailable:
      - name: h100
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'}
      - name: a100
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")'}
"#;

/// A pod whose GPUs come only through the ResourceClaim `claim` (the cache does not keep
/// it: `explain` reads its object).
fn claim_pod(name: &str, claim: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: team-c}}\n\
         spec:\n  resourceClaims: [{{name: gpu, resourceClaimName: {claim}}}]\n  \
         containers:\n  - name: c\n    resources: {{claims: [{{name: gpu}}]}}\n"
    )
}

#[test]
fn a_claim_whose_selectors_match_no_published_gpu_is_told_so() {
    let text = format!(
        "{}{CLAIMS}{}{}",
        include_str!("../../examples/cluster.yaml"),
        claim_pod("h100-job", "wants-h100"),
        claim_pod("a100-job", "wants-a100"),
    );
    let objects = parse_objects(&text, "test").unwrap();
    let judge = |key: &str| {
        let asked = Asked::Existing(key.into());
        explain(&objects, "test", &Config::default(), asked, NOW).unwrap()
    };
    let e = judge("team-c/h100-job");
    assert_eq!(e.code, Code::SelectorNoMatch, "{e:?}");
    let dra = stage(&e, "dra");
    assert!(
        dra.message
            .starts_with("ResourceClaim wants-h100, request gpu: its selectors match none"),
        "{e:?}"
    );
    assert!(dra.message.contains("(A100-SXM4-40GB)"), "{e:?}");
    // One alternative of a firstAvailable request matching is enough.
    let e = judge("team-c/a100-job");
    assert_eq!(stage(&e, "dra").code, Code::Fits, "{e:?}");
    assert_eq!(e.code, Code::Fits, "{e:?}");
}

/// A claim whose alternatives the mutating webhook chose among (the H100 passed over,
/// made unmatchable): explain says which one the quota kept, and why.
#[test]
fn a_claim_of_alternatives_says_which_one_the_quota_kept() {
    let chose = CLAIMS.replace(
        "name: wants-a100",
        "name: chose-a100",
    ).replace(
        "productName == \"NVIDIA H100 80GB HBM3\"'}\n      - name: a100",
        "productName == \"NVIDIA H100 80GB HBM3\"'}\n        - cel: {expression: 'false'}\n      - name: a100",
    );
    assert!(chose.contains("expression: 'false'"), "{chose}");
    let text = format!(
        "{}{chose}{}",
        include_str!("../../examples/cluster.yaml"),
        claim_pod("a100-job", "chose-a100"),
    );
    let objects = parse_objects(&text, "test").unwrap();
    let asked = Asked::Existing("team-c/a100-job".into());
    let e = explain(&objects, "test", &Config::default(), asked, NOW).unwrap();
    let dra = stage(&e, "dra");
    assert_eq!(dra.code, Code::Fits, "{e:?}");
    assert!(
        dra.message.ends_with(
            "; ResourceClaim chose-a100, request gpu: the quota chose alternative a100 (the alternatives before it had no room in the quota when the claim was created)"
        ),
        "{e:?}"
    );
}

#[test]
fn a_queued_pod_the_releaser_has_charged_is_let_go_not_refused() {
    // team-s's quota (1 Tesla-T4) holds the releaser's charge for release-1 already; the
    // watch has not shown its gate gone: it is being let go, not over its quota.
    let text = r#"
apiVersion: v1
kind: Node
metadata: {name: t4, labels: {nvidia.com/gpu.product: Tesla-T4}}
status:
  allocatable: {cpu: "32", memory: 128Gi, tencent.com/vcuda-core: "200", tencent.com/vcuda-memory: "64"}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUQuota
metadata: {name: default, namespace: team-s}
spec:
  hard: {Tesla-T4: "1"}
  onExceed: Queue
status:
  used: {Tesla-T4: "1"}
  pending:
  - {created: "2026-11-29T00:59:59Z", model: Tesla-T4, amount: "1", pods: 1, chargeIds: [u-release-1.5f.0]}
---
apiVersion: v1
kind: Pod
metadata:
  name: release-1
  namespace: team-s
  uid: u-release-1
  creationTimestamp: "2026-11-29T00:59:00Z"
  annotations: {gpu-admission.io/gpu-type: Tesla-T4}
spec:
  schedulingGates: [{name: gpu-admission.io/quota}]
  containers:
  - name: c
    resources: {limits: {tencent.com/vcuda-core: "100"}}
"#;
    let objects = parse_objects(text, "test").unwrap();
    let judge = |objects: &[crate::cache::FileObject]| {
        let asked = Asked::Existing("team-s/release-1".into());
        explain(objects, "test", &Config::default(), asked, NOW).unwrap()
    };
    let e = judge(&objects);
    assert_eq!(stage(&e, "admission").code, Code::Fits, "{e:?}");
    assert!(
        stage(&e, "admission")
            .message
            .starts_with("let out of the quota queue"),
        "{e:?}"
    );
    // Another pod's release charge says nothing of this one: it still waits in line.
    let other = text.replace("u-release-1.5f.0", "u-someone-else.5f.0");
    let e = judge(&parse_objects(&other, "test").unwrap());
    assert_eq!(e.code, Code::QueuedBehind, "{e:?}");
}
