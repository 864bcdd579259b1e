//! The kube-scheduler extender (docs/design.md): the filter and bind verbs and Volcano's
//! predicate, each around the one placement transaction (`plan`). Their requests are
//! decoded in `crate::wire`; the HTTP routes live in `server`.

pub(crate) mod bind;
pub(crate) mod filter;
pub(crate) mod plan;
pub(crate) mod volcano;

pub(crate) use bind::bind;
pub(crate) use filter::filter;
