//! Handing back to the kernel the pages a load freed. Loading a cluster (a cluster
//! file, or a watch's list) allocates many times what the cache keeps: every object
//! parsed, then projected and dropped. jemalloc (the binary's allocator, `main.rs`)
//! keeps such freed pages resident for about ten seconds after they were last used,
//! and longer while the process allocates nothing, and the resident set is what a
//! container's memory limit counts (docs/benchmarks.md, "Memory per cached pod").

use tikv_jemalloc_ctl::{Access, AsName};

/// One purge at a time: each sets decay times and puts them back.
static PURGING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Purge the unused pages of every jemalloc arena now. An arena given a decay time of
/// 0 purges every unused page at once, whether or not background threads run
/// (jemalloc 5.3, `pac_maybe_decay_purge`); it is then given back the decay time it
/// had. Setting the time it already has would not do: that restarts its decay and
/// purges only down to the limit the decay had reached, and nothing at all while
/// the background threads run (every purge is theirs then). A few system calls per
/// arena, once a load is done. Without jemalloc as the global allocator (the tests)
/// it purges jemalloc's own empty arenas: nothing.
pub(crate) fn return_freed_pages() {
    // Nothing else sets decay times: under the lock, what is read is the arena's own.
    let _one_at_a_time = PURGING.lock();
    let Ok(arenas) = tikv_jemalloc_ctl::arenas::narenas::read() else {
        return;
    };
    for arena in 0..arenas {
        // Dirty pages first: with a muzzy decay time set, purged dirty pages become
        // muzzy (lazily freed), which the second purges for good.
        for kind in ["dirty", "muzzy"] {
            let name = format!("arena.{arena}.{kind}_decay_ms\0");
            let key = name.as_bytes().name();
            // An arena not in use has no decay time to read: nothing to purge.
            if let Ok(decay_ms) = Access::<isize>::read(key) {
                let _ = Access::<isize>::write(key, 0);
                let _ = Access::<isize>::write(key, decay_ms);
            }
        }
    }
}
