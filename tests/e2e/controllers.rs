//! The real controllers (kube-controller-manager from the same build) against the quota:
//! what a Job gets from a `Deny` quota it does not fit in.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

/// A Job of 20 one-GPU pods, all at once, in a namespace whose `Deny` quota allows 8. The
/// Job controller gets 8 pods and `FailedCreate`s for the rest, and retries with its
/// back-off; the test plays the kubelet (each pod succeeds 2 s after it is created).
/// Never more than 8 pods are live, and the Job completes; how long it took, and how long
/// each new pod came after room appeared, are printed (docs/quota.md).
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn a_job_past_a_deny_quota_gets_failed_creates_and_finishes_by_retrying() {
    let Some(cluster) = setup("job-deny").await else {
        return;
    };
    let model = "Tesla-T4";
    cluster
        .quota_under_webhooks(
            "default",
            json!({"hard": {model: "8"}, "defaultType": model}),
        )
        .await;

    let template = unscheduled_gpu_pod("unused", None, 1);
    let mut spec = serde_json::to_value(&template.spec).unwrap();
    spec["restartPolicy"] = json!("Never");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "train"},
        "spec": {
            "completions": 20, "parallelism": 20, "backoffLimit": 100,
            "template": {"metadata": {"labels": {"app": "train"}}, "spec": spec},
        },
    }))
    .unwrap();
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let started = Instant::now();
    jobs.create(&PostParams::default(), &job).await.unwrap();

    let pods = cluster.pods();
    let most_live = AtomicUsize::new(0);
    let timeline = Mutex::new(Timeline::default());
    let done = wait_for_or_none(Duration::from_secs(240), || {
        let (pods, jobs, most_live, timeline) = (pods.clone(), jobs.clone(), &most_live, &timeline);
        async move {
            let live = succeed_pods_older_than(&pods, Duration::from_secs(2), timeline).await;
            most_live.fetch_max(live, Ordering::Relaxed);
            let job = jobs.get("train").await.ok()?;
            let succeeded = job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0);
            (succeeded >= 20).then_some(job)
        }
    })
    .await;
    let took = started.elapsed();
    let most_live = most_live.into_inner();
    let lags = timeline.into_inner().unwrap().lags;
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let failed: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
        .collect();
    let count: i32 = failed.iter().map(|e| e.count.unwrap_or(1)).sum();
    let first = failed
        .first()
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    println!(
        "Job of 20 one-GPU pods, Deny quota of 8: {} after {took:.1?}; {count} FailedCreate \
         events; at most {most_live} pods live at once; from a pod's success to the next \
         pod created (as seen every 250 ms): {lags:.1?}; first refusal: {first}",
        if done.is_some() {
            "complete"
        } else {
            "NOT complete"
        },
    );
    assert!(done.is_some(), "the Job must finish once room appears");
    assert!(
        count >= 1,
        "the refused creates are FailedCreate events: {count}"
    );
    assert!(
        first.contains("GPU quota exceeded"),
        "the event carries the quota's message: {first}"
    );
    assert!(
        most_live <= 8,
        "never more than the quota: {most_live} live at once"
    );
    unregister_webhooks(&cluster).await;
}

/// When the test last made room, and how long each new pod came after it.
#[derive(Default)]
struct Timeline {
    seen: BTreeSet<String>,
    last_success: Option<Instant>,
    lags: Vec<Duration>,
}

/// Play the kubelet: every live pod created more than `age` ago succeeds. Returns how
/// many pods were live (not finished) before this call's changes.
async fn succeed_pods_older_than(
    pods: &Api<Pod>,
    age: Duration,
    timeline: &Mutex<Timeline>,
) -> usize {
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut live = 0;
    for pod in &list {
        let mut timeline = timeline.lock().unwrap();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if timeline.seen.insert(name) {
            let lag = timeline.last_success.map(|t| t.elapsed());
            timeline.lags.extend(lag);
        }
    }
    for pod in list {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        live += 1;
        let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let old = created.is_some_and(|t| now.duration_since(t).as_secs() >= age.as_secs() as i64);
        if old {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let done = json!({"status": {"phase": "Succeeded"}});
            let _ = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&done))
                .await;
            timeline.lock().unwrap().last_success = Some(Instant::now());
        }
    }
    live
}
