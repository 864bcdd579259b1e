//! Honest callers during a connection flood, against the real binary: `serve --cluster`
//! on loopback with development certificates, default limits.
//!
//! Scenarios, each with `CALLS` honest `POST /validate` (a fresh TLS connection each,
//! as a new API server connection) and `CALLS` `GET /livez` (a fresh connection each,
//! as the kubelet probes) from 127.0.0.1, one every 100 ms, side by side:
//!
//! - `quiet`: no flood;
//! - `half-open`: 300 connections to the webhook port (from 127.0.0.2-31) and 100 to
//!   the admin port (127.0.0.40-49) that never send a byte, each reopened as soon as
//!   the server closes it;
//! - `half-open, client CA`: the same with `--client-ca` (the honest caller presents
//!   a certificate it signed);
//! - `metrics flood`: 100 keep-alive connections to the admin port (127.0.0.60-69)
//!   sending `GET /metrics` back to back;
//! - `half-open, one address`: the half-open flood from 127.0.0.1 itself, the
//!   address the honest callers use (peers cannot be told apart).
//!
//! A call that fails or takes over 5 s counts as failed. Every flood stops when the
//! honest calls are done, and at most 5 s per call plus 10 s after it started.
//!
//! Sieges ("doors no peer can lock", and issue #46's shapes), each at full scale against
//! default limits, flooding the webhook door from 127.10+k.x.y and the admin door from
//! 127.40+k.x.y alike (bodies and heads at the admin door go to `/explain`), every
//! flooding connection reopened as soon as the server closes it; meanwhile the modelled
//! API server (one peer, 127.0.0.1, a client-go webhook client: a keep-alive pool, a dial
//! when no connection is idle; ten reviews a second and twenty at once every five
//! seconds, each with 5 s to be answered, not retried) and kubelet-like probes (`GET
//! /livez`, a fresh connection every 100 ms whether the last was answered or not, each
//! with the kubelet's 1 s timeout), both from before the floods:
//!
//! - `siege: half-open, one address`: 600 connections that never send a byte;
//! - `siege: idle, one address`: 600 connections idle after one request;
//! - `siege: slow bodies, 200 x 2`: 400 connections from 200 addresses, each a full
//!   request head announcing 4 MB, then the body a byte a second;
//! - `siege: h2 slow streams, 200 x 2 x 16`: the same over 400 h2 connections, 16
//!   streams each;
//! - `siege: half-open and idle, 120 x 3 each`: 360 of each kind from 120 addresses each;
//! - `siege: all at once`: 600 half-open and 600 idle from one address each, 200 slow
//!   bodies and 200 slow h2 connections (16 streams) from 100 addresses each;
//! - `siege: idle after TLS, 200 x 2` and `400 x 1`: connections that finish TLS (at the
//!   admin door: connect) and send nothing;
//! - `siege: idle after one request, 200 x 2`;
//! - `siege: 4 KiB then silence, 200 x 2`: a head announcing 4 MB, 4 KiB of it at once,
//!   then nothing;
//! - `siege: slow heads after one request, 200 x 2`: one request answered, then the next
//!   head a byte a second;
//! - `siege: churn, 250 x 1`: connections opened (and at the webhook door taken through
//!   TLS) and closed at once, again and again;
//! - `siege: mixed, 400 addresses`: idle after TLS, idle after one request and 4 KiB then
//!   silence, 100 addresses x 2 each, and 100 h2 connections of 16 slow streams.
//!
//! A review that fails or takes over 5 s, or a probe over 1 s, is not answered; the
//! latencies are of those answered, over `WINDOW` seconds (20) once the flood has filled
//! the doors. The
//! floods run on threads of their own, the honest callers on others (in a cluster they
//! are other processes). The server's resident memory: before the flood, and its peak.
//!
//! Run: `cargo bench --bench flood` (the binary cargo built), or, to compare binaries
//! in one run, `FLOOD_BINS=old=/path/a,new=/path/b cargo bench --bench flood`. The
//! sieges churn some 1,000-5,000 connections a second: on a host whose connection
//! tracking is on (a Kubernetes node's is) they fill its table within a minute or two,
//! and the kernel then drops the SYNs of new connections, probes' included, before the
//! server sees them (the `conntrack drops` column). To measure the server, not the host,
//! run them in a network namespace of their own, where nothing tracks connections:
//! `unshare -n sh -c 'ip link set lo up && cargo bench --offline --bench flood'` (as root,
//! the bench built beforehand).
//! Environment: `CALLS` (20), `WINDOW` (20), `SCENARIOS` (comma-separated parts of
//! names: a scenario runs when its name holds one, e.g. `siege` or `quiet,metrics`; all
//! by default).
#![allow(clippy::unwrap_used)]

#[path = "../tests/flood_support/mod.rs"]
mod flood_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use flood_support::{ApiServer, Flood, Kubelet, Outcome, Shape, Target, Traffic};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server's allocator, as the binary declares it (`src/main.rs`): what a benchmark
/// measures in process is what the server runs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const PATIENCE: Duration = Duration::from_secs(5);
/// A kubelet probe's timeout (its default `timeoutSeconds`).
const PROBE_PATIENCE: Duration = Duration::from_secs(1);
/// The modelled API server in the sieges: ten reviews a second, and twenty at once every
/// five seconds (it dials up to twenty connections, and keeps them).
const API: Traffic = Traffic {
    per_second: 10,
    burst: 20,
    burst_every: Duration::from_secs(5),
};
const EVERY: Duration = Duration::from_millis(100);
/// A bound, never reached in a run: scrapes count every request.
const FLOOD_MAX_OPENS: u64 = 500_000_000;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Server {
    child: Child,
    webhook: SocketAddr,
    admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve` from `bin` in a new directory (development certificates there) on ephemeral
/// loopback ports, learnt from its "serving" log line.
fn start(bin: &Path, client_ca: Option<&Path>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let cluster = format!("{}/examples/cluster.yaml", env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(bin);
    command
        .args(["serve", "--cluster", &cluster, "--log-format", "json"])
        .args(["--address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"])
        .args(["--extender-address", "127.0.0.1:0"]);
    if let Some(ca) = client_ca {
        command.arg("--client-ca").arg(ca);
    }
    let mut child = command
        .current_dir(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref().map_while(Result::ok) {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if event["message"] == "serving" || event["fields"]["message"] == "serving" {
            let fields = if event["address"].is_string() {
                &event
            } else {
                &event["fields"]
            };
            let addr = |key: &str| fields[key].as_str().unwrap().parse().unwrap();
            // Keep reading its log, so the server never writes into a closed pipe.
            std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
            return Server {
                webhook: addr("address"),
                admin: addr("admin_address"),
                child,
                dir,
            };
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{} did not report serving", bin.display());
}

/// A client trusting the server's development CA, presenting `identity` if given.
fn client(
    server: &Server,
    identity: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> Arc<rustls::ClientConfig> {
    let ca = server.dir.path().join("webhook-certs/ca.crt");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&ca).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder.with_client_auth_cert(vec![cert], key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Quiet,
    HalfOpen,
    HalfOpenClientCa,
    MetricsFlood,
    HalfOpenOneAddress,
}

impl Scenario {
    const ALL: [Scenario; 5] = [
        Scenario::Quiet,
        Scenario::HalfOpen,
        Scenario::HalfOpenClientCa,
        Scenario::MetricsFlood,
        Scenario::HalfOpenOneAddress,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Quiet => "quiet",
            Scenario::HalfOpen => "half-open",
            Scenario::HalfOpenClientCa => "half-open, client CA",
            Scenario::MetricsFlood => "metrics flood",
            Scenario::HalfOpenOneAddress => "half-open, one address",
        }
    }

    fn floods(self, server: &Server, for_at_most: Duration) -> Vec<Flood> {
        let half_open = |addr, sources: Vec<_>, total| {
            flood_support::half_open(addr, &sources, total, for_at_most, FLOOD_MAX_OPENS)
        };
        let lo = flood_support::loopback;
        match self {
            Scenario::Quiet => vec![],
            Scenario::HalfOpen | Scenario::HalfOpenClientCa => vec![
                half_open(server.webhook, lo(2, 30), 300),
                half_open(server.admin, lo(40, 10), 100),
            ],
            Scenario::MetricsFlood => vec![flood_support::scrapes(
                server.admin,
                &lo(60, 10),
                100,
                "/metrics",
                for_at_most,
                FLOOD_MAX_OPENS,
            )],
            Scenario::HalfOpenOneAddress => vec![
                half_open(server.webhook, lo(1, 1), 300),
                half_open(server.admin, lo(1, 1), 100),
            ],
        }
    }
}

/// One scenario against `bin`: the honest calls' outcomes and how many flood
/// connections (or scrapes) were made.
async fn run(bin: &Path, scenario: Scenario, calls: usize) -> (Outcome, Outcome, u64) {
    let pki = tempfile::tempdir().unwrap();
    let mutual = scenario == Scenario::HalfOpenClientCa;
    let (ca, cert, key) = flood_support::client_pki(pki.path(), "client-ca");
    let server = start(bin, mutual.then_some(ca.as_path()));
    let tls = client(&server, mutual.then_some((cert, key)));
    // Ready before the flood starts (the cache of the offline cluster is loaded).
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while flood_support::probe_once(server.admin, PATIENCE)
        .await
        .is_err()
    {
        assert!(std::time::Instant::now() < until, "server never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let for_at_most = PATIENCE * calls as u32 + Duration::from_secs(10);
    let floods = scenario.floods(&server, for_at_most);
    for flood in &floods {
        flood.wait_for(100, Duration::from_secs(10)).await;
    }
    // Let the flood fill the slots.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (webhook, admin) = (server.webhook, server.admin);
    let (validate, livez) = tokio::join!(
        flood_support::honest(calls, EVERY, || flood_support::validate_once(
            webhook,
            tls.clone(),
            PATIENCE
        )),
        flood_support::honest(calls, EVERY, || flood_support::probe_once(admin, PATIENCE)),
    );
    let mut opened = 0;
    for flood in floods {
        opened += flood.stop().await;
    }
    (validate, livez, opened)
}

/// A siege: its name, and its floods (each a shape, from how many addresses, with how
/// many connections each), thrown at both doors alike.
struct Siege {
    name: &'static str,
    floods: &'static [(Shape, usize, usize)],
}

const SILENT: Shape = Shape::Silent;
const IDLE: Shape = Shape::IdleAfterOne;
const TRICKLED: Shape = Shape::TrickledBody;
const STREAMS: Shape = Shape::SlowStreams { streams: 16 };
const STALLED: Shape = Shape::StalledBody { burst: 4096 };

const SIEGES: &[Siege] = &[
    Siege {
        name: "siege: half-open, one address",
        floods: &[(SILENT, 1, 600)],
    },
    Siege {
        name: "siege: idle, one address",
        floods: &[(IDLE, 1, 600)],
    },
    Siege {
        name: "siege: slow bodies, 200 x 2",
        floods: &[(TRICKLED, 200, 2)],
    },
    Siege {
        name: "siege: h2 slow streams, 200 x 2 x 16",
        floods: &[(STREAMS, 200, 2)],
    },
    Siege {
        name: "siege: half-open and idle, 120 x 3 each",
        floods: &[(SILENT, 120, 3), (IDLE, 120, 3)],
    },
    Siege {
        name: "siege: all at once",
        floods: &[
            (SILENT, 1, 600),
            (IDLE, 1, 600),
            (TRICKLED, 100, 2),
            (STREAMS, 100, 2),
        ],
    },
    Siege {
        name: "siege: idle after TLS, 200 x 2",
        floods: &[(Shape::IdleAfterTls, 200, 2)],
    },
    Siege {
        name: "siege: idle after one request, 200 x 2",
        floods: &[(IDLE, 200, 2)],
    },
    Siege {
        name: "siege: idle after TLS, 400 x 1",
        floods: &[(Shape::IdleAfterTls, 400, 1)],
    },
    Siege {
        name: "siege: 4 KiB then silence, 200 x 2",
        floods: &[(STALLED, 200, 2)],
    },
    Siege {
        name: "siege: slow heads after one request, 200 x 2",
        floods: &[(Shape::SlowHead { after_one: true }, 200, 2)],
    },
    Siege {
        name: "siege: churn, 250 x 1",
        floods: &[(Shape::Churn, 250, 1)],
    },
    Siege {
        name: "siege: mixed, 400 addresses",
        floods: &[
            (Shape::IdleAfterTls, 100, 2),
            (IDLE, 100, 2),
            (STALLED, 100, 2),
            (STREAMS, 100, 1),
        ],
    },
];

impl Siege {
    /// The floods of `target`, the k-th from 127.`net + k`.x.y; bodies and heads go to
    /// `body_path`.
    fn floods(
        &self,
        target: &Target,
        net: u8,
        body_path: &'static str,
        for_at_most: Duration,
    ) -> Vec<Flood> {
        let mut floods = Vec::new();
        for (k, &(shape, addresses, each)) in self.floods.iter().enumerate() {
            let sources = flood_support::addresses(net + k as u8, 0, addresses);
            floods.push(flood_support::flood(
                target,
                shape,
                body_path,
                &sources,
                addresses * each,
                Duration::ZERO,
                flood_support::Until {
                    for_at_most,
                    max_opens: FLOOD_MAX_OPENS,
                },
            ));
        }
        floods
    }
}

/// Resident memory of process `pid` in MiB: now (`VmRSS`) or its peak (`VmHWM`).
fn resident_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What one siege saw: the reviews, the probes, flood connections, memory before and
/// at its peak.
struct Besieged {
    reviews: Outcome,
    probes: Outcome,
    opened: u64,
    /// Packets the kernel dropped for a full conntrack table meanwhile (`None`: not loaded).
    dropped: Option<u64>,
    idle_mib: f64,
    peak_mib: f64,
}

/// One siege against `bin`, measured over `window`; the floods run on `flooders`, a
/// runtime of their own (the API server and the kubelet are other processes: a flood
/// that keeps its own threads busy must not delay the honest callers' clocks).
async fn besiege(
    bin: &Path,
    siege: &Siege,
    window: Duration,
    flooders: &tokio::runtime::Handle,
) -> Besieged {
    let server = start(bin, None);
    let tls = client(&server, None);
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while flood_support::probe_once(server.admin, PATIENCE)
        .await
        .is_err()
    {
        assert!(std::time::Instant::now() < until, "server never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = server.child.id();
    let idle_mib = resident_mib(pid, "VmRSS:");
    let mut api = ApiServer::start(server.webhook, tls.clone(), API, PATIENCE);
    // The kubelet probes for as long as the pod runs: from before any flood.
    let mut kubelet = Kubelet::start(server.admin, EVERY, PROBE_PATIENCE);
    // Its pool dialled (a burst), as before any flood.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let for_at_most = window * 3 + Duration::from_secs(60);
    let webhook = Target {
        addr: server.webhook,
        tls: Some(tls),
        path: "/validate",
    };
    let admin = Target {
        addr: server.admin,
        tls: None,
        path: "/livez",
    };
    let drops = flood_support::conntrack_drops();
    let floods = {
        let _flooders = flooders.enter();
        let mut floods = siege.floods(&webhook, 10, "/validate", for_at_most);
        floods.extend(siege.floods(&admin, 40, "/explain", for_at_most));
        floods
    };
    let filled = std::time::Instant::now() + Duration::from_secs(10);
    while floods.iter().map(Flood::opened).sum::<u64>() < 600 && std::time::Instant::now() < filled
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (reviews, probes) = tokio::join!(api.measure(window), kubelet.measure(window));
    let peak_mib = resident_mib(pid, "VmHWM:");
    let mut opened = 0;
    for flood in floods {
        opened += flood.stop().await;
    }
    let dropped = drops.zip(flood_support::conntrack_drops());
    Besieged {
        reviews,
        probes,
        opened,
        dropped: dropped.map(|(before, after)| after.saturating_sub(before)),
        idle_mib,
        peak_mib,
    }
}

/// `answered/total (percent)` and `p50 / p99` of `outcome`.
fn answered(outcome: &Outcome) -> (String, String) {
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    let share = 100.0 * outcome.latencies.len() as f64 / outcome.total().max(1) as f64;
    (
        format!(
            "{}/{} ({share:.1}%)",
            outcome.latencies.len(),
            outcome.total()
        ),
        format!(
            "{} / {}",
            ms(outcome.quantile(0.5)),
            ms(outcome.quantile(0.99))
        ),
    )
}

fn row(label: &str, scenario: Scenario, route: &str, outcome: &Outcome) -> String {
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    format!(
        "| {label} | {} | {route} | {}/{} | {} | {} | {} |",
        scenario.name(),
        outcome.latencies.len(),
        outcome.latencies.len() + outcome.failures.len(),
        ms(outcome.quantile(0.5)),
        ms(outcome.quantile(0.99)),
        ms(outcome.quantile(1.0)),
    )
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test --benches` builds this; only `cargo bench` runs it.
    }
    let bins: Vec<(String, PathBuf)> = match std::env::var("FLOOD_BINS") {
        Ok(list) => list
            .split(',')
            .map(|entry| {
                let (label, path) = entry.split_once('=').expect("FLOOD_BINS: label=path,...");
                (label.to_string(), PathBuf::from(path))
            })
            .collect(),
        Err(_) => vec![(
            "this build".to_string(),
            PathBuf::from(env!("CARGO_BIN_EXE_gpu-admission")),
        )],
    };
    let calls = env_or("CALLS", 20);
    let window = Duration::from_secs(env_or("WINDOW", 20) as u64);
    let wanted = std::env::var("SCENARIOS").ok();
    // Names hold commas: a scenario runs when its name holds one of the parts.
    let chosen = |name: &str| {
        wanted.as_deref().is_none_or(|w| {
            w.split(',')
                .map(str::trim)
                .any(|part| !part.is_empty() && name.contains(part))
        })
    };
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| chosen(s.name()))
        .collect();
    let sieges: Vec<&Siege> = SIEGES.iter().filter(|s| chosen(s.name)).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let flooders = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("flooder")
        .build()
        .unwrap();
    if !sieges.is_empty() {
        println!(
            "| binary | siege | reviews answered | reviews p50 / p99 ms | /livez answered | /livez p50 / p99 ms | flood connections | conntrack drops | RSS idle / peak MiB |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    for siege in sieges {
        for (label, bin) in &bins {
            let seen = runtime.block_on(besiege(bin, siege, window, flooders.handle()));
            let (reviews, reviews_ms) = answered(&seen.reviews);
            let (probes, probes_ms) = answered(&seen.probes);
            let dropped = seen.dropped.map_or("-".to_string(), |n| n.to_string());
            println!(
                "| {label} | {} | {reviews} | {reviews_ms} | {probes} | {probes_ms} | {} | {dropped} | {:.0} / {:.0} |",
                siege.name, seen.opened, seen.idle_mib, seen.peak_mib
            );
            if seen.dropped.is_some_and(|n| n > 0) {
                eprintln!(
                    "  {label} {}: the kernel dropped packets for a full conntrack table: new connections failed before the server saw them (run the sieges in a network namespace of their own: docs/benchmarks.md)",
                    siege.name
                );
            }
            for failure in seen
                .reviews
                .failures
                .iter()
                .chain(&seen.probes.failures)
                .take(3)
            {
                eprintln!("  {label} {}: {failure}", siege.name);
            }
        }
    }
    if scenarios.is_empty() {
        return;
    }
    println!(
        "| binary | scenario | honest call | succeeded | p50 ms | p99 ms | max ms | flood connections |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for scenario in scenarios {
        for (label, bin) in &bins {
            let (validate, livez, opened) = runtime.block_on(run(bin, scenario, calls));
            println!(
                "{} {opened} |",
                row(label, scenario, "/validate", &validate)
            );
            println!("{} {opened} |", row(label, scenario, "/livez", &livez));
            for failure in validate.failures.iter().chain(&livez.failures).take(3) {
                eprintln!("  {label} {}: {failure}", scenario.name());
            }
        }
    }
}
