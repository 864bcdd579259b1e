//! The kube-scheduler extender (docs/design.md): the filter and bind verbs and Volcano's
//! predicate, each around the one placement transaction (`plan`). Their requests are
//! decoded in `crate::wire`; the HTTP routes live in `server`.

pub mod bind;
pub mod filter;
pub mod plan;
pub mod volcano;

pub use bind::{BindOutcome, bind};
pub use filter::{FilterOutcome, filter};
