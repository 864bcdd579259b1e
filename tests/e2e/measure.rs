//! Measurements: the latency the webhooks add to a pod create and the scheduling
//! throughput with the extender (printed as `MEASURE` lines; docs/e2e.md records them).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use crate::support::*;

/// G. Measurements (printed, and recorded in docs/e2e.md): the latency the webhooks add
/// to a pod create (p50/p99 of 200 sequential creates with and without them), and pods
/// per second through kube-scheduler with the extender.
#[tokio::test]
#[ignore = "needs a control plane: bash hack/e2e.sh runs it"]
async fn measure_webhook_latency_and_scheduling_throughput() {
    let Some(cluster) = setup("measure").await else {
        return;
    };
    let model = "Tesla-A10";
    cluster
        .quota_under_webhooks(
            "default",
            json!({"hard": {model: "1000"}, "defaultType": model}),
        )
        .await;
    let plain_ns = cluster.create_namespace("plain").await;
    let plain: Api<Pod> = Api::namespaced(cluster.client.clone(), &plain_ns);
    // The platform's own floor for an exact quota: a namespace with a core ResourceQuota,
    // whose admission plugin writes the quota's status on every create, as ours does.
    let core_ns = cluster.create_namespace("core-quota").await;
    let core: Api<Pod> = Api::namespaced(cluster.client.clone(), &core_ns);
    let quotas: Api<ResourceQuota> = Api::namespaced(cluster.client.clone(), &core_ns);
    let quota: ResourceQuota = serde_json::from_value(
        json!({"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "100000"}}}),
    )
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // kube-controller-manager's resource quota controller fills in the status; until it
    // has, the admission plugin refuses every create in the namespace.
    wait_for("the core ResourceQuota's status", QUOTA_TIMEOUT, || {
        let quotas = quotas.clone();
        async move {
            let status = quotas.get("pods").await.ok()?.status?;
            status.used.filter(|u| u.contains_key("pods")).map(drop)
        }
    })
    .await;

    const CREATES: usize = 200;
    let server_before = admin_metrics();
    let mut with_hooks = Vec::with_capacity(CREATES);
    let mut without = Vec::with_capacity(CREATES);
    let mut core_quota = Vec::with_capacity(CREATES);
    for i in 0..CREATES {
        let pod = unscheduled_gpu_pod(&format!("lat-{i:03}"), None, 1);
        let t = Instant::now();
        cluster.try_create(&pod).await.unwrap();
        with_hooks.push(t.elapsed());
        let t = Instant::now();
        plain.create(&PostParams::default(), &pod).await.unwrap();
        without.push(t.elapsed());
        let t = Instant::now();
        core.create(&PostParams::default(), &pod).await.unwrap();
        core_quota.push(t.elapsed());
    }
    let line = |what: &str, samples: &[Duration]| {
        format!(
            "{what}: p50 {:.1} ms, p99 {:.1} ms ({} creates)",
            percentile_ms(samples, 50.0),
            percentile_ms(samples, 99.0),
            samples.len()
        )
    };
    println!(
        "MEASURE pod create {}",
        line(
            "with webhooks (mutate + validate with quota reservation)",
            &with_hooks
        )
    );
    println!("MEASURE pod create {}", line("without webhooks", &without));
    println!(
        "MEASURE pod create {}",
        line(
            "without webhooks, in a namespace with a core ResourceQuota",
            &core_quota
        )
    );
    println!(
        "MEASURE p50 ratios: with webhooks / without {:.2}, core ResourceQuota / without {:.2}",
        percentile_ms(&with_hooks, 50.0) / percentile_ms(&without, 50.0),
        percentile_ms(&core_quota, 50.0) / percentile_ms(&without, 50.0)
    );
    println!(
        "MEASURE webhook overhead: p50 +{:.1} ms, p99 +{:.1} ms",
        percentile_ms(&with_hooks, 50.0) - percentile_ms(&without, 50.0),
        percentile_ms(&with_hooks, 99.0) - percentile_ms(&without, 99.0)
    );
    println!(
        "MEASURE with webhooks, p50 of the first 50 creates {:.1} ms, of the last 50 {:.1} ms; \
         pending totals in the GPUQuota status now: {}",
        percentile_ms(&with_hooks[..50], 50.0),
        percentile_ms(&with_hooks[CREATES - 50..], 50.0),
        cluster.quota_status("default").await.pending.len()
    );
    // A Job or ReplicaSet creates in parallel: waves of 10 creates at once, the three
    // namespaces in turn wave by wave (so a slow moment of the machine hits all three).
    const WAVE: usize = 10;
    let mut bursts: [Vec<Duration>; 3] = Default::default();
    for wave in 0..CREATES / WAVE {
        let targets = [&cluster.pods(), &plain, &core];
        for (samples, api) in bursts.iter_mut().zip(targets) {
            let timed = (0..WAVE).map(|i| {
                let pod = unscheduled_gpu_pod(&format!("burst-{wave:02}-{i}"), None, 1);
                async move {
                    let t = Instant::now();
                    api.create(&PostParams::default(), &pod).await.unwrap();
                    t.elapsed()
                }
            });
            samples.extend(futures::future::join_all(timed).await);
        }
    }
    let [hooks_burst, plain_burst, core_burst] = &bursts;
    println!(
        "MEASURE 10-way burst: {}; {}; {}",
        line("with webhooks", hooks_burst),
        line("without", plain_burst),
        line("core ResourceQuota", core_burst)
    );
    println!(
        "MEASURE 10-way burst p50 ratios: with webhooks / without {:.2}, core ResourceQuota / without {:.2}",
        percentile_ms(hooks_burst, 50.0) / percentile_ms(plain_burst, 50.0),
        percentile_ms(core_burst, 50.0) / percentile_ms(plain_burst, 50.0)
    );
    // Of which inside gpu-admission (its own request-duration histogram).
    let server_after = admin_metrics();
    for route in ["mutate", "validate"] {
        let fragment = format!("route=\"{route}\"");
        let delta = |name: &str| {
            sum_metric(&server_after, name, &fragment) - sum_metric(&server_before, name, &fragment)
        };
        let (sum, count) = (
            delta("gpu_admission_request_duration_seconds_sum"),
            delta("gpu_admission_request_duration_seconds_count"),
        );
        if count > 0.0 {
            println!(
                "MEASURE inside gpu-admission: /{route} mean {:.1} ms over {count} requests",
                sum / count * 1000.0
            );
        }
    }
    // For comparison: what validate's two API calls (list the namespace's GPUQuotas,
    // write one status with its resourceVersion) take from this test's kube client.
    // Once the creates stop, the room the replicas held for them goes back (idle grants).
    let idle = Instant::now();
    wait_for(
        "the grants to be given back",
        Duration::from_secs(10),
        || async {
            cluster
                .quota_status("default")
                .await
                .grants
                .is_empty()
                .then_some(())
        },
    )
    .await;
    println!(
        "MEASURE grants given back {:.0} ms after the last create",
        idle.elapsed().as_secs_f64() * 1000.0
    );
    let (mut lists, mut writes) = (Vec::new(), Vec::new());
    while writes.len() < 20 {
        let t = Instant::now();
        let quota = cluster.quotas().list(&ListParams::default()).await.unwrap();
        lists.push(t.elapsed());
        let mut quota = quota.items.into_iter().next().unwrap();
        // A real change (as a reservation is), so the apiserver cannot skip the write.
        let status = quota.status.get_or_insert_with(Default::default);
        let probe =
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(lists.len().to_string());
        status.used.insert("e2e-probe".into(), probe);
        let t = Instant::now();
        let written = cluster
            .quotas()
            .replace_status("default", &PostParams::default(), &quota)
            .await;
        match written {
            Ok(_) => writes.push(t.elapsed()),
            // The reconciler wrote in between: read again.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => panic!("status write: {error}"),
        }
    }
    println!(
        "MEASURE from the test's kube client: GPUQuota list p50 {:.1} ms, changed status write p50 {:.1} ms",
        percentile_ms(&lists, 50.0),
        percentile_ms(&writes, 50.0)
    );
    unregister_webhooks(&cluster).await;
    // Its pending GPU pods would keep the waiting controller busy after it.
    cluster.delete_pods().await;
    for api in [&plain, &core] {
        let everything = ListParams::default();
        api.delete_collection(&Default::default(), &everything)
            .await
            .unwrap();
    }

    // Throughput: 100 half-GPU pods on 8 nodes of 8 GPUs (128 half-GPU slots).
    let bench_model = "Tesla-A10-bench";
    for n in 1..=8 {
        cluster
            .create_gpu_node(&format!("e2e-measure-{n}"), bench_model, 8)
            .await;
    }
    const PODS: usize = 100;
    // Created 10 at a time, so the API server's create rate does not limit the measure.
    let started = Instant::now();
    let mut creates = tokio::task::JoinSet::new();
    for batch in 0..PODS / 10 {
        let cluster = Cluster {
            client: cluster.client.clone(),
            scenario: cluster.scenario,
            ns: cluster.ns.clone(),
        };
        creates.spawn(async move {
            for i in batch * 10..batch * 10 + 10 {
                let share = Gpu::Share {
                    core: 50,
                    memory: 2,
                };
                cluster
                    .create_gpu_pod(&format!("sched-{i:03}"), bench_model, share)
                    .await;
            }
        });
    }
    while let Some(joined) = creates.join_next().await {
        joined.unwrap();
    }
    let created = started.elapsed();
    let pods = cluster.pods();
    wait_for(
        &format!("all {PODS} pods to be bound"),
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default().labels("")).await.ok()?;
                let bound = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with("sched-"))
                    })
                    .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
                    .count();
                (bound == PODS).then_some(())
            }
        },
    )
    .await;
    let all_bound = started.elapsed();
    println!(
        "MEASURE scheduling: {PODS} GPU pods created in {:.2} s, all bound after {:.2} s = {:.1} pods/s",
        created.as_secs_f64(),
        all_bound.as_secs_f64(),
        PODS as f64 / all_bound.as_secs_f64()
    );
    cluster.delete_nodes().await;
}

/// p-th percentile (0..=100, nearest rank) of `samples`, in milliseconds.
fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}
