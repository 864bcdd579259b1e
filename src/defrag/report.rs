//! What `defrag` prints: per pending pod, its plan (moves, then the target node and its
//! GPUs) or why there is none; text for people, JSON (`-o json`) for tools.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::cache::plan_hold::PlanHold;
use crate::cache::pod::{key_parts, shown_to};
use crate::placement::Assignment;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Text,
    Json,
}

/// One running pod moved: off `from`, onto the GPUs `gpus` of `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Step {
    pub(crate) pod: String,
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) gpus: Vec<u8>,
    /// The moved pod's uid and its controller's (the mover checks the live pod against
    /// them before it evicts): never printed.
    #[serde(skip)]
    pub(crate) uid: String,
    #[serde(skip)]
    pub(crate) owner: Option<String>,
}

/// A pending pod's plan: it fits on `node`, GPUs `gpus`, after `moves` (none: it fits
/// now).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PlanOut {
    pub(crate) pod: String,
    pub(crate) node: String,
    pub(crate) gpus: Vec<u8>,
    pub(crate) moves: Vec<Step>,
    /// What carrying the plan out holds (its `since` and `until` still to set), when
    /// every moved pod names its controller: the mover's, never printed.
    #[serde(skip)]
    pub(crate) hold: Option<PlanHold>,
}

impl PlanOut {
    /// One line for an Event on the pending pod, which its tenant reads: "fits on
    /// node-7 (GPUs 0,1) after moving team-a/x (node-7 → node-3)"; a pod of another
    /// namespace is not named ([`shown_to`]).
    pub(crate) fn sentence(&self) -> String {
        let gpus = list(&self.gpus);
        let namespace = key_parts(&self.pod).0;
        let moves: Vec<String> = (self.moves.iter())
            .map(|m| format!("{} ({} → {})", shown_to(namespace, &m.pod), m.from, m.to))
            .collect();
        match moves.is_empty() {
            true => format!("fits now on {} (GPUs {gpus})", self.node),
            false => format!(
                "fits on {} (GPUs {gpus}) after moving {}",
                self.node,
                moves.join(", ")
            ),
        }
    }
}

/// A pending pod without a plan, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Unplanned {
    pub(crate) pod: String,
    pub(crate) reason: String,
}

/// Every answer, and how many running GPU pods each rule keeps in place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Report {
    pub(crate) plans: Vec<PlanOut>,
    pub(crate) unplanned: Vec<Unplanned>,
    /// Running GPU pods by whether they may move (`movable`) or the rule that keeps
    /// them (`not_opted_in`, `no_controller`, `controller_absent`,
    /// `disruption_budget`).
    pub(crate) kept: BTreeMap<&'static str, usize>,
}

impl Report {
    pub(crate) fn add(&mut self, answer: Result<PlanOut, Unplanned>) {
        match answer {
            Ok(plan) => self.plans.push(plan),
            Err(no) => self.unplanned.push(no),
        }
    }

    pub(crate) fn render(&self, output: Output) -> serde_json::Result<String> {
        match output {
            Output::Json => serde_json::to_string_pretty(self).map(|s| s + "\n"),
            Output::Text => Ok(self.text()),
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        if self.plans.is_empty() && self.unplanned.is_empty() {
            out.push_str("no pending GPU pod\n");
        }
        for plan in &self.plans {
            let gpus = list(&plan.gpus);
            let _ = match plan.moves.len() {
                0 => writeln!(out, "{}: fits now on {} (GPUs {gpus})", plan.pod, plan.node),
                n => writeln!(
                    out,
                    "{}: fits on {} (GPUs {gpus}) after {n} move{}:",
                    plan.pod,
                    plan.node,
                    if n == 1 { "" } else { "s" }
                ),
            };
            for step in &plan.moves {
                let gpus = list(&step.gpus);
                let _ = writeln!(
                    out,
                    "  move {} from {} to {} (GPUs {gpus})",
                    step.pod, step.from, step.to
                );
            }
        }
        for no in &self.unplanned {
            let _ = writeln!(out, "{}: no plan: {}", no.pod, no.reason);
        }
        let kept: Vec<String> = self.kept.iter().map(|(k, n)| format!("{k} {n}")).collect();
        if !kept.is_empty() {
            let _ = writeln!(out, "running GPU pods: {}", kept.join(", "));
        }
        out
    }
}

fn list(gpus: &[u8]) -> String {
    let text: Vec<String> = gpus.iter().map(u8::to_string).collect();
    text.join(",")
}

/// The GPU indices an assignment uses, in order.
pub(crate) fn gpu_indices(assignment: &Assignment) -> Vec<u8> {
    let mut gpus: Vec<u8> = assignment
        .choices
        .iter()
        .flat_map(|c| c.gpus.iter().copied())
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}
