//! The placement transaction, in one place: **plan** (under the cache lock: which copy
//! of the pod is placed, which nodes its quota lets it use, the policy's choice among
//! them, and a hold on the chosen GPUs), **record** (the quota charge a placement
//! adds, then the annotations gpu-manager reads — or, with the bind verb, one Binding),
//! and **undo** (release the hold, and a charge written for a placement that failed).
//! The filter verb, the bind verb and Volcano's predicate call it; the backend makes
//! each write stick the run mode's way.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::backend::{Ask, Backend, ChargeOutcome, WriteError};
use crate::cache::pod::key_parts;
use crate::cache::{
    AnnotationKeys, CachedPod, Candidates, FilterDecision, Hold, PlanError, PodKey, Subject,
};
use crate::config::Config;
use crate::placement::learn::LearningPlacer;
use crate::placement::models::WantedModels;
use crate::placement::{Assignment, GpuRequest, Outcome, Placer};
use crate::quota::eligible::Eligibility;
use crate::quota::pending::ChargeId;
use crate::quota::{Costs, ModelAmounts};

/// A placement being made (chosen and held, not yet recorded): what the record step
/// needs to know of it.
pub(super) struct Placing {
    pub(super) key: PodKey,
    uid: String,
    /// The GPU request of the pod placed: the cluster's copy in API mode.
    pub(super) request: GpuRequest,
    /// The models it accepts (empty: any), which the placer learns.
    pub(super) models: Vec<String>,
    /// What the quota ledger is charged at placement: all of it for a pod that
    /// accepts several models, what a dearer node costs beyond its admission charge
    /// otherwise (`None`: nothing).
    charge_at_placement: Option<PlacementCharge>,
    /// The placement kept is one already written with its charge (by the filter, or
    /// seen on the pod): the bind verb must not charge it again.
    recorded: bool,
}

pub(super) struct PlacementCharge {
    /// Per quota key, on the node's model.
    charge: ModelAmounts,
    node_model: Option<String>,
    /// The pod's creation second (the ledger's pending total it joins).
    created: i64,
}

/// Why a placement could not be recorded: the text goes to the node's reason.
pub(super) struct Refusal {
    pub(super) reason: String,
    /// The quota had no room (the scheduler may try elsewhere), not a failure of ours.
    pub(super) unfit: bool,
    /// The placement's charge was written before the step that failed: undo gives it
    /// back.
    pub(super) charged: bool,
}

/// Choose and hold a placement for the pod `subject` names among the nodes `names`,
/// under the cache lock: the first half of both the filter and the bind verb.
pub(super) fn plan(
    backend: &Backend,
    placer: &LearningPlacer,
    key: PodKey,
    subject: Subject,
    names: &[&str],
) -> Result<(Placing, FilterDecision), PlanError> {
    let namespace = key_parts(&key).0.to_string();
    let placer = placer.placer();
    let cache = backend.writer();
    let mig = &cache.projection().names.mig;
    cache.write(|state| {
        let held = state.take_subject(&key, subject)?;
        // The pod as the cluster has it decides what it wants and was charged.
        let pod = state.pod(&key);
        let uid = pod.map(|p| p.uid.to_string()).unwrap_or_default();
        let request = pod.map(|p| p.request.clone()).unwrap_or_default();
        let created = pod.map_or(0, |p| p.created);
        let quota = state.namespace_quota(&namespace);
        let own = pod.map(|p| p.models.as_slice()).unwrap_or_default();
        let wanted = quota.wanted(own);
        let models = wanted.models.clone();
        // Kept current as quotas change (not rebuilt from every quota per call); a copy,
        // as the state is changed below.
        let limits = quota.limits.clone();
        let eligibility = quota.eligibility(&limits, wanted, (&request, created), mig);
        let choice = Choice {
            placer: &placer,
            eligibility: &eligibility,
        };
        let decision = state.place_subject(
            &key,
            held,
            names,
            |cached, candidates| choice.choose(cached, candidates),
            Instant::now(),
        );
        let node = decision.hold.as_ref().map(|r| &*r.node);
        let charge_at_placement = node.and_then(|n| {
            let node_model = state.node(n)?.model.as_deref().map(str::to_string);
            let label = node_model.as_deref().unwrap_or_default();
            Some(PlacementCharge {
                charge: eligibility.placement_charge(label, &request)?,
                node_model,
                created,
            })
        });
        let kept = decision.hold.as_ref().is_some_and(|r| r.kept);
        let recorded = kept && state.placement_recorded(&key);
        let plan = Placing {
            key,
            uid,
            request,
            models,
            charge_at_placement,
            recorded,
        };
        Ok((plan, decision))
    })
}

/// What the policy chooses with: the rules a node must pass for the pod.
struct Choice<'a> {
    placer: &'a Placer,
    eligibility: &'a Eligibility<'a>,
}

impl Choice<'_> {
    /// The policy's choice among `candidates` for the cluster's copy of the pod.
    fn choose(&self, pod: &CachedPod, candidates: &mut Candidates<'_>) -> Outcome {
        candidates.place(self.placer, &pod.request, |node| {
            self.eligibility.admits(node, &pod.request)
        })
    }
}

impl Placing {
    fn namespace(&self) -> &str {
        key_parts(&self.key).0
    }

    /// The filter's record step (no bind verb): the charge the placement adds, then
    /// the annotations, with the pod's uid as a precondition. On a refusal the caller
    /// rolls the hold back.
    pub(super) async fn record(
        &self,
        backend: &Backend,
        config: &Config,
        hold: &Hold,
    ) -> Result<(), Refusal> {
        self.charge(backend, config).await?;
        let keys = &backend.cache().projection().keys;
        let annotations = annotations(keys, &hold.node, &hold.assignment);
        let recorded = backend.record(&self.key, &self.uid, annotations).await;
        recorded.map_err(|error| Refusal {
            reason: error.to_string(),
            unfit: false,
            charged: true,
        })?;
        (backend.writer()).write(|state| state.mark_recorded(&self.key));
        Ok(())
    }

    /// Charge the quota what this placement adds (written to the GPUQuota ledger in API
    /// mode, the one the validating webhook charges in, so no replica can admit past
    /// `hard` meanwhile; offline the hold itself is counted).
    pub(super) async fn charge(&self, backend: &Backend, config: &Config) -> Result<(), Refusal> {
        let Some(charge) = self.charge_at_placement.as_ref().filter(|_| !self.recorded) else {
            return Ok(());
        };
        let model = charge.node_model.clone().unwrap_or_default();
        let ask = Ask {
            wanted: WantedModels::one(model.clone()),
            costs: Costs::single(model, charge.charge.clone()),
            rules: config.admit_rules(),
            created: charge.created,
            charge_id: None,
            dry_run: false,
        };
        match backend.charge_at_placement(self.namespace(), ask).await {
            Ok(ChargeOutcome::Charged { .. }) => Ok(()),
            Ok(ChargeOutcome::Denied(denial)) => Err(Refusal {
                reason: denial.to_string(),
                unfit: true,
                charged: false,
            }),
            Err(error) => Err(Refusal {
                reason: error.to_string(),
                unfit: false,
                charged: false,
            }),
        }
    }

    /// The bind verb's record step: annotations and `spec.nodeName` in one Binding.
    pub(super) async fn bind(
        &self,
        backend: &Backend,
        node: &str,
        assignment: Option<&Assignment>,
    ) -> Result<(), WriteError> {
        let keys = &backend.cache().projection().keys;
        let written = match assignment {
            Some(assignment) => annotations(keys, node, assignment),
            None => BTreeMap::new(), // DRA allocated the GPUs: only the binding is ours
        };
        backend.bind(&self.key, &self.uid, node, written).await
    }

    /// Undo a placement whose record step failed, the one way for the filter and the
    /// bind verb alike: the cache goes back to what it held before the hold (a pod only
    /// offered leaves it again), and a charge the step wrote (`charged`) is given back.
    pub(super) async fn undo(&self, backend: &Backend, hold: Hold, charged: bool) {
        (backend.writer()).write(|state| state.rollback(&self.key, hold));
        let charge = self.charge_at_placement.as_ref();
        let Some(charge) = charge.filter(|_| charged && !self.recorded) else {
            return;
        };
        let released = backend
            .give_back(
                self.namespace(),
                &charge.charge,
                (charge.created, ChargeId::None),
            )
            .await;
        if let Err(error) = released {
            tracing::warn!(pod = %self.key, %error, "could not release the quota charge; the reconciler will");
        }
    }
}

/// The gpu-manager annotations for a placement (docs/design.md), written in one patch.
fn annotations(
    keys: &AnnotationKeys,
    node: &str,
    assignment: &Assignment,
) -> BTreeMap<String, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut annotations: BTreeMap<String, String> = assignment
        .choices
        .iter()
        .map(|choice| {
            (
                keys.gpu_idx(choice.container),
                Assignment::indices_text(choice),
            )
        })
        .collect();
    annotations.insert(keys.node.clone(), node.to_string());
    annotations.insert(keys.assigned.clone(), "false".into());
    annotations.insert(keys.time.clone(), nanos.to_string());
    annotations
}
