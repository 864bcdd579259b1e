//! API mode: one kube watcher per kind, projected into the cache as events arrive.
//! A relist (Init .. InitDone) replaces that kind's objects wholesale.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::dra::ResourceClaim;
use crate::dra::classes::{ClassInfo, DeviceClass};
use crate::dra::slices::{ResourceSlice, SliceDevices, gpu_devices};
use crate::placement::NodeGpus;
use crate::quota::GPUQuota;

use super::pod::{CachedPod, PodKey, SkipReason, pod_key};
use super::state::claims::{CachedClaim, claim_key};
use super::{ClusterCache, ClusterState, Projection};

/// Run the watches until `shutdown`; mark the cache ready once all have listed. Nodes,
/// pods and GPUQuotas always; ResourceClaims, ResourceSlices and DeviceClasses with
/// `dra.enabled`.
pub(super) async fn run(cache: ClusterCache, client: Client, shutdown: CancellationToken) {
    let dra = cache.projection().dra.enabled;
    let kinds = if dra { 6 } else { 3 };
    let listed = Arc::new(Listed {
        count: AtomicUsize::new(0),
        kinds,
    });
    let claims = watch_dra(dra, cache.clone(), client.clone(), listed.clone());
    // Terminal pods leave the selector, which the watch reports as a deletion.
    let live_pods =
        watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let nodes = watch::<Node, _>(
        Api::all(client.clone()),
        watcher::Config::default(),
        cache.clone(),
        listed.clone(),
        NodeKind,
    );
    let pods = watch::<Pod, _>(
        Api::all(client.clone()),
        live_pods,
        cache.clone(),
        listed.clone(),
        PodKind,
    );
    let quotas = watch::<GPUQuota, _>(
        Api::all(client),
        watcher::Config::default(),
        cache,
        listed,
        QuotaKind,
    );
    tokio::select! {
        _ = futures::future::join4(nodes, pods, quotas, claims) => {}
        _ = shutdown.cancelled() => {}
    }
}

/// The pause before a failed watch lists again: 0.5 s, doubling to 30 s while the
/// failures go on (reset by any event).
#[derive(Default)]
struct Retry {
    failures: u32,
}

impl Retry {
    fn next(&mut self) -> Duration {
        let pause = Duration::from_millis(500) * 2u32.pow(self.failures.min(6));
        self.failures += 1;
        pause.min(Duration::from_secs(30))
    }
}

/// A watch that, when it fails, starts over with a list after a pause ([`Retry`]), not
/// resumed from the last version seen: across an API server restart, a resumed pod watch
/// was seen to be accepted and then deliver nothing (docs/design.md, "Watches"). The
/// cache's watches and the planner's world (`snapshot::LiveWorld`) follow their kinds
/// through it.
pub(crate) struct Relisting<K, F> {
    start: F,
    events: BoxStream<'static, watcher::Result<watcher::Event<K>>>,
    retry: Retry,
}

impl<K, F> Relisting<K, F>
where
    F: Fn() -> BoxStream<'static, watcher::Result<watcher::Event<K>>>,
{
    pub(crate) fn new(start: F) -> Self {
        Relisting {
            events: start(),
            start,
            retry: Retry::default(),
        }
    }

    /// The next event; `None` once the stream ends.
    pub(crate) async fn next(&mut self) -> Option<watcher::Event<K>> {
        loop {
            match self.events.try_next().await {
                Ok(event) => {
                    self.retry = Retry::default();
                    return event;
                }
                Err(error) => {
                    let pause = self.retry.next();
                    tracing::warn!(%error, retry_in_ms = pause.as_millis() as u64, "watch failed; listing again");
                    tokio::time::sleep(pause).await;
                    self.events = (self.start)();
                }
            }
        }
    }
}

/// How many kinds have listed once, of how many.
struct Listed {
    count: AtomicUsize,
    kinds: usize,
}

/// The ResourceClaim, ResourceSlice and DeviceClass watches (nothing when `enabled` is
/// false).
async fn watch_dra(enabled: bool, cache: ClusterCache, client: Client, listed: Arc<Listed>) {
    if !enabled {
        return;
    }
    let claims = watch::<ResourceClaim, _>(
        Api::all(client.clone()),
        watcher::Config::default(),
        cache.clone(),
        listed.clone(),
        ClaimKind,
    );
    let slices = watch::<ResourceSlice, _>(
        Api::all(client.clone()),
        watcher::Config::default(),
        cache.clone(),
        listed.clone(),
        SliceKind,
    );
    let classes = watch::<DeviceClass, _>(
        Api::all(client),
        watcher::Config::default(),
        cache,
        listed,
        ClassKind,
    );
    futures::future::join3(claims, slices, classes).await;
}

/// How one kind of object lands in the cluster state.
trait Kind<K>: Send {
    const NAME: &'static str;
    type Item: Send;
    fn project(&self, object: &K, projection: &Projection) -> Option<Self::Item>;
    /// What must be worked out off the lock before `items` are applied.
    fn prepare(
        &self,
        _cache: &ClusterCache,
        items: Vec<Self::Item>,
    ) -> impl Future<Output = Vec<Self::Item>> + Send {
        async { items }
    }
    /// What follows off the lock once items were applied.
    fn applied(&self, _cache: &ClusterCache) -> impl Future<Output = ()> + Send {
        async {}
    }
    fn apply(&self, state: &mut ClusterState, item: Self::Item);
    fn delete(&self, state: &mut ClusterState, object: &K);
    fn replace(&self, state: &mut ClusterState, items: Vec<Self::Item>);
}

/// Follow one kind's watch, inside a `watch` span that names the kind (every log line
/// of the watch carries it).
#[tracing::instrument(name = "watch", skip_all, fields(kind = W::NAME))]
async fn watch<K, W>(
    api: Api<K>,
    config: watcher::Config,
    cache: ClusterCache,
    listed: Arc<Listed>,
    kind: W,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    W: Kind<K>,
{
    let mut buffer: Vec<W::Item> = Vec::new();
    let mut first_list = true;
    let mut events = Relisting::new(|| watcher(api.clone(), config.clone()).boxed());
    while let Some(event) = events.next().await {
        let projection = cache.projection();
        match event {
            watcher::Event::Init => buffer.clear(),
            watcher::Event::InitApply(object) => buffer.extend(kind.project(&object, projection)),
            watcher::Event::InitDone => {
                let items = kind.prepare(&cache, std::mem::take(&mut buffer)).await;
                let count = items.len();
                cache.write(|state| kind.replace(state, items));
                // The list's objects are all dropped now: what they took goes back.
                super::allocator::return_freed_pages();
                kind.applied(&cache).await;
                tracing::info!(count, "listed");
                if std::mem::take(&mut first_list)
                    && listed.count.fetch_add(1, Ordering::AcqRel) + 1 == listed.kinds
                {
                    cache.set_ready();
                    tracing::info!("cache ready");
                }
            }
            watcher::Event::Apply(object) => match kind.project(&object, projection) {
                Some(item) => {
                    for item in kind.prepare(&cache, vec![item]).await {
                        cache.write(|state| kind.apply(state, item));
                    }
                    kind.applied(&cache).await;
                }
                None => {
                    cache.write(|state| kind.delete(state, &object));
                    cache.usage_moved().notify_one();
                    kind.applied(&cache).await;
                }
            },
            watcher::Event::Delete(object) => {
                cache.write(|state| kind.delete(state, &object));
                cache.usage_moved().notify_one();
                kind.applied(&cache).await;
            }
        }
        if cache.read(|state| state.waiting_count() > 0) {
            cache.queue_moved().notify_one();
        }
    }
}

struct NodeKind;
impl Kind<Node> for NodeKind {
    const NAME: &'static str = "Node";
    type Item = NodeGpus;
    fn project(&self, node: &Node, p: &Projection) -> Option<NodeGpus> {
        Some(NodeGpus::from_node(node, &p.names, &p.labels))
    }
    fn apply(&self, state: &mut ClusterState, item: NodeGpus) {
        state.apply_node(item);
    }
    fn delete(&self, state: &mut ClusterState, node: &Node) {
        state.delete_node(node.metadata.name.as_deref().unwrap_or_default());
    }
    fn replace(&self, state: &mut ClusterState, items: Vec<NodeGpus>) {
        state.replace_nodes(items);
    }
}

struct PodKind;
impl Kind<Pod> for PodKind {
    const NAME: &'static str = "Pod";
    type Item = (PodKey, CachedPod);
    fn project(&self, pod: &Pod, p: &Projection) -> Option<(PodKey, CachedPod)> {
        match CachedPod::from_pod(pod, p) {
            Ok(cached) => Some((pod_key(pod), cached)),
            Err(SkipReason::BadRequest(error)) => {
                tracing::warn!(pod = %pod_key(pod), %error, "pod's GPU request is unreadable; not cached");
                None
            }
            Err(_) => None,
        }
    }
    fn apply(&self, state: &mut ClusterState, (key, pod): (PodKey, CachedPod)) {
        state.apply_pod(key, pod);
    }
    fn delete(&self, state: &mut ClusterState, pod: &Pod) {
        state.delete_pod(&pod_key(pod));
    }
    fn replace(&self, state: &mut ClusterState, items: Vec<(PodKey, CachedPod)>) {
        state.replace_pods(items, Instant::now());
    }
}

struct QuotaKind;
impl Kind<GPUQuota> for QuotaKind {
    const NAME: &'static str = "GPUQuota";
    type Item = GPUQuota;
    fn project(&self, quota: &GPUQuota, _: &Projection) -> Option<GPUQuota> {
        Some(quota.clone())
    }
    fn apply(&self, state: &mut ClusterState, quota: GPUQuota) {
        state.apply_quota(quota);
    }
    fn delete(&self, state: &mut ClusterState, quota: &GPUQuota) {
        state.delete_quota(quota);
    }
    fn replace(&self, state: &mut ClusterState, items: Vec<GPUQuota>) {
        state.replace_quotas(items);
    }
}

struct ClaimKind;
impl Kind<ResourceClaim> for ClaimKind {
    const NAME: &'static str = "ResourceClaim";
    type Item = (PodKey, CachedClaim);
    fn project(&self, claim: &ResourceClaim, p: &Projection) -> Option<(PodKey, CachedClaim)> {
        let cached = CachedClaim::from_claim(claim, &p.dra)?;
        Some((key_of(claim), cached))
    }
    /// Evaluate, in the CEL pool, the claims not held already with asks under the
    /// current DeviceClasses (docs/design.md, "One rule, one place").
    fn prepare(
        &self,
        cache: &ClusterCache,
        mut items: Vec<(PodKey, CachedClaim)>,
    ) -> impl Future<Output = Vec<(PodKey, CachedClaim)>> + Send {
        let cache = cache.clone();
        async move {
            let unevaluated = cache.read(|s| s.unevaluated(&mut items));
            if !unevaluated.is_empty() {
                let job = move || unevaluated.evaluate();
                if let Ok(evaluated) = cache.cel_pool().run_waiting(job).await {
                    evaluated.give(&mut items);
                }
            }
            items
        }
    }
    /// A DeviceClass that changed while they were evaluated: evaluate them again.
    fn applied(&self, cache: &ClusterCache) -> impl Future<Output = ()> + Send {
        let cache = cache.clone();
        async move { cache.evaluate_claims().await }
    }
    fn apply(&self, state: &mut ClusterState, (key, claim): (PodKey, CachedClaim)) {
        state.apply_claim(key, claim);
    }
    fn delete(&self, state: &mut ClusterState, claim: &ResourceClaim) {
        state.delete_claim(&key_of(claim));
    }
    fn replace(&self, state: &mut ClusterState, items: Vec<(PodKey, CachedClaim)>) {
        state.replace_claims(items);
    }
}

fn key_of(claim: &ResourceClaim) -> PodKey {
    let meta = &claim.metadata;
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    claim_key(namespace, meta.name.as_deref().unwrap_or_default())
}

type NamedSlice = (String, SliceDevices);

struct SliceKind;
impl Kind<ResourceSlice> for SliceKind {
    const NAME: &'static str = "ResourceSlice";
    type Item = NamedSlice;
    fn project(&self, slice: &ResourceSlice, p: &Projection) -> Option<NamedSlice> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        Some((name, gpu_devices(slice, &p.dra)))
    }
    fn apply(&self, state: &mut ClusterState, (name, devices): NamedSlice) {
        state.apply_slice(&name, devices);
    }
    fn delete(&self, state: &mut ClusterState, slice: &ResourceSlice) {
        state.delete_slice(slice.metadata.name.as_deref().unwrap_or_default());
    }
    fn replace(&self, state: &mut ClusterState, items: Vec<NamedSlice>) {
        state.replace_slices(items);
    }
}

type NamedClass = (String, ClassInfo);

struct ClassKind;
impl Kind<DeviceClass> for ClassKind {
    const NAME: &'static str = "DeviceClass";
    type Item = NamedClass;
    fn project(&self, class: &DeviceClass, _: &Projection) -> Option<NamedClass> {
        let name = class.metadata.name.clone().unwrap_or_default();
        Some((name, ClassInfo::of(class)))
    }
    /// The claims are evaluated again under the new classes, off the lock.
    fn applied(&self, cache: &ClusterCache) -> impl Future<Output = ()> + Send {
        let cache = cache.clone();
        async move { cache.evaluate_claims().await }
    }
    fn apply(&self, state: &mut ClusterState, (name, class): NamedClass) {
        state.apply_class(&name, class);
    }
    fn delete(&self, state: &mut ClusterState, class: &DeviceClass) {
        state.delete_class(class.metadata.name.as_deref().unwrap_or_default());
    }
    fn replace(&self, state: &mut ClusterState, items: Vec<NamedClass>) {
        state.replace_classes(items.into_iter().collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_watch_waits_longer_each_time_up_to_30_s() {
        let mut retry = Retry::default();
        let pauses: Vec<u64> = (0..9).map(|_| retry.next().as_millis() as u64).collect();
        assert_eq!(
            pauses,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
    }
}
