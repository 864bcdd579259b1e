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
     does not match the CA; an install's Secret is weeks from that (the decision is \
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

/// What the audit log shows: permissions used (authorized) and those refused (403), with
/// how often.
fn audited(path: &str) -> (BTreeSet<Grant>, BTreeMap<Grant, u32>) {
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
        // Any answer but 401 and 403 got past authorization (a 404 from a get of what
        // does not exist yet needed the permission as much as a 200).
        match event["responseStatus"]["code"].as_u64().unwrap_or(0) {
            403 => *refused.entry(grant).or_default() += 1,
            401 => {}
            _ => drop(used.insert(grant)),
        }
    }
    (used, refused)
}

/// The check: nothing the components asked was refused for good (a 403 that the same
/// request later got past is the API server's RBAC cache right after a restart), and
/// nothing granted went unused but [`NOT_EXERCISED`].
pub fn the_shipped_rbac_is_what_the_components_use() {
    let path = std::env::var("GPU_ADMISSION_E2E_AUDIT_LOG").expect("hack/e2e.sh sets it");
    let (used, refused) = audited(&path);
    let granted = granted();
    let forbidden: Vec<_> = refused.iter().filter(|(g, _)| !used.contains(*g)).collect();
    let transient: Vec<_> = refused.iter().filter(|(g, _)| used.contains(*g)).collect();
    println!(
        "RBAC: {} permissions used; refused then allowed (the API server starting): {transient:?}",
        used.len()
    );
    assert!(
        forbidden.is_empty(),
        "requests refused for good (a missing permission): {forbidden:?}"
    );
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
