//! `gpu-admission defrag` (docs/defrag.md): for each pending GPU pod, the fewest moves
//! of running pods after which it fits, or why there are none. It plans on a
//! [`Snapshot`] of the cluster (a file, or the API server) and never evicts: the plan is
//! the placement core's (`placement::defrag`), the nodes' eligibility and the quota
//! picture the cache's (`NamespaceQuota`).

mod movable;
mod report;

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use foldhash::HashMap;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use crate::cache::plan_hold::{GpusKept, PlanHold, Slot};
use crate::cache::{CachedPod, ClusterState, FileObject, PlacementPrice, PodKey};
use crate::config::Config;
use crate::placement::NodeGpus;
use crate::placement::defrag::{
    Ask, DEFAULT_BUDGET, DEFAULT_MAX_MOVES, LARGEST_BUDGET, Limits, MOST_MOVES, Plan, Planner,
    Resident, Site,
};
use crate::placement::mig::MigResources;
use crate::placement::models::WantedModels;
use crate::snapshot::{ClusterSource, Read, Snapshot, World};

use movable::Mobility;
pub(crate) use report::PlanOut;
pub(crate) use report::gpu_indices;
pub(crate) use report::{Output, Report};
use report::{Step, Unplanned};

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
    let snapshot = Snapshot::of(objects, source, config)?;
    plan_in(&snapshot, limits, only)
}

/// [`plan_objects`] on a snapshot already read. One read of the cache copies what
/// planning needs of it ([`OutOfCache`]); the searches run with no lock held, so the
/// planner in the cluster never keeps the cache's writers (or the webhooks behind them)
/// waiting on a search.
pub(crate) fn plan_in(
    snapshot: &Snapshot,
    limits: Limits,
    only: Option<&str>,
) -> anyhow::Result<Report> {
    let Snapshot {
        cache,
        world,
        placer,
    } = snapshot;
    let mig = &cache.projection().names.mig;
    let copied = cache.read(|state| OutOfCache::read(state, world, mig, only))?;
    let mobility = Mobility::new(world);
    let planning = Planning {
        copied: &copied,
        world,
        mobility: &mobility,
        planner: Planner { placer, limits },
        mig,
    };
    let mut report = Report {
        kept: planning.kept(),
        ..Report::default()
    };
    for pending in &copied.pending {
        report.add(planning.plan(pending));
    }
    Ok(report)
}

/// What planning reads of the cache, copied out in one read.
struct OutOfCache {
    sites: Vec<Site<PodKey>>,
    /// The pods to plan for, in name order.
    pending: Vec<Pending>,
    /// The uid and controller of each pod on the sites (a moved pod's step and its
    /// replacement's hold name them).
    movers: HashMap<PodKey, (Box<str>, Option<Box<str>>)>,
}

/// A pod to plan for, with its quota picture.
struct Pending {
    key: PodKey,
    pod: CachedPod,
    price: PlacementPrice,
}

impl OutOfCache {
    fn read(
        state: &ClusterState,
        world: &World,
        mig: &MigResources,
        only: Option<&str>,
    ) -> anyhow::Result<Self> {
        let sites = sites(state, world, mig);
        let residents = sites.iter().flat_map(|s| &s.residents);
        let movers = residents
            .filter_map(|r| {
                let pod = state.pod(&r.pod)?;
                Some((r.pod.clone(), (pod.uid.clone(), pod.owner.clone())))
            })
            .collect();
        let pending = pending(state, only)?
            .into_iter()
            .map(|(key, pod)| {
                let namespace = crate::cache::pod::key_parts(&key).0;
                let quota = state.namespace_quota(namespace);
                let wanted = quota.wanted(&pod.models);
                let price = quota.placement_price(wanted, (&pod.request, pod.created));
                Pending {
                    key,
                    pod: pod.clone(),
                    price,
                }
            })
            .collect();
        Ok(OutOfCache {
            sites,
            pending,
            movers,
        })
    }
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
fn sites(state: &ClusterState, world: &World, mig: &MigResources) -> Vec<Site<PodKey>> {
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
    // One node of each model and pool: a quota admits a pod by those alone.
    let mut kinds: Vec<NodeGpus> = Vec::new();
    for gpus in sites.iter().map(|s| &s.gpus) {
        if gpus.model.is_some()
            && !kinds
                .iter()
                .any(|k| k.model == gpus.model && k.pool == gpus.pool)
        {
            kinds.push(gpus.clone());
        }
    }
    for (key, pod) in state.pods().filter(|(_, p)| p.bound) {
        let at = sites.binary_search_by(|s| Some(&s.gpus.name).cmp(&pod.node.as_ref()));
        let (Ok(at), Some(assignment)) = (at, &pod.assignment) else {
            continue; // on a node pods may not land on, or its GPUs are not known
        };
        let namespace = crate::cache::pod::key_parts(key).0;
        let pools = state.namespace_limits(namespace).pools.clone();
        let own = sites[at].gpus.model.clone();
        let other_models = other_models(state, namespace, pod, own.as_deref(), &kinds, mig);
        sites[at].residents.push(Resident {
            pod: key.clone(),
            request: pod.request.clone(),
            host: world.pods.get(&**key).map(|p| p.host).unwrap_or_default(),
            assignment: assignment.clone(),
            priority: pod.priority,
            pools: Arc::from(pools),
            other_models,
        });
    }
    // The cache holds pods in no order; the planner breaks its last ties by it.
    for site in &mut sites {
        site.residents.sort_unstable_by(|a, b| a.pod.cmp(&b.pod));
    }
    sites
}

/// The models other than `own` that a move may take `pod` (running in `namespace`) to:
/// for a pod that accepts several models (its quota lists several and it names none,
/// or it names several), those its quota has room for its charge on now, which follows
/// it there (its replacement is charged at placement, as every such pod is). None for
/// a pod of one model or one with MIG slices (a slice profile is one model's).
fn other_models(
    state: &ClusterState,
    namespace: &str,
    pod: &CachedPod,
    own: Option<&str>,
    kinds: &[NodeGpus],
    mig: &MigResources,
) -> Arc<[Arc<str>]> {
    let Some(wanted) = several_models(state, namespace, pod) else {
        return Arc::from(Vec::new());
    };
    let quota = state.namespace_quota(namespace);
    let price = quota.placement_price(wanted, (&pod.request, pod.created));
    let rules = price.eligibility(mig);
    let mut models: Vec<Arc<str>> = kinds
        .iter()
        .filter(|node| node.model.as_deref() != own)
        .filter(|node| rules.admits(node, &pod.request).is_ok())
        .filter_map(|node| node.model.clone())
        .collect();
    models.sort();
    models.dedup();
    models.into()
}

/// The models `pod` (of `namespace`) accepts, if it accepts several and a move may
/// take it to another: not with MIG slices (a slice profile is one model's).
fn several_models(state: &ClusterState, namespace: &str, pod: &CachedPod) -> Option<WantedModels> {
    let wanted = state.namespace_quota(namespace).wanted(&pod.models);
    (wanted.models.len() > 1 && pod.request.mig.is_empty()).then_some(wanted)
}

/// Whether a running pod that may change model ([`several_models`]) holds GPUs of a
/// model `pod` (pending as `key`) may use: moving it to another model could free room
/// where the pod's models have too little free in all. The cluster's planner plans for
/// such a pod as well as for a `Fragmented` one.
pub(crate) fn model_change_helps(state: &ClusterState, key: &PodKey, pod: &CachedPod) -> bool {
    let namespace = crate::cache::pod::key_parts(key).0;
    let wanted = state.namespace_quota(namespace).wanted(&pod.models);
    let mut running = state.pods().filter(|(_, p)| p.bound);
    running.any(|(other, p)| {
        let on = p.node.as_deref().and_then(|n| state.node(n));
        on.is_some_and(|node| wanted.admits(node).is_ok())
            && several_models(state, crate::cache::pod::key_parts(other).0, p).is_some()
    })
}

/// A pod `plan` moves to another model whose charge lands where another of the plan's
/// does: the same namespace and model as an earlier such move, or as the pending pod
/// `key` on the target. Each move's room was checked alone ([`other_models`]), so two
/// together might overdraw the quota (placement would then refuse the second).
fn shared_charge(sites: &[Site<PodKey>], key: &PodKey, plan: &Plan<PodKey>) -> Option<PodKey> {
    let namespace = |pod: &PodKey| crate::cache::pod::key_parts(pod).0.to_string();
    let model = |node: usize| sites[node].gpus.model.clone();
    let mut charged = vec![(namespace(key), model(plan.node))];
    let changes = plan.moves.iter().filter(|m| model(m.from) != model(m.to));
    for step in changes {
        let charge = (namespace(&step.pod), model(step.to));
        if charged.contains(&charge) {
            return Some(step.pod.clone());
        }
        charged.push(charge);
    }
    None
}

/// What each pod's plan is made against.
struct Planning<'a> {
    copied: &'a OutOfCache,
    world: &'a World,
    mobility: &'a Mobility<'a>,
    planner: Planner<'a>,
    mig: &'a MigResources,
}

impl Planning<'_> {
    /// How many running GPU pods stay put, by rule (those that may move: `movable`).
    fn kept(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut kept = std::collections::BTreeMap::new();
        let residents = self.copied.sites.iter().flat_map(|s| &s.residents);
        for resident in residents {
            let rule = match self.mobility.check(&resident.pod) {
                Ok(()) => "movable",
                Err(stay) => stay.kind(),
            };
            *kept.entry(rule).or_default() += 1;
        }
        kept
    }

    fn plan(&self, pending: &Pending) -> Result<PlanOut, Unplanned> {
        let Pending { key, pod, price } = pending;
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
        let rules = price.eligibility(self.mig);
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
        // A plan that overdraws a disruption budget, or may overdraw a quota, is not
        // used: the pod that would stays, and the search runs again (at most once per
        // move).
        let mut stays: BTreeSet<PodKey> = BTreeSet::new();
        for _ in 0..=self.planner.limits.max_moves {
            let movable = |r: &Resident<PodKey>| {
                !stays.contains(&r.pod) && self.mobility.check(&r.pod).is_ok()
            };
            let sites = &self.copied.sites;
            let plan = self.planner.plan(
                sites,
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
            if let Some(over) = shared_charge(sites, key, &plan) {
                stays.insert(over);
                continue;
            }
            let name = |node: usize| sites[node].gpus.name.to_string();
            return Ok(PlanOut {
                hold: self.hold_of(pod, &plan),
                pod: key.to_string(),
                node: name(plan.node),
                gpus: gpu_indices(&plan.assignment),
                moves: plan
                    .moves
                    .iter()
                    .map(|m| {
                        let moved = self.copied.movers.get(&m.pod);
                        Step {
                            pod: m.pod.to_string(),
                            from: name(m.from),
                            to: name(m.to),
                            gpus: gpu_indices(&m.assignment),
                            uid: moved.map(|(uid, _)| uid.to_string()).unwrap_or_default(),
                            owner: moved.and_then(|(_, o)| o.as_deref()).map(str::to_string),
                        }
                    })
                    .collect(),
            });
        }
        Err(unplanned(
            "every plan found would disrupt a PodDisruptionBudget beyond what it allows, or \
             charge a quota twice on one model"
                .into(),
        ))
    }

    /// The holds that carrying `plan` out for `pod` keeps: the target's GPUs for the
    /// pending pod, each destination for the moved pod's replacement (known by its
    /// controller). None when a moved pod names no controller, or MIG slices would have
    /// to be held (holds keep GPU indices and shares only).
    fn hold_of(&self, pod: &CachedPod, plan: &Plan<PodKey>) -> Option<PlanHold> {
        let sites = &self.copied.sites;
        let target = &sites[plan.node].gpus;
        if !pod.request.mig.is_empty() {
            return None;
        }
        let slots = plan.moves.iter().map(|m| {
            let request = sites[m.from].residents.iter().find(|r| r.pod == m.pod)?;
            let request = Some(&request.request).filter(|r| r.mig.is_empty())?;
            let (uid, owner) = self.copied.movers.get(&m.pod)?;
            let (namespace, _) = m.pod.split_once('/')?;
            Some(Slot::new(
                namespace,
                uid,
                owner.as_deref()?,
                request,
                GpusKept::of(&sites[m.to].gpus, &m.assignment),
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
