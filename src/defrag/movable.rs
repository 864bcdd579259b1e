//! Which running pods a plan may move (docs/defrag.md, "Who may move"): only a pod its
//! controller recreates (a ReplicaSet, StatefulSet or Job present in the cluster), that
//! opted in (`gpu-admission.io/movable: "true"`) and whose PodDisruptionBudgets allow a
//! disruption now; the planner adds that no pod of higher priority than the pending
//! pod's ever moves. A plan that would disrupt one budget more than it allows is not
//! used ([`Mobility::overdrawn`]).

use std::collections::BTreeMap;

use crate::snapshot::DisruptionBudget;
use crate::snapshot::world::{CONTROLLER_KINDS, Owner, PodFacts, World};

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

/// The rules, applied to the cluster's pods.
#[derive(Debug)]
pub(crate) struct Mobility<'w> {
    world: &'w World,
}

impl<'w> Mobility<'w> {
    pub(crate) fn new(world: &'w World) -> Self {
        Mobility { world }
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
        self.world.budgets.iter().filter(|b| b.guards(pod))
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
