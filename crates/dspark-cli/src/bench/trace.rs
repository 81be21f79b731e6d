//! `dspark bench --trace`: each phase's replayed step on the device's own clock, kernel by kernel
//! (dspark_kernels::cuda::trace has the method). Needs the trace build of the kernels:
//! `cargo xtask ptx --trace`, then `DSPARK_PTX_DIR=target/ptx-trace dspark bench --trace`.
//!
//! A phase is run twice: once with fresh graphs while the host logs its launches (the capture
//! is where the launches are made), once replayed with the ring armed. Its table gives, per
//! kernel, the time the step was held by its launches (the next launch's ready less its own),
//! their mean lead (resident before their predecessor ended), and a window of one layer's
//! launches in order. The stamps perturb the step a little, so the times of the table are
//! shares of a traced step, set beside the untraced phase time of the same run.

use anyhow::{bail, Context, Result};
use dspark_kernels::cuda::trace::{timeline, Timeline};
use dspark_kernels::cuda::Gpu;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use std::fmt::Write;

/// Records a step may write: a verify of 8 is ~250 launches of at most a few hundred blocks.
const RING: usize = 1 << 20;

/// Phase `phase` at `ctx` keys (`untraced_us` as timed): runs `step` twice (logged, then
/// traced; see the module docs) and returns its table. With `DSPARK_TRACE_DUMP=DIR` the launch
/// log and the records are also written there as CSV (`<phase>_<ctx>.log.csv`,
/// `….records.csv`), to read a table's matching by hand.
pub(super) fn trace_phase(
    (phase, ctx, untraced_us): (&str, usize, f64),
    gpu: &Gpu,
    target: &mut CudaQwen3,
    draft: &mut CudaDraft,
    step: &mut dyn FnMut(&mut CudaQwen3, &mut CudaDraft) -> dspark_model::Result<()>,
) -> Result<String> {
    let what = format!("{phase}_{ctx}");
    let graphs = std::env::var_os("DSPARK_NO_GRAPHS").is_none();
    // Fresh graphs, so this run captures them and the log sees every launch.
    target.set_graphs(graphs);
    draft.set_graphs(graphs);
    gpu.trace_log(true)?;
    let ran = step(target, draft);
    let log = gpu.trace_log(false)?;
    ran?;
    gpu.trace_arm(RING)?;
    let ran = step(target, draft);
    let read = gpu.trace_read();
    gpu.trace_arm(0)?;
    ran?;
    let (records, asked) = read?;
    if asked > RING {
        bail!("--trace: the step asked for {asked} records, the ring holds {RING}");
    }
    if let Some(dir) = std::env::var_os("DSPARK_TRACE_DUMP") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut s = String::from("name,blocks,threads\n");
        for l in &log {
            let (b, t) = l.shape.unwrap_or((0, 0));
            let _ = writeln!(s, "{},{b},{t}", l.name);
        }
        let path = dir.join(format!("{what}.log.csv"));
        std::fs::write(&path, s).with_context(|| format!("writing {}", path.display()))?;
        let mut s = String::from("grid,start,ready,grid_blocks,block_threads,block,sm\n");
        for r in &records {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{}",
                r.grid, r.start, r.ready, r.grid_blocks, r.block_threads, r.block, r.sm
            );
        }
        let path = dir.join(format!("{what}.records.csv"));
        std::fs::write(&path, s).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(table(phase, ctx, untraced_us, &timeline(&log, &records), records.len()))
}

/// The markdown of one traced phase: its summary line, the per-kernel table and one window of
/// launches from the middle of the step (a layer's chain, for the phases that have layers).
fn table(phase: &str, ctx: usize, untraced_us: f64, t: &Timeline, records: usize) -> String {
    let mut s = String::new();
    let span = t.span_us();
    let _ = writeln!(
        s,
        "\n#### {phase} at {ctx} keys: traced span {span:.1} µs (untimed phase {untraced_us:.1} µs), {} launches traced, {} without records, {} grids unmatched, {records} block records, timer step {} ns\n",
        t.launches.len(),
        t.untraced,
        t.unmatched_grids,
        t.timer_step_ns
    );
    let _ = writeln!(s, "| kernel | launches | held µs | share | µs a launch | lead µs |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for k in t.by_kernel() {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1}% | {:.2} | {:.2} |",
            k.name,
            k.launches,
            k.held_us,
            100.0 * k.held_us / span.max(1e-9),
            k.held_us / k.launches as f64,
            k.lead_us
        );
    }
    let n = t.launches.len();
    if n >= 16 {
        let _ = writeln!(s, "\nLaunches {}–{} (µs from the step's start):\n", n / 2, n / 2 + 11);
        let _ = writeln!(s, "| # | kernel | blocks | first start | ready | held | untraced after |");
        let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|");
        for (i, l) in t.launches.iter().enumerate().skip(n / 2).take(12) {
            let held = l.held.map_or("—".to_string(), |h| format!("{:.2}", h as f64 / 1e3));
            let _ = writeln!(
                s,
                "| {i} | {} | {} | {:.2} | {:.2} | {held} | {} |",
                l.name,
                l.blocks,
                l.first_start as f64 / 1e3,
                l.ready as f64 / 1e3,
                l.merged
            );
        }
    }
    s
}
