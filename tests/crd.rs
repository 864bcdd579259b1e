//! `deploy/crd.yaml` is generated from the Rust type; this keeps the two in step.
//! After changing `GpuQuotaSpec`, run `UPDATE_CRD=1 cargo test --test crd`.
#![allow(clippy::unwrap_used)]

mod repo;

use gpu_admission::quota::GPUQuota;
use kube::CustomResourceExt;

fn crd_path() -> String {
    repo::path("deploy/crd.yaml")
}

fn generated() -> String {
    let header =
        "# Generated from src/quota/mod.rs by `UPDATE_CRD=1 cargo test --test crd`. Do not edit.\n";
    format!(
        "{header}{}",
        serde_yaml::to_string(&GPUQuota::crd()).unwrap()
    )
}

#[test]
fn deploy_crd_matches_the_rust_type() {
    let want = generated();
    if std::env::var_os("UPDATE_CRD").is_some() {
        std::fs::write(crd_path(), &want).unwrap();
    }
    let have = std::fs::read_to_string(crd_path()).unwrap_or_default();
    assert!(
        have == want,
        "deploy/crd.yaml is out of date: run `UPDATE_CRD=1 cargo test --test crd`"
    );
    let chart = repo::path("charts/gpu-admission/crds/gpuquotas.yaml");
    if std::env::var_os("UPDATE_CRD").is_some() {
        std::fs::write(&chart, &want).unwrap();
    }
    assert!(
        std::fs::read_to_string(chart).unwrap_or_default() == want,
        "the chart's CRD is out of date: run `UPDATE_CRD=1 cargo test --test crd`"
    );
}

#[test]
fn crd_names_and_columns_are_the_contract() {
    let crd = GPUQuota::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("gpuquotas.gpu-admission.io")
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["gq".to_string()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    let columns: Vec<(String, i32)> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.priority.unwrap_or(0)))
        .collect();
    // OnExceed and Cohort only with `-o wide` (priority 1); Queued is empty (so blank)
    // unless pods wait in the quota queue, Borrowed and Lent unless the quota's cohort
    // lends.
    let want = [
        ("Hard", 0),
        ("Used", 0),
        ("Queued", 0),
        ("Borrowed", 0),
        ("Lent", 0),
        ("OnExceed", 1),
        ("Cohort", 1),
        ("Age", 0),
    ];
    let want: Vec<(String, i32)> = want.iter().map(|(n, p)| (n.to_string(), *p)).collect();
    assert_eq!(columns, want);
    assert!(version.subresources.as_ref().unwrap().status.is_some());
}

/// `onExceed` takes only the modes gpu-admission carries out: the API server itself
/// refuses any other word, so a quota never says one thing and does another.
#[test]
fn on_exceed_accepts_only_the_modes_that_are_built() {
    let crd = serde_json::to_value(GPUQuota::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        spec["properties"]["onExceed"]["enum"],
        serde_json::json!(["Deny", "Warn", "Queue"])
    );
}
