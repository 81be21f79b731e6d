//! The checkpoint readers under libFuzzer: every input goes through
//! `dspark_model::fuzzing::read_all` (the safetensors header and index parsers, the Qwen3 and
//! FP8 config readers, the DSpark draft config, the CPU loaders' tensor checks). A panic, a hang
//! or an out-of-memory is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dspark_model::fuzzing::read_all(data);
});
