//! API mode, on the GPU scheduler's sidecar: the controllers that tell pods what
//! gpu-admission judges of them, on the replica holding the controller Lease only (one
//! word per change, not one per replica): why a pending GPU pod waits, as its
//! `gpu-admission.io/Waiting` condition and an Event (`waiting`, docs/explain.md), and,
//! with `defrag.mode: DryRun` or `Evict`, the defragmentation planner's plan for it,
//! told or carried out (`defrag`, `mover`; docs/defrag.md). They read the cache, judge with `explain` and plan with `defrag`,
//! and write through the API server; nothing else calls them.

pub(crate) mod defrag;
pub(crate) mod mover;
pub(crate) mod waiting;
