//! What `simulate` accepts (docs/simulate.md, "Bounds"): every number it reads, on its
//! command line or in a trace, is checked against a limit before anything is allocated
//! or looped over by it, and a value past one is an error that names the flag (or the
//! file, line and column) and the limit.

use std::fmt::Display;

/// Most seeds one run replays (`--seeds`): each is a whole replay.
pub(super) const MAX_SEEDS: u128 = 1_000;
/// Largest `--inflate`: the workload's GPU demand, as a multiple of the cluster's.
pub(super) const MAX_INFLATE: f64 = 100.0;
/// Most pods one workload replays (the trace's and their copies, `--inflate`).
pub(super) const MAX_WORKLOAD_PODS: usize = 2_000_000;
/// Most namespaces `--timeline` deals pods to (`--namespaces`).
pub(super) const MAX_NAMESPACES: usize = 1_000;
/// Largest `--quota-scale`.
pub(super) const MAX_QUOTA_SCALE: f64 = 1_000.0;
/// Largest `--max-moves`.
pub(super) const MAX_MOVES: usize = crate::placement::defrag::MOST_MOVES;
/// Largest `--defrag-budget`.
pub(super) const MAX_DEFRAG_BUDGET: u64 = crate::placement::defrag::LARGEST_BUDGET;
/// Most GPUs a trace's node or pod may have: the product's own bound.
pub(super) const MAX_GPUS: u32 = crate::placement::node::MAX_GPUS_PER_NODE as u32;
/// Largest CPU (milli) or memory (MiB) of a trace's node or pod: sums over a whole
/// workload stay far inside 64 bits.
pub(super) const MAX_HOST: u64 = 1_000_000_000_000;
/// Latest time (seconds) in a trace: an arrival plus a run time stays inside 64 bits.
pub(super) const MAX_TIME: u64 = 1_000_000_000_000;
/// Largest trace file read.
pub(super) const MAX_TRACE_BYTES: u64 = 256 << 20;
/// Most nodes in a node list.
pub(super) const MAX_NODES: usize = 100_000;
/// Most pods in a pod list.
pub(super) const MAX_PODS: usize = 1_000_000;

/// A flag's value past its bound, or a list naming a value twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum BoundError {
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("must be above 0 and at most {max}, not {value}")]
    OutOfRange { max: String, value: String },
    #[error("must be {min} to {max}, not {value}")]
    Between {
        min: String,
        max: String,
        value: String,
    },
    #[error("{0:?} is not a seed (a whole number)")]
    NotASeed(String),
    #[error("empty seed range {0}")]
    EmptyRange(String),
    #[error("{text} names {count} seeds; at most {MAX_SEEDS} are replayed")]
    TooManySeeds { text: String, count: u128 },
    #[error("{flag} names {value} twice")]
    Twice { flag: &'static str, value: String },
}

/// A number above 0 and at most `max` (`inf` and `NaN` are neither).
fn fraction_up_to(text: &str, max: f64) -> Result<f64, BoundError> {
    let value: f64 = (text.trim().parse()).map_err(|_| BoundError::NotANumber(text.into()))?;
    if value > 0.0 && value <= max {
        Ok(value)
    } else {
        Err(BoundError::OutOfRange {
            max: max.to_string(),
            value: text.into(),
        })
    }
}

/// A whole number from `min` to `max`.
fn whole_between<T>(text: &str, min: T, max: T) -> Result<T, BoundError>
where
    T: std::str::FromStr + PartialOrd + Display + Copy,
{
    let value: T = (text.trim().parse()).map_err(|_| BoundError::NotANumber(text.into()))?;
    if value >= min && value <= max {
        Ok(value)
    } else {
        Err(BoundError::Between {
            min: min.to_string(),
            max: max.to_string(),
            value: text.into(),
        })
    }
}

/// `--inflate`.
pub(super) fn inflate(text: &str) -> Result<f64, BoundError> {
    fraction_up_to(text, MAX_INFLATE)
}

/// `--quota-scale`.
pub(super) fn quota_scale(text: &str) -> Result<f64, BoundError> {
    fraction_up_to(text, MAX_QUOTA_SCALE)
}

/// `--namespaces`.
pub(super) fn namespaces(text: &str) -> Result<usize, BoundError> {
    whole_between(text, 1, MAX_NAMESPACES)
}

/// One value of `--max-moves`.
pub(super) fn max_moves(text: &str) -> Result<usize, BoundError> {
    whole_between(text, 0, MAX_MOVES)
}

/// `--defrag-budget`.
pub(super) fn defrag_budget(text: &str) -> Result<u64, BoundError> {
    whole_between(text, 1, MAX_DEFRAG_BUDGET)
}

/// The seeds of `--seeds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seeds(pub(super) Vec<u64>);

/// `--seeds`: a range `42-51` or a list `42,43`, at most [`MAX_SEEDS`] seeds, none twice.
pub(super) fn seeds(text: &str) -> Result<Seeds, BoundError> {
    let number =
        |s: &str| (s.trim().parse::<u64>()).map_err(|_| BoundError::NotASeed(s.to_string()));
    let too_many = |count: u128| BoundError::TooManySeeds {
        text: text.into(),
        count,
    };
    let seeds: Vec<u64> = match text.split_once('-') {
        Some((from, to)) => {
            let (from, to) = (number(from)?, number(to)?);
            if from > to {
                return Err(BoundError::EmptyRange(text.to_string()));
            }
            let count = u128::from(to - from) + 1;
            if count > MAX_SEEDS {
                return Err(too_many(count));
            }
            (from..=to).collect()
        }
        None => {
            let count = text.split(',').count() as u128;
            if count > MAX_SEEDS {
                return Err(too_many(count));
            }
            text.split(',').map(number).collect::<Result<_, _>>()?
        }
    };
    once_each("--seeds", &seeds)?;
    Ok(Seeds(seeds))
}

/// Each of `values` once: a list flag naming a value twice would replay it twice.
pub(super) fn once_each<T: PartialEq + std::fmt::Debug>(
    flag: &'static str,
    values: &[T],
) -> Result<(), BoundError> {
    for (at, value) in values.iter().enumerate() {
        if values[..at].contains(value) {
            let value = format!("{value:?}").to_lowercase();
            return Err(BoundError::Twice { flag, value });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::{SimulateArgs, run};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    /// `simulate` with `flags`: its arguments, or clap's error text.
    fn parsed(flags: &[&str]) -> Result<SimulateArgs, String> {
        let mut argv = vec!["simulate", "--nodes", "n.csv", "--pods", "p.csv"];
        argv.extend_from_slice(flags);
        let cli = <Cli as clap::Parser>::try_parse_from(argv).map_err(|e| e.to_string())?;
        Ok(cli.args)
    }

    /// Each value past its bound is refused by name, with the bound, before anything
    /// is read or allocated.
    #[test]
    fn every_numeric_flag_past_its_bound_is_refused_naming_the_flag_and_the_limit() {
        let refused = [
            (
                &["--seeds", "0-18446744073709551615"][..],
                "--seeds",
                "names 18446744073709551616 seeds; at most 1000 are replayed",
            ),
            (&["--seeds", "1-1001"], "--seeds", "at most 1000"),
            (&["--seeds", "7,8,7"], "--seeds", "--seeds names 7 twice"),
            (&["--inflate", "NaN"], "--inflate", "at most 100, not NaN"),
            (&["--inflate", "inf"], "--inflate", "at most 100, not inf"),
            (&["--inflate", "1e12"], "--inflate", "at most 100, not 1e12"),
            (&["--inflate", "0"], "--inflate", "must be above 0"),
            (
                &["--namespaces", "100000000000"],
                "--namespaces",
                "must be 1 to 1000",
            ),
            (
                &["--namespaces", "0"],
                "--namespaces",
                "must be 1 to 1000, not 0",
            ),
            (&["--quota-scale", "1e300"], "--quota-scale", "at most 1000"),
            (
                &["--max-moves", "2,9"],
                "--max-moves",
                "must be 0 to 8, not 9",
            ),
            (
                &["--defrag-budget", "18446744073709551615"],
                "--defrag-budget",
                "must be 1 to 10000000",
            ),
        ];
        for (flags, flag, says) in refused {
            let error = parsed(flags).map(drop).unwrap_err();
            assert!(error.contains(flag), "{flags:?}: {error}");
            assert!(error.contains(says), "{flags:?}: {error}");
        }
        let at_the_bounds = [
            "--inflate",
            "100",
            "--namespaces",
            "1000",
            "--seeds",
            "1-1000",
        ];
        assert!(parsed(&at_the_bounds).is_ok());
    }

    #[test]
    fn a_list_flag_naming_a_value_twice_is_refused_before_any_file_is_read() {
        for (flags, says) in [
            (
                &["--policy", "fgd,binpack,fgd"][..],
                "--policy names fgd twice",
            ),
            (&["--max-moves", "2,2"], "--max-moves names 2 twice"),
            (&["--modes", "deny,deny"], "--modes names deny twice"),
        ] {
            let error = run(parsed(flags).unwrap()).unwrap_err().to_string();
            assert_eq!(error, says, "{flags:?}");
        }
    }
}
