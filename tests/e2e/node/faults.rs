//! Faults on the shipped install (deploy/ on the real node, see [`super::install`]):
//! the GPU scheduler's leader deleted while it places, a webhook replica SIGKILLed in a
//! burst, the kubelet restarted, a drain against the webhooks' PodDisruptionBudget. The
//! bar is exactness: no GPU handed out twice, no quota passed, every create answered.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::install::{
    BURST_MODEL, BURST_QUOTA, GPU_MODEL, GPU_NODE, NAMESPACE, OTHER_MODEL, OTHER_NODE,
    REFUSED_MODEL,
};
use super::install::{create_placed_pod, deployment_ready, install_state, wait_bound};
use crate::support::*;

/// The GPU scheduler's leader (from its Lease): the pod's name.
async fn scheduler_leader(cluster: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let lease = leases.get("gpu-scheduler").await.ok()?;
    let holder = lease.spec?.holder_identity?;
    Some(holder.split('_').next()?.to_string())
}

fn component_pods(cluster: &Cluster) -> Api<Pod> {
    Api::namespaced(cluster.client.clone(), NAMESPACE)
}

async fn pods_of(cluster: &Cluster, component: &str) -> Vec<Pod> {
    let selector = format!("app.kubernetes.io/component={component}");
    let list = component_pods(cluster)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap();
    list.items
}

/// Each running container of `pods` (`pod/container`) with its ID and restart count.
fn containers(pods: &[Pod]) -> BTreeMap<String, (String, i32)> {
    let mut out = BTreeMap::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone());
        for c in statuses.unwrap_or_default() {
            let id = c.container_id.unwrap_or_default();
            out.insert(format!("{name}/{}", c.name), (id, c.restart_count));
        }
    }
    out
}

/// A create through the installed webhooks is judged: the quota of [`REFUSED_MODEL`] is
/// full, so the answer is the quota's refusal (a failed webhook call fails the test).
async fn judged(cluster: &Cluster, what: &str) {
    let pod = unscheduled_gpu_pod(&format!("judged-{what}"), Some(REFUSED_MODEL), 1);
    let message = forbidden_message(cluster.try_create(&pod).await, what);
    assert!(
        message.contains("validate.gpu-admission.io\" denied the request: GPU quota exceeded"),
        "{what}: {message}"
    );
}

/// vcuda-core each GPU index of `node` carries, from the pods' placement annotations.
async fn core_per_gpu(cluster: &Cluster, node: &str, gpus: u32) -> BTreeMap<u32, u32> {
    let pods = cluster.pods().list(&ListParams::default()).await.unwrap();
    let mut per_gpu = BTreeMap::new();
    for pod in pods.items {
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
            continue;
        }
        let indices = assert_placement_annotations(&pod, gpus);
        let core: u32 = pod.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref()?.get(CORE).map(|q| q.0.parse().unwrap()))
            .unwrap_or(0);
        for i in &indices {
            *per_gpu.entry(*i).or_default() += core / indices.len() as u32;
        }
    }
    per_gpu
}

/// The GPU scheduler's leader pod is deleted while GPU pods are being placed: the other
/// replica takes the Lease and places the rest, and no GPU is handed out twice. Two nodes
/// of two models and pods of three shapes (whole GPUs, halves, quarters, created largest
/// first per node, the models interleaved) fill both nodes exactly — 350 vcuda-core after
/// the install's half-GPU pod on the 4-GPU node, 200 on the 2-GPU one — so one capacity
/// handed out twice would leave a pod unplaced or a GPU past 100, and a pod on the other
/// model's node would leave its own node short.
pub async fn the_scheduler_leader_deleted_while_placing(cluster: &Cluster) {
    let leader = wait_for(
        "the GPU scheduler's leader",
        Duration::from_secs(60),
        || scheduler_leader(cluster),
    )
    .await;
    let plan: [(&str, u32); 12] = [
        (GPU_MODEL, 100),
        (OTHER_MODEL, 100),
        (GPU_MODEL, 50),
        (OTHER_MODEL, 50),
        (GPU_MODEL, 50),
        (GPU_MODEL, 50),
        (OTHER_MODEL, 25),
        (GPU_MODEL, 25),
        (OTHER_MODEL, 25),
        (GPU_MODEL, 25),
        (GPU_MODEL, 25),
        (GPU_MODEL, 25),
    ];
    let started = Instant::now();
    let mut names = Vec::new();
    for (i, (model, core)) in plan.iter().enumerate() {
        if i == 4 {
            let pods = component_pods(cluster);
            pods.delete(&leader, &DeleteParams::default())
                .await
                .unwrap();
            println!("deleted the GPU scheduler's leader {leader} after 4 pods");
        }
        let name = format!("leader-{i:02}");
        create_placed_pod(cluster, &name, model, *core).await;
        names.push((name, *model));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (name, model) in &names {
        let pod = wait_bound(cluster, name).await;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let want = if *model == GPU_MODEL {
            GPU_NODE
        } else {
            OTHER_NODE
        };
        assert_eq!(node, Some(want), "pod {name} of {model}");
    }
    let new_leader = scheduler_leader(cluster).await;
    let per_gpu = core_per_gpu(cluster, GPU_NODE, 4).await;
    let per_other = core_per_gpu(cluster, OTHER_NODE, 2).await;
    println!(
        "12 pods placed in {:.1?}; leader {leader} -> {new_leader:?}; vcuda-core per GPU {per_gpu:?} and {per_other:?}",
        started.elapsed()
    );
    assert_ne!(
        new_leader.as_deref(),
        Some(leader.as_str()),
        "the leader moved"
    );
    let full = |gpus: u32| (0..gpus).map(|i| (i, 100)).collect::<BTreeMap<u32, u32>>();
    assert_eq!(per_gpu, full(4), "every GPU exactly full, none past 100");
    assert_eq!(per_other, full(2), "every GPU exactly full, none past 100");
    deployment_ready(cluster, "gpu-scheduler").await;
}

/// One webhook replica's container is SIGKILLed (through containerd, as an OOM kill or a
/// crash would) in a burst of parallel creates against a quota of [`BURST_QUOTA`]: never
/// past the quota, every create admitted, refused for quota, or failed by the webhook's
/// `failurePolicy: Fail`; the kubelet restarts the container and both serve again.
pub async fn a_webhook_replica_killed_mid_burst(cluster: &Cluster) {
    const CREATES: u32 = 120;
    let webhooks = pods_of(cluster, "webhook").await;
    let before = containers(&webhooks);
    let (victim, (id, restarts)) = before.into_iter().next().expect("a webhook container");
    let creates = (0..CREATES).map(|i| {
        let pod = unscheduled_gpu_pod(&format!("burst-{i:03}"), Some(BURST_MODEL), 1);
        ("admitted".to_string(), cluster.pods(), pod)
    });
    let burst = tokio::spawn(create_in_parallel(creates.collect(), |text| {
        if text.contains("GPU quota exceeded") {
            Some("quota exceeded (403)")
        } else if text.contains("failed calling webhook") {
            Some("webhook call failed (failurePolicy Fail)")
        } else {
            None
        }
    }));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let id = id.trim_start_matches("containerd://").to_string();
    kill_container(&id);
    let (admitted, refusals) = burst.await.unwrap();
    let admitted = admitted.values().sum::<u32>();
    println!("killed {victim} mid-burst: {admitted} admitted of {CREATES}; refusals {refusals:?}");
    assert!(admitted <= BURST_QUOTA, "never past the quota: {admitted}");
    let known = [
        "quota exceeded (403)",
        "webhook call failed (failurePolicy Fail)",
    ];
    assert!(
        refusals.keys().all(|k| known.contains(&k.as_str())),
        "every refusal is the quota's or the failure policy's: {refusals:?}"
    );
    let restarted = wait_for(
        "the killed container's restart",
        Duration::from_secs(60),
        || async {
            let now = containers(&pods_of(cluster, "webhook").await);
            now.get(&victim).filter(|(_, n)| *n > restarts).cloned()
        },
    )
    .await;
    println!("{victim} restarted (count {})", restarted.1);
    deployment_ready(cluster, "gpu-admission").await;
    let status = cluster.quota_status("default").await;
    let used = status.used.get(BURST_MODEL).map_or(0, |q| milli_gpus(&q.0));
    assert!(
        u64::from(admitted) * 1000 <= used && used <= u64::from(BURST_QUOTA) * 1000,
        "the ledger holds every admitted pod and never more than the quota: used {used}m, admitted {admitted}"
    );
    judged(cluster, "after-kill").await;
}

/// SIGKILL to a container of the node's containerd (namespace k8s.io).
fn kill_container(id: &str) {
    let socket = std::env::var("GPU_ADMISSION_E2E_NODE_SOCKET").expect("hack/e2e.sh sets it");
    let out = std::process::Command::new("ctr")
        .args([
            "--address",
            &socket,
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "-s",
            "SIGKILL",
            id,
        ])
        .output()
        .expect("ctr runs");
    assert!(
        out.status.success(),
        "ctr tasks kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The node's kubelet is stopped for 5 s and started again: the containers it started run
/// on (same IDs, no restart), the webhooks judge while it is down and after, and both
/// Deployments are still Ready.
pub async fn the_kubelet_restarted(cluster: &Cluster) {
    let mut pods = pods_of(cluster, "webhook").await;
    pods.extend(pods_of(cluster, "gpu-scheduler").await);
    let before = containers(&pods);
    let restart = tokio::task::spawn_blocking(|| restart_daemon("kubelet", 5));
    tokio::time::sleep(Duration::from_secs(2)).await;
    judged(cluster, "kubelet-down").await;
    let said = restart.await.unwrap();
    println!("{}", said.trim());
    judged(cluster, "kubelet-back").await;
    for deployment in ["gpu-admission", "gpu-scheduler"] {
        deployment_ready(cluster, deployment).await;
    }
    let mut pods = pods_of(cluster, "webhook").await;
    pods.extend(pods_of(cluster, "gpu-scheduler").await);
    assert_eq!(
        containers(&pods),
        before,
        "the containers ran through the kubelet's restart"
    );
}

/// `kubectl drain` of the node evicts one webhook replica and is refused the second by
/// the PodDisruptionBudget (`minAvailable: 1`; the evicted one's replacement cannot start
/// on the cordoned node), so one replica serves throughout; after `uncordon` both do.
pub async fn a_drain_respects_the_disruption_budget(cluster: &Cluster) {
    let node = std::env::var("GPU_ADMISSION_E2E_NODE").unwrap();
    let selector = "--pod-selector=app.kubernetes.io/component=webhook";
    let (ok, out, err) = kubectl(&["drain", &node, selector, "--timeout=20s"], "");
    println!("kubectl drain: {out}{err}");
    assert!(
        !ok,
        "the drain cannot finish while the budget holds one replica"
    );
    assert!(
        err.contains("disruption budget"),
        "refused by the budget: {err}"
    );
    let running = pods_of(cluster, "webhook").await;
    let ready = running.iter().filter(|p| is_ready(p)).count();
    assert_eq!(
        ready,
        1,
        "exactly one webhook replica left Ready:\n{}",
        install_state()
    );
    judged(cluster, "drained").await;
    let (ok, out, err) = kubectl(&["uncordon", &node], "");
    assert!(ok, "{out}{err}");
    deployment_ready(cluster, "gpu-admission").await;
}

fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
