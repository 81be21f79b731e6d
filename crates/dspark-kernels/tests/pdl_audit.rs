//! A plain test over the committed PTX for the rule of programmatic dependent launch
//! (kernels/common.cuh): a kernel reads what an earlier kernel produced only after
//! `griddepcontrol.wait`, and never through the non-coherent path (`ld.global.nc`, which nvcc
//! emits for plain reads through a `const T* __restrict__` and for `__ldg`). ptxas treats a
//! non-coherent load as a read of memory that stays constant while the kernel runs, so it may
//! schedule one written after the wait above it. That happened to `attention_tc_hd128_f32`'s
//! queries (SASS: `LDG.E.128.CONSTANT` before `ACQBULK`): a verify step could read the previous
//! layer's queries while `qkv_rope_append_f32` was still writing this layer's, which only a
//! whole-model run at head dim 128 would show.
//!
//! The rule checked, per kernel of every sm_90 module: a kernel that triggers its dependents
//! also waits, and after its first wait every non-coherent load is a weight stream
//! (`ld.global.nc.L1::no_allocate…`, matvec.cu's `ldg_stream`: weights are written by no
//! kernel, so reading them early is allowed anywhere). Loads before the wait are reviewed in
//! the source (only weights and host-written step lengths may be read there).

use std::path::PathBuf;

/// Violations in one PTX module: (kernel, offending line).
fn audit(ptx: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut kernel = String::new();
    let (mut waited, mut triggers, mut waits) = (false, false, false);
    let finish = |kernel: &str, triggers: bool, waits: bool, out: &mut Vec<(String, String)>| {
        if !kernel.is_empty() && triggers && !waits {
            out.push((kernel.to_string(), "griddepcontrol.launch_dependents without griddepcontrol.wait".into()));
        }
    };
    for line in ptx.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            finish(&kernel, triggers, waits, &mut out);
            kernel = rest.trim_end_matches('(').to_string();
            (waited, triggers, waits) = (false, false, false);
        } else if line.starts_with("griddepcontrol.wait") {
            (waited, waits) = (true, true);
        } else if line.starts_with("griddepcontrol.launch_dependents") {
            triggers = true;
        } else if waited && line.starts_with("ld.global.nc") && !line.contains("L1::no_allocate") {
            out.push((kernel.clone(), line.to_string()));
        }
    }
    finish(&kernel, triggers, waits, &mut out);
    out
}

#[test]
fn pdl_kernels_read_produced_data_coherently() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ptx");
    let mut modules: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".sm90.ptx.xz"))
        .collect();
    modules.sort();
    assert!(modules.len() >= 5, "expected the sm_90 PTX modules in {}", dir.display());
    let mut bad = Vec::new();
    let mut waiting = 0;
    for m in &modules {
        let text = dspark_kernels::cuda::inflate(&std::fs::read(m).unwrap()).unwrap();
        waiting += text.matches("griddepcontrol.wait").count();
        bad.extend(audit(&text).into_iter().map(|(k, l)| format!("{}: {k}: {l}", m.display())));
    }
    assert!(waiting >= 10, "the sm_90 PTX should hold the PDL kernels' waits ({waiting} found)");
    assert!(bad.is_empty(), "PDL kernels reading through the non-coherent path after the wait:\n{}", bad.join("\n"));
}

#[test]
fn the_audit_flags_a_noncoherent_read_after_the_wait() {
    let ptx = "\
.visible .entry good(
\tgriddepcontrol.launch_dependents;
\tld.global.nc.f32 %f1, [%rd1];
\tgriddepcontrol.wait;
\tld.global.cg.v4.f32 {%f1,%f2,%f3,%f4}, [%rd2];
\tld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%r1,%r2,%r3,%r4}, [%rd3];
}
.visible .entry reads_q_early(
\tgriddepcontrol.launch_dependents;
\tgriddepcontrol.wait;
\tld.global.nc.v4.f32 {%f1,%f2,%f3,%f4}, [%rd4];
}
.visible .entry never_waits(
\tgriddepcontrol.launch_dependents;
\tld.global.f32 %f1, [%rd1];
}
";
    let found = audit(ptx);
    let kernels: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kernels, ["reads_q_early", "never_waits"], "{found:?}");
}
