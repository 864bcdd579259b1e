#![no_main]

use gpu_admission_fuzz::PodInput;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: PodInput| {
    let pod = input.pod();
    dump(&pod);
    gpu_admission_fuzz::harness::pod_annotations(&pod);
});

/// With `FUZZ_DUMP_POD=<file>`, write the pod as JSON before checking it: how a crash
/// input (arbitrary's byte format) becomes a `*.pod.json` for tests/fuzz_regressions.rs.
fn dump(pod: &k8s_openapi::api::core::v1::Pod) {
    static PATH: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    if let Some(path) = PATH.get_or_init(|| std::env::var_os("FUZZ_DUMP_POD")) {
        let json = serde_json::to_vec_pretty(pod).expect("a Pod serializes");
        std::fs::write(path, json).expect("FUZZ_DUMP_POD is writable");
    }
}
