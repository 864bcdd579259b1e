//! The kubelet probing a pod: `GET /livez` on a fresh connection every period, each
//! with its timeout (1 s by default in Kubernetes), from before any flood (it probes for
//! as long as the pod runs); what the probes due in a window saw.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Outcome, probe_once};

/// Probes running until dropped (or an hour has passed).
pub struct Kubelet {
    sent: super::Sent,
    patience: Duration,
    stop: CancellationToken,
}

impl Kubelet {
    /// Starts probing the admin port at `addr` every `period`, each probe with `patience`.
    pub fn start(addr: SocketAddr, period: Duration, patience: Duration) -> Kubelet {
        let (record, sent) = tokio::sync::mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            let hour = tokio::time::sleep(Duration::from_secs(3600));
            tokio::pin!(hour);
            loop {
                tokio::select! {
                    () = until.cancelled() => return,
                    () = &mut hour => return,
                    _ = ticks.tick() => {}
                }
                let record = record.clone();
                tokio::spawn(async move {
                    let due = Instant::now();
                    let answered = probe_once(addr, patience).await;
                    let _ = record.send((due, answered.map_err(|e| e.to_string())));
                });
            }
        });
        Kubelet {
            sent,
            patience,
            stop,
        }
    }

    /// What the probes due in the next `window` saw.
    pub async fn measure(&mut self, window: Duration) -> Outcome {
        super::measure(&mut self.sent, self.patience, window).await
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
