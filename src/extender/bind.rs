//! The bind verb (`bindVerb: bind`, with `placement.bindVerb: true`): the filter chose
//! node and GPUs and holds them in memory; here, in kube-scheduler's parallel binding
//! cycle, the choice is charged (what the placement adds, unless the filter already
//! wrote it with its charge) and written — annotations and `spec.nodeName` in one
//! Binding — so the scheduler's serial cycle waits on no API write of ours
//! (docs/design.md, "The extender: filter, then bind"). A bind call under
//! `placement.bindVerb: false` switches the filter to holding only
//! (`Backend::note_bind_call`).

use crate::backend::{Backend, WriteError};
use crate::cache::{PodKey, Subject};
use crate::config::Config;
use crate::placement::learn::LearningPlacer;
use crate::wire::binding::{ExtenderBindingArgs, ExtenderBindingResult};

use super::plan::plan;

/// How a bind call ended, for metrics and logs (a bounded set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BindOutcome {
    Bound,
    /// The pod was already bound to that node (a retried call).
    AlreadyBound,
    /// The node cannot take the pod (any more): the scheduler tries again.
    Unfit,
    /// The pod is unknown, another one, or the API refused the binding.
    Error,
}

impl BindOutcome {
    pub(crate) const fn label(self) -> &'static str {
        match self {
            BindOutcome::Bound => "bound",
            BindOutcome::AlreadyBound => "already_bound",
            BindOutcome::Unfit => "unfit",
            BindOutcome::Error => "error",
        }
    }
}

/// Bind the pod the call names to its node with the placement held for it. A placement
/// on that node held by the filter (or recorded on the pod) is used as it is; without
/// one — the hold expired, or this replica restarted — the pod is placed again on that
/// node alone, with every check the filter makes.
pub(crate) async fn bind(
    backend: &Backend,
    config: &Config,
    placer: &LearningPlacer,
    args: &ExtenderBindingArgs,
) -> (ExtenderBindingResult, BindOutcome) {
    let cache = backend.writer();
    backend.note_bind_call(config.placement.bind_verb);
    let key: PodKey = format!("{}/{}", args.pod_namespace, args.pod_name).into();
    backend.ensure_pod(&key).await;
    let bound_here = cache.read(|state| {
        let pod = state.pod(&key)?;
        Some(pod.bound && *pod.uid == *args.pod_uid && pod.node.as_deref() == Some(&*args.node))
    });
    if bound_here == Some(true) {
        return (ExtenderBindingResult::default(), BindOutcome::AlreadyBound);
    }
    let subject = Subject::Known {
        uid: args.pod_uid.as_str().into(),
    };
    let (plan, decision) = match plan(backend, placer, key.clone(), subject, &[&args.node]) {
        Ok(planned) => planned,
        Err(error) => return failed(error.to_string(), BindOutcome::Error),
    };
    let Some(hold) = decision.hold else {
        let dra = cache.read(|state| state.dra_nodes(&key, &[&args.node]));
        if !dra.is_empty() {
            // DRA allocated its GPUs (kube-scheduler's claim): only the binding is ours.
            return match plan.bind(backend, &args.node, None).await {
                Ok(()) => (ExtenderBindingResult::default(), BindOutcome::Bound),
                Err(error) => failed(error.to_string(), BindOutcome::Error),
            };
        }
        let reason = decision.misfits.first().map(|(_, m)| m.to_string());
        let reason = reason.unwrap_or_else(|| "the node is not in gpu-admission's view".into());
        let error = format!("pod {key} cannot go to node {}: {reason}", args.node);
        return failed(error, BindOutcome::Unfit);
    };
    let assignment = hold.assignment.clone();
    if let Err(refusal) = plan.charge(backend, config).await {
        plan.undo(backend, hold, refusal.charged).await;
        return failed(refusal.reason, BindOutcome::Unfit);
    }
    let bound = plan.bind(backend, &args.node, Some(&assignment)).await;
    if let Err(error) = bound {
        if is_conflict(&error) {
            // Already bound (a retry after our first binding went through), or the pod
            // was replaced: the watch brings the truth; nothing held is released blindly.
            return failed(error.to_string(), BindOutcome::Error);
        }
        tracing::warn!(pod = %key, node = %args.node, %error, "binding failed; placement released");
        plan.undo(backend, hold, true).await;
        return failed(error.to_string(), BindOutcome::Error);
    }
    cache.write(|state| state.mark_bound(&key));
    tracing::info!(pod = %key, node = %args.node, "bound");
    (ExtenderBindingResult::default(), BindOutcome::Bound)
}

fn is_conflict(error: &WriteError) -> bool {
    matches!(error.api_code(), Some(409))
}

fn failed(error: String, outcome: BindOutcome) -> (ExtenderBindingResult, BindOutcome) {
    (ExtenderBindingResult { error }, outcome)
}
