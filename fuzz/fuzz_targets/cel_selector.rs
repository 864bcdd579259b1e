#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gpu_admission_fuzz::harness::cel_selector(data);
});
