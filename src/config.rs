//! The configuration file (docs/design.md): plain validated data, defaults for every key,
//! unknown keys and bad values refused by name.

use std::path::Path;

use serde::Deserialize;

use crate::marks::{MarkNames, Spelled, Writers};
use crate::placement::{NodeLabels, Policy, ResourceNames};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {problem}")]
    Invalid {
        path: String,
        problem: ConfigProblem,
    },
}

/// What is wrong with the configuration's text: each names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    /// Not YAML, an unknown key, or a bad value (serde names the key and its line).
    #[error(transparent)]
    Yaml(#[from] serde_yaml::Error),
    #[error("{key}: must not be empty")]
    Empty { key: &'static str },
    #[error("resources.mig: compute slices per GPU must be between 1 and 64")]
    ComputeSlices,
    #[error("{key}: only letters, digits and - _ . / may be used")]
    BadKey { key: &'static str },
    #[error("placementWriters: a user name must not be empty")]
    EmptyWriter,
    #[error("queue.releasers: a user name must not be empty")]
    EmptyReleaser,
    #[error("schedulerUsers: a user name must not be empty")]
    EmptySchedulerUser,
    #[error("reclaim.{key}: must be at most 3600 (seconds)")]
    ReclaimTooLong { key: &'static str },
    #[error("defrag.holdSeconds: must be between 10 and 600")]
    DefragHold,
    #[error("defrag.cooldownSeconds: must be at most 86400 (a day)")]
    DefragCooldown,
    #[error("defrag.maxMoves: must be between 1 and 4")]
    DefragMaxMoves,
}

pub(crate) use crate::quota::{DEFAULT_SCHEDULER, UntypedPods};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum SchedulerNamePolicy {
    IfDefault,
    Always,
    Never,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub(crate) struct Placement {
    pub(crate) policy: Policy,
    /// Share-mode GPUs inside the chosen node are the ones gpu-manager itself picks
    /// (it refuses any other); turn off only for a node agent without that check.
    pub(crate) gpu_manager_compat: bool,
    /// kube-scheduler's extender configuration sets `bindVerb: bind`: the filter only
    /// holds its choice in memory and the bind verb writes it, annotations and Binding
    /// in one API call, in the scheduler's parallel binding cycle. Off (the default,
    /// as tkestack's extender works), the filter writes the annotations itself.
    pub(crate) bind_verb: bool,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            policy: crate::placement::policy::DEFAULT_POLICY,
            gpu_manager_compat: true,
            bind_verb: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    pub(crate) scheduler_name: String,
    pub(crate) scheduler_name_policy: SchedulerNamePolicy,
    pub(crate) model_label: String,
    pub(crate) pool_label: String,
    pub(crate) type_annotation: String,
    pub(crate) untyped_pods: UntypedPods,
    pub(crate) quota_required: bool,
    pub(crate) resources: ResourceNames,
    pub(crate) placement: Placement,
    /// ResourceClaims (Dynamic Resource Allocation): how GPU devices and models are named.
    pub dra: crate::dra::Dra,
    /// The users (as the API server authenticates them) that may change a pod's
    /// placement annotations (`<annotationPrefix>/predicate-*`, `gpu-assigned`) once it
    /// exists: by protocol, the GPU scheduler's extender and gpu-manager on the nodes.
    pub(crate) placement_writers: Vec<String>,
    /// The users (as the API server authenticates them) the schedulers that bind pods
    /// act as: a ResourceClaim one of them creates for a pod's DRA-backed extended
    /// resources is the pod's own GPUs, charged to the pod (docs/security.md, "What the
    /// quota trusts"). Anyone else's such claim is charged like any claim.
    pub(crate) scheduler_users: Vec<String>,
    /// The quota queue (`onExceed: Queue`).
    pub(crate) queue: QueueConfig,
    /// How a cohort's lender takes back what it lent (`reclaim: Evict`).
    pub(crate) reclaim: ReclaimConfig,
    /// Making room for pending GPU pods by moving running ones (docs/defrag.md).
    pub(crate) defrag: DefragConfig,
}

/// Defragmentation in the cluster (docs/defrag.md, "In the cluster").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub(crate) struct DefragConfig {
    pub(crate) mode: DefragMode,
    /// The most moves one plan may make.
    pub(crate) max_moves: usize,
    /// A GPU pod pending this long is planned for.
    pub(crate) pending_seconds: u32,
    /// `Evict`: how long the GPUs a plan frees stay held for the pending pod, and each
    /// destination for the moved pod's replacement.
    pub(crate) hold_seconds: u32,
    /// `Evict`: a pod whose controller had a pod moved this recently is not moved.
    pub(crate) cooldown_seconds: u32,
}

/// What the cluster does with the plans (`defrag.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
pub(crate) enum DefragMode {
    /// Nothing is planned.
    #[default]
    Off,
    /// Plans are computed and reported (an Event on the pending pod, metrics); nothing
    /// is evicted.
    DryRun,
    /// Plans are carried out: the freed GPUs held, the moved pods evicted through the
    /// Eviction API (the GPU scheduler's sidecar, `controllers::mover`).
    Evict,
}

impl Default for DefragConfig {
    fn default() -> Self {
        DefragConfig {
            mode: DefragMode::Off,
            max_moves: crate::placement::defrag::DEFAULT_MAX_MOVES,
            pending_seconds: 30,
            hold_seconds: 60,
            cooldown_seconds: 600,
        }
    }
}

/// The reclaim bound (docs/quota.md, "The reclaim bound"): a borrowing pod that reclaim
/// chose is evicted through the Eviction API, PodDisruptionBudgets respected; if it is
/// still there `timeoutSeconds` after it was first chosen, it is deleted with a grace
/// period of at most `maxGraceSeconds`, whatever its budget or its own grace period say.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReclaimConfig {
    pub(crate) timeout_seconds: u32,
    pub(crate) max_grace_seconds: u32,
}

/// `reclaim.timeoutSeconds` and `reclaim.maxGraceSeconds` when the configuration does not
/// say: with them a lender's pod runs within two minutes (docs/quota.md).
const DEFAULT_RECLAIM_TIMEOUT_SECONDS: u32 = 45;
const DEFAULT_RECLAIM_MAX_GRACE_SECONDS: u32 = 30;
/// The largest either may be: a bound a lender can rely on is minutes, not days.
const MAX_RECLAIM_SECONDS: u32 = 3600;

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig {
            timeout_seconds: DEFAULT_RECLAIM_TIMEOUT_SECONDS,
            max_grace_seconds: DEFAULT_RECLAIM_MAX_GRACE_SECONDS,
        }
    }
}

/// The quota queue (docs/quota.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub(crate) struct QueueConfig {
    /// The users (as the API server authenticates them) that may let a pod out of the
    /// quota queue: remove the `gpu-admission.io/quota` gate and write the
    /// `gpu-admission.io/quota-released` annotation. gpu-admission's own identities.
    pub(crate) releasers: Vec<String>,
    /// How long a pod that does not fit may be passed over by pods behind it; after
    /// that it goes to the front and holds its model until it fits.
    max_pass_over_seconds: u32,
}

/// `queue.maxPassOverSeconds` when the configuration does not say.
pub(crate) const DEFAULT_MAX_PASS_OVER_SECONDS: u32 = 300;

/// The GPU scheduler's ServiceAccount in deploy/: its gpu-admission sidecar runs the
/// releaser (`--release-queue`); the webhook servers' identity may not write pods.
pub const DEFAULT_QUEUE_RELEASERS: [&str; 1] =
    ["system:serviceaccount:gpu-admission:gpu-scheduler"];

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            releasers: DEFAULT_QUEUE_RELEASERS.map(String::from).to_vec(),
            max_pass_over_seconds: DEFAULT_MAX_PASS_OVER_SECONDS,
        }
    }
}

/// The GPU scheduler's ServiceAccount in deploy/ (its gpu-admission sidecar writes the
/// placement annotations) and tkestack gpu-manager's in its own manifests.
pub const DEFAULT_PLACEMENT_WRITERS: [&str; 2] = [
    "system:serviceaccount:gpu-admission:gpu-scheduler",
    "system:serviceaccount:kube-system:gpu-manager",
];

/// kube-scheduler's own identity, and the GPU scheduler's ServiceAccount in deploy/ (its
/// kube-scheduler creates the claims of the pods it binds).
pub const DEFAULT_SCHEDULER_USERS: [&str; 2] = [
    "system:kube-scheduler",
    "system:serviceaccount:gpu-admission:gpu-scheduler",
];

impl Default for Config {
    fn default() -> Self {
        let labels = NodeLabels::default();
        Config {
            scheduler_name: "gpu-scheduler".into(),
            scheduler_name_policy: SchedulerNamePolicy::IfDefault,
            model_label: labels.model,
            pool_label: labels.pool,
            type_annotation: "gpu-admission.io/gpu-type".into(),
            untyped_pods: UntypedPods::Allow,
            quota_required: false,
            resources: ResourceNames::default(),
            placement: Placement::default(),
            dra: crate::dra::Dra::default(),
            placement_writers: DEFAULT_PLACEMENT_WRITERS.map(String::from).to_vec(),
            scheduler_users: DEFAULT_SCHEDULER_USERS.map(String::from).to_vec(),
            queue: QueueConfig::default(),
            reclaim: ReclaimConfig::default(),
            defrag: DefragConfig::default(),
        }
    }
}

impl Config {
    /// The quota queue's order rules (`quota::queue`).
    pub fn queue_rules(&self) -> crate::quota::queue::QueueRules {
        crate::quota::queue::QueueRules {
            max_pass_over: i64::from(self.queue.max_pass_over_seconds),
            admit: self.admit_rules(),
        }
    }

    /// The admission rules that are configuration, as the quota arithmetic takes them.
    pub(crate) fn admit_rules(&self) -> crate::quota::AdmitRules {
        crate::quota::AdmitRules {
            untyped: self.untyped_pods,
            quota_required: self.quota_required,
        }
    }

    pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|problem| ConfigError::Invalid {
            path: path.display().to_string(),
            problem,
        })
    }

    /// Parse YAML text; the error names the key (and its line) that is wrong.
    pub fn parse(text: &str) -> Result<Config, ConfigProblem> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        let config: Config = serde_yaml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigProblem> {
        let required = [
            ("schedulerName", &self.scheduler_name),
            ("modelLabel", &self.model_label),
            ("poolLabel", &self.pool_label),
            ("typeAnnotation", &self.type_annotation),
            ("resources.vcudaCore", &self.resources.vcuda_core),
            ("resources.vcudaMemory", &self.resources.vcuda_memory),
            (
                "resources.annotationPrefix",
                &self.resources.annotation_prefix,
            ),
            (
                "resources.mig.resourcePrefix",
                &self.resources.mig.resource_prefix,
            ),
        ];
        let mig = &self.resources.mig;
        let slices = mig
            .compute_slices
            .values()
            .chain([&mig.default_compute_slices]);
        if slices.into_iter().any(|n| !(1..=64).contains(n)) {
            return Err(ConfigProblem::ComputeSlices);
        }
        if self.placement_writers.iter().any(|w| w.trim().is_empty()) {
            return Err(ConfigProblem::EmptyWriter);
        }
        if self.queue.releasers.iter().any(|w| w.trim().is_empty()) {
            return Err(ConfigProblem::EmptyReleaser);
        }
        if self.scheduler_users.iter().any(|w| w.trim().is_empty()) {
            return Err(ConfigProblem::EmptySchedulerUser);
        }
        let reclaim = [
            ("timeoutSeconds", self.reclaim.timeout_seconds),
            ("maxGraceSeconds", self.reclaim.max_grace_seconds),
        ];
        if let Some((key, _)) = reclaim.iter().find(|(_, s)| *s > MAX_RECLAIM_SECONDS) {
            return Err(ConfigProblem::ReclaimTooLong { key });
        }
        if !(10..=600).contains(&self.defrag.hold_seconds) {
            return Err(ConfigProblem::DefragHold);
        }
        if self.defrag.cooldown_seconds > 86_400 {
            return Err(ConfigProblem::DefragCooldown);
        }
        if !(1..=4).contains(&self.defrag.max_moves) {
            return Err(ConfigProblem::DefragMaxMoves);
        }
        if let Some((key, _)) = required.iter().find(|(_, value)| value.trim().is_empty()) {
            return Err(ConfigProblem::Empty { key });
        }
        // Both are spelled into the webhooks' CEL (`marks::update_condition`).
        let keys = [
            ("typeAnnotation", &self.type_annotation),
            (
                "resources.annotationPrefix",
                &self.resources.annotation_prefix,
            ),
        ];
        let bad = |name: &str| {
            !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        };
        match keys.iter().find(|(_, name)| bad(name)) {
            Some((key, _)) => Err(ConfigProblem::BadKey { key }),
            None => Ok(()),
        }
    }

    /// How the marks of `crate::marks` are spelled in this configuration.
    pub(crate) fn mark_names(&self) -> MarkNames<'_> {
        MarkNames {
            annotation_prefix: &self.resources.annotation_prefix,
            type_annotation: &self.type_annotation,
        }
    }

    /// Who may write the marks of `crate::marks`.
    pub(crate) fn writers(&self) -> Writers<'_> {
        Writers {
            placement: &self.placement_writers,
            gpu_admission: &self.queue.releasers,
        }
    }

    /// Every mark only gpu-admission (or gpu-manager) writes on a pod, spelled as this
    /// configuration spells it (`crate::marks`).
    pub fn mark_keys(&self) -> Vec<crate::marks::MarkKey> {
        crate::marks::mark_keys(self.mark_names())
    }

    /// The validating webhook's `matchConditions` expression for pods under this
    /// configuration (`create-or-guarded-change`, as deploy/ and the chart ship it for
    /// theirs): every CREATE, and the UPDATEs that change a mark by a user who may not
    /// write it.
    pub fn guarded_change_condition(&self) -> String {
        crate::marks::update_condition(self.mark_names(), Spelled::Users(self.writers()))
    }

    /// The models `pod` may use in a namespace limited by `limits` (first match wins;
    /// docs/design.md): the configured annotation and model label, then the quota's.
    pub(crate) fn wanted_models(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        limits: &crate::quota::NamespaceLimits,
    ) -> crate::placement::models::WantedModels {
        crate::placement::models::WantedModels::of_pod(
            pod,
            &self.type_annotation,
            &self.model_label,
            limits.default_type.as_deref(),
            &limits.models,
        )
    }

    pub(crate) fn node_labels(&self) -> NodeLabels {
        NodeLabels {
            model: self.model_label.clone(),
            pool: self.pool_label.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn reads_every_documented_key() {
        let config = Config::parse(
            "schedulerName: s\nschedulerNamePolicy: always\nmodelLabel: m\npoolLabel: p\n\
             typeAnnotation: t\nuntypedPods: deny\nquotaRequired: true\n\
             resources: {vcudaCore: a/c, vcudaMemory: a/m, annotationPrefix: a, wholeGpu: [x/gpu]}\n\
             placement: {policy: spread}\n",
        )
        .unwrap();
        assert_eq!(config.scheduler_name_policy, SchedulerNamePolicy::Always);
        assert_eq!(config.untyped_pods, UntypedPods::Deny);
        assert!(config.quota_required);
        assert_eq!(config.resources.whole_gpu, ["x/gpu"]);
        assert_eq!(config.placement.policy, Policy::Spread);
    }

    #[test]
    fn scheduler_users_default_to_kube_scheduler_and_the_gpu_scheduler() {
        let users = Config::default().scheduler_users;
        assert_eq!(users, DEFAULT_SCHEDULER_USERS);
        let config = Config::parse("schedulerUsers: [system:serviceaccount:kai:binder]\n").unwrap();
        assert_eq!(config.scheduler_users, ["system:serviceaccount:kai:binder"]);
        let err = Config::parse("schedulerUsers: ['']\n")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "schedulerUsers: a user name must not be empty");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = Config::parse("schedulerNmae: x\n").unwrap_err().to_string();
        assert!(err.contains("unknown field `schedulerNmae`"), "{err}");
        let err = Config::parse("placement:\n  polcy: fgd\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("placement") && err.contains("polcy"), "{err}");
        let err = Config::parse("placement: {policy: fastest}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("fastest"), "{err}");
        let err = Config::parse("schedulerName: ''\n")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "schedulerName: must not be empty");
        let err = Config::parse("reclaim: {maxGraceSeconds: 86400}\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "reclaim.maxGraceSeconds: must be at most 3600 (seconds)"
        );
    }

    #[test]
    fn defragmentation_is_off_unless_asked_and_its_bounds_are_named() {
        assert_eq!(Config::default().defrag.mode, DefragMode::Off);
        let config = Config::parse("defrag: {mode: DryRun, pendingSeconds: 5}\n").unwrap();
        assert_eq!(config.defrag.mode, DefragMode::DryRun);
        assert_eq!(config.defrag.pending_seconds, 5);
        assert_eq!(config.defrag.max_moves, 2);
        let err = |text: &str| Config::parse(text).unwrap_err().to_string();
        let evict = Config::parse("defrag: {mode: Evict, holdSeconds: 30}\n").unwrap();
        assert_eq!(evict.defrag.mode, DefragMode::Evict);
        assert_eq!(evict.defrag.hold_seconds, 30);
        assert_eq!(evict.defrag.cooldown_seconds, 600);
        assert_eq!(
            err("defrag: {holdSeconds: 5}\n"),
            "defrag.holdSeconds: must be between 10 and 600"
        );
        assert_eq!(
            err("defrag: {cooldownSeconds: 100000}\n"),
            "defrag.cooldownSeconds: must be at most 86400 (a day)"
        );
        assert_eq!(
            err("defrag: {maxMoves: 9}\n"),
            "defrag.maxMoves: must be between 1 and 4"
        );
        assert!(err("defrag: {mode: Sometimes}\n").contains("Sometimes"));
    }

    #[test]
    fn the_reclaim_bound_is_read_and_defaults_to_two_minutes_at_most() {
        let config = Config::parse("reclaim: {timeoutSeconds: 5, maxGraceSeconds: 0}\n").unwrap();
        assert_eq!(
            (
                config.reclaim.timeout_seconds,
                config.reclaim.max_grace_seconds
            ),
            (5, 0)
        );
        let default = ReclaimConfig::default();
        assert!(default.timeout_seconds + default.max_grace_seconds < 120);
    }
}
