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
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

/// Rewrites a safetensors header through `edit`, keeping the data section as it is.
pub fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut h = header.to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

/// `generate --json` on qwen3-tiny-f32 (or `dir`) with `extra` flags; the parsed object.
pub fn generate_json(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["generate", "--target", dir.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-tokens", "24"];
    args.extend(["--device", "cpu", "--json"]);
    args.extend(extra);
    let out = dspark(&args);
    assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}
