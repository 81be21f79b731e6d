//! The in-graph timeline of a step (`dspark bench --trace`): where a replayed decode, verify or
//! draft round spends its time, launch by launch.
//!
//! Host events time a launch only outside a graph, where each one carries ~4 µs of host work
//! that the replay does not, so the event profile cannot say what a kernel costs inside the
//! graph. The trace build of the kernels (`cargo xtask ptx --trace`, loaded with
//! `DSPARK_PTX_DIR=target/ptx-trace`) has every block stamp one record at its PDL hooks
//! (kernels/trace.cuh): when it became resident (`start`) and when its wait for the predecessor
//! returned (`ready`), with its launch's `%gridid` and shape. This module arms the ring those
//! records go to, keeps the host's log of the launches a step makes (name and shape, recorded
//! while the step's graph is captured) and joins the two:
//!
//! * a launch is the records of one grid id, in the order of their earliest `start` (with PDL a
//!   launch's blocks start only after all of its predecessor's have, and without it after its
//!   predecessor ends), matched to the log in order by shape — a logged launch whose kernel has
//!   no hooks (cuBLAS, or a kernel that exits before its wait) matches no records;
//! * `ready` of a launch (its earliest block's wait return) is when its predecessor finished,
//!   so the time a launch holds the step is the next traced launch's `ready` less its own: those
//!   increments sum to the step, and a launch without records is counted with the one before;
//! * `lead` is `ready` less the launch's earliest `start`: how long its blocks sat resident
//!   before they could run, issuing their weights' first loads (PDL's whole point).
//!
//! The reconstruction is plain data ([`timeline`]), tested on the CPU; the GPU side only moves
//! bytes. Stamps cost thread 0 of a block a timer read, one atomic and a 48-byte store, so a
//! traced step is not the record's step: the table is where the time goes, not how much.

use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::CudaSlice;

/// One block's stamps, as kernels/trace.cuh writes them (48 bytes, `repr(C)` to match).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceRecord {
    pub grid: u64,
    pub start: u64,
    pub ready: u64,
    pub grid_blocks: u32,
    pub block_threads: u32,
    pub block: u32,
    pub sm: u32,
    pub reserved: u64,
}

/// One launch as the host made it: the kernel and, where the host knows it, its shape
/// (blocks, threads a block); cuBLAS calls have none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedLaunch {
    pub name: String,
    pub shape: Option<(u32, u32)>,
}

/// One launch of the step on the device timeline (ns from the step's first `ready`).
#[derive(Clone, Debug, PartialEq)]
pub struct TracedLaunch {
    pub name: String,
    /// Blocks that wrote a record, of the launch's grid.
    pub blocks: usize,
    pub first_start: i64,
    pub ready: i64,
    /// The time the step spent on this launch (and on the untraced launches after it, `merged`):
    /// the next traced launch's `ready` less this one's; `None` for the last.
    pub held: Option<i64>,
    pub merged: usize,
}

/// A step's launches and how well the records matched the log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub launches: Vec<TracedLaunch>,
    /// Logged launches that matched no records.
    pub untraced: usize,
    /// Grids left over after the log was matched (a log that is not this step's).
    pub unmatched_grids: usize,
    /// The smallest step between distinct timer values seen (the timer's resolution, ns).
    pub timer_step_ns: u64,
}

/// Per kernel name: launches, time held (µs) and mean lead (µs), largest first.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelHeld {
    pub name: String,
    pub launches: usize,
    pub held_us: f64,
    pub lead_us: f64,
}

/// Joins a step's records to its launch log (see the module docs). Grids are ordered by their
/// earliest start, ties by grid id (a launch number).
pub fn timeline(log: &[LoggedLaunch], records: &[TraceRecord]) -> Timeline {
    // Records by grid id, each grid with its earliest start and ready and its shape.
    let mut sorted: Vec<&TraceRecord> = records.iter().filter(|r| r.ready != 0).collect();
    sorted.sort_by_key(|r| (r.grid, r.start));
    struct Grid {
        grid: u64,
        shape: (u32, u32),
        blocks: usize,
        first_start: u64,
        ready: u64,
    }
    let mut grids: Vec<Grid> = Vec::new();
    let mut last_grid = None;
    for r in &sorted {
        if last_grid != Some(r.grid) {
            grids.push(Grid {
                grid: r.grid,
                shape: (r.grid_blocks, r.block_threads),
                blocks: 0,
                first_start: r.start,
                ready: r.ready,
            });
            last_grid = Some(r.grid);
        }
        let g = grids.last_mut().expect("pushed above");
        g.blocks += 1;
        g.first_start = g.first_start.min(r.start);
        g.ready = g.ready.min(r.ready);
    }
    grids.sort_by_key(|g| (g.first_start, g.grid));
    let mut times: Vec<u64> = records.iter().filter(|r| r.ready != 0).flat_map(|r| [r.start, r.ready]).collect();
    times.sort_unstable();
    times.dedup();
    let timer_step_ns = times.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(0);

    let mut t = Timeline { timer_step_ns, ..Timeline::default() };
    let origin = grids.first().map_or(0, |g| g.ready.min(g.first_start)) as i64;
    let mut next = 0;
    for (i, l) in log.iter().enumerate() {
        // Two launches whose blocks became resident together (a one-block copy and the matvec
        // launched after it, as the matvec before them retired) may read the timer in either
        // order: where the next grid is the next launch's and the one after it this one's, they
        // are taken as swapped.
        let swapped = grids.get(next).map(|g| Some(g.shape)) == log.get(i + 1).map(|n| n.shape)
            && grids.get(next + 1).is_some_and(|g| Some(g.shape) == l.shape)
            && grids.get(next).is_some_and(|g| Some(g.shape) != l.shape);
        if swapped {
            grids.swap(next, next + 1);
        }
        match grids.get(next) {
            Some(g) if l.shape == Some(g.shape) => {
                t.launches.push(TracedLaunch {
                    name: l.name.clone(),
                    blocks: g.blocks,
                    first_start: g.first_start as i64 - origin,
                    ready: g.ready as i64 - origin,
                    held: None,
                    merged: 0,
                });
                next += 1;
            }
            _ => {
                t.untraced += 1;
                if let Some(prev) = t.launches.last_mut() {
                    prev.merged += 1;
                }
            }
        }
    }
    t.unmatched_grids = grids.len() - next;
    for i in 1..t.launches.len() {
        let d = t.launches[i].ready - t.launches[i - 1].ready;
        t.launches[i - 1].held = Some(d);
    }
    t
}

impl Timeline {
    /// The time held per kernel name (the last launch, whose end no record shows, left out).
    pub fn by_kernel(&self) -> Vec<KernelHeld> {
        let mut out: Vec<KernelHeld> = Vec::new();
        for l in &self.launches {
            let Some(held) = l.held else { continue };
            let lead = (l.ready - l.first_start) as f64 / 1e3;
            match out.iter_mut().find(|k| k.name == l.name) {
                Some(k) => {
                    k.launches += 1;
                    k.held_us += held as f64 / 1e3;
                    k.lead_us += lead;
                }
                None => out.push(KernelHeld {
                    name: l.name.clone(),
                    launches: 1,
                    held_us: held as f64 / 1e3,
                    lead_us: lead,
                }),
            }
        }
        for k in &mut out {
            k.lead_us /= k.launches as f64;
        }
        out.sort_by(|a, b| b.held_us.total_cmp(&a.held_us));
        out
    }

    /// From the first launch's `ready` to the last's, µs.
    pub fn span_us(&self) -> f64 {
        match (self.launches.first(), self.launches.last()) {
            (Some(a), Some(b)) => (b.ready - a.ready) as f64 / 1e3,
            _ => 0.0,
        }
    }
}

/// The device side of a trace: the ring, its slot counter, and the launch log.
#[derive(Default)]
pub(crate) struct TraceState {
    log: Vec<LoggedLaunch>,
    ring: Option<(CudaSlice<TraceRecord>, CudaSlice<u32>)>,
}

// SAFETY: TraceRecord is plain old data of integers (repr(C), no padding: 3 × 8 + 4 × 4 + 8).
unsafe impl cudarc::driver::DeviceRepr for TraceRecord {}
// SAFETY: all-zero bytes are a valid TraceRecord.
unsafe impl cudarc::driver::ValidAsZeroBits for TraceRecord {}

impl Gpu {
    /// Whether the loaded kernels are the trace build (every module has the ring's pointer).
    pub fn trace_build(&self) -> bool {
        self.modules.iter().all(|m| m.get_global("dspark_trace_ring", &self.stream).is_ok())
    }

    /// Starts (clearing) or stops the log of launches; returns what was logged.
    pub fn trace_log(&self, on: bool) -> CudaResult<Vec<LoggedLaunch>> {
        let mut st = self.trace.lock().map_err(|_| CudaError::Shape("trace state poisoned".into()))?;
        self.trace_logging.store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(std::mem::take(&mut st.log))
    }

    /// Logs one launch while [`Gpu::trace_log`] is on (the launch paths call it).
    pub(crate) fn log_launch(&self, name: &str, shape: Option<(u32, u32)>) {
        if !self.trace_logging.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if let Ok(mut st) = self.trace.lock() {
            st.log.push(LoggedLaunch { name: name.to_string(), shape });
        }
    }

    /// Points every module's hooks at a zeroed ring of `capacity` records (`capacity` 0: off).
    pub fn trace_arm(&self, capacity: usize) -> CudaResult<()> {
        if !self.trace_build() {
            return Err(CudaError::Unavailable(
                "the loaded kernels are not the trace build: run `cargo xtask ptx --trace` and set DSPARK_PTX_DIR=target/ptx-trace".into(),
            ));
        }
        let mut st = self.trace.lock().map_err(|_| CudaError::Shape("trace state poisoned".into()))?;
        let (ring_addr, count_addr) = if capacity == 0 {
            st.ring = None;
            (0u64, 0u64)
        } else {
            let ring = self.stream.alloc_zeros::<TraceRecord>(capacity)?;
            let count = self.stream.alloc_zeros::<u32>(1)?;
            let addrs = (super::pdl::device_addr(self, &ring), super::pdl::device_addr(self, &count));
            st.ring = Some((ring, count));
            addrs
        };
        let cap = u32::try_from(capacity).map_err(|_| CudaError::Shape(format!("trace capacity {capacity}")))?;
        for m in &self.modules {
            for (name, bytes) in [
                ("dspark_trace_ring", ring_addr.to_le_bytes().to_vec()),
                ("dspark_trace_count", count_addr.to_le_bytes().to_vec()),
                ("dspark_trace_capacity", cap.to_le_bytes().to_vec()),
            ] {
                let mut g = m.get_global(name, &self.stream)?;
                if g.len() != bytes.len() {
                    return Err(CudaError::Shape(format!(
                        "{name}: {} bytes on the device, {} expected",
                        g.len(),
                        bytes.len()
                    )));
                }
                self.stream.memcpy_htod(&bytes, &mut g)?;
            }
        }
        self.stream.synchronize()?;
        Ok(())
    }

    /// The records written since [`Gpu::trace_arm`] (synchronises), and how many blocks asked for
    /// a slot (more than the records when the ring was too small).
    pub fn trace_read(&self) -> CudaResult<(Vec<TraceRecord>, usize)> {
        let st = self.trace.lock().map_err(|_| CudaError::Shape("trace state poisoned".into()))?;
        let Some((ring, count)) = &st.ring else {
            return Err(CudaError::Shape("trace_read: the ring is not armed".into()));
        };
        let asked = self.stream.clone_dtoh(count)?[0] as usize;
        let mut records = self.stream.clone_dtoh(ring)?;
        records.truncate(asked);
        Ok((records, asked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(grid: u64, start: u64, ready: u64, shape: (u32, u32), block: u32) -> TraceRecord {
        TraceRecord { grid, start, ready, grid_blocks: shape.0, block_threads: shape.1, block, sm: block, reserved: 0 }
    }
    fn logged(name: &str, shape: Option<(u32, u32)>) -> LoggedLaunch {
        LoggedLaunch { name: name.into(), shape }
    }

    /// Three launches, the middle one cuBLAS (no records), the grids' records shuffled and the
    /// grid ids not in launch order: each traced launch holds the step until the next one's
    /// earliest ready, the untraced one counted with the launch before it.
    #[test]
    fn launches_hold_the_step_until_the_next_ready() {
        let (a, b) = ((132, 256), (64, 128));
        let records = vec![
            rec(9, 3_000, 9_000, b, 1),
            rec(7, 1_000, 2_000, a, 0),
            rec(9, 2_500, 8_000, b, 0),
            rec(7, 1_200, 2_100, a, 1),
            rec(5, 9_500, 20_000, a, 0),
            TraceRecord::default(), // a slot taken but never written
        ];
        let log = vec![logged("qkv", Some(a)), logged("gemm", None), logged("attn", Some(b)), logged("o", Some(a))];
        let t = timeline(&log, &records);
        assert_eq!((t.untraced, t.unmatched_grids), (1, 0));
        let names: Vec<&str> = t.launches.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["qkv", "attn", "o"]);
        assert_eq!(t.launches[0].ready, 1_000); // origin = min(first start, ready) of the first grid
        assert_eq!(t.launches[0].held, Some(6_000));
        assert_eq!(t.launches[0].merged, 1);
        assert_eq!(t.launches[1].held, Some(12_000));
        assert_eq!(t.launches[1].ready - t.launches[1].first_start, 5_500);
        assert_eq!(t.launches[2].held, None);
        assert_eq!(t.span_us(), 18.0);
        let k = t.by_kernel();
        assert_eq!((k[0].name.as_str(), k[0].held_us, k[0].lead_us), ("attn", 12.0, 5.5));
        assert_eq!(t.timer_step_ns, 100);
    }

    /// A one-block launch and the launch after it, resident at the same moment, whose first
    /// stamps came out in the other order: matched as launched.
    #[test]
    fn launches_resident_together_are_matched_in_launch_order() {
        let (copy, mv, attn) = ((1, 256), (384, 256), (528, 128));
        let records = vec![
            rec(3, 100, 150, mv, 0),
            rec(4, 101, 160, copy, 0), // the copy's stamp 1 ns after the matvec's
            rec(5, 200, 260, attn, 0),
        ];
        let log = vec![logged("copy", Some(copy)), logged("qkv", Some(mv)), logged("attn", Some(attn))];
        let t = timeline(&log, &records);
        assert_eq!((t.untraced, t.unmatched_grids), (0, 0));
        let names: Vec<&str> = t.launches.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["copy", "qkv", "attn"]);
        assert_eq!(t.launches[1].held, Some(110));
    }

    /// A log that is not the step's leaves grids unmatched and launches untraced, which the
    /// report shows instead of a wrong table.
    #[test]
    fn a_foreign_log_is_visible() {
        let records = vec![rec(1, 0, 10, (4, 32), 0), rec(2, 20, 30, (8, 32), 0)];
        let t = timeline(&[logged("x", Some((16, 32)))], &records);
        assert_eq!((t.launches.len(), t.untraced, t.unmatched_grids), (0, 1, 2));
    }
}
