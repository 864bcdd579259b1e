//! TLS material: a CA and a serving certificate (rcgen).
//!
//! [`ensure`] is idempotent and is what both `certs` and dev mode call: it keeps
//! a good pair, renews the leaf under the same CA when it is close to expiry or
//! its SANs changed (so the `caBundle` in the webhook configurations stays
//! valid), and only creates a new CA when there is no usable one.

mod atomic;
mod inspect;
pub mod install;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use self::atomic::{CERT_MODE, KEY_MODE};
use self::inspect::Ca;

/// Validity of a freshly created CA (10 years).
const CA_VALIDITY: time::Duration = time::Duration::days(3650);
/// Backdating of `not_before`, so peers with a slightly slow clock accept a
/// certificate created a moment ago.
const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);

/// Errors from reading, parsing, generating or writing TLS material.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file (or its directory) could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file does not hold what it should.
    #[error("{}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    /// In-memory PEM (not from a file) is not a certificate.
    #[error("invalid PEM certificate: {reason}")]
    Pem { reason: String },
    /// The request cannot produce a certificate (e.g. zero days).
    #[error("invalid certificate request: {0}")]
    Request(String),
    /// rcgen refused to build or sign a certificate.
    #[error("generating certificate")]
    Generate(#[from] rcgen::Error),
}

/// What the serving certificate must cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertRequest {
    pub service: String,
    pub namespace: String,
    /// Extra DNS names (e.g. `localhost`).
    pub hosts: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// Validity of the serving certificate.
    pub days: u32,
}

impl CertRequest {
    /// The SANs: the four in-cluster Service names, then `hosts`, then `ips`,
    /// without duplicates.
    pub fn sans(&self) -> Vec<String> {
        let (svc, ns) = (&self.service, &self.namespace);
        let service_names = [
            svc.clone(),
            format!("{svc}.{ns}"),
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ];
        let mut out: Vec<String> = Vec::new();
        let all = service_names
            .into_iter()
            .chain(self.hosts.iter().cloned())
            .chain(self.ips.iter().map(IpAddr::to_string));
        for san in all {
            if !out.contains(&san) {
                out.push(san);
            }
        }
        out
    }
}

/// Where the TLS material lives. [`CertFiles::in_dir`] gives the layout of a
/// `kubernetes.io/tls` Secret plus the CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    pub ca_cert: PathBuf,
    /// The CA private key, kept so the leaf can be renewed under the same CA.
    pub ca_key: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// `ca.crt`, `ca.key`, `tls.crt` and `tls.key` inside `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        CertFiles {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }
}

/// What [`ensure`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A new CA and a new serving certificate were written.
    Created,
    /// A new serving certificate was issued by the existing CA (the old one
    /// was near expiry, lacked a wanted SAN, or was missing or broken).
    Renewed,
    /// Everything on disk was good; nothing was written.
    Kept,
}

/// Makes `files` hold a CA and a serving certificate for `req`, valid at `now`
/// for longer than `renew_within`. Idempotent; see the module docs.
///
/// Each file is replaced atomically (temp file, fsync, rename), keys are
/// created with mode 0600. A CA whose own expiry is inside the renewal window
/// is replaced, and a leaf never outlives its CA.
pub fn ensure(
    files: &CertFiles,
    req: &CertRequest,
    renew_within: std::time::Duration,
    now: OffsetDateTime,
) -> Result<Outcome, Error> {
    if req.days == 0 {
        return Err(Error::Request("days must be at least 1".into()));
    }
    let window = time::Duration::try_from(renew_within).unwrap_or(time::Duration::MAX);
    if window >= time::Duration::days(i64::from(req.days)) {
        // Every fresh leaf would already be inside the window: renew forever.
        return Err(Error::Request(format!(
            "renewal window ({renew_within:?}) must be shorter than the validity ({} days)",
            req.days
        )));
    }
    let sans = req.sans();
    match inspect::load_ca(&files.ca_cert, &files.ca_key, now, window) {
        Ok(ca) => {
            match inspect::check_leaf(&files.cert, &files.key, &ca, &sans, now, window) {
                Ok(()) => return Ok(Outcome::Kept),
                Err(reason) => tracing::info!(%reason, "issuing a new serving certificate"),
            }
            let leaf = issue_leaf(req, &ca, now)?;
            atomic::write_all(&[
                (&files.key, leaf.key_pem.as_bytes(), KEY_MODE),
                (&files.cert, leaf.cert_pem.as_bytes(), CERT_MODE),
            ])?;
            Ok(Outcome::Renewed)
        }
        Err(reason) => {
            tracing::info!(%reason, "creating a new CA and serving certificate");
            let ca = new_ca(req, now)?;
            let leaf = issue_leaf(req, &ca, now)?;
            // Everything is generated before anything is written, so a bad
            // request cannot replace a working CA and leave no leaf.
            atomic::write_all(&[
                (&files.ca_key, ca.key.serialize_pem().as_bytes(), KEY_MODE),
                (&files.ca_cert, ca.cert_pem.as_bytes(), CERT_MODE),
                (&files.key, leaf.key_pem.as_bytes(), KEY_MODE),
                (&files.cert, leaf.cert_pem.as_bytes(), CERT_MODE),
            ])?;
            Ok(Outcome::Created)
        }
    }
}

/// ECDSA P-256 key pair (what every Kubernetes client accepts).
fn new_key() -> Result<KeyPair, Error> {
    Ok(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?)
}

fn new_ca(req: &CertRequest, now: OffsetDateTime) -> Result<Ca, Error> {
    let key = new_key()?;
    let mut params = CertificateParams::default();
    // A distinct name per CA (a key fingerprint): clients that trust an old
    // and a new CA during a rotation look the issuer up by name.
    let fingerprint = Sha256::digest(key.subject_public_key_info());
    let id: String = fingerprint[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    params.distinguished_name = name(&format!("{} CA {id}", req.service));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + CA_VALIDITY;
    let cert = params.self_signed(&key)?;
    Ok(Ca {
        cert_pem: cert.pem(),
        der: cert.der().clone(),
        key,
        not_after: params.not_after,
    })
}

/// A serving certificate and its key, PEM-encoded.
struct Leaf {
    cert_pem: String,
    key_pem: String,
}

fn issue_leaf(req: &CertRequest, ca: &Ca, now: OffsetDateTime) -> Result<Leaf, Error> {
    let key = new_key()?;
    let params = leaf_params(req, ca.not_after, now)?;
    let issuer = Issuer::from_ca_cert_der(&ca.der, &ca.key)?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Leaf {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn leaf_params(
    req: &CertRequest,
    ca_not_after: OffsetDateTime,
    now: OffsetDateTime,
) -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(&format!("{}.{}.svc", req.service, req.namespace));
    params.subject_alt_names = req
        .sans()
        .into_iter()
        .map(|san| match san.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(san.try_into()?)),
        })
        .collect::<Result<_, rcgen::Error>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - CLOCK_SKEW;
    params.not_after = (now + time::Duration::days(i64::from(req.days))).min(ca_not_after);
    Ok(params)
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Standard base64 of the CA PEM file, as a webhook configuration's `caBundle`.
pub fn ca_bundle_base64(files: &CertFiles) -> Result<String, Error> {
    let pem = inspect::read(&files.ca_cert)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(pem))
}

/// The request dev mode uses: the default Service names plus `localhost`,
/// `127.0.0.1` and `::1`, one year.
pub fn dev_request() -> CertRequest {
    CertRequest {
        service: "gpu-admission".into(),
        namespace: "gpu-admission".into(),
        hosts: vec!["localhost".into()],
        ips: vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ],
        days: 365,
    }
}

/// `notAfter` of the first certificate in a PEM buffer (for the expiry metric).
pub fn not_after(cert_pem: &[u8]) -> Result<OffsetDateTime, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(cert_pem).map_err(|e| Error::Pem {
        reason: e.to_string(),
    })?;
    let (_, x509) = x509_parser::parse_x509_certificate(&der).map_err(|e| Error::Pem {
        reason: e.to_string(),
    })?;
    Ok(x509.validity().not_after.to_datetime())
}

#[cfg(test)]
mod tests;
