#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use time::OffsetDateTime;

use super::inspect::{San, sans_of, verify_signed_by};
use super::*;

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn setup() -> (tempfile::TempDir, CertFiles) {
    let dir = tempfile::tempdir().unwrap();
    let files = CertFiles::in_dir(dir.path());
    (dir, files)
}

/// The bytes of all four files, in a fixed order.
fn snapshot(files: &CertFiles) -> [Vec<u8>; 4] {
    [&files.ca_cert, &files.ca_key, &files.cert, &files.key].map(|p| std::fs::read(p).unwrap())
}

fn der(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).unwrap()
}

fn leaf_sans(files: &CertFiles) -> BTreeSet<San> {
    let der = der(&files.cert);
    let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
    sans_of(&x509)
}

#[test]
fn sans_cover_service_names_hosts_and_ips() {
    assert_eq!(
        dev_request().sans(),
        [
            "gpu-admission",
            "gpu-admission.gpu-admission",
            "gpu-admission.gpu-admission.svc",
            "gpu-admission.gpu-admission.svc.cluster.local",
            "localhost",
            "127.0.0.1",
            "::1",
        ]
    );
}

#[test]
fn sans_drop_duplicates() {
    let mut req = dev_request();
    req.hosts = vec![
        "gpu-admission".into(),
        "localhost".into(),
        "localhost".into(),
    ];
    let sans = req.sans();
    assert_eq!(sans.iter().filter(|s| *s == "gpu-admission").count(), 1);
    assert_eq!(sans.iter().filter(|s| *s == "localhost").count(), 1);
}

#[test]
fn creates_ca_and_leaf_with_requested_sans() {
    let (_dir, files) = setup();
    let req = dev_request();
    assert_eq!(ensure(&files, &req, DAY, now()).unwrap(), Outcome::Created);

    let want: BTreeSet<San> = req.sans().iter().map(|s| San::parse(s)).collect();
    assert_eq!(leaf_sans(&files), want);

    let ca_der = der(&files.ca_cert);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    assert!(ca.is_ca());
    let leaf_der = der(&files.cert);
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();
    assert!(!leaf.is_ca());
    assert!(
        leaf.extended_key_usage()
            .unwrap()
            .unwrap()
            .value
            .server_auth
    );
}

#[test]
fn second_ensure_keeps_every_byte() {
    let (_dir, files) = setup();
    let t = now();
    ensure(&files, &dev_request(), DAY, t).unwrap();
    let before = snapshot(&files);
    let later = t + time::Duration::days(100);
    assert_eq!(
        ensure(&files, &dev_request(), DAY, later).unwrap(),
        Outcome::Kept
    );
    assert_eq!(snapshot(&files), before);
}

#[test]
fn renewal_window_reissues_leaf_under_same_ca() {
    let (_dir, files) = setup();
    let t = now();
    ensure(&files, &dev_request(), DAY, t).unwrap();
    let [ca_cert, ca_key, cert, key] = snapshot(&files);

    // 365-day leaf, 30-day window: 340 days later it is inside the window.
    let later = t + time::Duration::days(340);
    let outcome = ensure(&files, &dev_request(), 30 * DAY, later).unwrap();
    assert_eq!(outcome, Outcome::Renewed);

    let [ca_cert2, ca_key2, cert2, key2] = snapshot(&files);
    assert_eq!(ca_cert2, ca_cert, "CA certificate must not change");
    assert_eq!(ca_key2, ca_key, "CA key must not change");
    assert_ne!(cert2, cert);
    assert_ne!(key2, key);
    verify_signed_by(&der(&files.cert), &der(&files.ca_cert), later).unwrap();
}

#[test]
fn changed_sans_reissue_leaf_under_same_ca() {
    let (_dir, files) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    let ca_before = std::fs::read(&files.ca_cert).unwrap();

    let mut req = dev_request();
    req.hosts.push("webhook.example.com".into());
    assert_eq!(ensure(&files, &req, DAY, now()).unwrap(), Outcome::Renewed);
    assert_eq!(std::fs::read(&files.ca_cert).unwrap(), ca_before);
    assert!(leaf_sans(&files).contains(&San::Dns("webhook.example.com".into())));

    // A request for a subset of the SANs is satisfied by the wider cert.
    assert_eq!(
        ensure(&files, &dev_request(), DAY, now()).unwrap(),
        Outcome::Kept
    );
}

#[test]
fn ca_near_expiry_is_replaced() {
    let (_dir, files) = setup();
    let t = now();
    ensure(&files, &dev_request(), DAY, t).unwrap();
    let ca_before = std::fs::read(&files.ca_cert).unwrap();
    let near_ca_expiry = t + time::Duration::days(3650 - 10);
    let outcome = ensure(&files, &dev_request(), 30 * DAY, near_ca_expiry).unwrap();
    assert_eq!(outcome, Outcome::Created);
    assert_ne!(std::fs::read(&files.ca_cert).unwrap(), ca_before);
}

#[test]
fn leaf_never_outlives_ca() {
    let (_dir, files) = setup();
    let t = now();
    ensure(&files, &dev_request(), DAY, t).unwrap();
    // 100 days before CA expiry, a 365-day leaf would outlive the CA.
    let late = t + time::Duration::days(3650 - 100);
    assert_eq!(
        ensure(&files, &dev_request(), 30 * DAY, late).unwrap(),
        Outcome::Renewed
    );
    let leaf_end = not_after(&std::fs::read(&files.cert).unwrap()).unwrap();
    let ca_end = not_after(&std::fs::read(&files.ca_cert).unwrap()).unwrap();
    assert!(leaf_end <= ca_end);
}

#[test]
fn broken_leaf_is_reissued() {
    let (_dir, files) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    std::fs::write(&files.cert, b"garbage").unwrap();
    assert_eq!(
        ensure(&files, &dev_request(), DAY, now()).unwrap(),
        Outcome::Renewed
    );
    verify_signed_by(&der(&files.cert), &der(&files.ca_cert), now()).unwrap();
}

#[test]
fn mismatched_leaf_key_is_reissued() {
    let (_dir, files) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    std::fs::copy(&files.ca_key, &files.key).unwrap();
    assert_eq!(
        ensure(&files, &dev_request(), DAY, now()).unwrap(),
        Outcome::Renewed
    );
}

#[test]
fn leaf_from_another_ca_is_reissued() {
    let (_dir, files) = setup();
    let (_other_dir, other) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    ensure(&other, &dev_request(), DAY, now()).unwrap();
    std::fs::copy(&other.cert, &files.cert).unwrap();
    std::fs::copy(&other.key, &files.key).unwrap();
    assert_eq!(
        ensure(&files, &dev_request(), DAY, now()).unwrap(),
        Outcome::Renewed
    );
    verify_signed_by(&der(&files.cert), &der(&files.ca_cert), now()).unwrap();
}

#[cfg(unix)]
#[test]
fn keys_are_owner_only_and_no_temp_files_remain() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, files) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    for key in [&files.key, &files.ca_key] {
        let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ca.crt", "ca.key", "tls.crt", "tls.key"]);
}

#[test]
fn leaf_verifies_against_ca_with_rustls() {
    let (_dir, files) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    let leaf = der(&files.cert);
    verify_signed_by(&leaf, &der(&files.ca_cert), now()).unwrap();
    let parsed = rustls::server::ParsedCertificate::try_from(&leaf).unwrap();
    for name in [
        "localhost",
        "gpu-admission.gpu-admission.svc",
        "127.0.0.1",
        "::1",
    ] {
        let server_name = rustls::pki_types::ServerName::try_from(name).unwrap();
        rustls::client::verify_server_name(&parsed, &server_name).unwrap();
    }
    // And not against an unrelated CA.
    let (_other_dir, other) = setup();
    ensure(&other, &dev_request(), DAY, now()).unwrap();
    assert!(verify_signed_by(&leaf, &der(&other.ca_cert), now()).is_err());
}

/// Cross-check with a second implementation. Needs `openssl` on PATH; when it
/// is missing the test says so on stderr and checks nothing.
#[test]
fn leaf_verifies_against_ca_with_openssl() {
    let Ok(version) = std::process::Command::new("openssl")
        .arg("version")
        .output()
    else {
        eprintln!("SKIPPED: openssl not on PATH; rustls check above still runs");
        return;
    };
    assert!(version.status.success());
    let (_dir, files) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["verify", "-purpose", "sslserver", "-CAfile"])
        .arg(&files.ca_cert)
        .arg(&files.cert)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl verify failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ca_bundle_is_base64_of_the_ca_file() {
    use base64::Engine as _;
    let (_dir, files) = setup();
    ensure(&files, &dev_request(), DAY, now()).unwrap();
    let bundle = ca_bundle_base64(&files).unwrap();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(bundle)
        .unwrap();
    assert_eq!(decoded, std::fs::read(&files.ca_cert).unwrap());
}

#[test]
fn not_after_reads_leaf_expiry() {
    let (_dir, files) = setup();
    let t = now();
    ensure(&files, &dev_request(), DAY, t).unwrap();
    let end = not_after(&std::fs::read(&files.cert).unwrap()).unwrap();
    let expected = t + time::Duration::days(365);
    assert!((end - expected).abs() <= time::Duration::seconds(2));
    assert!(matches!(not_after(b"nope"), Err(Error::Pem { .. })));
}

#[test]
fn zero_days_is_rejected_and_missing_ca_is_reported_by_path() {
    let (_dir, files) = setup();
    let mut req = dev_request();
    req.days = 0;
    assert!(matches!(
        ensure(&files, &req, DAY, now()),
        Err(Error::Request(_))
    ));
    req.days = 30;
    assert!(matches!(
        ensure(&files, &req, 30 * DAY, now()),
        Err(Error::Request(_))
    ));
    match ca_bundle_base64(&files) {
        Err(Error::Read { path, .. }) => assert_eq!(path, files.ca_cert),
        other => panic!("unexpected {other:?}"),
    }
}
