//! The stages of a GPU pod's way, judged on the cache with the same rules the webhooks
//! and the extender apply: admission (`NamespaceQuota::admit`, the quota queue's line)
//! and placement (`NamespaceQuota::eligibility` and the placer's fit). Nothing is
//! charged, held or written. Every node fit is counted, and the judgment stops at the
//! next one once its caller has left (`effort`).

use crate::cache::{CachedPod, ClusterState};
use crate::placement::mig::MigResources;
use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;
use crate::placement::{Misfit, NodeGpus, Outcome, Placer, place};
use crate::quota::{AdmitRules, Denial, StatusError};

use super::ExplainError;
use super::effort::Effort;
use super::verdict::{Code, Counterfactual, Explanation, Stage};
use crate::config::Config;

/// Most pods of a quota queue's line read to find a pod's place.
const LINE_READ: usize = 10_000;

/// What judging needs besides the pod.
pub(crate) struct Judge<'a> {
    pub(crate) state: &'a ClusterState,
    pub(crate) placer: &'a Placer,
    pub(crate) mig: &'a MigResources,
    pub(crate) rules: AdmitRules,
    pub(crate) max_pass_over: i64,
    /// Unix seconds: a manifest is judged as if created now.
    pub(crate) now: i64,
    /// The node fits spent, and whether the caller still waits.
    pub(crate) effort: Effort,
}

/// The pod judged: its key, its projection, and whether it exists (else: what-if).
pub(crate) struct Judged<'p> {
    pub(crate) key: &'p str,
    pub(crate) pod: &'p CachedPod,
    pub(crate) exists: bool,
}

impl Judged<'_> {
    pub(super) fn namespace(&self) -> &str {
        crate::cache::pod::key_parts(self.key).0
    }

    fn created(&self, now: i64) -> i64 {
        if self.exists { self.pod.created } else { now }
    }
}

impl<'a> Judge<'a> {
    /// A judge of pods on `state`, with `config`'s rules, at unix second `now`.
    pub(crate) fn new(
        state: &'a ClusterState,
        placer: &'a Placer,
        mig: &'a MigResources,
        config: &Config,
        now: i64,
    ) -> Self {
        Judge {
            state,
            placer,
            mig,
            rules: config.admit_rules(),
            max_pass_over: config.queue_rules().max_pass_over,
            now,
            effort: Effort::default(),
        }
    }

    /// The same judge for a caller who may leave: `effort` counts its work and says
    /// when it has gone.
    pub(crate) fn for_caller(self, effort: Effort) -> Self {
        Judge { effort, ..self }
    }

    /// Every stage's verdict for `subject`, and, when one stops it, the counterfactuals
    /// judging alone finds (another model; a running pod's end). The planner's moves are
    /// the caller's to add: they need more of the cluster than the cache holds.
    /// `ExplainError::Abandoned` once the caller has left.
    pub(crate) fn explain(&self, subject: &Judged<'_>) -> Result<Explanation, ExplainError> {
        let (admission, denial) = self.admission(subject)?;
        self.effort.check()?;
        let placement = self.placement(subject);
        // A caller gone mid-way leaves a stage judged on part of the nodes: never given.
        self.effort.check()?;
        let mut counterfactuals = Vec::new();
        if !admission.code.passes() || !placement.code.passes() {
            counterfactuals = self.other_models(subject)?;
            if let Some(denial) = &denial {
                counterfactuals.extend(self.ends(subject, denial));
                counterfactuals.extend(cohort_lends(denial));
            }
        }
        let stages = vec![admission, placement];
        Ok(Explanation::new(
            subject.key.to_string(),
            stages,
            counterfactuals,
        ))
    }

    /// Admission: bound, admitted at creation, or (waiting in the quota queue, or not
    /// yet created) what the quota says now.
    /// With the stage, the quota's refusal, if any (the `ends` counterfactual reads it).
    pub(crate) fn admission(
        &self,
        subject: &Judged<'_>,
    ) -> Result<(Stage, Option<Denial>), StatusError> {
        let stage = |code, message| Stage {
            stage: "admission",
            code,
            message,
        };
        let pod = subject.pod;
        if subject.exists && !pod.gated {
            let message = if pod.bound {
                "admitted; bound".to_string()
            } else {
                "admitted at creation and charged".to_string()
            };
            return Ok((stage(Code::Fits, message), None));
        }
        let quota = self.state.namespace_quota(subject.namespace());
        if subject.exists && quota.being_released(&subject.pod.uid) {
            let message = "let out of the quota queue: charged, its gate coming off".into();
            return Ok((stage(Code::Fits, message), None));
        }
        let wanted = quota.wanted(&pod.models);
        let costs = quota.costs(&pod.request, &wanted.models, subject.created(self.now));
        let verdict = quota.admit(&wanted, &costs, self.rules)?;
        let queues = wanted.models.len() == 1 && quota.limits.queues(&wanted.models[0]);
        Ok(match verdict {
            Ok(_) if pod.gated => {
                let (place, of) = self.line_place(subject);
                let message = format!(
                    "its quota has room now; it waits in the quota queue, {place} of {of} in line"
                );
                (stage(Code::QueuedBehind, message), None)
            }
            Ok(_) => {
                let message = "its quota has room: it would be admitted".into();
                (stage(Code::Fits, message), None)
            }
            Err(denial) => {
                let mut message = denial.to_string();
                if pod.gated {
                    let (place, of) = self.line_place(subject);
                    message += &format!("; it waits in the quota queue, {place} of {of} in line");
                } else if queues {
                    message += "; it would wait in the quota queue (onExceed: Queue)";
                }
                (stage(denial_code(&denial), message), Some(denial))
            }
        })
    }

    /// The pod's place in its namespace's quota queue (from 1), and the line's length
    /// (as far as read).
    fn line_place(&self, subject: &Judged<'_>) -> (usize, usize) {
        let line =
            self.state
                .waiting_line(subject.namespace(), self.now, self.max_pass_over, LINE_READ);
        let at = line.iter().position(|w| w.key == subject.key);
        (at.map_or(line.len(), |at| at + 1), line.len())
    }

    /// Placement: bound or held, else the extender's rules and fit over every open node.
    pub(crate) fn placement(&self, subject: &Judged<'_>) -> Stage {
        let stage = |code, message| Stage {
            stage: "placement",
            code,
            message,
        };
        let pod = subject.pod;
        if let (Some(node), true) = (&pod.node, subject.exists) {
            return if pod.bound {
                stage(Code::Placed, format!("bound to node {node}"))
            } else {
                stage(
                    Code::Fits,
                    format!("placed on node {node}, waiting for the bind"),
                )
            };
        }
        let quota = self.state.namespace_quota(subject.namespace());
        let wanted = quota.wanted(&pod.models);
        let models = wanted.models.clone();
        let nodes: Vec<&NodeGpus> = self.open_nodes().collect();
        let outcome = self.fit_on(subject, wanted, &nodes, Effort::fit);
        if let Some(message) = fits_message(&outcome, &nodes) {
            return stage(Code::Fits, message);
        }
        self.misfit_stage(subject, &models, &nodes, outcome, stage)
    }

    /// The placer's choice for `subject` wanting `wanted` among `nodes`, under the
    /// extender's rules; each node tried is counted by `count`, which stops the fitting
    /// when it says no (the caller left, or a budget is spent).
    pub(super) fn fit_on(
        &self,
        subject: &Judged<'_>,
        wanted: WantedModels,
        nodes: &[&NodeGpus],
        count: fn(&Effort) -> bool,
    ) -> Outcome {
        let pod = subject.pod;
        let quota = self.state.namespace_quota(subject.namespace());
        let limits = quota.limits.clone();
        let created = subject.created(self.now);
        let rules = quota.eligibility(&limits, wanted, (&pod.request, created), self.mig);
        let counted = nodes.iter().copied().take_while(|_| count(&self.effort));
        place(self.placer, &pod.request, counted, |n| {
            rules.admits(n, &pod.request)
        })
    }

    /// Why no node of `nodes` took the pod wanting `models`, from the placer's misfits.
    fn misfit_stage(
        &self,
        subject: &Judged<'_>,
        models: &[String],
        nodes: &[&NodeGpus],
        outcome: Outcome,
        stage: impl Fn(Code, String) -> Stage,
    ) -> Stage {
        let pod = subject.pod;
        let wanted = if models.is_empty() {
            "any model".to_string()
        } else {
            models.join(", ")
        };
        // Nodes of its models that could take it once free (`of_model`), those too small
        // ever to (`too_small`, e.g. fewer GPUs than it asks).
        let (mut of_model, mut too_small) = (Vec::new(), None);
        let (mut capped, mut quota_full) = (None, None);
        for (at, misfit) in &outcome.misfits {
            match misfit {
                Misfit::ModelNotWanted { .. } | Misfit::PoolNotAllowed { .. } => {}
                Misfit::QuotaFull { model, detail } if model.contains('/') => {
                    capped = Some(detail.clone());
                }
                Misfit::QuotaFull { detail, .. } => quota_full = Some(detail.clone()),
                misfit if misfit.is_unresolvable() => too_small = Some(misfit.to_string()),
                _ => of_model.push(nodes[*at]),
            }
        }
        if of_model.is_empty() {
            if let Some(why) = too_small {
                let message = format!("no open node of {wanted} could ever take it: {why}");
                return stage(Code::NoNodeOfModel, message);
            }
            if let Some(detail) = capped {
                return stage(Code::ProfileCap, detail);
            }
            if let Some(detail) = quota_full {
                return stage(Code::QuotaExceeded, detail);
            }
            let closed = self.state.nodes().filter(|n| n.closed.is_some()).count();
            let message = format!(
                "no open node of {wanted} in the pools it may use ({closed} nodes closed: cordoned, tainted or not Ready)"
            );
            return stage(Code::NoNodeOfModel, message);
        }
        let need = pod.request.core_units();
        let free: u64 = of_model
            .iter()
            .map(|n| u64::from(n.total_free_core()))
            .sum();
        let gpus = |core: u64| core as f64 / 100.0;
        let (free_gpus, nodes, need_gpus) = (gpus(free), of_model.len(), gpus(need));
        let counted =
            format!("{free_gpus} GPUs of {wanted} are free on {nodes} nodes, it needs {need_gpus}");
        if free >= need {
            let message = format!("{counted} on one node: no node or GPU set fits");
            stage(Code::Fragmented, message)
        } else {
            stage(Code::InsufficientGpus, counted)
        }
    }

    pub(super) fn open_nodes(&self) -> impl Iterator<Item = &'a NodeGpus> + use<'a> {
        let open = self.state.nodes().filter(|n| n.closed.is_none());
        open.filter(|n| n.gpu_count() > 0)
    }

    /// When a quota refused the pod for one model: the running pod of its namespace
    /// whose end frees enough of that model, the smallest such (then by name); when no
    /// single one does, the fewest pods that do together (the largest first).
    pub(crate) fn ends(&self, subject: &Judged<'_>, denial: &Denial) -> Option<Counterfactual> {
        let Denial::Exceeded(exceeded) = denial else {
            return None;
        };
        let (key, short) = exceeded.short_by();
        let namespace = subject.namespace();
        let running = self.state.pods().filter(|(k, p)| {
            p.bound && &***k != subject.key && crate::cache::pod::key_parts(k).0 == namespace
        });
        let mut frees: Vec<(Milli, &str)> = running
            .filter_map(|(k, _)| {
                let mut charge = self.state.charge_of(k);
                let (_, freed) = charge.find(|(of, freed)| *of == key && freed.0 > 0)?;
                Some((freed, &**k))
            })
            .collect();
        let message = match frees.iter().filter(|(f, _)| f.0 >= short.0).min() {
            Some((freed, pod)) => {
                format!("fits when {pod} ends (frees {freed} {key}; {short} more is needed)")
            }
            None => {
                frees.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
                let (mut pods, mut freed) = (Vec::new(), Milli(0));
                for (frees, pod) in frees {
                    if freed.0 >= short.0 {
                        break;
                    }
                    freed.0 += frees.0;
                    pods.push(pod);
                }
                if freed.0 < short.0 {
                    return None;
                }
                let (last, first) = pods.split_last()?;
                format!(
                    "fits when {} and {last} end (they free {freed} {key} together; {short} more is needed)",
                    first.join(", ")
                )
            }
        };
        Some(Counterfactual {
            kind: "ends",
            message,
        })
    }
}

/// "fits now on node N (GPUs 0,1)" when `outcome` chose one of `nodes`.
pub(super) fn fits_message(outcome: &Outcome, nodes: &[&NodeGpus]) -> Option<String> {
    let (at, assignment) = outcome.chosen.as_ref()?;
    let gpus = crate::defrag::gpu_indices(assignment);
    let gpus: Vec<String> = gpus.iter().map(u8::to_string).collect();
    Some(format!(
        "fits now on node {} (GPUs {})",
        nodes[*at].name,
        gpus.join(",")
    ))
}

/// "Cohort c can lend k": for each quota the refusal names whose cohort lends less than
/// the pod needs past the quota's own room.
fn cohort_lends(denial: &Denial) -> Vec<Counterfactual> {
    let tried: Vec<&crate::quota::Exceeded> = match denial {
        Denial::Exceeded(exceeded) => vec![exceeded],
        Denial::NoModelHasRoom { tried, .. } => tried.iter().collect(),
        _ => Vec::new(),
    };
    let lends = tried.into_iter().filter_map(|exceeded| {
        let (cohort, free) = exceeded.cohort_lends()?;
        let key = &exceeded.model;
        let message = format!(
            "cohort {cohort} can lend {free} {key} now, not enough: fits when its members leave more idle or borrowers give some back"
        );
        Some(Counterfactual {
            kind: "cohort",
            message,
        })
    });
    lends.collect()
}

/// The code of a refusal at admission.
fn denial_code(denial: &Denial) -> Code {
    match denial {
        Denial::Exceeded(e) if e.by_cohort() => Code::CohortLimit,
        Denial::NoModelHasRoom { tried, .. } if tried.iter().all(|e| e.by_cohort()) => {
            Code::CohortLimit
        }
        Denial::Exceeded(_) | Denial::NoModelHasRoom { .. } => Code::QuotaExceeded,
        Denial::ModelNotAllowed { .. }
        | Denial::QuotaRequired { .. }
        | Denial::UntypedDenied { .. }
        | Denial::NeedsGpuScheduler { .. } => Code::ModelNotAllowed,
        Denial::BoundNode { .. } => Code::NoNodeOfModel,
    }
}
