use anyhow::Context;
use base64::Engine as _;
use clap::Parser;
use gpu_admission::certs::install;
use gpu_admission::cli::{CertsArgs, Cli, Command, QuotaCommand};
use gpu_admission::{certs, import, serve, telemetry};

/// The server's allocator: jemalloc. A review's decode and answer are a few dozen small
/// allocations, often freed on another worker than the one that made them; under 64
/// concurrent TLS connections glibc's malloc and free were a fifth of a `/mutate`'s
/// CPU. (mimalloc was as fast but held three times the memory under hostile bodies.)
/// Declared here, not in the library, so a test binary may count its own allocations
/// (`tests/cache_memory.rs`); the benchmarks declare it as well (docs/design.md, "The
/// allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    // jemalloc gives pages freed for good back to the kernel only as it allocates
    // again, unless its background threads do it: an idle server would keep what
    // loading the cluster freed (docs/design.md, "The allocator").
    if let Err(error) = tikv_jemalloc_ctl::background_thread::write(true) {
        eprintln!("warning: jemalloc's background threads: {error}");
    }
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
            runtime.block_on(serve::run(*args))
        }
        Command::Certs(args) => run_certs(args),
        Command::Quota(QuotaCommand::Import(args)) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(import::run(args))
        }
        Command::Simulate(args) => gpu_admission::simulate::run(args),
        Command::Defrag(args) => gpu_admission::defrag::run(args),
        Command::Explain(args) => gpu_admission::explain::run(args),
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
    if !args.install {
        ensure_files(&files, &request, renew_within)?;
        println!("{}", certs::ca_bundle_base64(&files)?);
        return Ok(());
    }
    let target = install::InstallTarget {
        secret: &args.secret,
        namespace: &request.namespace,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let client = serve::kube_client(args.kubeconfig.as_deref(), None).await?;
        // A re-run (the bootstrap Job starts with an empty disk) keeps a Secret that is
        // still good, so the CA and the caBundle do not change under running servers.
        let kept = match install::existing_secret(&client, &target).await? {
            Some(secret) if files_absent(&files) => install::TlsMaterial::from_secret(&secret)
                .filter(|material| {
                    let check = material.check(
                        &request.sans(),
                        time::OffsetDateTime::now_utc(),
                        renew_within,
                    );
                    if let Err(reason) = &check {
                        eprintln!("Secret {}: not kept ({reason})", args.secret);
                    }
                    check.is_ok()
                }),
            _ => None,
        };
        let material = match kept {
            Some(material) => {
                eprintln!(
                    "Kept: the certificate in Secret {} is still good",
                    args.secret
                );
                material
            }
            None => {
                ensure_files(&files, &request, renew_within)?;
                install::TlsMaterial::read(&files)?
            }
        };
        install::install(&client, &target, &material).await?;
        println!(
            "{}",
            base64::engine::general_purpose::STANDARD.encode(&material.ca_cert)
        );
        Ok(())
    })
}

fn ensure_files(
    files: &certs::CertFiles,
    request: &certs::CertRequest,
    renew_within: std::time::Duration,
) -> anyhow::Result<()> {
    let outcome = certs::ensure(
        files,
        request,
        renew_within,
        time::OffsetDateTime::now_utc(),
    )?;
    eprintln!(
        "{outcome:?}: {} ({})",
        files.cert.display(),
        request.sans().join(", ")
    );
    Ok(())
}

/// No CA on disk: the material in the Secret, if good, is the one to keep.
fn files_absent(files: &certs::CertFiles) -> bool {
    !files.ca_cert.exists() && !files.ca_key.exists()
}
