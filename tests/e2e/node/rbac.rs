//! The RBAC deploy/ ships against what the components did, from the API server's audit
//! log (hack/e2e.sh logs every request of the ServiceAccounts of namespace gpu-admission,
//! at `Metadata` level, for the whole run): no request of theirs was refused for good, and
//! every permission deploy/10-rbac.yaml grants them was used, but the few listed in
//! [`NOT_EXERCISED`] with the reason the suite cannot use them.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

/// One permission: ServiceAccount, `group/resource[/subresource]`, verb.
type Grant = (String, String, String);

/// Granted and needed, but not used by this suite's run, each with its reason.
const NOT_EXERCISED: &[(&str, &str, &str, &str)] = &[(
    "gpu-admission-certs",
    "/secrets",
    "update",
    "the certificate Job renews the Secret only when its certificate is near expiry or \
     does not match the CA; a fresh install is months from that (the decision is \
     certs::install's unit tests')",
)];

/// Every permission deploy/10-rbac.yaml's own Roles and ClusterRoles grant to a
/// ServiceAccount (the built-in roles it binds are Kubernetes').
fn granted() -> BTreeSet<Grant> {
    let text = std::fs::read_to_string(crate::repo::path("deploy/10-rbac.yaml")).unwrap();
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .collect();
    let mut rules: BTreeMap<(String, String), Vec<serde_yaml::Value>> = BTreeMap::new();
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if matches!(kind, "Role" | "ClusterRole") {
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let list = doc["rules"].as_sequence().cloned().unwrap_or_default();
            rules.insert((kind.to_string(), name), list);
        }
    }
    let mut out = BTreeSet::new();
    for doc in &docs {
        if !matches!(
            doc["kind"].as_str(),
            Some("RoleBinding" | "ClusterRoleBinding")
        ) {
            continue;
        }
        let role = (
            doc["roleRef"]["kind"].as_str().unwrap().to_string(),
            doc["roleRef"]["name"].as_str().unwrap().to_string(),
        );
        let Some(role_rules) = rules.get(&role) else {
            continue;
        };
        let subjects = doc["subjects"].as_sequence().cloned().unwrap_or_default();
        for subject in subjects.iter().filter(|s| s["kind"] == "ServiceAccount") {
            let sa = subject["name"].as_str().unwrap();
            for rule in role_rules {
                for (group, resource, verb) in expand(rule) {
                    out.insert((sa.to_string(), format!("{group}/{resource}"), verb));
                }
            }
        }
    }
    out
}

fn strings(value: &serde_yaml::Value) -> Vec<String> {
    let list = value.as_sequence().cloned().unwrap_or_default();
    list.iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

fn expand(rule: &serde_yaml::Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for group in strings(&rule["apiGroups"]) {
        for resource in strings(&rule["resources"]) {
            for verb in strings(&rule["verbs"]) {
                out.push((group.clone(), resource.clone(), verb));
            }
        }
    }
    out
}

/// What the audit log shows: permissions used (authorized); and requests refused (403)
/// outside the `excused` windows (seconds since the epoch), per permission and object
/// (namespace/name), with how often.
fn audited(
    path: &str,
    excused: &[(i64, i64)],
) -> (BTreeSet<Grant>, BTreeMap<(Grant, String), u32>) {
    const PREFIX: &str = "system:serviceaccount:gpu-admission:";
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut used = BTreeSet::new();
    let mut refused = BTreeMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let user = event["user"]["username"].as_str().unwrap_or_default();
        let Some(sa) = user.strip_prefix(PREFIX) else {
            continue;
        };
        let object = &event["objectRef"];
        let Some(resource) = object["resource"].as_str() else {
            continue; // a non-resource URL (/api, /version)
        };
        let mut resource = format!("{}/{resource}", object["apiGroup"].as_str().unwrap_or(""));
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let verb = event["verb"].as_str().unwrap_or_default().to_string();
        let grant = (sa.to_string(), resource, verb);
        let on = format!(
            "{}/{}",
            object["namespace"].as_str().unwrap_or_default(),
            object["name"].as_str().unwrap_or_default()
        );
        let at = event["stageTimestamp"].as_str().and_then(epoch_seconds);
        let excused =
            at.is_some_and(|at| excused.iter().any(|(from, to)| (*from..=*to).contains(&at)));
        // Any answer but 401 and 403 got past authorization (a 404 from a get of what
        // does not exist yet needed the permission as much as a 200).
        // A 403 from an admission webhook (a scenario's own refusal) is not RBAC's.
        let message = event["responseStatus"]["message"]
            .as_str()
            .unwrap_or_default();
        let admission = message.contains("admission webhook");
        match event["responseStatus"]["code"].as_u64().unwrap_or(0) {
            403 if excused => {}
            // Past authorization: the permission was used.
            403 if admission => drop(used.insert(grant)),
            403 => *refused.entry((grant, on)).or_default() += 1,
            401 => {}
            _ => drop(used.insert(grant)),
        }
    }
    (used, refused)
}

/// The check: nothing the components asked was refused — but in `uninstalling` (windows
/// from an uninstall's start to the next install, when components outlive their RBAC)
/// and in the 30 s after each start of the API server (its RBAC cache is empty until it
/// has synced) — and, when the whole suite ran, nothing granted went unused but
/// [`NOT_EXERCISED`].
pub fn the_shipped_rbac_is_what_the_components_use(uninstalling: &[(i64, i64)]) {
    let path = std::env::var("GPU_ADMISSION_E2E_AUDIT_LOG").expect("hack/e2e.sh sets it");
    let mut windows = uninstalling.to_vec();
    windows.extend(api_server_starts().into_iter().map(|at| (at, at + 30)));
    let (used, refused) = audited(&path, &windows);
    let granted = granted();
    println!("RBAC: {} permissions used; refused {refused:?}", used.len());
    assert!(
        refused.is_empty(),
        "requests refused (a missing permission): {refused:?}"
    );
    if std::env::var_os("E2E_FILTER").is_some_and(|f| !f.is_empty()) {
        // Part of the suite ran (E2E_FILTER): what the rest would use is not in the log.
        println!("RBAC: not checking for unused permissions: E2E_FILTER ran part of the suite");
        return;
    }
    let excused: BTreeSet<Grant> = NOT_EXERCISED
        .iter()
        .map(|(sa, r, v, _)| (sa.to_string(), r.to_string(), v.to_string()))
        .collect();
    let unused: Vec<&Grant> = granted
        .iter()
        .filter(|g| !used.contains(*g) && !excused.contains(*g))
        .collect();
    assert!(
        unused.is_empty(),
        "granted by deploy/10-rbac.yaml, never used: {unused:?}"
    );
    let stale: Vec<&Grant> = excused.iter().filter(|g| used.contains(*g)).collect();
    assert!(
        stale.is_empty(),
        "listed as not exercised, but used: {stale:?}"
    );
}

/// When kube-apiserver (re)started, from the markers hack/lib/control-plane.sh and
/// hack/e2e/restart.sh write into its log (`=== restart 2026-11-26T04:04:12Z: ...`).
fn api_server_starts() -> Vec<i64> {
    let log = std::env::var("GPU_ADMISSION_E2E_APISERVER_LOG").expect("hack/e2e.sh sets it");
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{log}: {e}"));
    text.lines()
        .filter(|l| l.starts_with("=== restart"))
        .filter_map(|l| l.find(" 20").and_then(|i| epoch_seconds(&l[i + 1..])))
        .collect()
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2026-11-26T04:04:12[.123456]Z`).
pub fn epoch_seconds(text: &str) -> Option<i64> {
    let field = |from: usize, to: usize| text.get(from..to)?.parse::<i64>().ok();
    let (y, m, d) = (field(0, 4)?, field(5, 7)?, field(8, 10)?);
    let (hh, mm, ss) = (field(11, 13)?, field(14, 16)?, field(17, 19)?);
    // Days from 1970-01-01 to y-m-d (days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// Now, in seconds since the epoch.
pub fn now_seconds() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_secs() as i64)
}

#[test]
fn epoch_seconds_reads_rfc3339() {
    assert_eq!(epoch_seconds("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(epoch_seconds("2000-03-01T00:00:01Z"), Some(951_868_801));
    assert_eq!(
        epoch_seconds("2026-11-26T04:04:12.123456Z"),
        Some(1_795_665_852)
    );
}
