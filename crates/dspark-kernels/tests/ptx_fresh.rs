//! The committed PTX is generated code: it must come from the current `kernels/*.cu`.
//! Each PTX file's first line records the SHA-256 of every `kernels/*.cuh` (in name order)
//! followed by its source; this plain test recomputes it, so editing a kernel or a header
//! without `cargo xtask ptx` fails.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The files of `dir` with extension `ext`, in name order.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn committed_ptx_matches_kernel_sources() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernels = root.join("kernels");
    let common: Vec<u8> = files(&kernels, "cuh").iter().flat_map(|h| std::fs::read(h).unwrap()).collect();
    let sources = files(&kernels, "cu");
    assert!(!sources.is_empty());
    let mut stale = Vec::new();
    for src in &sources {
        let stem = src.file_stem().unwrap().to_str().unwrap();
        let mut h = Sha256::new();
        h.update(&common);
        h.update(std::fs::read(src).unwrap());
        let want = format!("source-sha256={:x}", h.finalize());
        for target in ["sm90", "sm80"] {
            let ptx = root.join(format!("crates/dspark-kernels/ptx/{stem}.{target}.ptx"));
            let first = std::fs::read_to_string(&ptx).ok().and_then(|t| t.lines().next().map(str::to_string));
            if !first.as_deref().is_some_and(|l| l.contains(&want)) {
                stale.push(ptx.display().to_string());
            }
        }
    }
    let ptx_count = std::fs::read_dir(root.join("crates/dspark-kernels/ptx")).unwrap().count();
    assert_eq!(ptx_count, 2 * sources.len(), "a PTX file has no kernel source (or the reverse)");
    assert!(stale.is_empty(), "stale PTX, run `cargo xtask ptx`: {stale:?}");
}
