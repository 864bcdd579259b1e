//! The workload of one simulated run (docs/design.md): the trace's pods plus uniformly drawn
//! copies, until the next copy would take the GPU demand past `inflate` × capacity,
//! then shuffled. Seeded, so a seed always gives the same workload. At most
//! [`MAX_WORKLOAD_PODS`] pods: a larger one is an error, not a run.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::bounds::MAX_WORKLOAD_PODS;

/// The workload `--inflate` asks for would pass [`MAX_WORKLOAD_PODS`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "--inflate {inflate} makes a workload of more than {MAX_WORKLOAD_PODS} pods of this trace (seed {seed}): lower --inflate"
)]
pub(super) struct TooLarge {
    inflate: f64,
    seed: u64,
}

/// Indices into the trace's pods, in arrival order. `demands` are the pods' GPU demands
/// and `capacity_milli` the cluster's GPU capacity, both in milli-GPU.
pub(super) fn build(
    demands: &[u64],
    capacity_milli: u64,
    inflate: f64,
    seed: u64,
) -> Result<Vec<usize>, TooLarge> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let limit = inflate * capacity_milli as f64;
    let mut order: Vec<usize> = (0..demands.len()).collect();
    let mut demand: u64 = demands.iter().sum();
    // A trace without GPU demand would never reach the limit: no copies then.
    if demand > 0 {
        loop {
            let copy = rng.random_range(0..demands.len());
            let next = demand + demands[copy];
            if next as f64 > limit {
                break;
            }
            if order.len() >= MAX_WORKLOAD_PODS {
                return Err(TooLarge { inflate, seed });
            }
            demand = next;
            order.push(copy);
        }
    }
    order.shuffle(&mut rng);
    Ok(order)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::simulate::trace::{PodRow, parse_pods};

    fn demands(csv: &str) -> Vec<u64> {
        let pods = parse_pods("t.csv", csv).unwrap();
        pods.iter().map(PodRow::gpu_demand_milli).collect()
    }

    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
        half,1000,1024,1,500,\n\
        one,1000,1024,1,1000,\n\
        cpu,1000,1024,0,0,\n";

    #[test]
    fn copies_stop_before_the_limit_and_the_seed_decides_everything() {
        let pods = demands(PODS);
        // Capacity 4 GPUs × 1.3 = 5200 milli; the trace itself asks 1500.
        let order = build(&pods, 4000, 1.3, 7).unwrap();
        let demand: u64 = order.iter().map(|&i| pods[i]).sum();
        assert!(demand <= 5200, "{demand}");
        // The stop rule: the draw after the last copy would have gone past the limit,
        // so at least 200 milli (the smallest GPU pod is 500) must be missing — the
        // total is more than 5200 - 1000 (the largest pod).
        assert!(demand > 4200, "{demand}");
        // Every trace pod is there at least once.
        for i in 0..pods.len() {
            assert!(order.contains(&i));
        }
        assert_eq!(order, build(&pods, 4000, 1.3, 7).unwrap());
        assert_ne!(order, build(&pods, 4000, 1.3, 8).unwrap());
    }

    #[test]
    fn stop_rule_is_exact_for_a_single_shape() {
        let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
        let pods = demands(&format!("{header}one,1,1,1,1000,\n"));
        // 10 GPUs × 1.3 = 13000 milli: the trace's one pod plus 12 copies, never 14.
        assert_eq!(build(&pods, 10_000, 1.3, 42).unwrap().len(), 13);
        // No GPU demand at all: no copies, no endless loop.
        let cpu = demands(&format!("{header}c,1,1,0,0,\n"));
        assert_eq!(build(&cpu, 10_000, 1.3, 42).unwrap(), vec![0]);
    }

    #[test]
    fn a_workload_past_its_bound_is_an_error_naming_the_flag() {
        let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
        // A 1-milli pod on 16 GPUs at --inflate 100: 1.6 million copies fit; 32 GPUs: 3.2.
        let pods = demands(&format!("{header}tiny,1,1,1,1,\n"));
        assert!(build(&pods, 16_000, 100.0, 42).is_ok());
        let err = build(&pods, 32_000, 100.0, 42).unwrap_err().to_string();
        assert_eq!(
            err,
            "--inflate 100 makes a workload of more than 2000000 pods of this trace (seed 42): lower --inflate"
        );
    }
}
