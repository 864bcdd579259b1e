//! Reading back what is on disk and deciding whether it can be reused.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

use rcgen::{KeyPair, PublicKeyData};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use super::Error;

/// A subject alternative name, normalised for comparison (DNS names are
/// case-insensitive; IPs compare by value, not by spelling).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum San {
    Dns(String),
    Ip(IpAddr),
}

impl San {
    pub(super) fn parse(s: &str) -> Self {
        match s.parse::<IpAddr>() {
            Ok(ip) => San::Ip(ip),
            Err(_) => San::Dns(s.to_ascii_lowercase()),
        }
    }
}

/// A usable CA read from disk: its certificate and signing key.
pub(super) struct Ca {
    pub(super) cert_pem: String,
    pub(super) der: CertificateDer<'static>,
    pub(super) key: KeyPair,
    pub(super) not_after: OffsetDateTime,
}

/// Reads a file, mapping errors to [`Error::Read`].
pub(super) fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_err(path: &Path, reason: impl ToString) -> Error {
    Error::Parse {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The first certificate of a PEM file, as DER.
pub(super) fn first_cert(path: &Path, pem: &[u8]) -> Result<CertificateDer<'static>, Error> {
    CertificateDer::from_pem_slice(pem)
        .map_err(|e| parse_err(path, format!("no PEM certificate: {e}")))
}

pub(super) fn parse_x509<'a>(
    path: &Path,
    der: &'a CertificateDer<'_>,
) -> Result<X509Certificate<'a>, Error> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, cert)| cert)
        .map_err(|e| parse_err(path, format!("not an X.509 certificate: {e}")))
}

/// Loads the CA pair and checks it can sign: a CA certificate whose key is
/// the one in `ca.key`, valid now and for longer than `renew_within`.
pub(super) fn load_ca(
    cert_path: &Path,
    key_path: &Path,
    now: OffsetDateTime,
    renew_within: time::Duration,
) -> Result<Ca, Error> {
    let cert_pem =
        String::from_utf8(read(cert_path)?).map_err(|_| parse_err(cert_path, "not UTF-8 PEM"))?;
    let key_pem =
        String::from_utf8(read(key_path)?).map_err(|_| parse_err(key_path, "not UTF-8 PEM"))?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| parse_err(key_path, e))?;
    let der = first_cert(cert_path, cert_pem.as_bytes())?;
    let x509 = parse_x509(cert_path, &der)?;
    if !x509.is_ca() {
        return Err(parse_err(cert_path, "not a CA certificate"));
    }
    if x509.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(parse_err(key_path, "key does not match the CA certificate"));
    }
    let not_after = x509.validity().not_after.to_datetime();
    check_window(
        cert_path,
        x509.validity().not_before.to_datetime(),
        not_after,
        now,
        renew_within,
    )?;
    Ok(Ca {
        der: der.clone().into_owned(),
        cert_pem,
        key,
        not_after,
    })
}

/// Checks that an existing serving pair can be kept as is: signed by `ca`,
/// key matches, every wanted SAN present, and not inside the renewal window.
pub(super) fn check_leaf(
    cert_path: &Path,
    key_path: &Path,
    ca: &Ca,
    wanted: &[String],
    now: OffsetDateTime,
    renew_within: time::Duration,
) -> Result<(), Error> {
    check_leaf_pem(
        (cert_path, &read(cert_path)?),
        (key_path, &read(key_path)?),
        &ca.der,
        wanted,
        now,
        renew_within,
    )
}

/// [`check_leaf`] on PEM already in memory; the paths only label errors.
pub(super) fn check_leaf_pem(
    (cert_path, cert_pem): (&Path, &[u8]),
    (key_path, key_pem): (&Path, &[u8]),
    ca_der: &CertificateDer<'static>,
    wanted: &[String],
    now: OffsetDateTime,
    renew_within: time::Duration,
) -> Result<(), Error> {
    let der = first_cert(cert_path, cert_pem)?;
    let key_pem = std::str::from_utf8(key_pem).map_err(|_| parse_err(key_path, "not UTF-8 PEM"))?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| parse_err(key_path, e))?;
    let x509 = parse_x509(cert_path, &der)?;
    if x509.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(parse_err(key_path, "key does not match the certificate"));
    }
    let validity = x509.validity();
    check_window(
        cert_path,
        validity.not_before.to_datetime(),
        validity.not_after.to_datetime(),
        now,
        renew_within,
    )?;
    let missing = missing_sans(&x509, wanted);
    if !missing.is_empty() {
        return Err(parse_err(cert_path, format!("missing SANs {missing:?}")));
    }
    verify_signed_by(&der, ca_der, now).map_err(|e| parse_err(cert_path, e))
}

fn check_window(
    path: &Path,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
    renew_within: time::Duration,
) -> Result<(), Error> {
    if not_before > now {
        return Err(parse_err(path, format!("not valid before {not_before}")));
    }
    if not_after - now <= renew_within {
        return Err(parse_err(
            path,
            format!("expires {not_after}, inside the renewal window"),
        ));
    }
    Ok(())
}

/// The subject alternative names of a certificate (DNS names and IPs only).
pub(super) fn sans_of(x509: &X509Certificate<'_>) -> BTreeSet<San> {
    let Ok(Some(ext)) = x509.subject_alternative_name() else {
        return BTreeSet::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(San::Dns(dns.to_ascii_lowercase())),
            GeneralName::IPAddress(bytes) => ip_from_bytes(bytes).map(San::Ip),
            _ => None,
        })
        .collect()
}

fn missing_sans(x509: &X509Certificate<'_>, wanted: &[String]) -> Vec<String> {
    let present = sans_of(x509);
    wanted
        .iter()
        .filter(|s| !present.contains(&San::parse(s)))
        .cloned()
        .collect()
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// Verifies the leaf chains to `ca` at `now` (webpki, through rustls).
pub(super) fn verify_signed_by(
    leaf: &CertificateDer<'_>,
    ca: &CertificateDer<'static>,
    now: OffsetDateTime,
) -> Result<(), rustls::Error> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone())?;
    let parsed = rustls::server::ParsedCertificate::try_from(leaf)?;
    let secs = u64::try_from(now.unix_timestamp()).unwrap_or(0);
    let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &parsed,
        &roots,
        &[],
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs)),
        algs.all,
    )
}
