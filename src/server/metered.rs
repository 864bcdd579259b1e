//! A request body metered against its listener's rate rule (`server::pace`): it records
//! how the body arrives, and once the body's time has run out (behind the floor over the
//! window, or not whole by its deadline) it fails with `BodyTooSlow` and tells its
//! connection (`server::slots`) to give up its slot.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::pace::{Pace, Progress};
use super::slots::Activity;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body that records how it arrives and fails with [`super::pace::BodyTooSlow`] once its
/// time has run out, telling its connection to give up its slot.
pub(super) struct MeteredBody<B> {
    inner: B,
    progress: Arc<Progress>,
    pace: Pace,
    activity: Arc<Activity>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> MeteredBody<B> {
    pub(super) fn new(
        inner: B,
        progress: Arc<Progress>,
        pace: Pace,
        activity: Arc<Activity>,
    ) -> Self {
        MeteredBody {
            inner,
            progress,
            pace,
            activity,
            timer: None,
        }
    }

    /// Pending until the body is due; then the error that cuts it.
    fn wait_or_cut(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.pace.floor == 0 {
            return Poll::Pending;
        }
        loop {
            let (due, why) = self.progress.due(self.pace);
            if Instant::now() >= due {
                tracing::debug!(peer = %self.activity.peer(), %why, "request body too slow; closing its connection");
                self.activity.cut_for_slowness();
                return Poll::Ready(Some(Err(why.into())));
            }
            let deadline = tokio::time::Instant::from_std(due);
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            timer.as_mut().reset(deadline);
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let end = this.inner.is_end_stream();
                this.progress.arrived(this.pace, frame.as_ref(), end);
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                this.progress.awaiting();
                this.wait_or_cut(cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
