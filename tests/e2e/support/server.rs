//! The gpu-admission replicas under test, as hack/e2e.sh describes them in the
//! environment: stopping and starting them, their binary, their doors' URLs and the TLS
//! identities to call them with, the extender's verbs called directly, and the admin
//! port's metrics.

use std::path::PathBuf;

use super::{CTL_ENV, https};

/// Runs the `GPU_ADMISSION_E2E_CTL` script with `action` (`stop` or `start`) for
/// gpu-admission replica `a` (the extender, and the webhooks' usual backend).
pub fn ctl(action: &str) {
    ctl_replica(action, "a");
}

/// Replica `c`, stopped when dropped.
pub struct ReplicaC;

impl ReplicaC {
    /// Starts it against the API server directly (`direct`), or through the proxy the
    /// watch-cut scenarios run (`proxy::replica_c_behind_proxy`).
    pub async fn start(direct: bool) -> Self {
        let env: &'static [(&str, &str)] = if direct { &[("C_DIRECT", "1")] } else { &[] };
        tokio::task::spawn_blocking(move || ctl_replica_with("start", "c", env))
            .await
            .unwrap();
        ReplicaC
    }
}

impl Drop for ReplicaC {
    fn drop(&mut self) {
        ctl_replica("stop", "c");
    }
}

/// Runs the `GPU_ADMISSION_E2E_CTL` script with `action` for `replica` (`a`, `b` or `c`).
pub fn ctl_replica(action: &str, replica: &str) {
    ctl_replica_with(action, replica, &[]);
}

fn ctl_replica_with(action: &str, replica: &str, env: &[(&str, &str)]) {
    let script = std::env::var_os(CTL_ENV).unwrap_or_else(|| {
        panic!("{CTL_ENV} is not set: this scenario needs a script to stop/start gpu-admission")
    });
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(action)
        .arg(replica)
        .envs(env.iter().copied())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "`{script:?} {action} {replica}` failed: {status}"
    );
}

/// Starts gpu-admission replica `a` with the config file `config` instead of the run's.
pub fn start_with_config(config: &std::path::Path) {
    start_replica_with_config("a", config);
}

/// Starts gpu-admission replica `replica` (`a` or `b`) with the config file `config`.
pub fn start_replica_with_config(replica: &str, config: &std::path::Path) {
    let script = std::env::var_os(CTL_ENV).unwrap_or_else(|| panic!("{CTL_ENV} is not set"));
    let status = std::process::Command::new("bash")
        .arg(&script)
        .args(["start", replica])
        .env("GPU_ADMISSION_CONFIG", config)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "starting gpu-admission with {config:?}: {status}"
    );
}

/// The run's gpu-admission config file (`GPU_ADMISSION_E2E_CONFIG`).
pub fn run_config() -> String {
    let path = env("GPU_ADMISSION_E2E_CONFIG", "gpu-admission's config file");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Restarts the replicas named (`a`, `b`) with the run's own config when dropped, after
/// a scenario started them with another.
pub struct RunConfigOnDrop(pub &'static [&'static str]);

impl Drop for RunConfigOnDrop {
    fn drop(&mut self) {
        for replica in self.0 {
            ctl_replica("stop", replica);
            ctl_replica("start", replica);
        }
    }
}

/// Restarts gpu-admission when dropped, so a failing assertion does not leave the
/// extender down for the scenarios that follow.
pub struct RestartOnDrop(pub bool);

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if self.0 {
            ctl("start");
        }
    }
}

fn env(name: &str, what: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} ({what}) is not set"))
}

/// The gpu-admission binary of the run (`GPU_ADMISSION_E2E_BIN`, a copy hack/e2e.sh took
/// of this checkout's build: cargo's own output may be replaced by another checkout's build
/// when the target directory is shared); cargo's when the variable is not set.
pub fn gpu_admission_bin() -> PathBuf {
    std::env::var_os("GPU_ADMISSION_E2E_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpu-admission")))
}

/// https URL of the webhook door of gpu-admission replica `a`
/// (`GPU_ADMISSION_E2E_SERVER_URL`).
pub fn server_url() -> String {
    env("GPU_ADMISSION_E2E_SERVER_URL", "gpu-admission's https URL")
}

/// https URL of the webhook door of the second replica `b`
/// (`GPU_ADMISSION_E2E_SERVER_URL_B`).
pub fn server_url_b() -> String {
    env("GPU_ADMISSION_E2E_SERVER_URL_B", "replica b's https URL")
}

/// https URL of the webhook door of replica `a`, `b` or `c` (`c` runs only while a
/// scenario has started it).
pub fn replica_server_url(replica: &str) -> String {
    match replica {
        "a" => server_url(),
        "b" => server_url_b(),
        _ => env("GPU_ADMISSION_E2E_SERVER_URL_C", "replica c's https URL"),
    }
}

/// https URL of replica `a`'s extender door (`GPU_ADMISSION_E2E_EXTENDER_URL`), the
/// kube-scheduler's `urlPrefix` without `/scheduler`.
pub fn extender_url() -> String {
    env(
        "GPU_ADMISSION_E2E_EXTENDER_URL",
        "gpu-admission's extender https URL",
    )
}

/// gpu-admission's serving CA (`GPU_ADMISSION_E2E_CA_FILE`).
pub fn serving_ca() -> PathBuf {
    env("GPU_ADMISSION_E2E_CA_FILE", "gpu-admission's CA").into()
}

/// The client certificate and key kube-apiserver presents to the webhooks
/// (`GPU_ADMISSION_E2E_CLIENT_CERT`, `GPU_ADMISSION_E2E_CLIENT_KEY`), signed by the CA
/// gpu-admission gets as `--client-ca` (`GPU_ADMISSION_E2E_CLIENT_CA`).
pub fn apiserver_client_identity() -> (PathBuf, PathBuf) {
    (
        env(
            "GPU_ADMISSION_E2E_CLIENT_CERT",
            "kube-apiserver's webhook client certificate",
        )
        .into(),
        env(
            "GPU_ADMISSION_E2E_CLIENT_KEY",
            "kube-apiserver's webhook client key",
        )
        .into(),
    )
}

/// A TLS client trusting gpu-admission's serving CA, presenting no certificate.
pub fn anonymous_tls() -> std::sync::Arc<rustls::ClientConfig> {
    https::client_config(&serving_ca(), None)
}

/// A TLS client trusting gpu-admission's serving CA, presenting kube-apiserver's webhook
/// client certificate.
pub fn apiserver_tls() -> std::sync::Arc<rustls::ClientConfig> {
    let (cert, key) = apiserver_client_identity();
    https::client_config(&serving_ca(), Some((&cert, &key)))
}

/// POSTs an `ExtenderArgs` to replica `a`'s extender door at `/scheduler/predicates`
/// (no client certificate, as the scheduler calls it); asserts HTTP 200 and returns the
/// `ExtenderFilterResult`.
pub async fn extender_filter(args: &serde_json::Value) -> serde_json::Value {
    extender_call(&extender_url(), "predicates", args).await
}

/// POSTs `args` to `/scheduler/VERB` of the extender door at `url`; asserts HTTP 200 and
/// returns the JSON answer.
pub async fn extender_call(url: &str, verb: &str, args: &serde_json::Value) -> serde_json::Value {
    let path = format!("/scheduler/{verb}");
    let (status, body) = https::post(url, &path, args.to_string(), anonymous_tls())
        .await
        .unwrap_or_else(|e| panic!("POST {url}{path}: {}", https::chain(&*e)));
    assert_eq!(status, 200, "POST {url}{path} answered {status}: {body}");
    serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("the extender's answer is not JSON ({e}): {body}"))
}

/// POSTs `args` (ExtenderBindingArgs) to replica a's `/scheduler/bind`, as kube-scheduler
/// does, and returns the answer's `Error` (empty: bound).
pub async fn extender_bind(args: &serde_json::Value) -> String {
    let answer = extender_call(&extender_url(), "bind", args).await;
    answer["Error"].as_str().unwrap_or_default().to_string()
}

/// gpu-admission's metrics (Prometheus text) from its admin port
/// (`GPU_ADMISSION_E2E_ADMIN_URL`).
pub fn admin_metrics() -> String {
    replica_metrics("a")
}

/// The metrics of replica `replica` (`a`: `GPU_ADMISSION_E2E_ADMIN_URL`, `b`:
/// `GPU_ADMISSION_E2E_ADMIN_URL_B`).
pub fn replica_metrics(replica: &str) -> String {
    let admin = match replica {
        "b" => env("GPU_ADMISSION_E2E_ADMIN_URL_B", "replica b's admin URL"),
        _ => env("GPU_ADMISSION_E2E_ADMIN_URL", "gpu-admission's admin URL"),
    };
    let out = std::process::Command::new("curl")
        .args(["-fsS", &format!("{admin}/metrics")])
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {admin}/metrics failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The value of `metric` (the line starting `metric `, labels included) on
/// gpu-admission's admin port; 0 when absent.
pub fn admin_metric(metric: &str) -> f64 {
    sum_metric(&admin_metrics(), metric, "")
}

/// The sum of every sample of `text` whose series starts with `name` and contains
/// `fragment` (e.g. `route="validate"`); 0 when there is none.
pub fn sum_metric(text: &str, name: &str, fragment: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| series.starts_with(name) && series.contains(fragment))
        .filter(|(series, _)| {
            // `name` itself, or `name{...}`, not a longer metric name.
            matches!(series.as_bytes().get(name.len()), None | Some(b'{'))
        })
        .map(|(_, value)| value.parse::<f64>().unwrap_or(0.0))
        .sum()
}

/// SHA-256 fingerprint (openssl's `-fingerprint` line) of the certificate gpu-admission
/// presents at `url` on a fresh TLS handshake (as kube-apiserver, with its client
/// certificate), or of a PEM file.
pub fn fingerprint(source: &str) -> String {
    let script = if let Some(hostport) = source.strip_prefix("https://") {
        // The webhook door wants kube-apiserver's client certificate (mutual TLS).
        let (cert, key) = apiserver_client_identity();
        format!(
            "openssl s_client -connect {hostport} -cert {} -key {} </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256",
            cert.display(),
            key.display()
        )
    } else {
        format!("openssl x509 -in {source} -noout -fingerprint -sha256")
    };
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "`{script}` failed: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A renewal of the serving certificate in `cert_dir` under the same CA, with `host` as
/// an extra name (so it differs from the one served), made by `gpu-admission certs` in a
/// scratch directory: the directory, holding the new `tls.crt` and `tls.key`.
pub fn renew_certificate(cert_dir: &std::path::Path, host: &str) -> tempfile::TempDir {
    let scratch = tempfile::tempdir().unwrap();
    for file in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        std::fs::copy(cert_dir.join(file), scratch.path().join(file)).unwrap();
    }
    let out = std::process::Command::new(gpu_admission_bin())
        .args([
            "certs",
            "--service",
            "gpu-admission",
            "--namespace",
            "gpu-admission",
        ])
        .args([
            "--ip",
            "127.0.0.1",
            "--host",
            "localhost",
            "--host",
            host,
            "--out-dir",
        ])
        .arg(scratch.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "gpu-admission certs failed: {out:?}");
    scratch
}

/// Restarts daemon `name` of the run (`kube-apiserver`, `kubelet`, ...) through
/// hack/e2e/restart.sh, left down `down_secs`; returns what it printed (how long it was
/// down).
pub fn restart_daemon(name: &str, down_secs: u32) -> String {
    let daemons = std::env::var("GPU_ADMISSION_E2E_DAEMONS")
        .expect("GPU_ADMISSION_E2E_DAEMONS names the run's daemons (hack/e2e.sh sets it)");
    let out = std::process::Command::new("bash")
        .arg(crate::repo::path("hack/e2e/restart.sh"))
        .args([&daemons, name, &down_secs.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "restarting {name}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
