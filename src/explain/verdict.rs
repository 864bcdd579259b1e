//! What `explain` answers: per stage a reason code from one fixed set (docs/explain.md
//! lists them with an example each) and its numbers, the first stage that stops the pod
//! as the pod's code, and what would change the verdict.

use std::fmt::Write as _;

use serde::Serialize;

/// Why a GPU pod waits, or that it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Code {
    /// The namespace's quota has no room for it.
    QuotaExceeded,
    /// The quota has room, and it waits in the quota queue behind other pods.
    QueuedBehind,
    /// Past its quota's own `hard`, and the cohort lends no more.
    CohortLimit,
    /// Its namespace may not use the GPU model it names (or any: no quota, none named).
    ModelNotAllowed,
    /// No open node of a model (and pool) it may use.
    NoNodeOfModel,
    /// Enough free GPU of its models in total, but no node or GPU set that fits.
    Fragmented,
    /// Not enough free GPU of its models in total.
    #[serde(rename = "InsufficientGPUs")]
    InsufficientGpus,
    /// Only MIG slices of a profile its namespace caps would take it.
    ProfileCap,
    /// A ResourceClaim's selectors match no published GPU of a model it may use.
    SelectorNoMatch,
    /// It would be admitted and placed now.
    Fits,
    /// It is bound to a node.
    Placed,
}

impl Code {
    /// Whether the pod goes on past this stage.
    pub(crate) fn passes(self) -> bool {
        matches!(self, Code::Fits | Code::Placed)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Code::QuotaExceeded => "QuotaExceeded",
            Code::QueuedBehind => "QueuedBehind",
            Code::CohortLimit => "CohortLimit",
            Code::ModelNotAllowed => "ModelNotAllowed",
            Code::NoNodeOfModel => "NoNodeOfModel",
            Code::Fragmented => "Fragmented",
            Code::InsufficientGpus => "InsufficientGPUs",
            Code::ProfileCap => "ProfileCap",
            Code::SelectorNoMatch => "SelectorNoMatch",
            Code::Fits => "Fits",
            Code::Placed => "Placed",
        }
    }
}

/// One stage's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Stage {
    /// `admission`, `placement` or `dra`.
    pub(crate) stage: &'static str,
    pub(crate) code: Code,
    pub(crate) message: String,
}

/// What would change the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Counterfactual {
    /// `other_model` (fits now as another model), `moves` (fits after moving running
    /// pods), `ends` (fits when a running pod of its namespace ends).
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

/// The answer for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Explanation {
    pub(crate) pod: String,
    /// The first stage's code that stops the pod; `Fits` or `Placed` when none does.
    pub(crate) code: Code,
    pub(crate) stages: Vec<Stage>,
    pub(crate) counterfactuals: Vec<Counterfactual>,
}

impl Explanation {
    pub(crate) fn new(
        pod: String,
        stages: Vec<Stage>,
        counterfactuals: Vec<Counterfactual>,
    ) -> Self {
        let stops = stages.iter().find(|s| !s.code.passes());
        let code = stops.or(stages.last()).map_or(Code::Fits, |s| s.code);
        Explanation {
            pod,
            code,
            stages,
            counterfactuals,
        }
    }

    pub(crate) fn text(&self) -> String {
        let mut out = format!("{}: {}\n", self.pod, self.code.name());
        for stage in &self.stages {
            let _ = writeln!(
                out,
                "  {:<10} {:<16} {}",
                stage.stage,
                stage.code.name(),
                stage.message
            );
        }
        for what_if in &self.counterfactuals {
            let _ = writeln!(out, "  would change it: {}", what_if.message);
        }
        out
    }
}
