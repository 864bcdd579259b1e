//! `gpu-admission explain` (docs/explain.md): why a GPU pod waits, as a reason code per
//! stage with its numbers, and what would change it. It reads the cluster (a file, or
//! the API server), judges with the webhooks' and the extender's own rules (`judge`),
//! asks the defragmentation planner for "fits after N moves" (`defrag`), and writes
//! nothing.

mod dra;
mod effort;
mod judge;
mod other_model;
mod verdict;

#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use anyhow::Context;
use clap::{ArgGroup, Args};
use k8s_openapi::api::core::v1::Pod;

use crate::cache::pod::SkipReason;
use crate::cache::{CachedPod, ClusterCache, FileObject};
use crate::config::Config;
use crate::placement::Placer;
use crate::placement::defrag::Limits;
use crate::snapshot::Snapshot;

pub(crate) use effort::{Abandoned, Cancel, Effort};
pub(crate) use judge::{Judge, Judged};
use verdict::Counterfactual;
use verdict::Stage;
pub(crate) use verdict::{Code, Explanation};

#[derive(Debug, Args)]
#[command(group = ArgGroup::new("subject").required(true).args(["pod", "filename"]))]
pub struct ExplainArgs {
    /// The pod, as NAMESPACE/NAME.
    #[arg(value_name = "NAMESPACE/NAME")]
    pod: Option<String>,
    /// A Pod manifest not yet created, judged as if it were created now.
    #[arg(short = 'f', long)]
    filename: Option<PathBuf>,
    #[command(flatten)]
    source: crate::snapshot::ClusterSource,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: crate::defrag::Output,
}

pub fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let crate::snapshot::Read {
        objects,
        source,
        config,
    } = args.source.read()?;
    let manifest = match &args.filename {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let pod: Pod = serde_yaml::from_str(&text)
                .with_context(|| format!("{} is not a Pod manifest", path.display()))?;
            Some(pod)
        }
        None => None,
    };
    let subject = match (&args.pod, manifest) {
        (Some(key), _) => Asked::Existing(key.clone()),
        (None, Some(pod)) => Asked::Manifest(Box::new(pod)),
        (None, None) => anyhow::bail!("name a pod (NAMESPACE/NAME) or give -f FILE"),
    };
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let explanation = explain(&objects, &source, &config, subject, now)?;
    match args.output {
        crate::defrag::Output::Json => {
            println!("{}", serde_json::to_string_pretty(&explanation)?)
        }
        crate::defrag::Output::Text => print!("{}", explanation.text()),
    }
    Ok(())
}

/// The pod asked about.
pub(crate) enum Asked {
    /// A pod of the cluster, `namespace/name`.
    Existing(String),
    /// A manifest not yet created (what-if).
    Manifest(Box<Pod>),
    /// A pod of the cluster the cache does not keep: one whose GPUs come only through
    /// ResourceClaims (charged as claims, placed by kube-scheduler's DRA allocator).
    Uncached(Box<Pod>),
}

/// Why a pod cannot be judged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExplainError {
    #[error("pod {0} is not in the cluster, or asks for no GPU")]
    NotFound(String),
    #[error("the manifest cannot be judged: {0}")]
    Manifest(#[from] SkipReason),
    #[error(transparent)]
    Status(#[from] crate::quota::StatusError),
    #[error(transparent)]
    Abandoned(#[from] Abandoned),
}

impl Asked {
    /// `namespace/name`: a manifest without a namespace is in `default`; without a name,
    /// its `generateName`, else `what-if`.
    pub(crate) fn key(&self) -> String {
        match self {
            Asked::Existing(key) => key.clone(),
            Asked::Manifest(pod) | Asked::Uncached(pod) => {
                let meta = &pod.metadata;
                let namespace = meta.namespace.as_deref().unwrap_or("default");
                let name = (meta.name.as_deref()).or(meta.generate_name.as_deref());
                format!("{namespace}/{}", name.unwrap_or("what-if"))
            }
        }
    }
}

/// Judge the pod `asked` names on `cache` with `placer` and `config`'s rules at unix
/// second `now`: every stage and the counterfactuals judging finds (not the planner's
/// moves). Nothing is charged, held or written. The CLI and the admin port's `/explain`
/// both answer with it; judging stops (`ExplainError::Abandoned`) once `cancel` is
/// raised.
pub(crate) fn judge_on(
    cache: &ClusterCache,
    placer: &Placer,
    config: &Config,
    (asked, cancel): (Asked, &Cancel),
    now: i64,
) -> Result<Explanation, ExplainError> {
    let key = asked.key();
    let (what_if, exists) = match asked {
        Asked::Existing(_) => (None, true),
        Asked::Manifest(pod) => (Some(pod), false),
        Asked::Uncached(pod) => (Some(pod), true),
    };
    let what_if = match what_if {
        None => None,
        Some(pod) => match CachedPod::from_pod(&pod, cache.projection()) {
            Ok(cached) => Some(cached),
            Err(SkipReason::NoGpu) if pod.spec.is_some() => {
                return claims_only(cache, &key, &pod, exists);
            }
            Err(error) => return Err(error.into()),
        },
    };
    cache.read(|state| {
        let pod = match &what_if {
            Some(cached) => cached,
            None => state
                .pod(&key)
                .ok_or_else(|| ExplainError::NotFound(key.clone()))?,
        };
        let subject = Judged {
            key: &key,
            pod,
            exists,
        };
        let mig = &cache.projection().names.mig;
        let judge = Judge::new(state, placer, mig, config, now);
        judge
            .for_caller(Effort::new(cancel.clone()))
            .explain(&subject)
    })
}

/// A pod whose GPUs come only through ResourceClaims: its claims are charged when they
/// are created, and kube-scheduler's DRA allocator places it, so only the DRA stage
/// says anything. Not a GPU pod (no GPU claim either): not found.
fn claims_only(
    cache: &ClusterCache,
    key: &str,
    pod: &Pod,
    exists: bool,
) -> Result<Explanation, ExplainError> {
    let namespace = crate::cache::pod::key_parts(key).0;
    let claims = crate::cache::pod::claim_names(pod);
    let dra = cache.read(|state| dra::stage(state, namespace, &claims));
    let dra = dra.ok_or_else(|| ExplainError::NotFound(key.to_string()))?;
    let message = if exists {
        "its GPUs come through ResourceClaims, charged when they were created"
    } else {
        "its GPUs come through ResourceClaims, charged when they are created"
    };
    let admission = Stage {
        stage: "admission",
        code: Code::Fits,
        message: message.into(),
    };
    Ok(Explanation::new(
        key.to_string(),
        vec![admission, dra],
        Vec::new(),
    ))
}

/// The Pod `key` names among `objects`, if there is one.
fn find_pod(objects: &[FileObject], key: &str) -> Option<Pod> {
    let (namespace, name) = crate::cache::pod::key_parts(key);
    objects.iter().find_map(|object| {
        let value = &object.value;
        let meta = &value["metadata"];
        let is_pod = value["kind"].as_str() == Some("Pod")
            && meta["name"].as_str() == Some(name)
            && meta["namespace"].as_str().unwrap_or("default") == namespace;
        is_pod
            .then(|| serde_yaml::from_value(value.clone()).ok())
            .flatten()
    })
}

/// Judge the pod `asked` names on the cluster `objects` hold, at unix second `now`.
pub(crate) fn explain(
    objects: &[FileObject],
    source: &str,
    config: &Config,
    asked: Asked,
    now: i64,
) -> anyhow::Result<Explanation> {
    let snapshot = Snapshot::of(objects, source, config)?;
    let (cache, placer) = (&snapshot.cache, &snapshot.placer);
    let key = asked.key();
    let manifest = match &asked {
        Asked::Existing(_) | Asked::Uncached(_) => None,
        Asked::Manifest(pod) => Some(pod.clone()),
    };
    // The CLI's caller is the process: it never leaves before the answer.
    let stays = &Cancel::default();
    let judged = match judge_on(cache, placer, config, (asked, stays), now) {
        // Not in the cache: a pod whose GPUs come only through ResourceClaims?
        Err(ExplainError::NotFound(_)) => match find_pod(objects, &key) {
            Some(pod) => {
                let asked = Asked::Uncached(pod.into());
                judge_on(cache, placer, config, (asked, stays), now)
            }
            None => Err(ExplainError::NotFound(key.clone())),
        },
        judged => judged,
    };
    let mut explanation = judged.map_err(|e| match e {
        ExplainError::NotFound(key) => {
            anyhow::anyhow!("pod {key} is not in {source}, or asks for no GPU")
        }
        e => e.into(),
    })?;
    if explanation
        .stages
        .iter()
        .any(|s| s.code == Code::Fragmented)
    {
        let limits = Limits::default();
        let report = match &manifest {
            None => crate::defrag::plan_in(&snapshot, limits, Some(&key))?,
            // The manifest joins the cluster for the planner: it plans for pods that are.
            Some(pod) => {
                let mut objects = objects.to_vec();
                let value = serde_yaml::to_value(pod).context("encoding the manifest")?;
                let value = with_kind(value);
                objects.push(FileObject { document: 0, value });
                crate::defrag::plan_objects(&objects, source, config, limits, Some(&key))?
            }
        };
        explanation.counterfactuals.extend(moves(&report));
    }
    Ok(explanation)
}

/// A manifest's object as a cluster file holds it (kind and version set).
fn with_kind(mut value: serde_yaml::Value) -> serde_yaml::Value {
    if let Some(map) = value.as_mapping_mut() {
        map.insert("kind".into(), "Pod".into());
        map.insert("apiVersion".into(), "v1".into());
    }
    value
}

/// "Fits after N moves", from the defragmentation planner's `report` for the pod.
fn moves(report: &crate::defrag::Report) -> Option<Counterfactual> {
    let plan = report.plans.first().filter(|p| !p.moves.is_empty())?;
    // Told to whoever may read the pod: other namespaces' pods are not named.
    let namespace = crate::cache::pod::key_parts(&plan.pod).0;
    let steps: Vec<String> = plan
        .moves
        .iter()
        .map(|m| {
            format!(
                "{} from {} to {}",
                crate::cache::pod::shown_to(namespace, &m.pod),
                m.from,
                m.to
            )
        })
        .collect();
    let n = plan.moves.len();
    let message = format!(
        "fits on node {} after {n} move{}: {} (`gpu-admission defrag` plans it)",
        plan.node,
        if n == 1 { "" } else { "s" },
        steps.join("; ")
    );
    Some(Counterfactual {
        kind: "moves",
        message,
    })
}
