//! Paths into the repository for integration tests.

/// `rel` under the repository root. The root is read at run time (cargo sets
/// `CARGO_MANIFEST_DIR` for the test), falling back to the build-time value: a test
/// binary reused from a cache built in another checkout must read this one's files.
pub fn path(rel: &str) -> String {
    let root =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    format!("{root}/{rel}")
}
