//! The CEL pool (docs/design.md, "Doors and trust"): ResourceClaims' CEL selectors are
//! compiled and evaluated here, on at most `workers` threads at once, never on the
//! async workers that answer pod reviews and probes, and never under the cache's lock.
//! A review waits its turn in a bounded queue; past it, it is answered at once with
//! our own failure (a 503, never a denial: the API server's failure policy decides).
//! The cache's own evaluations (a claim from the watch, a DeviceClass change) wait
//! however long the queue is.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;

/// Reviews that may wait per worker: each runs at most one claim's budget (some
/// 30 ms of CPU), so the last in line waits well within the API server's webhook
/// timeout.
const QUEUE_PER_WORKER: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PoolError {
    #[error("{0} ResourceClaim evaluations are running or waiting: try again")]
    Busy(usize),
    #[error("a ResourceClaim evaluation stopped before it finished")]
    Failed,
}

#[derive(Debug, Clone)]
pub(crate) struct CelPool {
    running: Arc<Semaphore>,
    /// Reviews running or waiting.
    admitted: Arc<AtomicUsize>,
    capacity: usize,
}

impl CelPool {
    /// `workers` evaluations at once, and `queue` reviews waiting beside them.
    fn new(workers: usize, queue: usize) -> Self {
        let workers = workers.max(1);
        CelPool {
            running: Arc::new(Semaphore::new(workers)),
            admitted: Arc::new(AtomicUsize::new(0)),
            capacity: workers + queue,
        }
    }

    /// Half the machine's cores (at least one): the other half keeps answering.
    pub(super) fn for_this_machine() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = (cores / 2).max(1);
        Self::new(workers, workers * QUEUE_PER_WORKER)
    }

    /// Run a review's `job`, or refuse at once when the queue is full.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        let before = self.admitted.fetch_add(1, Ordering::AcqRel);
        let _admitted = Admitted(self.admitted.clone());
        if before >= self.capacity {
            return Err(PoolError::Busy(before));
        }
        self.execute(job).await
    }

    /// Run the cache's own `job`, waiting its turn however long the queue.
    pub(super) async fn run_waiting<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        self.execute(job).await
    }

    async fn execute<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        let permit = self.running.clone().acquire_owned().await;
        let permit = permit.map_err(|_| PoolError::Failed)?;
        // The job runs in its caller's span (a review's, the watch's).
        let span = tracing::Span::current();
        let running = tokio::task::spawn_blocking(move || {
            // Held until the job ends, even if its caller has gone.
            let _permit = permit;
            span.in_scope(job)
        });
        running.await.map_err(|_| PoolError::Failed)
    }
}

/// One admitted review, counted until it is answered or its caller goes.
struct Admitted(Arc<AtomicUsize>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reviews_past_the_queue_are_refused_at_once_and_the_cache_waits() {
        let pool = CelPool::new(1, 1);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let hold = Arc::new(parking_lot::Mutex::new(hold));
        let blocked = |pool: &CelPool| {
            let (pool, hold) = (pool.clone(), hold.clone());
            tokio::spawn(async move { pool.run(move || hold.lock().recv().is_ok()).await })
        };
        let first = blocked(&pool);
        let second = blocked(&pool);
        while pool.admitted.load(Ordering::Acquire) < 2 {
            tokio::task::yield_now().await;
        }
        // The worker and the queue's one place are taken: refused, not queued.
        assert_eq!(pool.run(|| ()).await, Err(PoolError::Busy(2)));
        let cache = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run_waiting(|| "evaluated").await }
        });
        release.send(()).unwrap();
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Ok(true));
        assert_eq!(second.await.unwrap(), Ok(true));
        assert_eq!(cache.await.unwrap(), Ok("evaluated"));
        assert_eq!(pool.admitted.load(Ordering::Acquire), 0);
        assert_eq!(pool.run(|| 1).await, Ok(1));
    }
}
