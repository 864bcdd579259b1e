//! `cargo run --release --example simulate -- --nodes N.csv --pods P.csv ...`: the
//! `simulate` command without the main CLI (same flags as `gpu-admission simulate`).

use clap::Parser;
use gpu_admission::simulate::{SimulateArgs, run};

#[derive(Parser, Debug)]
#[command(name = "simulate")]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

fn main() -> anyhow::Result<()> {
    run(Cli::parse().args)
}
