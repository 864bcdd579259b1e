//! `certs --install`: put the TLS material where the cluster needs it — the
//! `kubernetes.io/tls` Secret the servers mount, and the `caBundle` of every
//! webhook in the `gpu-admission` webhook configurations.
//!
//! The objects and patch bodies are built by pure functions (unit-tested); the
//! API calls in [`install`] stay thin.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{CertFiles, Error, inspect};

/// Field manager of the `caBundle` server-side apply.
const FIELD_MANAGER: &str = "gpu-admission-certs";
/// Name of both webhook configurations (the manifests and the chart create them).
const WEBHOOK_CONFIGURATION: &str = "gpu-admission";

const CA_CRT: &str = "ca.crt";
const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";

/// The PEM material that goes into the Secret: CA certificate (no CA key),
/// serving certificate and serving key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsMaterial {
    pub ca_cert: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl TlsMaterial {
    /// Reads `ca.crt`, `tls.crt` and `tls.key` (never `ca.key`).
    pub fn read(files: &CertFiles) -> Result<Self, Error> {
        Ok(TlsMaterial {
            ca_cert: inspect::read(&files.ca_cert)?,
            cert: inspect::read(&files.cert)?,
            key: inspect::read(&files.key)?,
        })
    }

    /// The material held by an existing Secret, if it has all three keys.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let get = |key: &str| data.get(key).map(|b| b.0.clone());
        Some(TlsMaterial {
            ca_cert: get(CA_CRT)?,
            cert: get(TLS_CRT)?,
            key: get(TLS_KEY)?,
        })
    }

    /// Whether this material can be kept as is: the serving pair matches, is
    /// signed by the CA, covers `sans` and does not expire within `renew_within`.
    /// Used so that re-running the bootstrap Job (whose disk starts empty) does not
    /// replace a good CA and certificate.
    pub fn check(
        &self,
        sans: &[String],
        now: OffsetDateTime,
        renew_within: std::time::Duration,
    ) -> Result<(), Error> {
        let window = time::Duration::try_from(renew_within).unwrap_or(time::Duration::MAX);
        let (ca_path, cert_path, key_path) =
            (Path::new(CA_CRT), Path::new(TLS_CRT), Path::new(TLS_KEY));
        let ca_der = inspect::first_cert(ca_path, &self.ca_cert)?;
        let ca_x509 = inspect::parse_x509(ca_path, &ca_der)?;
        if !ca_x509.is_ca() || ca_x509.validity().not_after.to_datetime() - now <= window {
            return Err(Error::Parse {
                path: ca_path.to_path_buf(),
                reason: "not a CA certificate valid beyond the renewal window".into(),
            });
        }
        let ca_der = ca_der.clone().into_owned();
        inspect::check_leaf_pem(
            (cert_path, &self.cert),
            (key_path, &self.key),
            &ca_der,
            sans,
            now,
            window,
        )
    }
}

/// The `kubernetes.io/tls` Secret holding `tls.crt`, `tls.key` and `ca.crt`.
fn tls_secret(name: &str, namespace: &str, material: &TlsMaterial) -> Secret {
    let data = BTreeMap::from([
        (CA_CRT.to_string(), ByteString(material.ca_cert.clone())),
        (TLS_CRT.to_string(), ByteString(material.cert.clone())),
        (TLS_KEY.to_string(), ByteString(material.key.clone())),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "gpu-admission".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The two webhook configuration kinds whose `caBundle` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WebhookKind {
    Validating,
    Mutating,
}

impl WebhookKind {
    fn kind(self) -> &'static str {
        match self {
            WebhookKind::Validating => "ValidatingWebhookConfiguration",
            WebhookKind::Mutating => "MutatingWebhookConfiguration",
        }
    }
}

/// The server-side apply body that sets `caBundle` (base64 of the CA PEM) on each
/// named webhook and claims nothing else: `webhooks` is a list keyed by `name`, so
/// the rest of every webhook stays owned by whoever created it.
fn ca_bundle_patch(kind: WebhookKind, webhooks: &[String], ca_pem: &[u8]) -> Value {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let webhooks: Vec<Value> = webhooks
        .iter()
        .map(|name| json!({"name": name, "clientConfig": {"caBundle": bundle}}))
        .collect();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind.kind(),
        "metadata": {"name": WEBHOOK_CONFIGURATION},
        "webhooks": webhooks,
    })
}

/// Where [`install`] writes.
pub struct InstallTarget<'a> {
    pub secret: &'a str,
    pub namespace: &'a str,
}

/// Writes the Secret (create, or update when it differs) and patches the
/// `caBundle` of both webhook configurations with `material.ca_cert`.
pub async fn install(
    client: &kube::Client,
    target: &InstallTarget<'_>,
    material: &TlsMaterial,
) -> anyhow::Result<()> {
    apply_secret(client, target, material).await?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let names = webhook_names(&validating, |c| {
        c.webhooks.into_iter().flatten().map(|w| w.name)
    })
    .await?;
    patch_ca_bundle(
        &validating,
        WebhookKind::Validating,
        names,
        &material.ca_cert,
    )
    .await?;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let names = webhook_names(&mutating, |c| {
        c.webhooks.into_iter().flatten().map(|w| w.name)
    })
    .await?;
    patch_ca_bundle(&mutating, WebhookKind::Mutating, names, &material.ca_cert).await
}

/// The webhook names of the `gpu-admission` configuration, or `None` when it does not exist.
async fn webhook_names<K, N>(
    api: &Api<K>,
    names: impl FnOnce(K) -> N,
) -> anyhow::Result<Option<Vec<String>>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    N: Iterator<Item = String>,
{
    Ok(api
        .get_opt(WEBHOOK_CONFIGURATION)
        .await?
        .map(|config| names(config).collect()))
}

/// Reads the Secret, if it exists (for keeping good material on a re-run).
pub async fn existing_secret(
    client: &kube::Client,
    target: &InstallTarget<'_>,
) -> anyhow::Result<Option<Secret>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), target.namespace);
    secrets
        .get_opt(target.secret)
        .await
        .with_context(|| format!("reading Secret {}/{}", target.namespace, target.secret))
}

async fn apply_secret(
    client: &kube::Client,
    target: &InstallTarget<'_>,
    material: &TlsMaterial,
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), target.namespace);
    let what = format!("Secret {}/{}", target.namespace, target.secret);
    let mut wanted = tls_secret(target.secret, target.namespace, material);
    match secrets
        .get_opt(target.secret)
        .await
        .with_context(|| format!("reading {what}"))?
    {
        None => {
            secrets
                .create(&PostParams::default(), &wanted)
                .await
                .with_context(|| format!("creating {what}"))?;
            eprintln!("{what} created");
        }
        Some(existing) if existing.data == wanted.data && existing.type_ == wanted.type_ => {
            eprintln!("{what} unchanged");
        }
        Some(existing) => {
            if existing.type_ != wanted.type_ {
                anyhow::bail!(
                    "{what} exists with type {:?}, not kubernetes.io/tls: delete it or pick another --secret",
                    existing.type_.unwrap_or_default()
                );
            }
            wanted.metadata.resource_version = existing.metadata.resource_version;
            secrets
                .replace(target.secret, &PostParams::default(), &wanted)
                .await
                .with_context(|| format!("updating {what}"))?;
            eprintln!("{what} updated");
        }
    }
    Ok(())
}

async fn patch_ca_bundle<K>(
    api: &Api<K>,
    kind: WebhookKind,
    webhooks: Option<Vec<String>>,
    ca_pem: &[u8],
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let what = format!("{} {WEBHOOK_CONFIGURATION}", kind.kind());
    let Some(webhooks) = webhooks else {
        eprintln!("{what} does not exist: skipped (the manifests or the chart create it)");
        return Ok(());
    };
    if webhooks.is_empty() {
        eprintln!("{what} has no webhooks: skipped");
        return Ok(());
    }
    let body = ca_bundle_patch(kind, &webhooks, ca_pem);
    api.patch(
        WEBHOOK_CONFIGURATION,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .with_context(|| format!("patching the caBundle of {what}"))?;
    eprintln!("{what}: caBundle set on {}", webhooks.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::certs::{CertRequest, ensure};

    const DAY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

    fn request(service: &str) -> CertRequest {
        CertRequest {
            service: service.into(),
            namespace: "gpu-admission".into(),
            hosts: vec![],
            ips: vec![],
            days: 365,
        }
    }

    fn material(service: &str) -> (tempfile::TempDir, TlsMaterial) {
        let dir = tempfile::tempdir().unwrap();
        let files = CertFiles::in_dir(dir.path());
        ensure(
            &files,
            &request(service),
            30 * DAY,
            OffsetDateTime::now_utc(),
        )
        .unwrap();
        let material = TlsMaterial::read(&files).unwrap();
        (dir, material)
    }

    #[test]
    fn secret_is_a_tls_secret_with_the_three_files_and_no_ca_key() {
        let (_dir, material) = material("gpu-admission");
        let secret = tls_secret("gpu-admission-tls", "gpu-admission", &material);
        let value = serde_json::to_value(&secret).unwrap();
        assert_eq!(value["type"], "kubernetes.io/tls");
        assert_eq!(value["metadata"]["name"], "gpu-admission-tls");
        assert_eq!(value["metadata"]["namespace"], "gpu-admission");
        let data = value["data"].as_object().unwrap();
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
        let decode = |k: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(data[k].as_str().unwrap())
                .unwrap()
        };
        assert_eq!(decode("ca.crt"), material.ca_cert);
        assert_eq!(decode("tls.key"), material.key);
        assert_eq!(TlsMaterial::from_secret(&secret), Some(material));
    }

    #[test]
    fn ca_bundle_patch_names_every_webhook_and_sets_only_the_bundle() {
        let pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let names = [
            "validate.gpu-admission.io".to_string(),
            "other.example".to_string(),
        ];
        let body = ca_bundle_patch(WebhookKind::Validating, &names, pem);
        let bundle = base64::engine::general_purpose::STANDARD.encode(pem);
        assert_eq!(
            body,
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "gpu-admission"},
                "webhooks": [
                    {"name": "validate.gpu-admission.io", "clientConfig": {"caBundle": bundle}},
                    {"name": "other.example", "clientConfig": {"caBundle": bundle}},
                ],
            })
        );
        let body = ca_bundle_patch(WebhookKind::Mutating, &names[..1], pem);
        assert_eq!(body["kind"], "MutatingWebhookConfiguration");
        assert_eq!(body["webhooks"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn good_material_is_kept_and_wrong_sans_or_expiry_are_not() {
        let (_dir, material) = material("gpu-admission");
        let sans = request("gpu-admission").sans();
        let now = OffsetDateTime::now_utc();
        material.check(&sans, now, 30 * DAY).unwrap();
        // Another service name: the SANs do not cover it.
        let other = request("other").sans();
        assert!(material.check(&other, now, 30 * DAY).is_err());
        // Inside the renewal window.
        assert!(
            material
                .check(&sans, now + time::Duration::days(340), 30 * DAY)
                .is_err()
        );
        // A certificate from another CA.
        let (_dir2, foreign) = material_pair();
        let mixed = TlsMaterial {
            ca_cert: foreign.ca_cert,
            ..material
        };
        assert!(mixed.check(&sans, now, 30 * DAY).is_err());
    }

    fn material_pair() -> (tempfile::TempDir, TlsMaterial) {
        material("gpu-admission")
    }

    #[test]
    fn a_secret_missing_a_key_is_not_material() {
        let (_dir, material) = material("gpu-admission");
        let mut secret = tls_secret("s", "n", &material);
        secret.data.as_mut().unwrap().remove("ca.crt");
        assert_eq!(TlsMaterial::from_secret(&secret), None);
    }
}
