//! Command line (clap derive). Every `serve` flag can also be set by the environment
//! variable `GPU_ADMISSION_<FLAG>`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::server::flag_values;
use crate::server::listener::ConnectionLimits;

#[derive(Debug, Parser)]
#[command(
    name = "gpu-admission",
    version,
    about = "GPU quota webhooks and fragment-aware GPU placement for Kubernetes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the webhooks and the scheduler extender.
    Serve(Box<ServeArgs>),
    /// Create (or keep, or renew) the webhook's CA and serving certificate.
    Certs(CertsArgs),
    /// GPUQuota tools.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// For each pending GPU pod, the fewest moves of running pods after which it fits
    /// (or why there are none). Reads the cluster; never evicts.
    Defrag(crate::defrag::DefragArgs),
    /// Why a GPU pod waits: a reason code per stage (admission, placement) with its
    /// numbers, and what would change it. Reads the cluster; writes nothing.
    Explain(crate::explain::ExplainArgs),
    /// Replay a GPU cluster trace (openb format) through the placement policies.
    Simulate(crate::simulate::SimulateArgs),
    /// Print the version.
    Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(
        long,
        env = "GPU_ADMISSION_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log level or filter directives (e.g. `info`, `gpu_admission=debug`).
    #[arg(long, env = "GPU_ADMISSION_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TLS listener for the admission webhooks only (`/validate`, `/mutate`, `/version`):
    /// the door the API server calls.
    #[arg(long, env = "GPU_ADMISSION_ADDRESS", default_value = "0.0.0.0:3456")]
    pub(crate) address: SocketAddr,
    /// TLS listener for the scheduler extender only (`/scheduler/*`, `/version`). Loopback
    /// by default: only the kube-scheduler in the same pod may call it.
    #[arg(
        long,
        env = "GPU_ADMISSION_EXTENDER_ADDRESS",
        default_value = "127.0.0.1:3458"
    )]
    pub(crate) extender_address: SocketAddr,
    /// CA (PEM) that signed the API server's client certificate. When set, the webhook
    /// listener refuses any client without a certificate it signed (mutual TLS).
    #[arg(long, env = "GPU_ADMISSION_CLIENT_CA")]
    pub(crate) client_ca: Option<PathBuf>,
    /// Serving certificate (PEM). Default: webhook-certs/tls.crt, created for development when absent.
    #[arg(long, env = "GPU_ADMISSION_TLS_CERT")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// Serving key (PEM). Default: webhook-certs/tls.key.
    #[arg(long, env = "GPU_ADMISSION_TLS_KEY")]
    pub(crate) tls_key: Option<PathBuf>,
    /// How often to look for a changed certificate.
    #[arg(long, env = "GPU_ADMISSION_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = flag_values::duration)]
    pub(crate) tls_reload_interval: Duration,
    /// Optional plain-HTTP listener with only the extender routes and probes (for a
    /// scheduler configured with `enableHTTPS: false`; bind it to loopback).
    #[arg(long, env = "GPU_ADMISSION_INSECURE_EXTENDER_ADDRESS")]
    pub(crate) insecure_extender_address: Option<SocketAddr>,
    /// Plain-HTTP listener for /livez, /readyz and /metrics.
    #[arg(
        long,
        env = "GPU_ADMISSION_ADMIN_ADDRESS",
        default_value = "0.0.0.0:3457"
    )]
    pub(crate) admin_address: SocketAddr,
    /// kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "GPU_ADMISSION_KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// API server URL, overriding the kubeconfig's.
    #[arg(long, env = "GPU_ADMISSION_MASTER")]
    pub(crate) master: Option<String>,
    /// Configuration file (YAML).
    #[arg(long, env = "GPU_ADMISSION_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Offline mode: this YAML file of Nodes, Pods and GPUQuotas is the cluster (at most
    /// 2 GiB).
    #[arg(long, env = "GPU_ADMISSION_CLUSTER")]
    pub(crate) cluster: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) limits: ConnectionLimits,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = "GPU_ADMISSION_SHUTDOWN_GRACE", default_value = "20s", value_parser = flag_values::duration)]
    pub(crate) shutdown_grace: Duration,
    /// API mode: let pods out of the quota queue (`onExceed: Queue`) and evict borrowing
    /// pods when a cohort's lender takes its GPUs back (`reclaim: Evict`), which take the
    /// rights to patch and evict pods. deploy/ runs it in the GPU scheduler's sidecar and
    /// turns it off in the webhook servers, whose identity may not write pods.
    #[arg(long, env = "GPU_ADMISSION_RELEASE_QUEUE", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) release_queue: bool,
    #[command(flatten)]
    pub log: LogArgs,
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Create or update GPUQuota objects from tkestack's legacy quota ConfigMap.
    Import(QuotaImportArgs),
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["configmap", "file"]))]
pub struct QuotaImportArgs {
    /// The legacy ConfigMap, as NAMESPACE/NAME (tkestack used kube-system/gpuquota).
    #[arg(long)]
    pub(crate) configmap: Option<String>,
    /// A file holding the legacy `gpu_quota` JSON instead.
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    /// Print the GPUQuota objects as YAML; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "GPU_ADMISSION_KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
}

/// The longest a certificate `certs` makes may be valid: its CA's validity (a serving
/// certificate never outlives its CA), in days.
const CERT_DAYS_MAX: i64 = 3650;

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Service name of the webhook.
    #[arg(long, default_value = "gpu-admission")]
    pub service: String,
    /// Namespace of the service.
    #[arg(long, default_value = "gpu-admission")]
    pub namespace: String,
    /// Where to write ca.crt, ca.key, tls.crt and tls.key.
    #[arg(long, default_value = "webhook-certs")]
    pub out_dir: PathBuf,
    /// Validity of the serving certificate in days (at most the CA's, 3650).
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=CERT_DAYS_MAX))]
    pub days: u32,
    /// Renew the serving certificate when it expires within this many days.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=CERT_DAYS_MAX))]
    pub renew_within_days: u32,
    /// Extra DNS names for the serving certificate (repeatable).
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// Extra IP addresses for the serving certificate (repeatable).
    #[arg(long = "ip")]
    pub ips: Vec<IpAddr>,
    /// Also write the `kubernetes.io/tls` Secret (`--secret` in `--namespace`) and set the
    /// `caBundle` of the `gpu-admission` webhook configurations.
    #[arg(long)]
    pub install: bool,
    /// Name of the TLS Secret written by `--install`.
    #[arg(long, default_value = "gpu-admission-tls", requires = "install")]
    pub secret: String,
    /// kubeconfig file for `--install` (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "GPU_ADMISSION_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
        let limits = ConnectionLimits::default();
        assert_eq!(limits.max_connections, 256);
        assert_eq!(limits.request_timeout, Duration::from_secs(15));
        assert_eq!(limits.min_body_rate, 240);
        assert_eq!(limits.body_rate_grace, Duration::from_secs(2));
    }

    /// A duration that overflows the clock, a timeout of zero, no connections: refused
    /// by name at startup, never a panic on the first connection.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_duration_or_count_flag_out_of_range_is_an_error_naming_the_flag() {
        let refused = [
            ("--request-timeout", "500000000000y"),
            ("--idle-timeout", "500000000000y"),
            ("--handshake-timeout", "500000000000y"),
            ("--body-rate-grace", "500000000000y"),
            ("--shutdown-grace", "500000000000y"),
            ("--tls-reload-interval", "500000000000y"),
            ("--request-timeout", "0s"),
            ("--handshake-timeout", "0s"),
            ("--max-connections", "0"),
            ("--max-connections", "18446744073709551615"),
            ("--max-connections", "1048577"),
            ("--max-connections", "-1"),
            ("--max-connections", "99999999999999999999999"),
            ("--max-connections", "many"),
            ("--max-streams", "0"),
        ];
        for (flag, value) in refused {
            let arg = format!("{flag}={value}");
            let err = Cli::try_parse_from(["gpu-admission", "serve", &arg]).unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains(flag) && message.contains(value),
                "{message}"
            );
        }
        let accepted = ["--request-timeout", "1h", "--shutdown-grace", "0s"];
        let cli = Cli::try_parse_from(["gpu-admission", "serve"].into_iter().chain(accepted));
        assert!(cli.is_ok(), "{:?}", cli.err());
        for count in ["1", "256", "1048576"] {
            let argv = ["gpu-admission", "serve", "--max-connections", count];
            assert!(Cli::try_parse_from(argv).is_ok(), "{count}");
        }
    }

    /// A validity past the CA's would overflow the certificate's dates: refused by name.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn certificate_days_past_the_cas_validity_are_refused_naming_the_flag() {
        for flags in [
            ["--days", "4294967295"],
            ["--days", "3651"],
            ["--renew-within-days", "4294967295"],
        ] {
            let argv = ["gpu-admission", "certs", flags[0], flags[1]];
            let error = Cli::try_parse_from(argv).unwrap_err().to_string();
            assert!(error.contains(flags[0]), "{error}");
            assert!(
                error.contains("1..=3650") || error.contains("0..=3650"),
                "{error}"
            );
        }
        let argv = ["gpu-admission", "certs", "--days", "3650"];
        assert!(Cli::try_parse_from(argv).is_ok());
    }

    /// `defrag`'s planner limits have the same bounds as `simulate`'s.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn defrag_limits_past_their_bounds_are_refused_naming_the_flag() {
        for (flag, value, range) in [
            ("--max-moves", "18446744073709551615", "0..=8"),
            ("--max-moves", "9", "0..=8"),
            ("--budget", "18446744073709551615", "1..=10000000"),
        ] {
            let argv = [
                "gpu-admission",
                "defrag",
                "--cluster",
                "c.yaml",
                flag,
                value,
            ];
            let error = Cli::try_parse_from(argv).unwrap_err().to_string();
            assert!(error.contains(flag) && error.contains(range), "{error}");
        }
    }
}
