//! The committed PTX is generated code: it must come from the current `kernels/*.cu`.
//! Each PTX file's first line records the SHA-256 of every `kernels/*.cuh` (in name order)
//! followed by its source; this plain test recomputes it, so editing a kernel or a header
//! without `cargo xtask ptx` fails. The files are xz streams (`<stem>.<target>.ptx.xz`); the
//! second test inflates the table the loader uses and checks that every module is PTX of its
//! target holding each kernel the table names.

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
    let mut sm89_builds = 0;
    for src in &sources {
        let stem = src.file_stem().unwrap().to_str().unwrap();
        let mut h = Sha256::new();
        h.update(&common);
        h.update(std::fs::read(src).unwrap());
        let want = format!("source-sha256={:x}", h.finalize());
        // Ada's build exists for the modules that include the E4M3 header (xtask `has_sm89_build`).
        let sm89 = std::fs::read_to_string(src).unwrap().contains("#include \"fp8.cuh\"");
        sm89_builds += usize::from(sm89);
        for target in ["sm90", "sm80", "sm89"].into_iter().filter(|&t| t != "sm89" || sm89) {
            let ptx = root.join(format!("crates/dspark-kernels/ptx/{stem}.{target}.ptx.xz"));
            let text = std::fs::read(&ptx).ok().and_then(|b| dspark_kernels::cuda::inflate(&b).ok());
            let first = text.and_then(|t| t.lines().next().map(str::to_string));
            if !first.as_deref().is_some_and(|l| l.contains(&want)) {
                stale.push(ptx.display().to_string());
            }
        }
    }
    let ptx_count = std::fs::read_dir(root.join("crates/dspark-kernels/ptx")).unwrap().count();
    assert!(sm89_builds >= 2, "matvec.cu and fp8.cu include fp8.cuh: {sm89_builds} sm_89 builds");
    assert_eq!(ptx_count, 2 * sources.len() + sm89_builds, "a PTX file has no kernel source (or the reverse)");
    assert!(stale.is_empty(), "stale PTX, run `cargo xtask ptx`: {stale:?}");
}

#[test]
fn the_loader_inflates_every_module_with_its_kernels() {
    use dspark_kernels::cuda::{ptx::MODULES, ptx_text, PtxTarget};
    for target in [PtxTarget::Sm90, PtxTarget::Sm89, PtxTarget::Sm80] {
        let text = ptx_text(target).unwrap();
        assert_eq!(text.len(), MODULES.len());
        for (m, t) in MODULES.iter().zip(text) {
            // Ada loads the sm_80 build of a module that has no sm_89 one.
            let arch = if target == PtxTarget::Sm89 && m.sm89.is_none() { "sm_80" } else { target.name() };
            assert!(t.starts_with("// dspark-ptx source-sha256="), "{} {arch}: no header", m.name);
            assert!(t.contains(&format!(".target {arch}")), "{} is not {arch} PTX", m.name);
            for f in m.functions {
                assert!(t.contains(&format!(".entry {f}(")), "{} {arch}: no kernel {f}", m.name);
            }
        }
        // The second call is the same inflated text, not a second inflation.
        assert!(std::ptr::eq(text, ptx_text(target).unwrap()));
    }
}
