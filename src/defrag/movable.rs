//! Which running pods a plan may move (docs/defrag.md, "Who may move"): only a pod its
//! controller recreates (a ReplicaSet, StatefulSet or Job present in the cluster), that
//! opted in (`gpu-admission.io/movable: "true"`) and whose PodDisruptionBudgets allow a
//! disruption now; the planner adds that no pod of higher priority than the pending
//! pod's ever moves. A plan that would disrupt one budget more than it allows is not
//! used ([`Mobility::overdrawn`]).

use std::collections::BTreeMap;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::snapshot::world::{CONTROLLER_KINDS, Owner, PodFacts, World};

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

/// Why a running pod stays where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stay {
    NotOptedIn,
    NoController,
    ControllerAbsent(Owner),
    Budget(String),
    Inactive,
    /// A pod of its controller was moved within `defrag.cooldownSeconds`.
    Cooldown,
}

impl Stay {
    /// A short name, for counting (`kept` in the report).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Stay::NotOptedIn => "not_opted_in",
            Stay::NoController => "no_controller",
            Stay::ControllerAbsent(_) => "controller_absent",
            Stay::Budget(_) => "disruption_budget",
            Stay::Inactive => "inactive",
            Stay::Cooldown => "cooldown",
        }
    }
}

impl DisruptionBudget {
    pub(crate) fn of(
        pdb: &PodDisruptionBudget,
        pods: &BTreeMap<String, PodFacts>,
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
        budget.allowed = match pdb.status.as_ref() {
            Some(status) => u32::try_from(status.disruptions_allowed).unwrap_or(0),
            None => {
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
pub(crate) fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
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

/// The rules, applied to the cluster's pods once.
#[derive(Debug)]
pub(crate) struct Mobility<'w> {
    world: &'w World,
    pub(crate) budgets: Vec<DisruptionBudget>,
}

impl<'w> Mobility<'w> {
    pub(crate) fn new(world: &'w World) -> Self {
        let budgets = world.budgets.iter();
        let budgets = budgets
            .map(|pdb| DisruptionBudget::of(pdb, &world.pods))
            .collect();
        Mobility { world, budgets }
    }

    /// Whether the pod `key` may be moved, or why it stays.
    pub(crate) fn check(&self, key: &str) -> Result<(), Stay> {
        let pod = self.world.pods.get(key).ok_or(Stay::Inactive)?;
        if !pod.active || pod.node.is_none() {
            return Err(Stay::Inactive);
        }
        if !pod.opted_in {
            return Err(Stay::NotOptedIn);
        }
        let owner = pod
            .owner
            .as_ref()
            .filter(|o| CONTROLLER_KINDS.contains(&o.kind.as_str()));
        let owner = owner.ok_or(Stay::NoController)?;
        let id = (
            pod.namespace.clone(),
            owner.kind.clone(),
            owner.name.clone(),
        );
        if !self.world.controllers.contains(&id) {
            return Err(Stay::ControllerAbsent(owner.clone()));
        }
        if self.world.cooling.contains(&owner.uid) {
            return Err(Stay::Cooldown);
        }
        let blocked = self.budgets(pod).find(|b| b.allowed == 0);
        match blocked {
            Some(budget) => Err(Stay::Budget(budget.name.clone())),
            None => Ok(()),
        }
    }

    fn budgets<'a>(&'a self, pod: &'a PodFacts) -> impl Iterator<Item = &'a DisruptionBudget> + 'a {
        self.budgets.iter().filter(|b| b.guards(pod))
    }

    /// Of `moved` (in the plan's order), the first pod that would disrupt a budget
    /// beyond what it allows, with the budget's name.
    pub(crate) fn overdrawn<'k>(&self, moved: &[&'k str]) -> Option<(&'k str, String)> {
        let mut drawn: BTreeMap<&str, u32> = BTreeMap::new();
        for &key in moved {
            let Some(pod) = self.world.pods.get(key) else {
                continue;
            };
            for budget in self.budgets(pod) {
                let count = drawn.entry(&budget.name).or_default();
                *count += 1;
                if *count > budget.allowed {
                    return Some((key, budget.name.clone()));
                }
            }
        }
        None
    }
}
