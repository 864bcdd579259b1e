//! `gpu-admission simulate` (docs/design.md): replay a GPU cluster trace (the openb format)
//! through the extender's placement code and report how much GPU capacity each
//! policy manages to allocate.

mod bounds;
mod defrag;
mod free_time;
mod plot;
mod replay;
mod tenancy;
mod timeline;
mod trace;
mod workload;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;

use crate::placement::defrag::{DEFAULT_BUDGET, DEFAULT_MAX_MOVES, Limits};
use crate::placement::{DEFAULT_POLICY, Placer, Policy};
use bounds::Seeds;
use defrag::DefragSummary;
use replay::{MixSource, RunResult, SimNode, SimPod};

/// Flags of `simulate`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Node list CSV (`sn, cpu_milli, memory_mib, gpu, model`).
    #[arg(long)]
    nodes: PathBuf,
    /// Pod list CSV (`name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, ...`).
    #[arg(long)]
    pods: PathBuf,
    /// Policies to compare, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = DEFAULT_POLICY.name())]
    policy: Vec<Policy>,
    /// Stop adding copies of trace pods before the GPU demand passes this × capacity
    /// (at most 100).
    #[arg(long, default_value_t = 1.3, value_parser = bounds::inflate)]
    inflate: f64,
    /// Seed of the workload (copies drawn and shuffle).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Several seeds: a range `42-51` or a list `42,43` (at most 1000); reports mean and
    /// sd. Overrides --seed.
    #[arg(long, value_parser = bounds::seeds)]
    seeds: Option<Seeds>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Whether FGD knows the request mix in advance or learns it from the pods so far.
    #[arg(long, value_enum, default_value_t = MixSource::Known)]
    mix: MixSource,
    /// Share-mode GPUs must be the ones gpu-manager picks (only the node is chosen).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    gpu_manager_compat: bool,
    /// Run the defragmentation planner on every GPU pod that fits nowhere on arrival
    /// and carry its plan out (moves of running pods, then the pod).
    #[arg(long)]
    defrag: bool,
    /// `--defrag`: at most this many moves per plan (0 to 8); a list (`0,1,2,4`) runs
    /// and reports each in turn.
    #[arg(long, value_delimiter = ',', default_values_t = [DEFAULT_MAX_MOVES], value_parser = bounds::max_moves)]
    max_moves: Vec<usize>,
    /// `--defrag`: the evaluations (candidate sets fitted, destinations scored) one
    /// plan may spend (at most 10,000,000).
    #[arg(long, default_value_t = DEFAULT_BUDGET, value_parser = bounds::defrag_budget)]
    defrag_budget: u64,
    /// Write an SVG plot of allocated GPU % against arrived GPU demand %.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Instead of the placement protocol, replay the trace over time through namespaces
    /// with GPU quotas (pods arrive at `creation_time` and run as long as they ran) and
    /// compare quota modes: `--namespaces`, `--quota-scale`, `--modes`; the first
    /// `--policy` places, `--seed` deals the pods to namespaces.
    #[arg(long)]
    timeline: bool,
    /// `--timeline`: the namespaces the pods are dealt to (weights 1, 1/2, 1/3, ...;
    /// 1 to 1000).
    #[arg(long, default_value_t = 8, value_parser = bounds::namespaces)]
    namespaces: usize,
    /// `--timeline`: the namespaces' quotas together, as a multiple of the trace's peak
    /// concurrent GPU demand (split equally, and over the models as the cluster's GPUs;
    /// at most 1000).
    #[arg(long, default_value_t = 1.0, value_parser = bounds::quota_scale)]
    quota_scale: f64,
    /// `--timeline`: `queue.maxPassOverSeconds`, how long a waiting pod that does not fit
    /// may be passed over before it holds its model.
    #[arg(long, default_value_t = crate::config::DEFAULT_MAX_PASS_OVER_SECONDS)]
    max_pass_over: u32,
    /// `--timeline`: the quota modes to compare.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "deny,queue,cohort"
    )]
    modes: Vec<timeline::QuotaMode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// One policy's runs over the seeds.
#[derive(Debug, Clone)]
struct PolicyReport {
    policy: Policy,
    /// `--defrag`'s limit on moves, when on.
    max_moves: Option<usize>,
    seeds: Vec<u64>,
    runs: Vec<RunResult>,
    seconds: f64,
}

/// Run `simulate`: print one report per policy (and per `--max-moves` with
/// `--defrag`) on stdout.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    bounds::once_each("--policy", &args.policy)?;
    bounds::once_each("--max-moves", &args.max_moves)?;
    bounds::once_each("--modes", &args.modes)?;
    let nodes: Vec<SimNode> = trace::read_nodes(&args.nodes)?
        .iter()
        .map(SimNode::of)
        .collect();
    let rows = trace::read_pods(&args.pods)?;
    if args.timeline {
        return run_timeline(&args, &nodes, &rows);
    }
    let pods: Vec<SimPod> = rows.iter().map(SimPod::of).collect();
    let seeds = args
        .seeds
        .clone()
        .map_or_else(|| vec![args.seed], |Seeds(list)| list);
    let mix = Arc::new(replay::known_mix(&pods));
    let mut reports = Vec::new();
    for &policy in &args.policy {
        let placer = Placer::new(policy)
            .with_mix(mix.clone())
            .with_gpu_manager_compat(args.gpu_manager_compat);
        for defrag in defrag_limits(&args) {
            let report = simulate_policy(&placer, &args, (&nodes, &pods), &seeds, defrag)?;
            println!("{}", render(&report, &args));
            reports.push(report);
        }
    }
    if let Some(path) = &args.plot {
        plot::write(path, &reports)
            .with_context(|| format!("writing the plot {}", path.display()))?;
    }
    Ok(())
}

/// `--timeline`: one report per quota mode.
fn run_timeline(
    args: &SimulateArgs,
    nodes: &[SimNode],
    rows: &[trace::PodRow],
) -> anyhow::Result<()> {
    let pods: Vec<timeline::TimedPod> = rows
        .iter()
        .filter(|row| row.gpu_demand_milli() > 0)
        .filter_map(|row| {
            let life = row.life?;
            Some(timeline::TimedPod {
                pod: SimPod::of(row),
                arrival: life.arrival,
                runtime: life.runtime,
            })
        })
        .collect();
    if pods.is_empty() {
        anyhow::bail!(
            "{}: no GPU pod has creation_time and deletion_time, which --timeline replays",
            args.pods.display()
        );
    }
    let policy = args.policy.first().copied().unwrap_or(DEFAULT_POLICY);
    let shapes: Vec<SimPod> = pods.iter().map(|p| p.pod.clone()).collect();
    let placer = Placer::new(policy)
        .with_mix(Arc::new(replay::known_mix(&shapes)))
        .with_gpu_manager_compat(args.gpu_manager_compat);
    let tenancy = timeline::tenancy(&pods, nodes, args.namespaces, args.quota_scale, args.seed);
    if args.format == Format::Text {
        println!("{}", tenancy::describe(&pods, &tenancy, policy, args));
    }
    for &mode in &args.modes {
        let max_pass_over = i64::from(args.max_pass_over);
        let result = timeline::run(mode, &placer, nodes, &pods, &tenancy, max_pass_over);
        println!("{}", render_timeline(mode, &result, args.format));
    }
    Ok(())
}

/// One mode's line (text) or object (JSON).
fn render_timeline(
    mode: timeline::QuotaMode,
    result: &timeline::TimelineResult,
    format: Format,
) -> String {
    if format == Format::Json {
        let mut object = serde_json::json!(result);
        object["mode"] = serde_json::json!(mode);
        return object.to_string();
    }
    format!(
        "{mode:?}: {started} of {pods} GPU pods started ({too_big} larger than any quota, \
         {never} never started, {no_node} of them for want of a node); {waited} waited on quota: p50 {p50}, p99 {p99}, max {max}; \
         stranded {stranded:.1} GPU-hours; free GPU-hours by cause: fragmented {fragmented:.1}, \
         quota_blocked {blocked:.1}, idle {idle:.1}; {evictions} evictions ({lost:.1} GPU-hours of work \
         lost); {retries} creates made again after a refusal; replayed in {secs:.2} s",
        started = result.started,
        pods = result.pods,
        too_big = result.too_big,
        never = result.never_started,
        no_node = result.no_node,
        waited = result.waited,
        p50 = span(result.wait_p50_s),
        p99 = span(result.wait_p99_s),
        max = span(result.wait_max_s),
        stranded = result.stranded_gpu_hours,
        fragmented = result.free_gpu_hours.fragmented,
        blocked = result.free_gpu_hours.quota_blocked,
        idle = result.free_gpu_hours.idle,
        evictions = result.evictions,
        lost = result.evicted_gpu_hours,
        retries = result.retries,
        secs = result.seconds,
    )
}

/// `45 s`, `12 min`, `3.5 h`, `2.1 d`.
fn span(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s} s"),
        s if s < 7_200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{:.1} h", s as f64 / 3_600.0),
        s => format!("{:.1} d", s as f64 / 86_400.0),
    }
}

/// Every seed of one policy (with the planner when `defrag` says).
fn simulate_policy(
    placer: &Placer,
    args: &SimulateArgs,
    (nodes, pods): (&[SimNode], &[SimPod]),
    seeds: &[u64],
    defrag: Option<Limits>,
) -> Result<PolicyReport, workload::TooLarge> {
    let progress = std::io::stderr().is_terminal();
    let capacity: u64 = nodes.iter().map(|n| n.gpus.gpu_count() as u64 * 1000).sum();
    let demands: Vec<u64> = pods.iter().map(|p| p.demand_milli).collect();
    let started = Instant::now();
    let done = AtomicUsize::new(0);
    let run_seed = |seed: u64| {
        let order = workload::build(&demands, capacity, args.inflate, seed)?;
        let result = replay::run(placer, args.mix, nodes, pods, &order, defrag);
        let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
        if progress {
            eprint!("\r{} {finished}/{} seeds   ", placer.policy, seeds.len());
        }
        Ok(result)
    };
    let runs = in_parallel(seeds, run_seed);
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    if progress {
        eprint!("\r{:40}\r", "");
    }
    Ok(PolicyReport {
        policy: placer.policy,
        max_moves: defrag.map(|limits| limits.max_moves),
        seeds: seeds.to_vec(),
        runs,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The runs to make for one policy: without the planner, or with `--defrag` one per
/// `--max-moves`.
fn defrag_limits(args: &SimulateArgs) -> Vec<Option<Limits>> {
    if !args.defrag {
        return vec![None];
    }
    let limits = |max_moves| Limits {
        max_moves,
        budget: args.defrag_budget,
    };
    args.max_moves.iter().map(|&k| Some(limits(k))).collect()
}

/// `work` over `seeds` on all cores, results in seed order. Runs are independent and
/// deterministic, so the order they finish in changes nothing.
fn in_parallel<T: Send>(seeds: &[u64], work: impl Fn(u64) -> T + Sync) -> Vec<T> {
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    let (next, work) = (&AtomicUsize::new(0), &work);
    // Each worker's lines in a span of its own, under the caller's.
    let caller = tracing::Span::current();
    let mut results: Vec<(usize, T)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.min(seeds.len()))
            .map(|worker| {
                let span = tracing::info_span!(parent: &caller, "simulate_worker", worker);
                scope.spawn(move || {
                    span.in_scope(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&seed) = seeds.get(i) else { break };
                            mine.push((i, work(seed)));
                        }
                        mine
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Mean and (sample) standard deviation.
fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

struct Summary {
    allocated: (f64, f64),
    /// Mean and sd when arrived demand reached 100%; `None` unless every run got there.
    at_100: Option<(f64, f64)>,
    failed: f64,
    /// GPU pods refused, total and by shape (means over seeds).
    refused: RefusedMeans,
    pods: f64,
    /// With `--defrag`.
    defrag: Option<DefragSummary>,
}

/// [`replay::Refused`], means over seeds.
struct RefusedMeans {
    total: f64,
    share: f64,
    one_gpu: f64,
    several_gpus: f64,
}

fn summarise(report: &PolicyReport) -> Summary {
    let of = |f: &dyn Fn(&RunResult) -> f64| -> Vec<f64> { report.runs.iter().map(f).collect() };
    Summary {
        allocated: mean_sd(&of(&|r| r.allocated_pct())),
        at_100: report
            .runs
            .iter()
            .map(|r| r.allocated_pct_at_100)
            .collect::<Option<Vec<f64>>>()
            .map(|values| mean_sd(&values)),
        failed: mean_sd(&of(&|r| r.failed as f64)).0,
        refused: RefusedMeans {
            total: mean_sd(&of(&|r| r.refused.total() as f64)).0,
            share: mean_sd(&of(&|r| r.refused.share as f64)).0,
            one_gpu: mean_sd(&of(&|r| r.refused.one_gpu as f64)).0,
            several_gpus: mean_sd(&of(&|r| r.refused.several_gpus as f64)).0,
        },
        pods: mean_sd(&of(&|r| r.pods as f64)).0,
        defrag: report
            .max_moves
            .map(|max_moves| DefragSummary::of(report.runs.iter().map(|r| &r.defrag), max_moves)),
    }
}

fn render(report: &PolicyReport, args: &SimulateArgs) -> String {
    let s = summarise(report);
    let fgd = report.policy == Policy::Fgd;
    match args.format {
        Format::Json => {
            let mut object = serde_json::json!({
                "policy": report.policy.name(),
                "seeds": report.seeds,
                "allocated_pct": round(s.allocated.0),
                "allocated_pct_std": round(s.allocated.1),
                "allocated_pct_at_100": s.at_100.map(|(mean, _)| round(mean)),
                "allocated_pct_at_100_std": s.at_100.map(|(_, sd)| round(sd)),
                "failed_pods": count(s.failed),
                "refused_gpu_pods": count(s.refused.total),
                "refused_gpu_pods_by_shape": {
                    "share": count(s.refused.share),
                    "one_gpu": count(s.refused.one_gpu),
                    "several_gpus": count(s.refused.several_gpus),
                },
                "pods": count(s.pods),
                "seconds": round(report.seconds),
                "gpu_manager_compat": args.gpu_manager_compat,
            });
            if fgd {
                object["mix"] = serde_json::json!(args.mix);
            }
            if let Some(defrag) = &s.defrag {
                defrag.add_to(&mut object);
            }
            object.to_string()
        }
        Format::Text => {
            let mix = if fgd {
                format!(", mix {}", mix_name(args.mix))
            } else {
                String::new()
            };
            let compat = if args.gpu_manager_compat { "on" } else { "off" };
            let defrag = s
                .defrag
                .as_ref()
                .map_or(String::new(), |d| format!("; {}", d.text()));
            format!(
                "{policy} (gpu-manager compat {compat}{mix}; seeds {seeds:?}, inflate {inflate}): \
                 allocated {a:.2}% ± {sd:.2} at the end, {at} when arrived demand reached 100%; \
                 failed pods {failed} of {pods}, of them GPU pods refused {refused} (share {share}, \
                 one GPU {one}, several GPUs {several}); {secs:.2} s ({per:.2} s per seed){defrag}",
                policy = report.policy,
                seeds = report.seeds,
                inflate = args.inflate,
                a = s.allocated.0,
                sd = s.allocated.1,
                at = s
                    .at_100
                    .map_or("n/a".to_string(), |(m, sd)| format!("{m:.2}% ± {sd:.2}")),
                failed = count(s.failed),
                pods = count(s.pods),
                refused = count(s.refused.total),
                share = count(s.refused.share),
                one = count(s.refused.one_gpu),
                several = count(s.refused.several_gpus),
                secs = report.seconds,
                per = report.seconds / report.seeds.len().max(1) as f64,
            )
        }
    }
}

fn mix_name(mix: MixSource) -> &'static str {
    match mix {
        MixSource::Known => "known in advance",
        MixSource::Online => "learnt online",
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A mean count: a whole number when it is one, else one decimal.
fn count(x: f64) -> serde_json::Value {
    if x.fract() == 0.0 {
        serde_json::json!(x as u64)
    } else {
        serde_json::json!((x * 10.0).round() / 10.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn json_report_has_means_and_sds_at_the_end_and_at_100() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimulateArgs,
        }
        let cli: Cli = clap::Parser::try_parse_from([
            "simulate", "--nodes", "n.csv", "--pods", "p.csv", "--format", "json",
        ])
        .unwrap();
        let run = |allocated_milli, at_100| RunResult {
            pods: 10,
            failed: 3,
            refused: replay::Refused {
                share: 1,
                one_gpu: usize::from(at_100 == Some(92.0)),
                several_gpus: 0,
            },
            capacity_milli: 1000,
            allocated_milli,
            allocated_pct_at_100: at_100,
            curve: Vec::new(),
            defrag: Default::default(),
        };
        let report = PolicyReport {
            policy: Policy::Fgd,
            max_moves: None,
            seeds: vec![42, 43],
            runs: vec![run(940, Some(90.0)), run(960, Some(92.0))],
            seconds: 1.0,
        };
        let json: serde_json::Value = serde_json::from_str(&render(&report, &cli.args)).unwrap();
        assert_eq!(json["allocated_pct"], 95.0);
        assert_eq!(json["allocated_pct_std"], 1.414);
        assert_eq!(json["allocated_pct_at_100"], 91.0);
        assert_eq!(json["allocated_pct_at_100_std"], 1.414);
        assert_eq!(json["mix"], "known");
        // CPU pods fail too; only GPU pods are refused arrivals, by shape.
        assert_eq!(json["failed_pods"], 3);
        assert_eq!(json["refused_gpu_pods"], 1.5);
        assert_eq!(json["refused_gpu_pods_by_shape"]["share"], 1);
        assert_eq!(json["refused_gpu_pods_by_shape"]["one_gpu"], 0.5);
        assert_eq!(json["refused_gpu_pods_by_shape"]["several_gpus"], 0);
        // A run that never reached 100% of capacity has no value there, not NaN.
        let short = PolicyReport {
            runs: vec![run(500, None)],
            ..report
        };
        let json: serde_json::Value = serde_json::from_str(&render(&short, &cli.args)).unwrap();
        assert!(json["allocated_pct_at_100"].is_null());
        assert!(json["allocated_pct_at_100_std"].is_null());
    }

    /// `--timeline --format json`: one object per mode, every measured field, the mode
    /// named; the text line reads waits in the largest unit that fits.
    #[test]
    fn timeline_reports_as_json_and_as_text() {
        let result = timeline::TimelineResult {
            pods: 10,
            started: 9,
            no_node: 1,
            never_started: 1,
            waited: 4,
            wait_p50_s: 90,
            wait_p99_s: 7_200,
            wait_max_s: 200_000,
            stranded_gpu_hours: 1.5,
            ..Default::default()
        };
        let json: serde_json::Value = serde_json::from_str(&render_timeline(
            timeline::QuotaMode::Cohort,
            &result,
            Format::Json,
        ))
        .unwrap();
        assert_eq!(json["mode"], "cohort");
        assert_eq!(json["started"], 9);
        assert_eq!(json["wait_p99_s"], 7200);
        assert_eq!(json["stranded_gpu_hours"], 1.5);
        let text = render_timeline(timeline::QuotaMode::Queue, &result, Format::Text);
        assert!(
            text.starts_with("Queue: 9 of 10 GPU pods started (0 larger than any quota, 1 never started, 1 of them for want of a node); 4 waited on quota: p50 90 s, p99 2.0 h, max 2.3 d;"),
            "{text}"
        );
    }

    #[test]
    fn seeds_parse_as_range_or_list() {
        assert_eq!(bounds::seeds("42-45").unwrap(), Seeds(vec![42, 43, 44, 45]));
        assert_eq!(bounds::seeds("1,5").unwrap(), Seeds(vec![1, 5]));
        assert!(bounds::seeds("5-1").is_err());
        assert!(bounds::seeds("x").is_err());
    }

    #[test]
    fn mean_and_sample_sd() {
        let (m, sd) = mean_sd(&[1.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((sd - 2f64.sqrt()).abs() < 1e-12);
    }
}
