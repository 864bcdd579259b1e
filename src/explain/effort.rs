//! What one judgment may spend, and whether anyone still waits for it (docs/explain.md,
//! "What a judgment costs"). A judgment counts the nodes it fits a pod on; the
//! counterfactual search stops at its budget, and the whole judgment stops at the next
//! node once its caller has gone (the admin port's `/explain` raises the flag when the
//! request's future is dropped: the client hung up, or the answer went out).

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Node fits the counterfactual search ("fits now as model X") may try in one
/// judgment. It tries each open node of the other models at most once, so this is
/// reached only on a cluster of more than this many such nodes; past it the search
/// stops with what it found.
pub(crate) const SEARCH_FITS: u64 = 20_000;

/// Raised when whoever waits for a judgment stops waiting. Cheap to check: one atomic
/// load.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag, and the guard that raises it when dropped: the waiting side holds the
    /// guard, the judging side the flag.
    pub(crate) fn on_drop() -> (Cancel, CancelOnDrop) {
        let cancel = Cancel::default();
        (cancel.clone(), CancelOnDrop(cancel))
    }

    pub(crate) fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Raises its [`Cancel`] when dropped.
#[derive(Debug)]
pub(crate) struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.raise();
    }
}

/// A judgment stopped because its caller left: there is nobody to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the caller left before the judgment was done")]
pub(crate) struct Abandoned;

/// The work of one judgment, counted where it is spent, and the caller's flag,
/// checked at every unit of it.
#[derive(Debug)]
pub(crate) struct Effort {
    cancel: Cancel,
    /// Node fits tried, stages and search together.
    fits: Cell<u64>,
    /// Node fits the counterfactual search may still try.
    search_left: Cell<u64>,
}

impl Default for Effort {
    /// A judgment whose caller waits for the answer, whatever it costs within the
    /// bounds.
    fn default() -> Self {
        Effort::new(Cancel::default())
    }
}

impl Effort {
    /// A judgment for a caller who stops waiting when `cancel` is raised.
    pub(crate) fn new(cancel: Cancel) -> Self {
        Effort {
            cancel,
            fits: Cell::new(0),
            search_left: Cell::new(SEARCH_FITS),
        }
    }

    /// The same, with `fits` node fits for the counterfactual search.
    #[cfg(test)]
    pub(crate) fn with_search_budget(self, fits: u64) -> Self {
        self.search_left.set(fits);
        self
    }

    /// Count one node fit: false once the caller has left (the fit is not made).
    pub(super) fn fit(&self) -> bool {
        if self.cancel.is_raised() {
            return false;
        }
        self.fits.set(self.fits.get() + 1);
        true
    }

    /// Count one node fit of the counterfactual search: false once its budget is
    /// spent or the caller has left.
    pub(super) fn search_fit(&self) -> bool {
        let left = self.search_left.get();
        if left == 0 {
            return false;
        }
        self.search_left.set(left - 1);
        self.fit()
    }

    /// Node fits the counterfactual search may still try.
    pub(super) fn search_left(&self) -> u64 {
        self.search_left.get()
    }

    /// `Err` once the caller has left.
    pub(super) fn check(&self) -> Result<(), Abandoned> {
        if self.cancel.is_raised() {
            Err(Abandoned)
        } else {
            Ok(())
        }
    }

    /// Node fits tried so far.
    #[cfg(test)]
    pub(crate) fn fits(&self) -> u64 {
        self.fits.get()
    }
}
