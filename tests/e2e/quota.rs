//! The GPUQuota ledger: admit, refuse and free again; dry runs; two replicas under
//! parallel creates; the legacy quota import; a multi-model pod charged before it is bound.

use std::time::{Duration, Instant};

use gpu_admission::quota::GPUQuota;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

/// A. Quota lifecycle (docs/design.md): with `Tesla-T4: 2`, two 1-GPU pods are admitted, the
/// third is refused by the API server (403 Forbidden, the webhook's quota message);
/// deleting a pod, or moving one to Succeeded, makes room again; `status.used` (the
/// `Used` column of `kubectl get gq`) follows the live pods.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn quota_lifecycle_admit_refuse_and_free_on_delete_and_on_success() {
    let Some(cluster) = setup("lifecycle").await else {
        return;
    };
    let model = "Tesla-T4";
    cluster
        .quota_under_webhooks(
            "default",
            json!({"hard": {model: "2"}, "defaultType": model}),
        )
        .await;

    for name in ["one", "two"] {
        let pod = unscheduled_gpu_pod(name, None, 1);
        cluster
            .try_create(&pod)
            .await
            .unwrap_or_else(|e| panic!("pod {name} is within quota and must be admitted: {e}"));
    }
    let message = forbidden_message(
        cluster
            .try_create(&unscheduled_gpu_pod("three", None, 1))
            .await,
        "the third 1-GPU pod",
    );
    println!("three: {message}");
    let expected = format!(
        "admission webhook \"validate.gpu-admission.io\" denied the request: GPU quota exceeded \
         in namespace \"{}\" for {model}: requested 1, used 2 of 2 (GPUQuota {}/default)",
        cluster.ns, cluster.ns
    );
    assert_eq!(message, expected);
    let status = cluster.wait_used("default", model, 2000).await;
    println!("after two pods: used {:?}", status.used);

    // Deleting a pod frees its GPU (the reconciler runs on pod deletion and every 15 s).
    cluster
        .pods()
        .delete("one", &DeleteParams::default())
        .await
        .unwrap();
    let started = Instant::now();
    cluster
        .create_when_admitted(&unscheduled_gpu_pod("three", None, 1), QUOTA_TIMEOUT)
        .await;
    println!("three admitted {:?} after deleting one", started.elapsed());
    forbidden_message(
        cluster
            .try_create(&unscheduled_gpu_pod("four", None, 1))
            .await,
        "a pod over the quota again",
    );

    // A pod that finished (phase Succeeded, written through the status subresource)
    // no longer counts.
    cluster
        .pods()
        .patch_status(
            "two",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    let started = Instant::now();
    cluster
        .create_when_admitted(&unscheduled_gpu_pod("four", None, 1), QUOTA_TIMEOUT)
        .await;
    println!("four admitted {:?} after two succeeded", started.elapsed());

    let status = cluster.wait_used("default", model, 2000).await;
    assert_eq!(
        cluster.live_pod_gpus().await,
        2000,
        "three and four are live"
    );
    println!(
        "kubectl get gq: Hard {{\"{model}\":\"2\"}} Used {:?}",
        status.used
    );
    unregister_webhooks(&cluster).await;
}

/// A pod being deleted still runs its containers, which hold their GPUs, for its whole
/// grace period, and the tenant chooses that period: with `Tesla-T4: 2`, two running pods
/// deleted with a day of grace stay charged, and new pods are refused however long the
/// tenant waits (several reconciler passes); once the pods are gone (the test plays the
/// kubelet that confirms their containers stopped), room comes back.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn pods_deleted_with_a_long_grace_stay_charged_until_they_are_gone() {
    let Some(cluster) = setup("terminating").await else {
        return;
    };
    let model = "Tesla-T4";
    let node = format!("e2e-{}-n1", cluster.scenario);
    cluster.create_gpu_node(&node, model, 4).await;
    cluster
        .quota_under_webhooks(
            "default",
            json!({"hard": {model: "2"}, "defaultType": model}),
        )
        .await;
    let running = json!({"status": {"phase": "Running"}});
    for name in ["old-1", "old-2"] {
        let mut pod = unscheduled_gpu_pod(name, None, 1);
        let spec = pod.spec.as_mut().unwrap();
        spec.node_name = Some(node.clone());
        spec.termination_grace_period_seconds = Some(86_400);
        // Retried until the webhooks' caches know the node.
        cluster.create_when_admitted(&pod, QUOTA_TIMEOUT).await;
        cluster
            .pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&running))
            .await
            .unwrap();
    }
    cluster.wait_used("default", model, 2000).await;
    for name in ["old-1", "old-2"] {
        cluster
            .pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    // Longer than the reconciler's period (15 s): its passes keep them charged.
    let until = Instant::now() + Duration::from_secs(20);
    let mut tries = 0;
    while Instant::now() < until {
        let old = cluster.pods().get("old-1").await.unwrap();
        assert!(
            old.metadata.deletion_timestamp.is_some(),
            "old-1 is being deleted"
        );
        forbidden_message(
            cluster
                .try_create(&unscheduled_gpu_pod("new-1", None, 1))
                .await,
            "a pod while two pods being deleted still hold the quota",
        );
        tries += 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let status = cluster.quota_status("default").await;
    let used = status.used.get(model).map(|q| milli_gpus(&q.0));
    assert_eq!(used, Some(2000), "still charged: {status:?}");
    println!("refused {tries} times in 20 s while the deleted pods ran: {status:?}");

    // Their containers stopped: the kubelet removes the pods, and their GPUs are free.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for name in ["old-1", "old-2"] {
        cluster.pods().delete(name, &now).await.unwrap();
    }
    for name in ["new-1", "new-2"] {
        let pod = unscheduled_gpu_pod(name, None, 1);
        cluster.create_when_admitted(&pod, QUOTA_TIMEOUT).await;
    }
    cluster.wait_used("default", model, 2000).await;
    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}

/// B. A server-side dry-run create of a GPU pod is evaluated (refused when over quota)
/// but reserves nothing: `status.used` and `status.pending` stay as they were.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn dry_run_is_judged_but_reserves_nothing() {
    let Some(cluster) = setup("dryrun").await else {
        return;
    };
    let model = "Tesla-T4";
    cluster
        .quota_under_webhooks(
            "default",
            json!({"hard": {model: "1"}, "defaultType": model}),
        )
        .await;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };

    let before = cluster.wait_used("default", model, 0).await;
    cluster
        .pods()
        .create(&dry_run, &unscheduled_gpu_pod("dry", None, 1))
        .await
        .unwrap_or_else(|e| panic!("a dry-run within quota must be allowed: {e}"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_charges_unchanged(&cluster.quota_status("default").await, &before, model);
    assert!(
        cluster.pods().get_opt("dry").await.unwrap().is_none(),
        "a dry-run creates nothing"
    );

    cluster
        .try_create(&unscheduled_gpu_pod("real", None, 1))
        .await
        .unwrap();
    let before = cluster.wait_used("default", model, 1000).await;
    let message = forbidden_message(
        cluster
            .pods()
            .create(&dry_run, &unscheduled_gpu_pod("dry-over", None, 1))
            .await,
        "a dry-run over the quota",
    );
    println!("dry-over: {message}");
    assert!(message.contains("GPU quota exceeded"), "{message}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_charges_unchanged(&cluster.quota_status("default").await, &before, model);
    unregister_webhooks(&cluster).await;
}

/// `used[model]` and the pending charges are what they were. (A status the reconciler
/// has not written yet lacks the model's key; its first write adds it as 0.)
fn assert_charges_unchanged(
    now: &gpu_admission::quota::GpuQuotaStatus,
    before: &gpu_admission::quota::GpuQuotaStatus,
    model: &str,
) {
    let used = |s: &gpu_admission::quota::GpuQuotaStatus| {
        s.used.get(model).map_or(0, |q| milli_gpus(&q.0))
    };
    assert_eq!(
        used(now),
        used(before),
        "used {model}: {now:?} vs {before:?}"
    );
    assert_eq!(
        now.pending, before.pending,
        "pending: {now:?} vs {before:?}"
    );
}

/// C. Two gpu-admission replicas validate concurrently against one GPUQuota (one webhook
/// per replica, each for the pods labelled `replica: a` / `replica: b`): a burst of 500
/// parallel 1-GPU creates against a quota of 250 admits exactly 250, refuses the other
/// 250 for quota and answers no create with an error, and `status.used` ends at 250 —
/// whatever grants the replicas took on the way (docs/design.md, "Grants").
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn two_replicas_never_admit_past_the_quota_under_parallel_creates() {
    let Some(cluster) = setup("replicas").await else {
        return;
    };
    replicas_never_admit_past_the_quota(&cluster, "Tesla-M60", &["a", "b"]).await;
}

/// C. The same with three replicas (the third, `c`, started for it).
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn three_replicas_never_admit_past_the_quota_under_parallel_creates() {
    let Some(cluster) = setup("replicas3").await else {
        return;
    };
    let _c = ReplicaC::start(true).await;
    replicas_never_admit_past_the_quota(&cluster, "Tesla-M40", &["a", "b", "c"]).await;
}

async fn replicas_never_admit_past_the_quota(cluster: &Cluster, model: &str, replicas: &[&str]) {
    const QUOTA: u32 = 250;
    const CREATES: u32 = 500;
    let creates = replica_burst(cluster, model, QUOTA, CREATES, replicas).await;
    let started = std::time::Instant::now();
    let (admitted, refusals) = create_in_parallel(creates, |text| {
        text.contains("GPU quota exceeded")
            .then_some("quota exceeded (403)")
    })
    .await;
    println!(
        "{CREATES} creates in {:.2} s: admitted per replica: {admitted:?}; refusals: {refusals:?}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        admitted.values().sum::<u32>(),
        QUOTA,
        "exactly the quota must be admitted; admitted per replica {admitted:?}, refusals {refusals:?}"
    );
    assert_eq!(
        refusals.get("quota exceeded (403)"),
        Some(&(CREATES - QUOTA)),
        "every other create is refused for quota, none fails; refusals {refusals:?}"
    );
    // Admissions raced across replicas. Not necessarily all of them: a replica's grants
    // may hold the quota's room until it is spent, and another's creates are then
    // refused, rightly (seen in CI: 3 replicas, admitted {a: 167, b: 83}).
    assert!(
        admitted.len() >= 2,
        "at least two replicas admitted some: {admitted:?}"
    );
    let gpus = u64::from(QUOTA) * 1000;
    let status = cluster.wait_used("default", model, gpus).await;
    assert_eq!(cluster.live_pod_gpus().await, gpus);
    assert!(
        status.grants.is_empty(),
        "no room is held at hard: {status:?}"
    );
    println!("status.used {:?}", status.used);
    unregister_webhooks(cluster).await;
}

/// F. `gpu-admission quota import --file` turns the legacy tkestack quota JSON into a
/// GPUQuota that the webhook then enforces.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn legacy_quota_import_creates_an_enforced_gpuquota() {
    let Some(cluster) = setup("import").await else {
        return;
    };
    let model = "Tesla-K40";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu_quota.json");
    std::fs::write(
        &file,
        json!({cluster.ns.as_str(): {"quota": {model: 1}}}).to_string(),
    )
    .unwrap();
    let kubeconfig = std::env::var(KUBECONFIG_ENV).unwrap();
    let out = std::process::Command::new(gpu_admission_bin())
        .args(["quota", "import", "--kubeconfig", &kubeconfig])
        .arg("--file")
        .arg(&file)
        .output()
        .unwrap();
    println!(
        "quota import: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "gpu-admission quota import failed: {out:?}"
    );
    let quota = cluster.quotas().get("default").await.unwrap();
    assert_eq!(
        quota.spec.hard.get(model).map(|q| milli_gpus(&q.0)),
        Some(1000),
        "imported spec: {:?}",
        quota.spec
    );

    cluster.label_for_webhooks().await;
    register_webhooks(&cluster).await;
    cluster
        .try_create(&unscheduled_gpu_pod("first", Some(model), 1))
        .await
        .unwrap_or_else(|e| panic!("within the imported quota: {e}"));
    let message = forbidden_message(
        cluster
            .try_create(&unscheduled_gpu_pod("second", Some(model), 1))
            .await,
        "a pod over the imported quota",
    );
    println!("second: {message}");
    assert!(
        message.contains(&format!(
            "for {model}: requested 1, used 1 of 1 (GPUQuota {}/default)",
            cluster.ns
        )),
        "{message}"
    );
    unregister_webhooks(&cluster).await;
}

/// A pod that accepts several models is charged when it is placed, for its node's model,
/// in the same ledger the validating webhook reserves in (`GPUQuota.status`), before the
/// extender answers the scheduler: a single-model pod created right after it is bound is
/// refused at once, not admitted until the reconciler's next pass (every 15 s).
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_multi_model_pod_is_charged_in_the_ledger_before_it_is_bound() {
    let Some(cluster) = setup("ledger").await else {
        return;
    };
    let (a, b) = ("E2E-Ledger-A", "E2E-Ledger-B");
    cluster.create_gpu_node("e2e-ledger-a", a, 1).await;
    cluster.create_gpu_node("e2e-ledger-b", b, 1).await;
    cluster
        .quota_under_webhooks("default", json!({"hard": {a: "1", b: "1"}}))
        .await;
    cluster
        .create_gpu_pod("either", &format!("{a},{b}"), Gpu::Whole(1))
        .await;
    let pod = cluster.wait_bound("either").await;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let model = if node == "e2e-ledger-a" { a } else { b };
    let status = cluster.quota_status("default").await;
    println!("bound to {node}; quota status right away: {status:?}");
    assert_eq!(
        status.used.get(model).map(|q| milli_gpus(&q.0)),
        Some(1000),
        "the placement's charge must be in the ledger when the pod is bound"
    );
    let message = forbidden_message(
        cluster
            .try_create(&unscheduled_gpu_pod("same-model", Some(model), 1))
            .await,
        "a 1-GPU pod of the model the multi-model pod took",
    );
    assert!(message.contains(&format!("for {model}")), "{message}");
    unregister_webhooks(&cluster).await;
    cluster.delete_nodes().await;
}

/// deploy/'s scheduler configuration (kube-scheduler calls the bind verb) under a
/// gpu-admission config that says it does not (`placement.bindVerb: false`): the first
/// pod's placement is written and charged by the filter, and its bind must not charge it
/// again (it did: twice the GPUs in the ledger); the bind call switches the filter to
/// holding only, so the next pod is charged once too, by its bind. The quota has room for
/// a double charge, so one would show.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_scheduler_that_binds_against_the_config_charges_each_pod_once() {
    let Some(cluster) = setup("bindverb").await else {
        return;
    };
    let (a, b) = ("E2E-Bindverb-A", "E2E-Bindverb-B");
    cluster.create_gpu_node("e2e-bindverb-a", a, 2).await;
    cluster.create_gpu_node("e2e-bindverb-b", b, 2).await;
    cluster.label_for_webhooks().await;
    cluster
        .create_quota("default", json!({a: "4", b: "4"}), None)
        .await;
    let config = run_config().replace("bindVerb: true", "bindVerb: false");
    assert!(config.contains("bindVerb: false"), "{config}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu-admission.yaml");
    std::fs::write(&path, config).unwrap();
    ctl("stop");
    let restore = RunConfigOnDrop(&["a"]);
    start_with_config(&path);
    register_webhooks(&cluster).await;

    for (i, name) in ["first", "second"].into_iter().enumerate() {
        cluster
            .create_gpu_pod(name, &format!("{a},{b}"), Gpu::Whole(1))
            .await;
        let pod = cluster.wait_bound(name).await;
        assert_placement_annotations(&pod, 2);
        // A double charge held until its pending total expired (120 s); between the
        // placement write and the reconciler seeing the bind, the pod may count by its
        // node and its total for a moment (docs/design.md, "The ledger"), so wait for
        // the count to settle, well within the total's life.
        let expected = 1000 * (i as u64 + 1);
        let last = std::sync::Mutex::new(None);
        let (last_ref, cluster_ref) = (&last, &cluster);
        let settled = wait_for_or_none(QUOTA_TIMEOUT, || async move {
            let status = cluster_ref.quota_status("default").await;
            let used: u64 = [a, b]
                .iter()
                .filter_map(|m| status.used.get(*m))
                .map(|q| milli_gpus(&q.0))
                .sum();
            *last_ref.lock().unwrap() = Some((used, status));
            (used == expected).then_some(())
        })
        .await;
        let last = last.into_inner().unwrap();
        println!("{name} bound; quota status: {last:?}");
        assert!(
            settled.is_some(),
            "{name}: each bound 1-GPU pod is charged one GPU, once: want {expected}m used \
             within {QUOTA_TIMEOUT:?}, last (used, status): {last:?}"
        );
    }
    unregister_webhooks(&cluster).await;
    drop(restore);
    cluster.delete_nodes().await;
}

/// Restarts gpu-admission replica `a` with the run's own config when dropped (also when
/// an assertion fails), for the scenarios that follow.
/// A placement whose write fails after the filter charged it gives the charge back (the
/// filter used to roll back its hold only, and the charge held its room until its pending
/// total expired, 120 s). gpu-admission runs with `placement.bindVerb: false` (the filter
/// writes the charge, then the annotations) and a `placementWriters` that leaves its own
/// identity out, so the validating webhook refuses its annotation patch: the multi-model
/// pod is never placed, and each attempt's charge comes back at once.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_placement_whose_write_is_refused_gives_its_charge_back() {
    let Some(cluster) = setup("undo").await else {
        return;
    };
    let (a, b) = ("E2E-Undo-A", "E2E-Undo-B");
    cluster.create_gpu_node("e2e-undo-a", a, 2).await;
    cluster.label_for_webhooks().await;
    cluster
        .create_quota("default", json!({a: "1", b: "1"}), None)
        .await;
    let run = run_config();
    let own = "placementWriters: [system:serviceaccount:gpu-admission:gpu-scheduler, ";
    assert!(run.contains(own), "{run}");
    let config =
        (run.replace("bindVerb: true", "bindVerb: false")).replace(own, "placementWriters: [");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu-admission.yaml");
    std::fs::write(&path, &config).unwrap();
    ctl("stop");
    let restore = RunConfigOnDrop(&["a"]);
    start_with_config(&path);
    // Registered as the chart would for this config: with gpu-admission's identity not a
    // placement writer, its annotation patch is one the validating webhook must judge.
    let condition = gpu_admission::config::Config::parse(&config)
        .expect("the scenario's config parses")
        .guarded_change_condition();
    let validate = Hook {
        condition: Some(condition),
        ..Hook::new("validate", &server_url())
    };
    register_hooks(
        &cluster,
        vec![Hook::new("mutate", &server_url())],
        vec![validate],
    )
    .await;

    cluster
        .create_gpu_pod("refused", &format!("{a},{b}"), Gpu::Whole(1))
        .await;
    let event = cluster
        .wait_failed_scheduling("refused", "placementWriters")
        .await;
    println!("the scheduler was told: {event}");
    // Every attempt charged the placement, then gave the charge back: nothing is held.
    let status = cluster.wait_used("default", a, 0).await;
    assert!(status.pending.is_empty(), "{status:?}");
    cluster
        .pods()
        .delete("refused", &DeleteParams::default())
        .await
        .unwrap();
    unregister_webhooks(&cluster).await;
    drop(restore);
    cluster.delete_nodes().await;
}

/// `onExceed: Warn` through the real API server and kubectl: past `hard` the pod is
/// created, kubectl prints the quota's message as a warning, the ledger charges it
/// (`used` passes `hard`), and `kubectl get gq -o wide` shows the mode.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_warn_quota_admits_past_hard_and_kubectl_prints_the_warning() {
    let Some(cluster) = setup("warn").await else {
        return;
    };
    let model = "Tesla-T4";
    let spec = json!({"hard": {model: "1"}, "defaultType": model, "onExceed": "Warn"});
    cluster.quota_under_webhooks("audit", spec).await;

    let ns = cluster.ns.clone();
    let create = |name: &str| {
        let pod = serde_json::to_string(&unscheduled_gpu_pod(name, None, 1)).unwrap();
        kubectl(&["create", "-n", &ns, "-f", "-"], &pod)
    };
    let (created, _, stderr) = create("first");
    assert!(created, "within hard: {stderr}");
    assert!(
        !stderr.contains("Warning"),
        "within hard, no warning: {stderr}"
    );
    // The first pod's charge must be in the ledger before the second is judged.
    cluster.wait_used("audit", model, 1000).await;
    let (created, stdout, stderr) = create("second");
    println!("kubectl create second: {stdout}{stderr}");
    assert!(created, "a Warn quota admits past hard: {stderr}");
    let expected = format!(
        "Warning: GPU quota exceeded in namespace \"{ns}\" for {model}: requested 1, used 1 of 1 \
         (GPUQuota {ns}/audit) (onExceed: Warn)"
    );
    assert!(
        stderr.contains(&expected),
        "kubectl must print {expected:?}; got {stderr:?}"
    );
    let status = cluster.wait_used("audit", model, 2000).await;
    println!("used past hard: {:?}", status.used);
    let (listed, table, stderr) = kubectl(&["get", "gq", "-n", &ns, "-o", "wide"], "");
    println!("kubectl get gq -o wide:\n{table}");
    assert!(listed, "{stderr}");
    let header = table.lines().next().unwrap_or_default();
    assert!(header.contains("ONEXCEED"), "{table}");
    assert!(
        table.lines().nth(1).unwrap_or_default().contains("Warn"),
        "{table}"
    );
    unregister_webhooks(&cluster).await;
}

/// Tenants read their GPUQuota as they read a ResourceQuota, and never write it: deploy/'s
/// `gpu-admission-gpuquota-reader`, aggregated by kube-controller-manager into the
/// built-in `view`, `edit` and `admin` roles, lets a namespace's viewer and its admin get,
/// list and watch its GPUQuotas, and neither may create, change or delete one, nor write
/// its status; a namespace they were given nothing in stays closed.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_tenant_reads_its_gpuquota_and_cannot_write_it() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
    let Some(cluster) = setup("tenant-read").await else {
        return;
    };
    let role: ClusterRole = deploy_object("deploy/10-rbac.yaml", "gpu-admission-gpuquota-reader");
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let apply = PatchParams::apply("gpu-admission-e2e").force();
    let name = "gpu-admission-gpuquota-reader";
    roles
        .patch(name, &apply, &Patch::Apply(&role))
        .await
        .unwrap();
    cluster
        .create_quota("default", json!({"Tesla-T4": "1"}), Some("Tesla-T4"))
        .await;
    for (user, built_in) in [("tenant-viewer", "view"), ("tenant-admin", "admin")] {
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": built_in},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
        .unwrap();
        Api::<RoleBinding>::namespaced(cluster.client.clone(), &cluster.ns)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    for user in ["tenant-viewer", "tenant-admin"] {
        let client = cluster.impersonate(user).await;
        let quotas: Api<GPUQuota> = Api::namespaced(client.clone(), &cluster.ns);
        // The aggregation controller merges the rules into the built-in roles.
        let listed = wait_for(
            &format!("{user} reading GPUQuotas"),
            QUOTA_TIMEOUT,
            || async { quotas.list(&Default::default()).await.ok() },
        )
        .await;
        assert_eq!(
            listed.items.len(),
            1,
            "{user} lists the namespace's GPUQuota"
        );
        let mut quota = quotas.get("default").await.unwrap();
        assert_eq!(quota.spec.hard["Tesla-T4"].0, "1");

        let refused = |what: &str, result: Result<GPUQuota, kube::Error>| match result {
            Err(kube::Error::Api(status)) if status.code == 403 => {}
            other => panic!("{user} {what}: must be forbidden, got {other:?}"),
        };
        let more = Patch::Merge(json!({"spec": {"hard": {"Tesla-T4": "100"}}}));
        refused(
            "raising hard",
            quotas
                .patch("default", &PatchParams::default(), &more)
                .await,
        );
        let none = Patch::Merge(json!({"status": {"used": {"Tesla-T4": "0"}}}));
        let status = quotas
            .patch_status("default", &PatchParams::default(), &none)
            .await;
        refused("zeroing status.used", status);
        quota.metadata.managed_fields = None;
        let replaced = quotas
            .replace_status("default", &PostParams::default(), &quota)
            .await;
        refused("replacing the status", replaced);
        quota.metadata.name = Some("mine".into());
        quota.metadata.resource_version = None;
        refused(
            "creating a GPUQuota",
            quotas.create(&PostParams::default(), &quota).await,
        );
        let deleted = quotas.delete("default", &DeleteParams::default()).await;
        assert!(
            matches!(&deleted, Err(kube::Error::Api(status)) if status.code == 403),
            "{user} deleting the GPUQuota must be forbidden: {deleted:?}"
        );
        let elsewhere: Api<GPUQuota> = Api::namespaced(client, "default");
        let other = elsewhere.list(&Default::default()).await;
        assert!(
            matches!(&other, Err(kube::Error::Api(status)) if status.code == 403),
            "{user} has nothing in namespace default: {other:?}"
        );
    }
    let quota = cluster.quotas().get("default").await.unwrap();
    assert_eq!(
        quota.spec.hard["Tesla-T4"].0, "1",
        "the GPUQuota is as the admin made it"
    );
    roles.delete(name, &DeleteParams::default()).await.unwrap();
}

/// The object `name` in the multi-document YAML file `path` (from the repository root).
fn deploy_object<T: serde::de::DeserializeOwned>(path: &str, name: &str) -> T {
    let text = std::fs::read_to_string(crate::repo::path(path)).unwrap();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document).unwrap();
        if value["metadata"]["name"].as_str() == Some(name) && value["kind"] == "ClusterRole" {
            return serde_yaml::from_value(value).unwrap();
        }
    }
    panic!("{path} has no ClusterRole {name}");
}

/// C. The GPUQuota status stays small however many pods are being created: 5,000 creates,
/// 50 at a time, through two replicas against a quota with room for all of them. The
/// status (as JSON) is read through the burst and never passes 16 KiB: it holds a total
/// per second and model and a grant per replica, never an entry per pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn the_quota_status_stays_small_through_a_5000_create_burst() {
    use futures::StreamExt;
    let Some(cluster) = setup("status-bytes").await else {
        return;
    };
    let model = "Tesla-M10";
    const CREATES: u32 = 5000;
    let creates = replica_burst(&cluster, model, 2 * CREATES, CREATES, &["a", "b"]).await;
    let done = std::sync::atomic::AtomicBool::new(false);
    let sample = async {
        let mut largest = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let status = cluster.quota_status("default").await;
            largest = largest.max(serde_json::to_vec(&status).unwrap().len());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        largest
    };
    let burst = async {
        let started = Instant::now();
        let admitted = futures::stream::iter(creates)
            .map(|(_, pods, pod)| async move { pods.create(&PostParams::default(), &pod).await })
            .buffer_unordered(50)
            .filter(|created| std::future::ready(created.is_ok()))
            .count()
            .await;
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (admitted, started.elapsed())
    };
    let ((admitted, took), largest) = tokio::join!(burst, sample);
    let settled = cluster
        .wait_used("default", model, u64::from(CREATES) * 1000)
        .await;
    let last = serde_json::to_vec(&settled).unwrap().len();
    println!(
        "{admitted} of {CREATES} creates admitted in {:.1} s; the status's largest {largest} bytes, \
         {} pending totals and {} grants at the end ({last} bytes)",
        took.as_secs_f64(),
        settled.pending.len(),
        settled.grants.len()
    );
    cluster.delete_pods().await;
    assert_eq!(admitted, CREATES as usize, "room for all of them");
    assert!(largest <= 16 * 1024, "the status grew to {largest} bytes");
    unregister_webhooks(&cluster).await;
}
