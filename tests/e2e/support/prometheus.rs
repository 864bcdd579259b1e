//! A real Prometheus (`GPU_ADMISSION_E2E_PROMETHEUS`, built by
//! hack/e2e/build-prometheus.sh) scraping the run's gpu-admission replicas as the chart's
//! ServiceMonitor says, with the chart's PrometheusRule loaded; queried over its HTTP API.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::wait_for_or_none;

/// How often Prometheus scrapes and evaluates the rules here (the chart's default
/// interval is 30 s: a scenario cannot wait minutes).
pub const SCRAPE_SECONDS: u64 = 1;

/// One scrape target: a replica's admin address (`host:port`) and the pod labels the
/// ServiceMonitor's `podTargetLabels` copy onto its series.
pub struct Target {
    pub address: String,
    pub pod: &'static str,
    pub component: &'static str,
}

/// The monitoring objects of the chart, rendered (`GPU_ADMISSION_E2E_CHART_MONITORING`:
/// ServiceMonitor, PrometheusRule and the dashboard's ConfigMap).
pub struct Monitoring {
    pub service_monitor: Value,
    pub rule: Value,
    pub dashboard: Value,
}

impl Monitoring {
    pub fn rendered() -> Monitoring {
        let path = std::env::var("GPU_ADMISSION_E2E_CHART_MONITORING")
            .expect("GPU_ADMISSION_E2E_CHART_MONITORING names the chart's rendered monitoring objects (hack/e2e.sh sets it)");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut objects = Vec::new();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(document)
                .unwrap_or_else(|e| panic!("{path}: not YAML: {e}"));
            if !value.is_null() {
                objects.push(value);
            }
        }
        let take = |kind: &str| {
            let found = objects.iter().find(|o| o["kind"] == kind);
            found
                .cloned()
                .unwrap_or_else(|| panic!("{path} has no {kind}"))
        };
        let map = take("ConfigMap");
        let json = map["data"]["gpu-admission.json"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: the dashboard ConfigMap has no gpu-admission.json"));
        Monitoring {
            service_monitor: take("ServiceMonitor"),
            rule: take("PrometheusRule"),
            dashboard: serde_json::from_str(json).unwrap(),
        }
    }

    /// The scrape job the Prometheus Operator makes of the ServiceMonitor's one endpoint
    /// for the Service gpu-admission-metrics (its job name; the path, scheme and
    /// honorLabels of the endpoint; the labels it puts on each target: namespace,
    /// service, pod, endpoint and the `podTargetLabels`), at [`SCRAPE_SECONDS`].
    pub fn scrape_config(&self, targets: &[Target]) -> Value {
        let spec = &self.service_monitor["spec"];
        let endpoints = spec["endpoints"]
            .as_array()
            .expect("ServiceMonitor endpoints");
        assert_eq!(endpoints.len(), 1, "one endpoint: {endpoints:?}");
        let endpoint = &endpoints[0];
        assert_eq!(endpoint["port"], "metrics", "{endpoint:?}");
        let copied: Vec<&str> = spec["podTargetLabels"]
            .as_array()
            .map(|labels| labels.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let static_configs: Vec<Value> = targets
            .iter()
            .map(|t| {
                let mut labels = json!({"namespace": "gpu-admission",
                    "service": "gpu-admission-metrics", "pod": t.pod, "endpoint": "metrics"});
                for label in &copied {
                    let value = match *label {
                        "app.kubernetes.io/component" => t.component,
                        other => panic!("podTargetLabels: no value for {other} here"),
                    };
                    labels[sanitize(label)] = json!(value);
                }
                json!({"targets": [t.address], "labels": labels})
            })
            .collect();
        json!({
            "job_name": "gpu-admission-metrics",
            "scrape_interval": format!("{SCRAPE_SECONDS}s"),
            "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
            "scheme": endpoint["scheme"].as_str().unwrap_or("http"),
            "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
            "static_configs": static_configs,
        })
    }

    /// The rule file Prometheus loads: the PrometheusRule's `spec` (its `groups`).
    pub fn rule_file(&self) -> Value {
        self.rule["spec"].clone()
    }

    /// Every alert of the PrometheusRule, by name.
    pub fn alert_names(&self) -> Vec<String> {
        let groups = self.rule["spec"]["groups"].as_array().expect("rule groups");
        let rules = groups
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter());
        rules
            .filter_map(|r| r["alert"].as_str().map(str::to_string))
            .collect()
    }
}

/// A Kubernetes label name as Prometheus' relabelling writes it.
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A Prometheus process; killed when dropped.
pub struct Prometheus {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus with `scrape` as its one scrape job and `rules` as its rule file,
    /// on a free loopback port; waits for /-/ready.
    pub async fn start(scrape: Value, rules: Value) -> Prometheus {
        let binary = std::env::var("GPU_ADMISSION_E2E_PROMETHEUS").expect(
            "GPU_ADMISSION_E2E_PROMETHEUS names the prometheus binary (hack/e2e.sh sets it)",
        );
        let dir = tempfile::tempdir().unwrap();
        let config = json!({
            "global": {"scrape_interval": format!("{SCRAPE_SECONDS}s"),
                "evaluation_interval": format!("{SCRAPE_SECONDS}s")},
            "rule_files": [dir.path().join("rules.yaml")],
            "scrape_configs": [scrape],
        });
        write_yaml(&dir.path().join("prometheus.yaml"), &config);
        write_yaml(&dir.path().join("rules.yaml"), &rules);
        check_rules(&dir.path().join("rules.yaml"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(&binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yaml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let ready = wait_for_or_none(Duration::from_secs(30), || async {
            curl(&[&format!("{}/-/ready", prometheus.url)]).map(drop)
        })
        .await;
        if ready.is_none() {
            panic!(
                "Prometheus did not become ready within 30 s; its log:\n{}",
                prometheus.log()
            );
        }
        prometheus
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` with `params` (URL-encoded) of the HTTP API: its `data`, or why not.
    pub fn api(&self, path: &str, params: &[(&str, String)]) -> Result<Value, String> {
        let mut args = vec!["-G".to_string(), format!("{}{path}", self.url)];
        for (name, value) in params {
            args.push("--data-urlencode".into());
            args.push(format!("{name}={value}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let body = curl_any(&args)?;
        let answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("not JSON ({e}): {body}"))?;
        if answer["status"] != "success" {
            return Err(format!("{}: {}", answer["errorType"], answer["error"]));
        }
        Ok(answer["data"].clone())
    }

    /// `query_range` of `expr` over the last `seconds` (step [`SCRAPE_SECONDS`]): the
    /// series of the matrix.
    pub fn query_range(&self, expr: &str, seconds: u64) -> Result<Vec<Value>, String> {
        let end = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let params = [
            ("query", expr.to_string()),
            ("start", (end - seconds).to_string()),
            ("end", end.to_string()),
            ("step", SCRAPE_SECONDS.to_string()),
        ];
        let data = self.api("/api/v1/query_range", &params)?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The instant `query` of `expr`: the vector's samples.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/query", &[("query", expr.to_string())])?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerting rules as /api/v1/rules tells them: (name, health, last error, state of
    /// each active alert with its labels).
    pub fn alerting_rules(&self) -> Vec<Value> {
        let data = self
            .api("/api/v1/rules", &[("type", "alert".to_string())])
            .unwrap_or_else(|e| panic!("/api/v1/rules: {e}"));
        let groups = data["groups"].as_array().cloned().unwrap_or_default();
        groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Waits until alert `name` has an active (pending or firing) instance whose labels
    /// include `labels`; returns it. Panics with what the rules showed last.
    pub async fn wait_alert(&self, name: &str, labels: Value, timeout: Duration) -> Value {
        let last = std::sync::Mutex::new(Value::Null);
        let found = wait_for_or_none(timeout, || async {
            let rules = self.alerting_rules();
            let rule = rules.into_iter().find(|r| r["name"] == name)?;
            *last.lock().unwrap() = rule.clone();
            let alerts = rule["alerts"].as_array().cloned().unwrap_or_default();
            alerts.into_iter().find(|alert| {
                let have = &alert["labels"];
                let wanted = labels.as_object().unwrap();
                wanted.iter().all(|(k, v)| &have[k] == v)
                    && matches!(alert["state"].as_str(), Some("pending" | "firing"))
            })
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "alert {name} with labels {labels} did not go pending within {timeout:?}; the rule: {}",
                last.lock().unwrap()
            )
        })
    }
}

fn write_yaml(path: &Path, value: &Value) {
    std::fs::write(path, serde_yaml::to_string(value).unwrap()).unwrap();
}

/// `promtool check rules` of the rule file, when hack/e2e.sh names promtool.
fn check_rules(path: &Path) {
    let Some(promtool) = std::env::var_os("GPU_ADMISSION_E2E_PROMTOOL").map(PathBuf::from) else {
        return;
    };
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
    assert!(
        out.status.success(),
        "promtool check rules of the chart's PrometheusRule: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `curl -fsS ARGS`: stdout, or `None` on any failure.
fn curl(args: &[&str]) -> Option<String> {
    let out = Command::new("curl").arg("-fsS").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `curl -sS ARGS` (an HTTP error status still gives its body, where the API says why).
fn curl_any(args: &[&str]) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30"])
        .args(args)
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "curl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
