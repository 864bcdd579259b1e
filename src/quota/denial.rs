//! The words a person reads when a GPU pod is refused or goes past a `Warn` quota
//! (docs/design.md, "Quota"): each denial, and the message `kubectl` prints for it.

use std::fmt;

use crate::placement::quantity::Milli;

use super::cohort::Short;

/// Why a pod is refused. The message is what `kubectl` prints after "denied the request:".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    Exceeded(Exceeded),
    NoModelHasRoom {
        namespace: String,
        tried: Vec<Exceeded>,
    },
    ModelNotAllowed {
        namespace: String,
        model: String,
        allowed: Vec<String>,
    },
    QuotaRequired {
        namespace: String,
    },
    UntypedDenied {
        namespace: String,
    },
    /// Created bound to a node (`spec.nodeName`) it cannot be charged to.
    BoundNode {
        namespace: String,
        node: String,
        problem: NodeProblem,
    },
    /// Accepts several models but another scheduler places it, so the extender never
    /// charges it at placement.
    NeedsGpuScheduler {
        namespace: String,
        models: Vec<String>,
        scheduler: String,
        gpu_scheduler: String,
        type_annotation: String,
    },
}

impl Denial {
    /// The quota keys whose room was too little: more room could change the answer.
    pub(crate) fn short_of(&self) -> impl Iterator<Item = &str> {
        let exceeded: &[Exceeded] = match self {
            Denial::Exceeded(e) => std::slice::from_ref(e),
            Denial::NoModelHasRoom { tried, .. } => tried,
            _ => &[],
        };
        exceeded.iter().map(|e| e.model.as_str())
    }
}

/// Why a pod created bound to a node cannot be charged to that node's model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeProblem {
    /// gpu-admission does not know the node (not a GPU node, or not seen yet).
    Unknown,
    /// The node has no GPU model label.
    NoModel,
    ModelNotWanted {
        model: String,
        wanted: Vec<String>,
    },
    PoolNotAllowed {
        pool: Option<String>,
        allowed: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// A quota key: a model or a MIG profile key (`<model>/<profile>`).
    pub(crate) model: String,
    pub(super) requested: Milli,
    pub(super) used: Milli,
    pub(super) hard: Milli,
    /// `<namespace>/<name>` of the quota, or of every quota when none lists `model`.
    pub(super) quota: String,
    /// Whether some quota lists `model`; when none does, `model` is the pod's own word.
    pub(crate) listed: bool,
    /// The quota's cohort, and why it lends no more (boxed: rare, and a denial is
    /// passed by value).
    pub(super) cohort: Option<Box<(String, Short)>>,
}

/// The refusal of one quota, as `kubectl` prints it (a `Warn` quota's warning too).
impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU quota exceeded in namespace {:?} for {}: requested {}, used {} of {} (GPUQuota {})",
            self.namespace(),
            self.model,
            self.requested,
            self.used,
            self.hard,
            self.quota
        )?;
        match self.cohort.as_deref() {
            Some((cohort, short)) => write!(f, "; cohort {cohort}: {short}"),
            None => Ok(()),
        }
    }
}

impl Exceeded {
    /// The namespace of the quota (or quotas) that had no room.
    pub(crate) fn namespace(&self) -> &str {
        self.quota.split('/').next().unwrap_or_default()
    }

    /// The quota key refused, and how much more room the request needs than the quota
    /// has (`explain`'s "fits when ... ends").
    pub(crate) fn short_by(&self) -> (&str, Milli) {
        let room = self.hard.0.saturating_sub(self.used.0);
        (&self.model, Milli(self.requested.0.saturating_sub(room)))
    }

    /// The quota's cohort and what it can lend now of the refused key, when that is less
    /// than the request needs past the quota's room (`explain`'s `cohort`
    /// counterfactual); `None` outside a cohort or past a borrowing limit.
    pub(crate) fn cohort_lends(&self) -> Option<(&str, Milli)> {
        match self.cohort.as_deref()? {
            (cohort, Short::NothingToBorrow { free } | Short::Lent { free }) => {
                Some((cohort.as_str(), *free))
            }
            (_, Short::BorrowingLimit { .. }) => None,
        }
    }

    /// Whether the quota is in a cohort that lends it no more (`explain`'s
    /// `CohortLimit`).
    pub(crate) fn by_cohort(&self) -> bool {
        self.cohort.is_some()
    }

    fn short(&self) -> String {
        format!("{}: used {} of {}", self.model, self.used, self.hard)
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::Exceeded(e) => write!(f, "{e}"),
            Denial::NoModelHasRoom { namespace, tried } => {
                let tried: Vec<String> = tried.iter().map(Exceeded::short).collect();
                let requested = tried_requested(self);
                write!(
                    f,
                    "GPU quota exceeded in namespace {namespace:?} for every model the pod accepts: requested {requested}; {}",
                    tried.join("; ")
                )
            }
            Denial::ModelNotAllowed {
                namespace,
                model,
                allowed,
            } => write!(
                f,
                "GPU model {model} is not in any GPUQuota of namespace {namespace:?} (allowed: {})",
                allowed.join(", ")
            ),
            Denial::QuotaRequired { namespace } => write!(
                f,
                "namespace {namespace:?} has no GPUQuota, and GPU pods need one here (quotaRequired)"
            ),
            Denial::UntypedDenied { namespace } => write!(
                f,
                "the pod names no GPU model and namespace {namespace:?} has no GPUQuota to default one; set the gpu-admission.io/gpu-type annotation"
            ),
            Denial::BoundNode {
                namespace,
                node,
                problem,
            } => {
                write!(f, "the pod is bound to node {node:?} (spec.nodeName), ")?;
                bound_node_problem(f, namespace, problem)
            }
            Denial::NeedsGpuScheduler {
                namespace,
                models,
                scheduler,
                gpu_scheduler,
                type_annotation,
            } => write!(
                f,
                "the pod accepts several GPU models ({}) and is scheduled by {scheduler:?}, so the GPU quota of namespace {namespace:?} cannot charge it to the model it lands on; name one model in the {type_annotation} annotation, or use schedulerName {gpu_scheduler:?}",
                models.join(",")
            ),
        }
    }
}

/// The rest of a [`Denial::BoundNode`] message: what is wrong with the node.
fn bound_node_problem(
    f: &mut fmt::Formatter<'_>,
    namespace: &str,
    problem: &NodeProblem,
) -> fmt::Result {
    const CHARGE: &str = "a pod created on a node is charged to that node's GPU model";
    match problem {
        NodeProblem::Unknown => write!(
            f,
            "which gpu-admission does not know as a GPU node; namespace {namespace:?} has a GPUQuota and {CHARGE}"
        ),
        NodeProblem::NoModel => write!(
            f,
            "which has no GPU model label; namespace {namespace:?} has a GPUQuota and {CHARGE}"
        ),
        NodeProblem::ModelNotWanted { model, wanted } => write!(
            f,
            "whose GPU model {model} is not one the pod accepts ({}); {CHARGE}",
            wanted.join(",")
        ),
        NodeProblem::PoolNotAllowed {
            pool: Some(pool),
            allowed,
        } => write!(
            f,
            "whose node pool {pool} is not one namespace {namespace:?} may use ({})",
            allowed.join(",")
        ),
        NodeProblem::PoolNotAllowed {
            pool: None,
            allowed,
        } => write!(
            f,
            "which has no node pool label; namespace {namespace:?} may use only the pools {}",
            allowed.join(",")
        ),
    }
}

fn tried_requested(denial: &Denial) -> String {
    match denial {
        Denial::NoModelHasRoom { tried, .. } => tried
            .first()
            .map(|e| e.requested.to_string())
            .unwrap_or_default(),
        _ => String::new(),
    }
}
