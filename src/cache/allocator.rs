//! Handing back to the kernel the pages a load freed. Loading a cluster (a cluster
//! file, or a watch's list) allocates many times what the cache keeps: every object
//! parsed, then projected and dropped. jemalloc (the binary's allocator, `main.rs`)
//! keeps such freed pages resident for about ten seconds after they were last used,
//! and longer while the process allocates nothing, and the resident set is what a
//! container's memory limit counts (docs/benchmarks.md, "Memory per cached pod").

use tikv_jemalloc_ctl::{Access, AsName};

/// Purge the unused pages of every jemalloc arena now: setting an arena's decay time,
/// even to the value it has, makes its unused pages count as fully decayed, which
/// purges them at once (jemalloc(3), `arena.<i>.dirty_decay_ms`). A few system calls
/// per arena, once a load is done. Without jemalloc as the global allocator (the
/// tests) it purges jemalloc's own empty arenas: nothing.
pub(crate) fn return_freed_pages() {
    let Ok(arenas) = tikv_jemalloc_ctl::arenas::narenas::read() else {
        return;
    };
    // While its background threads run, jemalloc leaves every purge to them, setting a
    // decay time included (its purge eagerness is then "never" for other threads):
    // they are stopped for the purge and started again after.
    let background = tikv_jemalloc_ctl::background_thread::read().unwrap_or(false);
    if background {
        let _ = tikv_jemalloc_ctl::background_thread::write(false);
    }
    for arena in 0..arenas {
        // Dirty pages first: purging them with a muzzy decay time set makes them muzzy
        // (lazily freed), which the second purges for good.
        for kind in ["dirty", "muzzy"] {
            let name = format!("arena.{arena}.{kind}_decay_ms\0");
            let key = name.as_bytes().name();
            // An arena not in use has no decay time to read: nothing to purge.
            if let Ok(decay_ms) = Access::<isize>::read(key) {
                let _ = Access::<isize>::write(key, decay_ms);
            }
        }
    }
    if background {
        let _ = tikv_jemalloc_ctl::background_thread::write(true);
    }
}
