//! Shared by the `cli*` integration tests: the `dspark` binary run on the fixtures, the goldens,
//! a fixture copied so a test can break it, and the one-line error every bad input must end in.
#![allow(dead_code)] // each test crate uses part of it

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(name: &str) -> PathBuf {
    repo().join("fixtures").join(name)
}

pub fn dspark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dspark")).args(args).output().expect("run dspark")
}

pub fn golden_ids(name: &str, key: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(repo().join(format!("fixtures/golden/{name}.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v[key].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

pub fn csv(ids: &[u64]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// Runs `dspark` expecting failure; returns stderr after checking it is one `error:` line.
/// Runs `dspark args`, which must succeed; its output and its stderr as text.
pub fn expect_success(args: &[&str]) -> (Output, String) {
    let out = dspark(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    (out, stderr)
}

pub fn expect_error(args: &[&str]) -> String {
    let out = dspark(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "expected failure for {args:?}, got success");
    assert!(!stderr.contains("panicked"), "panic for {args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "not one line for {args:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

/// Copies a fixture into a temp dir so a test can break it.
pub fn broken_copy(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    dspark_testkit::files::copy_files(&fixture(name), tmp.path());
    tmp
}

/// Rewrites a safetensors header through `edit`, keeping the data section as it is.
#[allow(unused_imports)] // not every test binary that includes this module edits a header
pub use dspark_testkit::files::edit_safetensors_header as edit_header;

/// `generate --json` on qwen3-tiny-f32 (or `dir`) with `extra` flags; the parsed object.
pub fn generate_json(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["generate", "--target", dir.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-tokens", "24"];
    args.extend(["--device", "cpu", "--json"]);
    args.extend(extra);
    let out = dspark(&args);
    assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}
