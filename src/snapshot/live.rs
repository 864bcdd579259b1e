//! In the cluster, the world the planner reads, kept by watches like the cache
//! (docs/design.md, "Snapshots"): Nodes' allocatable CPU and memory; every live pod's
//! node and CPU and memory, and for the pods that opted in to moving their owner and
//! labels; PodDisruptionBudgets as their status counts them; and which ReplicaSets,
//! StatefulSets and Jobs exist (their metadata only). A planning pass copies it
//! ([`LiveWorld::world`]): nothing lists the API server per pass.

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::sync::Arc;

use foldhash::{HashMap, HashSet};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::cache::Relisting;
use crate::placement::fragment::HostRoom;

use super::world::{
    CONTROLLER_KINDS, DisruptionBudget, NodeFacts, PodFacts, World, WorldError, node_facts,
    pod_facts,
};

/// The kinds watched: Node, Pod, PodDisruptionBudget and the controller kinds.
const KINDS: usize = 3 + CONTROLLER_KINDS.len();

/// The watched world, shared by its watches (writers) and the planner (reader).
#[derive(Clone, Default)]
pub(crate) struct LiveWorld {
    inner: Arc<RwLock<Watched>>,
}

#[derive(Default)]
struct Watched {
    /// Allocatable CPU and memory, by node name.
    nodes: HashMap<String, HostRoom>,
    /// By `namespace/name`.
    pods: HashMap<String, PodFacts>,
    /// By `namespace/name`.
    budgets: HashMap<String, DisruptionBudget>,
    /// By kind, the `namespace/name`s present.
    controllers: [HashMap<String, ()>; CONTROLLER_KINDS.len()],
    /// The kinds listed at least once.
    listed: HashSet<&'static str>,
}

/// Where one kind's objects land in the watched world.
trait WorldKind: Send + Sync + 'static {
    type Object: Resource + Send;
    type Item: Send + Sync;
    fn kind(&self) -> &'static str;
    /// What is kept of `object`; `None`: nothing (as if it were gone).
    fn project(&self, object: &Self::Object) -> Option<Self::Item>;
    fn map<'w>(&self, world: &'w mut Watched) -> &'w mut HashMap<String, Self::Item>;
}

struct Nodes;
impl WorldKind for Nodes {
    type Object = Node;
    type Item = HostRoom;
    fn kind(&self) -> &'static str {
        "Node"
    }
    fn project(&self, node: &Node) -> Option<HostRoom> {
        match node_facts(node, 0) {
            Ok(facts) => Some(facts.allocatable),
            Err(error) => {
                tracing::warn!(node = %key(node), error = %unreadable(error), "node's CPU or memory is unreadable; planned without it");
                None
            }
        }
    }
    fn map<'w>(&self, world: &'w mut Watched) -> &'w mut HashMap<String, HostRoom> {
        &mut world.nodes
    }
}

struct Pods;
impl WorldKind for Pods {
    type Object = Pod;
    type Item = PodFacts;
    fn kind(&self) -> &'static str {
        "Pod"
    }
    fn project(&self, pod: &Pod) -> Option<PodFacts> {
        match pod_facts(pod, 0) {
            Ok(facts) => Some(kept_of(facts)),
            Err(error) => {
                tracing::warn!(pod = %key(pod), error = %unreadable(error), "pod's CPU or memory is unreadable; planned without it");
                None
            }
        }
    }
    fn map<'w>(&self, world: &'w mut Watched) -> &'w mut HashMap<String, PodFacts> {
        &mut world.pods
    }
}

/// What is wrong with a watched object (a file's errors name its document; a watch has
/// none).
fn unreadable(error: WorldError) -> String {
    match error {
        WorldError::Quantity { what, source, .. } => format!("{what}: {source}"),
        other => other.to_string(),
    }
}

/// What is kept of a pod: only a pod that opted in to moving may move, so only its
/// owner and labels (which budgets guard it) are ever read.
fn kept_of(mut facts: PodFacts) -> PodFacts {
    if !facts.opted_in {
        facts.labels = BTreeMap::new();
        facts.owner = None;
    }
    facts
}

struct Budgets;
impl WorldKind for Budgets {
    type Object = PodDisruptionBudget;
    type Item = DisruptionBudget;
    fn kind(&self) -> &'static str {
        "PodDisruptionBudget"
    }
    fn project(&self, pdb: &PodDisruptionBudget) -> Option<DisruptionBudget> {
        Some(DisruptionBudget::of(pdb, None))
    }
    fn map<'w>(&self, world: &'w mut Watched) -> &'w mut HashMap<String, DisruptionBudget> {
        &mut world.budgets
    }
}

/// One controller kind (its index in [`CONTROLLER_KINDS`]), by metadata only.
struct Controllers<K>(usize, PhantomData<fn() -> K>);
impl<K> WorldKind for Controllers<K>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    type Object = PartialObjectMeta<K>;
    type Item = ();
    fn kind(&self) -> &'static str {
        CONTROLLER_KINDS[self.0]
    }
    fn project(&self, _: &Self::Object) -> Option<()> {
        Some(())
    }
    fn map<'w>(&self, world: &'w mut Watched) -> &'w mut HashMap<String, ()> {
        &mut world.controllers[self.0]
    }
}

/// What starts a watch of `api`'s objects (again, after a failure). An `Api` of
/// `PartialObjectMeta` watches metadata only.
fn starter<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Fn() -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + 'static,
{
    move || watcher::watcher(api.clone(), config.clone()).boxed()
}

/// `namespace/name`, or the name of an object of no namespace.
fn key<O: Resource>(object: &O) -> String {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match &meta.namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

impl LiveWorld {
    /// A copy of the world, once every kind has listed (`None` before).
    pub(crate) fn world(&self) -> Option<World> {
        let watched = self.inner.read();
        if watched.listed.len() < KINDS {
            return None;
        }
        let facts = |allocatable: &HostRoom| NodeFacts {
            allocatable: *allocatable,
            used: HostRoom::default(),
        };
        let nodes = watched.nodes.iter().map(|(n, a)| (n.clone(), facts(a)));
        let mut controllers = BTreeSet::new();
        for (kind, present) in CONTROLLER_KINDS.iter().zip(&watched.controllers) {
            for id in present.keys() {
                let (namespace, name) = id.split_once('/').unwrap_or(("", id));
                controllers.insert((namespace.into(), kind.to_string(), name.into()));
            }
        }
        let mut budgets: Vec<_> = watched.budgets.values().cloned().collect();
        budgets.sort_by(|a, b| a.name.cmp(&b.name));
        let mut world = World {
            nodes: nodes.collect(),
            pods: (watched.pods.iter())
                .map(|(k, p)| (k.clone(), p.clone()))
                .collect(),
            budgets,
            controllers,
            cooling: BTreeSet::new(),
        };
        world.settle();
        Some(world)
    }

    /// Whether every kind has listed once.
    pub(crate) fn listed(&self) -> bool {
        self.inner.read().listed.len() >= KINDS
    }

    /// Follow the watches until `shutdown`. Pods as the cache watches them: finished
    /// ones leave the selector (a deletion).
    pub(crate) async fn run(self, client: Client, shutdown: CancellationToken) {
        let live_pods =
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let all = watcher::Config::default;
        let nodes = self.follow(Nodes, starter(Api::all(client.clone()), all()));
        let pods = self.follow(Pods, starter(Api::all(client.clone()), live_pods));
        let budgets = self.follow(Budgets, starter(Api::all(client.clone()), all()));
        let replica_sets = self.follow(
            Controllers::<ReplicaSet>(0, PhantomData),
            starter(Api::all(client.clone()), all()),
        );
        let stateful_sets = self.follow(
            Controllers::<StatefulSet>(1, PhantomData),
            starter(Api::all(client.clone()), all()),
        );
        let jobs = self.follow(
            Controllers::<Job>(2, PhantomData),
            starter(Api::all(client), all()),
        );
        let watches = async {
            futures::join!(nodes, pods, budgets, replica_sets, stateful_sets, jobs);
        };
        tokio::select! {
            _ = watches => {}
            _ = shutdown.cancelled() => {}
        }
    }

    /// Follow one kind's watch, listing again after a failure as the cache's watches do
    /// ([`Relisting`]).
    #[tracing::instrument(name = "watch", skip_all, fields(kind = slot.kind()))]
    async fn follow<S: WorldKind>(
        &self,
        slot: S,
        start: impl Fn() -> BoxStream<'static, watcher::Result<Event<S::Object>>>,
    ) {
        let mut buffer: Vec<(String, S::Item)> = Vec::new();
        let mut events = Relisting::new(start);
        while let Some(event) = events.next().await {
            self.apply(&slot, event, &mut buffer);
        }
    }

    /// Apply one watch event; a relist's objects collect in `buffer` until it is done.
    fn apply<S: WorldKind>(
        &self,
        slot: &S,
        event: Event<S::Object>,
        buffer: &mut Vec<(String, S::Item)>,
    ) {
        match event {
            Event::Init => buffer.clear(),
            Event::InitApply(object) => {
                buffer.extend(slot.project(&object).map(|item| (key(&object), item)));
            }
            Event::InitDone => {
                let items: HashMap<_, _> = buffer.drain(..).collect();
                let count = items.len();
                let mut watched = self.inner.write();
                *slot.map(&mut watched) = items;
                watched.listed.insert(slot.kind());
                tracing::info!(count, "listed");
            }
            Event::Apply(object) => {
                let key = key(&object);
                let item = slot.project(&object);
                let mut watched = self.inner.write();
                match item {
                    Some(item) => slot.map(&mut watched).insert(key, item),
                    None => slot.map(&mut watched).remove(&key),
                };
            }
            Event::Delete(object) => {
                slot.map(&mut self.inner.write()).remove(&key(&object));
            }
        }
    }
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
