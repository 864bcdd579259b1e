//! The quota queue at scale (`onExceed: Queue`): how long a waiting pod takes to be let go
//! once room appears, with a long line behind it.
//!
//! A namespace with a `Queue` GPUQuota of [`ROOM`] GPUs: [`ROOM`] pods are let go and hold
//! it, then `--queue` more are created and wait. Then, `--releases` times: one holder is
//! force-deleted (room appears the moment the API server answers the delete) and the time
//! until a waiting pod is seen without its gate (a watch) is one sample. The pod let go
//! becomes a holder. The path measured is the whole of it: the pod watch of gpu-admission,
//! the reconciler's status write that gives the GPU back, the releaser's pass over the
//! line, its charge write and its gate removal, and the API server's watch back to us.

use std::collections::{HashSet, VecDeque};

use tokio::sync::mpsc;

use super::*;

/// The namespace of the line.
pub(crate) const LINE_NS: &str = "scale-line";
/// GPUs the line's quota allows (and the pods that hold them).
const ROOM: usize = 10;
/// The scheduling gate gpu-admission puts on a waiting pod.
const QUOTA_GATE: &str = "gpu-admission.io/quota";
/// How long one release may take before the run fails.
const PATIENCE: Duration = Duration::from_secs(60);

fn gated(pod: &Pod) -> bool {
    let gates = pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref());
    gates.is_some_and(|gates| gates.iter().any(|g| g.name == QUOTA_GATE))
}

/// Watches the line's pods and sends the name of each pod the first time it is seen
/// without the gate, with the instant it was seen; `listed` once the first list is done.
fn watch_releases(
    pods: Api<Pod>,
    listed: tokio::sync::oneshot::Sender<()>,
) -> (
    mpsc::UnboundedReceiver<(String, Instant)>,
    tokio::task::JoinHandle<Result<()>>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut seen = HashSet::new();
        let stream = watcher::watcher(pods, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.try_next().await? {
            let pod = match event {
                Event::InitDone => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                    continue;
                }
                Event::Apply(pod) | Event::InitApply(pod) => pod,
                Event::Init | Event::Delete(_) => continue,
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            if !gated(&pod) && seen.insert(name.clone()) && tx.send((name, Instant::now())).is_err()
            {
                return Ok(());
            }
        }
        Err(anyhow!("the pod watch of {LINE_NS} ended"))
    });
    (rx, task)
}

/// Creates `names` in the line's namespace from `--clients` parallel creators; returns
/// each create's latency.
async fn create_all(args: &Args, pods: &Api<Pod>, names: &[String]) -> Result<Vec<Duration>> {
    futures::stream::iter(names)
        .map(|name| async move {
            let pod = Profile::Gpu.pod(args, name, 0)?;
            let t = Instant::now();
            pods.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("creating pod {LINE_NS}/{name}"))?;
            anyhow::Ok(t.elapsed())
        })
        .buffer_unordered(args.clients)
        .try_collect()
        .await
}

/// The next pod the watch sees let go, within [`PATIENCE`].
async fn next_release(
    released: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    what: &str,
) -> Result<(String, Instant)> {
    match tokio::time::timeout(PATIENCE, released.recv()).await {
        Ok(Some(release)) => Ok(release),
        Ok(None) => bail!("the pod watch of {LINE_NS} stopped while waiting for {what}"),
        Err(_) => bail!(
            "no pod of {LINE_NS} was let out of the quota queue within {PATIENCE:?} while \
             waiting for {what} (see the gpu-admission logs)"
        ),
    }
}

/// `status.queued` of the line's quota reaches `pods` GPUs of the model: gpu-admission has
/// seen every waiting pod. Returns what it last read.
async fn wait_queued(quotas: &Api<GPUQuota>, pods: usize) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let quota = quotas
            .get("default")
            .await
            .with_context(|| format!("reading GPUQuota {LINE_NS}/default"))?;
        let queued = quota.status.unwrap_or_default().queued;
        let now = queued
            .get(MODELS[0])
            .map(|q| q.0.clone())
            .unwrap_or_default();
        if now == pods.to_string() {
            return Ok(now);
        }
        if Instant::now() >= deadline {
            bail!("GPUQuota {LINE_NS}/default shows {now:?} queued after 90 s, not {pods}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn release_latency(
    args: &Args,
    client: &Client,
    start: &Instant,
    summary: &mut String,
) -> Result<()> {
    println!(
        "\n== quota queue: {} releases with {} pods waiting (Queue quota of {ROOM} GPUs)",
        args.releases, args.queue
    );
    create_namespace(client, LINE_NS).await?;
    let spec = json!({"hard": {MODELS[0]: ROOM.to_string()}, "defaultType": MODELS[0],
                      "onExceed": "Queue"});
    quota_namespace(client, LINE_NS, spec).await?;
    let quotas: Api<GPUQuota> = Api::namespaced(client.clone(), LINE_NS);
    // gpu-admission must know the quota before the first pod, or that pod is not gated.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), LINE_NS);
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    let (mut released, watch) = watch_releases(pods.clone(), listed_tx);
    listed_rx
        .await
        .map_err(|_| anyhow!("the pod watch of {LINE_NS} failed before its first list"))?;

    say!(start, "{LINE_NS}: {ROOM} pods take the quota");
    let holders: Vec<String> = (0..ROOM).map(|i| format!("hold-{i:03}")).collect();
    create_all(args, &pods, &holders).await?;
    let mut holding = VecDeque::new();
    for _ in 0..ROOM {
        holding.push_back(
            next_release(&mut released, "the first pods to take the quota")
                .await?
                .0,
        );
    }

    say!(start, "{LINE_NS}: {} pods wait", args.queue);
    let line: Vec<String> = (0..args.queue).map(|i| format!("wait-{i:05}")).collect();
    let creates = sorted(&create_all(args, &pods, &line).await?);
    let queued = wait_queued(&quotas, args.queue).await?;
    if let Ok((name, _)) = released.try_recv() {
        bail!("{LINE_NS}/{name} was let go while the quota was full");
    }

    say!(
        start,
        "{LINE_NS}: {} releases, one at a time",
        args.releases
    );
    let now = DeleteParams::default().grace_period(0);
    let mut samples = Vec::with_capacity(args.releases);
    for _ in 0..args.releases.min(args.queue) {
        let holder = holding.pop_front().context("no pod holds the quota")?;
        pods.delete(&holder, &now)
            .await
            .with_context(|| format!("deleting pod {LINE_NS}/{holder}"))?;
        let room = Instant::now();
        let (name, at) = next_release(&mut released, "a release after a delete").await?;
        samples.push(at.saturating_duration_since(room));
        holding.push_back(name);
    }
    watch.abort();
    let samples = sorted(&samples);
    let p = |s: &[Duration], q: f64| percentile_ms(s, q);
    let lines = [
        format!(
            "quota queue ({} pods waiting, Queue quota of {ROOM} GPUs, status.queued {queued}):",
            args.queue
        ),
        format!(
            "  gated creates ({} from {} clients): p50 {:.1} ms, p99 {:.1} ms",
            creates.len(),
            args.clients,
            p(&creates, 50.0),
            p(&creates, 99.0)
        ),
        format!(
            "  room appears (a holder deleted) -> the next pod's gate removed, {} times: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            samples.len(),
            p(&samples, 50.0),
            p(&samples, 99.0),
            samples.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        ),
    ];
    for line in lines {
        println!("{line}");
        writeln!(summary, "{line}")?;
    }
    Ok(())
}
