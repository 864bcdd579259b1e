//! The tenants a trace does not have, for `simulate --timeline` (docs/simulate.md,
//! "Quota over time"): which namespace each pod belongs to, and each namespace's quota
//! and default model.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};

use crate::placement::quantity::Milli;
use crate::quota::ModelAmounts;

use super::replay::{SimNode, SimPod};

/// A trace GPU pod with its arrival and run time.
#[derive(Debug, Clone)]
pub(super) struct TimedPod {
    pub(super) pod: SimPod,
    pub(super) arrival: u64,
    pub(super) runtime: u64,
}

/// The tenants the trace does not have: which namespace each pod belongs to, and each
/// namespace's quota and default model.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tenancy {
    pub(super) namespace_of: Vec<usize>,
    /// Per namespace: the model a pod that names none is charged to.
    pub(super) default_model: Vec<String>,
    /// Per namespace: `hard` per model (the models its pods want).
    pub(super) hard: Vec<ModelAmounts>,
    /// The trace's peak concurrent GPU demand, milli-GPUs.
    pub(super) peak_milli: u64,
}

/// `namespaces` tenants of unequal size — pods are dealt at random (seeded) with weights
/// 1, 1/2, 1/3, ... — each with a default model that its pods naming no model are
/// charged to, the namespaces spread over the models as the cluster's GPUs are (half the
/// GPUs of one model: half the namespaces default to it). A namespace's quota on a
/// model is `quota_scale` × its own peak concurrent demand there, and never less than
/// its largest pod there (so every pod can run in every mode, and the modes differ only
/// in how long pods wait).
pub(super) fn tenancy(
    pods: &[TimedPod],
    nodes: &[SimNode],
    namespaces: usize,
    quota_scale: f64,
    seed: u64,
) -> Tenancy {
    let namespaces = namespaces.max(1);
    let mut capacity: BTreeMap<String, u64> = BTreeMap::new();
    for node in nodes {
        let model = node.gpus.model.as_deref().unwrap_or_default().to_string();
        *capacity.entry(model).or_default() += node.gpus.gpu_count() as u64 * 1000;
    }
    let mut largest: Vec<(&String, &u64)> = capacity.iter().collect();
    largest.sort_by_key(|(model, cap)| (Reverse(**cap), (*model).clone()));
    let total: u64 = capacity.values().sum();
    let default_model: Vec<String> = (0..namespaces)
        .map(|k| {
            // The model under the point (k + 1/2) / namespaces of the cluster's GPUs, the
            // largest model first: namespaces spread over the models as the GPUs are.
            let mut point = (2 * k as u64 + 1) * total / (2 * namespaces as u64);
            let model = largest.iter().find(|(_, cap)| {
                let here = point < **cap;
                point = point.saturating_sub(**cap);
                here
            });
            model
                .or(largest.last())
                .map_or_else(String::new, |m| m.0.clone())
        })
        .collect();
    let weights: Vec<f64> = (1..=namespaces).map(|k| 1.0 / k as f64).collect();
    let sum: f64 = weights.iter().sum();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let namespace_of: Vec<usize> = pods
        .iter()
        .map(|_| {
            let mut draw = rng.random_range(0.0..sum);
            weights
                .iter()
                .position(|w| {
                    draw -= w;
                    draw < 0.0
                })
                .unwrap_or(namespaces - 1)
        })
        .collect();
    // Each namespace's pods by the model they are sized on: the first they accept.
    let mut groups: BTreeMap<(usize, String), Vec<&TimedPod>> = BTreeMap::new();
    for (pod, &k) in pods.iter().zip(&namespace_of) {
        let model = pod
            .pod
            .models
            .first()
            .map_or(default_model[k].as_str(), |m| &**m);
        groups.entry((k, model.to_string())).or_default().push(pod);
    }
    let mut hard = vec![ModelAmounts::new(); namespaces];
    for ((k, model), group) in groups {
        let largest = group.iter().map(|p| p.pod.demand_milli).max().unwrap_or(0);
        let scaled = (quota_scale * peak_demand(group.iter().copied()) as f64) as u64;
        hard[k].insert(model, Milli(scaled.max(largest)));
    }
    Tenancy {
        namespace_of,
        default_model,
        hard,
        peak_milli: peak_demand(pods),
    }
}

/// The most GPU (milli) the pods hold at once.
fn peak_demand<'a>(pods: impl IntoIterator<Item = &'a TimedPod>) -> u64 {
    let mut changes: Vec<(u64, i64)> = Vec::new();
    for p in pods {
        let demand = p.pod.demand_milli as i64;
        changes.push((p.arrival, demand));
        changes.push((p.arrival + p.runtime, -demand));
    }
    changes.sort_unstable_by_key(|&(t, change)| (t, change)); // departures first
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, change) in changes {
        now += change;
        peak = peak.max(now);
    }
    peak.max(0) as u64
}

/// The run's setting, for the text report: the trace, then one line per namespace.
pub(super) fn describe(
    pods: &[TimedPod],
    tenancy: &Tenancy,
    policy: crate::placement::Policy,
    args: &super::SimulateArgs,
) -> String {
    let first = pods.iter().map(|p| p.arrival).min().unwrap_or(0);
    let last = pods
        .iter()
        .map(|p| p.arrival + p.runtime)
        .max()
        .unwrap_or(0);
    let mut per_namespace = vec![0usize; tenancy.hard.len()];
    for &k in &tenancy.namespace_of {
        per_namespace[k] += 1;
    }
    let mut text = format!(
        "timeline: {} GPU pods over {:.1} days, peak concurrent demand {} GPUs; quota scale {}, \
         maxPassOverSeconds {}, policy {policy}, seed {}",
        pods.len(),
        (last - first) as f64 / 86_400.0,
        Milli(tenancy.peak_milli),
        args.quota_scale,
        args.max_pass_over,
        args.seed,
    );
    for (k, hard) in tenancy.hard.iter().enumerate() {
        let quota: Vec<String> = hard.iter().map(|(m, h)| format!("{m}: {h}")).collect();
        text.push_str(&format!(
            "\n  ns-{k}: {} pods, default model {}, hard {{{}}}",
            per_namespace[k],
            tenancy.default_model[k],
            quota.join(", ")
        ));
    }
    text
}
