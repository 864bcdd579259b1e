use anyhow::Context;
use clap::Parser;
use gpu_admission::cli::{CertsArgs, Cli, Command, QuotaCommand};
use gpu_admission::{certs, import, serve, telemetry};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // One process-wide crypto provider for rustls (the kube client and our server).
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Serve(args) => {
            telemetry::init(&args.log)?;
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(serve::run(args))
        }
        Command::Certs(args) => run_certs(args),
        Command::Quota(QuotaCommand::Import(args)) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(import::run(args))
        }
        Command::Simulate(args) => gpu_admission::simulate::run(args),
        Command::Version => {
            println!("gpu-admission {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    }
}

fn run_certs(args: CertsArgs) -> anyhow::Result<()> {
    let files = certs::CertFiles::in_dir(&args.out_dir);
    let request = certs::CertRequest {
        service: args.service,
        namespace: args.namespace,
        hosts: args.hosts,
        ips: args.ips,
        days: args.days,
    };
    let renew_within =
        std::time::Duration::from_secs(u64::from(args.renew_within_days) * 24 * 3600);
    let outcome = certs::ensure(
        &files,
        &request,
        renew_within,
        time::OffsetDateTime::now_utc(),
    )?;
    eprintln!(
        "{outcome:?}: {} ({})",
        files.cert.display(),
        request.sans().join(", ")
    );
    println!("{}", certs::ca_bundle_base64(&files)?);
    Ok(())
}
