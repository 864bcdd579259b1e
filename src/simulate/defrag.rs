//! `simulate --defrag` (docs/simulate.md, "Defragmentation"): what the planner
//! (`placement::defrag`) did in a run, when an arriving GPU pod fit on no node, and
//! how it is reported. The replay (`replay.rs`) runs the planner and carries the plans
//! out.

use std::collections::BTreeMap;

use super::mean_sd;

/// What the planner did over one run.
#[derive(Debug, Clone, Default)]
pub(super) struct DefragStats {
    /// GPU pods that fit nowhere on arrival and were seated by a plan.
    pub(super) seated: usize,
    /// Moves those plans made.
    pub(super) moves: usize,
    /// Milliseconds each search took, one per GPU arrival that fit nowhere.
    pub(super) plan_ms: Vec<f64>,
    /// Searches that found no plan, by reason (`NoPlan::kind`).
    pub(super) unplanned: BTreeMap<&'static str, usize>,
}

/// `--defrag`'s figures over the seeds: counts are means over seeds, search times are
/// over every search of every seed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct DefragSummary {
    max_moves: usize,
    seated: f64,
    moves: f64,
    /// GPU arrivals that fit nowhere and were searched for.
    searched: f64,
    ms_p50: f64,
    ms_p99: f64,
    ms_max: f64,
    /// Searches without a plan by reason, means over seeds.
    unplanned: BTreeMap<&'static str, f64>,
}

impl DefragSummary {
    pub(super) fn of<'a>(
        runs: impl IntoIterator<Item = &'a DefragStats>,
        max_moves: usize,
    ) -> DefragSummary {
        let runs: Vec<&DefragStats> = runs.into_iter().collect();
        let mean = |f: &dyn Fn(&DefragStats) -> usize| {
            let values: Vec<f64> = runs.iter().map(|r| f(r) as f64).collect();
            mean_sd(&values).0
        };
        let mut times: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.plan_ms.iter().copied())
            .collect();
        times.sort_by(f64::total_cmp);
        DefragSummary {
            max_moves,
            seated: mean(&|r| r.seated),
            moves: mean(&|r| r.moves),
            searched: mean(&|r| r.plan_ms.len()),
            ms_p50: percentile(&times, 0.50),
            ms_p99: percentile(&times, 0.99),
            ms_max: times.last().copied().unwrap_or(0.0),
            unplanned: unplanned(&runs),
        }
    }

    /// Moves per pod seated by a plan (0 when none was).
    fn moves_per_seated(&self) -> f64 {
        if self.seated == 0.0 {
            0.0
        } else {
            self.moves / self.seated
        }
    }

    /// The JSON fields: `moves` and `seated_by_plan` (docs/design.md's contract), and
    /// the limit, the rate and the search times.
    pub(super) fn add_to(&self, object: &mut serde_json::Value) {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        object["max_moves"] = serde_json::json!(self.max_moves);
        object["moves"] = serde_json::json!(round(self.moves));
        object["seated_by_plan"] = serde_json::json!(round(self.seated));
        object["moves_per_seated"] = serde_json::json!(round(self.moves_per_seated()));
        object["searched"] = serde_json::json!(round(self.searched));
        object["plan_ms_p50"] = serde_json::json!(round(self.ms_p50));
        object["plan_ms_p99"] = serde_json::json!(round(self.ms_p99));
        object["plan_ms_max"] = serde_json::json!(round(self.ms_max));
        object["unplanned"] = serde_json::json!(self.unplanned);
    }

    pub(super) fn text(&self) -> String {
        format!(
            "defrag (at most {k} moves): {seated:.1} pods seated by a plan of {searched:.1} \
             that fit nowhere, {moves:.1} moves ({per:.2} per seated pod); search \
             p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms; no plan: {why}",
            k = self.max_moves,
            seated = self.seated,
            searched = self.searched,
            moves = self.moves,
            per = self.moves_per_seated(),
            p50 = self.ms_p50,
            p99 = self.ms_p99,
            max = self.ms_max,
            why = self
                .unplanned
                .iter()
                .map(|(why, n)| format!("{why} {n:.1}"))
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

/// Each reason's count, mean over `runs`.
fn unplanned(runs: &[&DefragStats]) -> BTreeMap<&'static str, f64> {
    let mut counts: BTreeMap<&'static str, f64> = BTreeMap::new();
    for run in runs {
        for (&why, &n) in &run.unplanned {
            *counts.entry(why).or_default() += n as f64;
        }
    }
    let seeds = runs.len().max(1) as f64;
    counts.values_mut().for_each(|n| *n /= seeds);
    counts
}

/// The nearest-rank percentile `p` (0..=1) of sorted `values`; 0 for none.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_means_over_seeds_and_times_pooled() {
        let a = DefragStats {
            seated: 10,
            moves: 15,
            plan_ms: vec![1.0, 2.0],
            unplanned: [("no_destination", 3)].into(),
        };
        let b = DefragStats {
            seated: 20,
            moves: 25,
            plan_ms: vec![3.0, 40.0],
            unplanned: [("no_destination", 1)].into(),
        };
        let summary = DefragSummary::of([&a, &b], 2);
        let mut json = serde_json::json!({});
        summary.add_to(&mut json);
        assert_eq!(json["seated_by_plan"], 15.0);
        assert_eq!(json["moves"], 20.0);
        assert_eq!(json["moves_per_seated"], 1.333);
        assert_eq!(json["searched"], 2.0);
        assert_eq!(json["plan_ms_p50"], 2.0);
        assert_eq!(json["plan_ms_p99"], 40.0);
        assert_eq!(json["max_moves"], 2);
        assert_eq!(json["unplanned"]["no_destination"], 2.0);
        assert!(
            summary
                .text()
                .starts_with("defrag (at most 2 moves): 15.0 pods")
        );
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&values, 0.5), 50.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
    }
}
