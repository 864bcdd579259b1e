//! What the planner reads beyond the cache's projection: every pod's CPU and
//! memory (GPU pods or not) and its owner, opt-in and labels; every node's allocatable
//! CPU and memory; PodDisruptionBudgets; the
//! controllers pods name as owners; and how many disruptions each budget allows now.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;

use crate::cache::FileObject;
use crate::placement::fragment::HostRoom;
use crate::placement::quantity::{Milli, QuantityError};

/// A problem with one object the command reads.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorldError {
    #[error("document {document}, {kind}: {source}")]
    Object {
        document: usize,
        kind: String,
        source: serde_yaml::Error,
    },
    #[error("document {document}, {what}: {source}")]
    Quantity {
        document: usize,
        what: String,
        source: QuantityError,
    },
}

/// One node as the command sees it.
#[derive(Debug, Clone)]
pub(crate) struct NodeFacts {
    /// Allocatable CPU and memory (`status.allocatable`, else `capacity`); a dimension
    /// the node does not state is unbounded.
    pub(crate) allocatable: HostRoom,
    /// What its active pods request.
    pub(crate) used: HostRoom,
}

/// A pod's controller, as its ownerReference names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// One pod as the command sees it.
#[derive(Debug, Clone)]
pub(crate) struct PodFacts {
    pub(crate) namespace: String,
    pub(crate) node: Option<String>,
    /// The CPU and memory the scheduler counts for it.
    pub(crate) host: HostRoom,
    pub(crate) labels: BTreeMap<String, String>,
    /// Its controller (ownerReference with `controller: true`), if any.
    pub(crate) owner: Option<Owner>,
    /// Carries `gpu-admission.io/movable: "true"`.
    pub(crate) opted_in: bool,
    /// Running or about to: not finished, not being deleted.
    pub(crate) active: bool,
}

/// The objects, read once.
#[derive(Debug, Default)]
pub(crate) struct World {
    pub(crate) nodes: BTreeMap<String, NodeFacts>,
    /// By `namespace/name`.
    pub(crate) pods: BTreeMap<String, PodFacts>,
    pub(crate) budgets: Vec<DisruptionBudget>,
    /// The controllers present, as (namespace, kind, name).
    pub(crate) controllers: BTreeSet<(String, String, String)>,
    /// The uids of controllers a pod of which was moved within `defrag.cooldownSeconds`
    /// (the mover's memory; empty for the command, which keeps none).
    pub(crate) cooling: BTreeSet<String>,
}

/// The annotation by which a pod's owner lets it be moved.
pub(crate) const MOVABLE_ANNOTATION: &str = "gpu-admission.io/movable";

/// The kinds of controller that recreate a pod they lose.
pub(crate) const CONTROLLER_KINDS: [&str; 3] = ["ReplicaSet", "StatefulSet", "Job"];

impl World {
    pub(crate) fn read(objects: &[FileObject]) -> Result<World, WorldError> {
        let mut world = World::default();
        let mut budgets: Vec<PodDisruptionBudget> = Vec::new();
        for object in objects {
            let kind = object.value.get("kind").and_then(|k| k.as_str());
            let document = object.document;
            match kind.unwrap_or_default() {
                "Node" => {
                    let node: Node = parse(object, "Node")?;
                    let name = node.metadata.name.clone().unwrap_or_default();
                    world.nodes.insert(name, node_facts(&node, document)?);
                }
                "Pod" => {
                    let pod: Pod = parse(object, "Pod")?;
                    let facts = pod_facts(&pod, document)?;
                    let name = pod.metadata.name.as_deref().unwrap_or_default();
                    world
                        .pods
                        .insert(format!("{}/{name}", facts.namespace), facts);
                }
                "PodDisruptionBudget" => budgets.push(parse(object, "PodDisruptionBudget")?),
                kind if CONTROLLER_KINDS.contains(&kind) => {
                    let meta: ObjectMeta = object
                        .value
                        .get("metadata")
                        .cloned()
                        .map(serde_yaml::from_value)
                        .transpose()
                        .map_err(|source| WorldError::Object {
                            document,
                            kind: kind.to_string(),
                            source,
                        })?
                        .unwrap_or_default();
                    world.controllers.insert((
                        meta.namespace.unwrap_or_else(|| "default".into()),
                        kind.to_string(),
                        meta.name.unwrap_or_default(),
                    ));
                }
                _ => {}
            }
        }
        let pods = Some(&world.pods);
        world.budgets = budgets
            .iter()
            .map(|b| DisruptionBudget::of(b, pods))
            .collect();
        world.settle();
        Ok(world)
    }

    /// Count what each node's active pods request as used on it.
    pub(super) fn settle(&mut self) {
        let active = self.pods.values().filter(|p| p.active);
        for pod in active {
            let facts = pod.node.as_deref().and_then(|n| self.nodes.get_mut(n));
            if let Some(facts) = facts {
                facts.used = facts.used.plus(&pod.host);
            }
        }
    }

    /// CPU and memory free on `node`: allocatable less what its active pods request.
    pub(crate) fn room(&self, node: &str) -> Option<HostRoom> {
        let facts = self.nodes.get(node)?;
        Some(facts.allocatable.minus(&facts.used))
    }
}

/// A PodDisruptionBudget: whose pods it guards and how many it lets go now.
#[derive(Debug, Clone)]
pub(crate) struct DisruptionBudget {
    /// `namespace/name`.
    pub(crate) name: String,
    namespace: String,
    /// `None`: selects nothing (a budget without a selector, as policy/v1 reads it).
    selector: Option<LabelSelector>,
    /// Disruptions allowed now: `status.disruptionsAllowed` when the object has a
    /// status, else worked out from its spec and the pods it selects.
    pub(crate) allowed: u32,
}

impl DisruptionBudget {
    /// The budget `pdb`; one without a status is worked out from `pods` when they are
    /// all known (a file), and allows nothing when they are not (in the cluster, where
    /// the planner keeps the labels of only the pods that opted in to moving, and the
    /// disruption controller has not counted the budget yet).
    pub(crate) fn of(
        pdb: &PodDisruptionBudget,
        pods: Option<&BTreeMap<String, PodFacts>>,
    ) -> DisruptionBudget {
        let namespace = pdb
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = format!(
            "{namespace}/{}",
            pdb.metadata.name.as_deref().unwrap_or_default()
        );
        let spec = pdb.spec.clone().unwrap_or_default();
        let mut budget = DisruptionBudget {
            name,
            namespace,
            selector: spec.selector.clone(),
            allowed: 0,
        };
        budget.allowed = match (pdb.status.as_ref(), pods) {
            (Some(status), _) => u32::try_from(status.disruptions_allowed).unwrap_or(0),
            (None, None) => 0,
            (None, Some(pods)) => {
                let selected: Vec<&PodFacts> = pods.values().filter(|p| budget.guards(p)).collect();
                let healthy = selected
                    .iter()
                    .filter(|p| p.active && p.node.is_some())
                    .count();
                let expected = selected.len();
                let keep = match (&spec.min_available, &spec.max_unavailable) {
                    (Some(min), _) => scaled(min, expected),
                    (None, Some(max)) => expected.saturating_sub(scaled(max, expected)),
                    (None, None) => expected, // neither: taken to allow nothing
                };
                u32::try_from(healthy.saturating_sub(keep)).unwrap_or(u32::MAX)
            }
        };
        budget
    }

    /// Whether the budget guards `pod`.
    pub(crate) fn guards(&self, pod: &PodFacts) -> bool {
        pod.namespace == self.namespace
            && self
                .selector
                .as_ref()
                .is_some_and(|s| selects(s, &pod.labels))
    }
}

/// A count or percentage of `total`, percentages rounded up (as the disruption
/// controller does).
fn scaled(value: &IntOrString, total: usize) -> usize {
    match value {
        IntOrString::Int(n) => usize::try_from(*n).unwrap_or(0),
        IntOrString::String(text) => {
            let percent = text.trim_end_matches('%').parse::<usize>().unwrap_or(100);
            (total * percent).div_ceil(100)
        }
    }
}

/// Whether a label selector selects `labels` (an empty selector selects everything).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let exact = selector.match_labels.iter().flatten();
    let exact_ok = exact.into_iter().all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector.match_expressions.iter().flatten();
    exact_ok
        && expressions.into_iter().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false, // an operator we do not know selects nothing
            }
        })
}

fn parse<T: DeserializeOwned>(object: &FileObject, kind: &str) -> Result<T, WorldError> {
    serde_yaml::from_value(object.value.clone()).map_err(|source| WorldError::Object {
        document: object.document,
        kind: kind.to_string(),
        source,
    })
}

/// A dimension a node does not state: larger than any request, with room to add.
const UNSTATED: u64 = u64::MAX / 4;

pub(super) fn node_facts(node: &Node, document: usize) -> Result<NodeFacts, WorldError> {
    let status = node.status.as_ref();
    let list = status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
    let amount = |key: &str| list.and_then(|l| l.get(key));
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let what = |resource: &str| format!("Node {name} {resource}");
    let allocatable = HostRoom {
        cpu_milli: match amount("cpu") {
            Some(q) => milli(q, document, || what("cpu"))?,
            None => UNSTATED,
        },
        memory_mib: match amount("memory") {
            Some(q) => mebibytes(q, document, || what("memory"))?,
            None => UNSTATED,
        },
    };
    Ok(NodeFacts {
        allocatable,
        used: HostRoom::default(),
    })
}

pub(super) fn pod_facts(pod: &Pod, document: usize) -> Result<PodFacts, WorldError> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let key = format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default());
    let spec = pod.spec.as_ref();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let finished = matches!(phase, Some("Succeeded" | "Failed"));
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| Owner {
            kind: r.kind.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        });
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MOVABLE_ANNOTATION));
    Ok(PodFacts {
        node: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        host: match spec {
            Some(spec) => host_need(spec, document, &key)?,
            None => HostRoom::default(),
        },
        labels: meta.labels.clone().unwrap_or_default(),
        owner,
        opted_in: annotation.is_some_and(|v| v == "true"),
        active: !finished && meta.deletion_timestamp.is_none(),
        namespace,
    })
}

/// The CPU and memory the scheduler reserves for a pod: its containers' requests
/// (limits where a request is not set) and restartable init containers (sidecars)
/// summed, at least the largest other init container, plus the pod's overhead.
fn host_need(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    document: usize,
    pod: &str,
) -> Result<HostRoom, WorldError> {
    let need = |c: &Container| container_need(c, document, pod);
    let mut running = HostRoom::default();
    let mut init_peak = HostRoom::default();
    for init in spec.init_containers.iter().flatten() {
        let one = need(init)?;
        if init.restart_policy.as_deref() == Some("Always") {
            running = running.plus(&one);
        } else {
            init_peak = peak(init_peak, running.plus(&one));
        }
    }
    for container in &spec.containers {
        running = running.plus(&need(container)?);
    }
    let mut total = peak(running, init_peak);
    for (resource, quantity) in spec.overhead.iter().flatten() {
        total = total.plus(&resource_need(resource, quantity, document, pod)?);
    }
    Ok(total)
}

fn peak(a: HostRoom, b: HostRoom) -> HostRoom {
    HostRoom {
        cpu_milli: a.cpu_milli.max(b.cpu_milli),
        memory_mib: a.memory_mib.max(b.memory_mib),
    }
}

fn container_need(c: &Container, document: usize, pod: &str) -> Result<HostRoom, WorldError> {
    let resources = c.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let mut total = HostRoom::default();
    for resource in ["cpu", "memory"] {
        let quantity = requests.and_then(|r| r.get(resource));
        if let Some(q) = quantity.or_else(|| limits.and_then(|l| l.get(resource))) {
            total = total.plus(&resource_need(resource, q, document, pod)?);
        }
    }
    Ok(total)
}

fn resource_need(
    resource: &str,
    quantity: &Quantity,
    document: usize,
    pod: &str,
) -> Result<HostRoom, WorldError> {
    let what = || format!("Pod {pod} {resource}");
    Ok(match resource {
        "cpu" => HostRoom {
            cpu_milli: milli(quantity, document, what)?,
            memory_mib: 0,
        },
        "memory" => HostRoom {
            cpu_milli: 0,
            memory_mib: mebibytes(quantity, document, what)?,
        },
        _ => HostRoom::default(),
    })
}

fn milli(q: &Quantity, document: usize, what: impl Fn() -> String) -> Result<u64, WorldError> {
    Milli::parse(&q.0)
        .map(|m| m.0)
        .map_err(|source| WorldError::Quantity {
            document,
            what: what(),
            source,
        })
}

/// Bytes as whole MiB, rounded up (a request never shrinks).
fn mebibytes(q: &Quantity, document: usize, what: impl Fn() -> String) -> Result<u64, WorldError> {
    let bytes = milli(q, document, what)?.div_ceil(1000);
    Ok(bytes.div_ceil(1 << 20))
}
