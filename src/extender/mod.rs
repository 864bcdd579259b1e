//! The kube-scheduler extender (docs/design.md): wire types, the filter verb and
//! Volcano's predicate. The HTTP routes live in `server`.

pub mod api;
pub mod bind;
pub mod eligible;
pub mod filter;
pub mod volcano;

pub use api::{ExtenderArgs, ExtenderFilterResult};
pub use bind::{BindOutcome, bind};
pub use filter::{FilterOutcome, filter};
