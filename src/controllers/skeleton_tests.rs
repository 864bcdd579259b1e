#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn a_recent_key_is_kept_for_its_time_unless_it_no_longer_holds() {
    let mut recent = Recent::new(Duration::from_secs(10));
    let start = Instant::now();
    recent.note("a", start);
    recent.note("b", start + Duration::from_secs(5));
    recent.forget(start + Duration::from_secs(9), |_| true);
    assert!(recent.contains(&"a") && recent.contains(&"b"));
    recent.forget(start + Duration::from_secs(10), |_| true);
    assert!(!recent.contains(&"a"), "kept its 10 s, then forgotten");
    assert!(recent.contains(&"b"));
    recent.forget(start + Duration::from_secs(11), |key| *key != "b");
    assert_eq!(
        recent.keys().count(),
        0,
        "forgotten once it no longer holds"
    );
}

use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::cache::{CacheWriter, Projection};
use crate::config::Config;
use crate::metrics::Metrics;

/// A controller whose passes end as scripted (`true`: ok), recording when each ran and
/// the metrics as its first pass saw them; it stops the loop after its last outcome.
struct Scripted {
    outcomes: VecDeque<bool>,
    passes: Arc<Mutex<Vec<tokio::time::Instant>>>,
    seen_at_first_pass: Arc<Mutex<Option<String>>>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

impl Controller for Scripted {
    const NAME: &'static str = "scripted";
    const EVERY: Duration = Duration::from_secs(10);

    async fn pass(&mut self) -> Result<usize, PassError> {
        let mut passes = self.passes.lock();
        if passes.is_empty() {
            *self.seen_at_first_pass.lock() = Some(self.metrics.encode());
        }
        passes.push(tokio::time::Instant::now());
        let ok = self.outcomes.pop_front().unwrap_or(true);
        if self.outcomes.is_empty() {
            self.shutdown.cancel();
        }
        let mut failures = Failures::default();
        if !ok {
            failures.note(std::io::Error::other("the API server is away"));
            failures.note(std::io::Error::other("and still away"));
        }
        failures.outcome(1)
    }
}

/// Runs a [`Scripted`] controller to its end; returns the gaps between its passes and
/// the metrics: as its first pass saw them, and at the end.
async fn script(outcomes: &[bool], wake: Option<Arc<Notify>>) -> (Vec<Duration>, String, String) {
    let metrics = Arc::new(Metrics::default());
    let shutdown = CancellationToken::new();
    let passes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(None));
    let controller = Scripted {
        outcomes: outcomes.iter().copied().collect(),
        passes: passes.clone(),
        seen_at_first_pass: seen.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
    };
    let harness = Harness {
        cache: CacheWriter::in_memory(Projection::from_config(&Config::default()))
            .cache()
            .clone(),
        metrics: metrics.controllers.clone(),
        shutdown,
    };
    run(controller, wake, harness).await;
    let passes = passes.lock();
    let gaps = passes.windows(2).map(|w| w[1] - w[0]).collect();
    let first = seen.lock().take().unwrap_or_default();
    (gaps, first, metrics.encode())
}

fn seconds(gaps: &[u64]) -> Vec<Duration> {
    gaps.iter().copied().map(Duration::from_secs).collect()
}

#[tokio::test(start_paused = true)]
async fn a_failed_pass_is_retried_after_a_pause_doubling_up_to_every_and_reset_by_success() {
    let (e, o) = (false, true);
    let (gaps, _, _) = script(&[e, e, e, e, e, o, e, o], None).await;
    // 1, 2, 4, 8 s after failures, then EVERY (10 s) at most; after the success, on
    // schedule (EVERY); the next failure is retried after 1 s again.
    assert_eq!(gaps, seconds(&[1, 2, 4, 8, 10, 10, 1]));
}

#[tokio::test(start_paused = true)]
async fn a_wake_starts_a_pass_at_once_but_waits_out_a_backoff() {
    let wake = Arc::new(Notify::new());
    let waker = wake.clone();
    let notify = async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        waker.notify_one(); // on schedule: a pass at once (it fails)
        tokio::time::sleep(Duration::from_millis(500)).await;
        waker.notify_one(); // during the 1 s backoff: no pass before it ends
    };
    let ((gaps, _, _), ()) = tokio::join!(script(&[true, false, true], Some(wake)), notify);
    assert_eq!(gaps, [Duration::from_secs(2), Duration::from_secs(1)]);
}

#[tokio::test(start_paused = true)]
async fn passes_are_counted_by_outcome_from_zero_with_the_last_success_and_their_duration() {
    let (first, end) = {
        let (_, first, end) = script(&[false, false, true], None).await;
        (first, end)
    };
    for zero in [
        r#"gpu_admission_controller_passes_total{controller="scripted",outcome="ok"} 0"#,
        r#"gpu_admission_controller_passes_total{controller="scripted",outcome="error"} 0"#,
        r#"gpu_admission_controller_last_success_timestamp_seconds{controller="scripted"} 0"#,
        r#"gpu_admission_controller_pass_duration_seconds_count{controller="scripted"} 0"#,
    ] {
        assert!(
            first.contains(zero),
            "no {zero:?} before the first pass:\n{first}"
        );
    }
    for counted in [
        r#"gpu_admission_controller_passes_total{controller="scripted",outcome="ok"} 1"#,
        r#"gpu_admission_controller_passes_total{controller="scripted",outcome="error"} 2"#,
        r#"gpu_admission_controller_pass_duration_seconds_count{controller="scripted"} 3"#,
    ] {
        assert!(
            end.contains(counted),
            "no {counted:?} after three passes:\n{end}"
        );
    }
    let last_success = end
        .lines()
        .find_map(|l| l.strip_prefix(r#"gpu_admission_controller_last_success_timestamp_seconds{controller="scripted"} "#))
        .and_then(|v| v.parse::<i64>().ok());
    assert!(
        last_success.is_some_and(|at| at > 1_700_000_000),
        "the last success is the time it ended: {last_success:?}"
    );
}

#[test]
fn a_pass_error_tells_how_many_failed_and_the_first() {
    let mut failures = Failures::default();
    assert_eq!(Failures::default().outcome(3).ok(), Some(3));
    failures.note(std::io::Error::other("pod team/a: 503"));
    failures.note(std::io::Error::other("pod team/b: 503"));
    let error = failures.outcome(3).unwrap_err();
    assert_eq!(
        error.to_string(),
        "2 failure(s) in the pass; the first: pod team/a: 503"
    );
}

#[tokio::test(start_paused = true)]
async fn an_api_call_that_never_answers_fails_at_the_limit() {
    let started = tokio::time::Instant::now();
    let hung = bounded(std::future::pending::<Result<(), kube::Error>>()).await;
    let error = hung.unwrap_err();
    assert_eq!(started.elapsed(), API_CALL_LIMIT);
    assert!(matches!(error, kube::Error::Service(_)), "{error:?}");
    assert!(
        error.to_string().contains("did not answer within 30s"),
        "{error}"
    );
}
