//! `gpu-admission defrag` (docs/defrag.md): for each pending GPU pod, the fewest moves
//! of running pods after which it fits, or why there are none. It reads the cluster (a
//! file, or the API server) and never evicts: the plan is the placement core's
//! (`placement::defrag`), the nodes' eligibility and the quota picture the
//! cache's (`NamespaceQuota`).

mod movable;
mod report;
mod world;

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{ArgGroup, Args};

use crate::cache::plan_hold::{GpusKept, PlanHold, Slot};
use crate::cache::{CachedPod, ClusterCache, ClusterState, FileObject, PodKey, Projection};
use crate::config::Config;
use crate::placement::Placer;
use crate::placement::defrag::{
    Ask, DEFAULT_BUDGET, DEFAULT_MAX_MOVES, LARGEST_BUDGET, Limits, MOST_MOVES, Plan, Planner,
    Resident, Site,
};
use crate::placement::learn::LearningPlacer;

use movable::Mobility;
pub(crate) use report::PlanOut;
pub(crate) use report::gpu_indices;
pub(crate) use report::{Output, Report};
use report::{Step, Unplanned};
pub(crate) use world::{MOVABLE_ANNOTATION, World};

/// Where `defrag` and `explain` read the cluster and the configuration from.
#[derive(Debug, Args)]
#[command(group = ArgGroup::new("source").required(true).args(["cluster", "kubeconfig"]))]
pub(crate) struct ClusterSource {
    /// The cluster as a YAML file: Nodes, Pods, GPUQuotas, PodDisruptionBudgets and the
    /// ReplicaSets, StatefulSets and Jobs pods name as owners (`kind: List`s as
    /// `kubectl get -o yaml` prints them are read too).
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Read the cluster from the API server this kubeconfig names.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Configuration file (YAML), as `serve` reads it.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// The cluster's objects, what to call their source in messages, and the configuration.
pub(crate) struct Read {
    pub(crate) objects: Vec<FileObject>,
    pub(crate) source: String,
    pub(crate) config: Config,
}

impl ClusterSource {
    /// Read the configuration, then the objects from the file or the API server.
    pub(crate) fn read(&self) -> anyhow::Result<Read> {
        let config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        let (objects, source) = match (&self.cluster, &self.kubeconfig) {
            (Some(path), _) => (
                crate::cache::read_objects(path)?,
                path.display().to_string(),
            ),
            (None, Some(kubeconfig)) => {
                let runtime =
                    tokio::runtime::Runtime::new().context("starting the async runtime")?;
                let objects = runtime.block_on(listed(kubeconfig))?;
                let source = format!("the API server of {}", kubeconfig.display());
                (objects, source)
            }
            (None, None) => anyhow::bail!("give --cluster FILE or --kubeconfig FILE"),
        };
        Ok(Read {
            objects,
            source,
            config,
        })
    }
}

#[derive(Debug, Args)]
pub struct DefragArgs {
    #[command(flatten)]
    source: ClusterSource,
    /// Plan for this pod only (NAMESPACE/NAME).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pod: Option<String>,
    /// At most this many moves per plan (0 to 8).
    #[arg(long, default_value_t = DEFAULT_MAX_MOVES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MOST_MOVES as u64))]
    max_moves: usize,
    /// Node and pod evaluations one plan may spend (at most 10,000,000).
    #[arg(long, default_value_t = DEFAULT_BUDGET,
          value_parser = clap::value_parser!(u64).range(1..=LARGEST_BUDGET))]
    budget: u64,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: Output,
}

/// Read the cluster, plan, print.
pub fn run(args: DefragArgs) -> anyhow::Result<()> {
    let Read {
        objects,
        source,
        config,
    } = args.source.read()?;
    let limits = Limits {
        max_moves: args.max_moves,
        budget: args.budget,
    };
    let report = plan_objects(&objects, &source, &config, limits, args.pod.as_deref())?;
    print!("{}", report.render(args.output)?);
    Ok(())
}

/// The plans for the pending GPU pods among `objects` (or for `only`).
pub(crate) fn plan_objects(
    objects: &[FileObject],
    source: &str,
    config: &Config,
    limits: Limits,
    only: Option<&str>,
) -> anyhow::Result<Report> {
    let world = World::read(objects).with_context(|| format!("reading {source}"))?;
    let cache = ClusterCache::from_objects(objects, source, Projection::from_config(config))?;
    let placer = learned_placer(&cache, config);
    plan_in(&cache, &world, &placer, limits, only)
}

/// The placer the extender would have: the configured policy, with the request mix
/// of the pods placed as it learns it (fragmentation is measured against it).
pub(crate) fn learned_placer(cache: &ClusterCache, config: &Config) -> Arc<Placer> {
    let placement = &config.placement;
    let learning = LearningPlacer::new(placement.policy, placement.gpu_manager_compat);
    cache.read(|state| {
        // In name order: the mix snapshots as it grows, so the same cluster must give
        // the same mix (and the same plan) every time.
        let mut placed: Vec<_> = state.pods().filter(|(_, p)| p.node.is_some()).collect();
        placed.sort_unstable_by(|a, b| a.0.cmp(b.0));
        placed
            .iter()
            .for_each(|(_, p)| learning.observe(&p.request));
    });
    learning.placer()
}

/// [`plan_objects`] on a cache and the objects' `world` already read.
pub(crate) fn plan_in(
    cache: &ClusterCache,
    world: &World,
    placer: &Placer,
    limits: Limits,
    only: Option<&str>,
) -> anyhow::Result<Report> {
    let planner = Planner { placer, limits };
    let mig = &cache.projection().names.mig;
    cache.read(|state| {
        let sites = sites(state, world);
        let mobility = Mobility::new(world);
        let ground = Ground {
            state,
            sites: &sites,
            world,
            mobility: &mobility,
            planner,
            mig,
        };
        let mut report = Report {
            kept: ground.kept(),
            ..Report::default()
        };
        for (key, pod) in pending(state, only)? {
            report.add(ground.plan(&key, pod));
        }
        Ok(report)
    })
}

/// The GPU pods to plan for: every pending one (not bound, not placed), or `only`.
fn pending<'s>(
    state: &'s ClusterState,
    only: Option<&str>,
) -> anyhow::Result<Vec<(PodKey, &'s CachedPod)>> {
    if let Some(key) = only {
        let pod = state
            .pod(key)
            .with_context(|| format!("pod {key} is not in the cluster or asks for no GPU"))?;
        return Ok(vec![(PodKey::from(key), pod)]);
    }
    let mut pods: Vec<(PodKey, &CachedPod)> = state
        .pods()
        .filter(|(_, p)| p.node.is_none())
        .map(|(k, p)| (k.clone(), p))
        .collect();
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(pods)
}

/// The nodes pods may land on, in name order, with their free CPU and memory and the
/// GPU pods running there whose GPUs are known.
fn sites(state: &ClusterState, world: &World) -> Vec<Site<PodKey>> {
    // GPUs the plans under way keep count as used: a new plan never counts on them.
    let held = state.held_from_others(crate::quota::pending::now_second());
    let mut sites: Vec<Site<PodKey>> = state
        .nodes()
        .filter(|gpus| gpus.closed.is_none() && world.nodes.contains_key(&*gpus.name))
        .map(|gpus| Site {
            gpus: held.get(&gpus.name).unwrap_or(gpus).clone(),
            room: world.room(&gpus.name),
            residents: Vec::new(),
        })
        .collect();
    sites.sort_by(|a, b| a.gpus.name.cmp(&b.gpus.name));
    for (key, pod) in state.pods().filter(|(_, p)| p.bound) {
        let at = sites.binary_search_by(|s| Some(&s.gpus.name).cmp(&pod.node.as_ref()));
        let (Ok(at), Some(assignment)) = (at, &pod.assignment) else {
            continue; // on a node pods may not land on, or its GPUs are not known
        };
        let namespace = crate::cache::pod::key_parts(key).0;
        let pools = state.namespace_limits(namespace).pools.clone();
        sites[at].residents.push(Resident {
            pod: key.clone(),
            request: pod.request.clone(),
            host: world.pods.get(&**key).map(|p| p.host).unwrap_or_default(),
            assignment: assignment.clone(),
            priority: pod.priority,
            pools: Arc::from(pools),
        });
    }
    // The cache holds pods in no order; the planner breaks its last ties by it.
    for site in &mut sites {
        site.residents.sort_unstable_by(|a, b| a.pod.cmp(&b.pod));
    }
    sites
}

/// What one pod's plan is made against.
struct Ground<'a> {
    state: &'a ClusterState,
    sites: &'a [Site<PodKey>],
    world: &'a World,
    mobility: &'a Mobility<'a>,
    planner: Planner<'a>,
    mig: &'a crate::placement::mig::MigResources,
}

impl Ground<'_> {
    /// How many running GPU pods stay put, by rule (those that may move: `movable`).
    fn kept(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut kept = std::collections::BTreeMap::new();
        let residents = self.sites.iter().flat_map(|s| &s.residents);
        for resident in residents {
            let rule = match self.mobility.check(&resident.pod) {
                Ok(()) => "movable",
                Err(stay) => stay.kind(),
            };
            *kept.entry(rule).or_default() += 1;
        }
        kept
    }

    fn plan(&self, key: &PodKey, pod: &CachedPod) -> Result<PlanOut, Unplanned> {
        let unplanned = |reason: String| Unplanned {
            pod: key.to_string(),
            reason,
        };
        if let Some(node) = &pod.node {
            let how = if pod.bound { "bound to" } else { "placed on" };
            return Err(unplanned(format!("{how} node {node}: nothing to plan")));
        }
        if pod.gated {
            return Err(unplanned(
                "waits in the quota queue: moves cannot seat it before its quota lets it out"
                    .into(),
            ));
        }
        let namespace = crate::cache::pod::key_parts(key).0;
        let quota = self.state.namespace_quota(namespace);
        let wanted = quota.wanted(&pod.models);
        let limits = quota.limits.clone();
        let rules = quota.eligibility(&limits, wanted, (&pod.request, pod.created), self.mig);
        let host = self
            .world
            .pods
            .get(&**key)
            .map(|p| p.host)
            .unwrap_or_default();
        let ask = Ask {
            request: &pod.request,
            host,
            priority: pod.priority,
        };
        // A plan that overdraws a disruption budget is not used: the pod that would
        // overdraw it stays, and the search runs again (at most once per move).
        let mut stays: BTreeSet<PodKey> = BTreeSet::new();
        for _ in 0..=self.planner.limits.max_moves {
            let movable = |r: &Resident<PodKey>| {
                !stays.contains(&r.pod) && self.mobility.check(&r.pod).is_ok()
            };
            let plan = self.planner.plan(
                self.sites,
                &ask,
                |gpus| rules.admits(gpus, &pod.request),
                movable,
            );
            let plan = match plan {
                Ok(plan) => plan,
                Err(no) => return Err(unplanned(no.to_string())),
            };
            let moved: Vec<&str> = plan.moves.iter().map(|m| &*m.pod).collect();
            if let Some((over, _)) = self.mobility.overdrawn(&moved) {
                stays.insert(PodKey::from(over));
                continue;
            }
            let name = |node: usize| self.sites[node].gpus.name.to_string();
            return Ok(PlanOut {
                hold: self.hold_of(pod, &plan),
                pod: key.to_string(),
                node: name(plan.node),
                gpus: gpu_indices(&plan.assignment),
                moves: plan
                    .moves
                    .iter()
                    .map(|m| {
                        let moved = self.state.pod(&m.pod);
                        Step {
                            pod: m.pod.to_string(),
                            from: name(m.from),
                            to: name(m.to),
                            gpus: gpu_indices(&m.assignment),
                            uid: moved.map(|p| p.uid.to_string()).unwrap_or_default(),
                            owner: moved.and_then(|p| p.owner.as_deref()).map(str::to_string),
                        }
                    })
                    .collect(),
            });
        }
        Err(unplanned(
            "every plan found would disrupt a PodDisruptionBudget beyond what it allows".into(),
        ))
    }

    /// The holds that carrying `plan` out for `pod` keeps: the target's GPUs for the
    /// pending pod, each destination for the moved pod's replacement (known by its
    /// controller). None when a moved pod names no controller, or MIG slices would have
    /// to be held (holds keep GPU indices and shares only).
    fn hold_of(&self, pod: &CachedPod, plan: &Plan<PodKey>) -> Option<PlanHold> {
        let target = &self.sites[plan.node].gpus;
        if !pod.request.mig.is_empty() {
            return None;
        }
        let slots = plan.moves.iter().map(|m| {
            let moved = self
                .state
                .pod(&m.pod)
                .filter(|p| p.request.mig.is_empty())?;
            let (namespace, _) = m.pod.split_once('/')?;
            Some(Slot::new(
                namespace,
                &moved.uid,
                moved.owner.as_deref()?,
                &moved.request,
                GpusKept::of(&self.sites[m.to].gpus, &m.assignment),
            ))
        });
        Some(PlanHold {
            model: target.model.as_deref().unwrap_or_default().to_string(),
            since: 0,
            until: 0,
            target: GpusKept::of(target, &plan.assignment),
            slots: slots.collect::<Option<Vec<Slot>>>()?,
        })
    }
}

/// The objects of the cluster `kubeconfig` names, as a cluster file would hold them.
async fn listed(kubeconfig: &std::path::Path) -> anyhow::Result<Vec<FileObject>> {
    let client = crate::api_client::kube_client(Some(kubeconfig), None).await?;
    list_cluster(&client).await
}

/// What the planner reads of the cluster, listed from the API server: Nodes, Pods,
/// GPUQuotas, PodDisruptionBudgets, and the controllers pods name as owners.
pub(crate) async fn list_cluster(client: &kube::Client) -> anyhow::Result<Vec<FileObject>> {
    use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;

    let client = client.clone();
    let mut objects = Vec::new();
    list::<Node>(&client, &mut objects).await?;
    list::<Pod>(&client, &mut objects).await?;
    list::<crate::quota::GPUQuota>(&client, &mut objects).await?;
    list::<PodDisruptionBudget>(&client, &mut objects).await?;
    list::<ReplicaSet>(&client, &mut objects).await?;
    list::<StatefulSet>(&client, &mut objects).await?;
    list::<Job>(&client, &mut objects).await?;
    Ok(objects)
}

/// Add every object of kind `K` the API server lists to `objects`.
async fn list<K>(client: &kube::Client, objects: &mut Vec<FileObject>) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let api: kube::Api<K> = kube::Api::all(client.clone());
    let kind = K::kind(&());
    let list = api
        .list(&kube::api::ListParams::default())
        .await
        .with_context(|| format!("listing {kind}s"))?;
    for item in list.items {
        let mut value = serde_yaml::to_value(&item).context("encoding an object")?;
        if let Some(map) = value.as_mapping_mut() {
            map.insert("kind".into(), kind.to_string().into());
            map.insert("apiVersion".into(), K::api_version(&()).to_string().into());
        }
        objects.push(FileObject {
            document: objects.len() + 1,
            value,
        });
    }
    Ok(())
}
