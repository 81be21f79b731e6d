//! The load progress bar: bytes of a checkpoint on their way to the GPU, drawn on stderr when
//! stderr is a terminal (indicatif) and nothing otherwise, so piped and JSON runs stay silent.
//!
//! ```ignore
//! let up = CheckpointUpload::new(&ck, &gpu.ctx, 0)?.with_progress(progress::load_bar(), "target");
//! ```

use dspark_model::cuda::upload::LoadProgress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};

/// A progress sink for `CheckpointUpload::with_progress`: a bar per load (per label) on stderr
/// when stderr is a terminal, else `None`.
pub fn load_bar() -> Option<Arc<dyn LoadProgress>> {
    if std::io::stderr().is_terminal() {
        Some(Arc::new(Bars::new(ProgressDrawTarget::stderr)))
    } else {
        None
    }
}

/// The bar of the load under way, replaced when a load of another label starts.
struct Bars {
    target: fn() -> ProgressDrawTarget,
    current: Mutex<Option<(String, ProgressBar)>>,
}

impl Bars {
    fn new(target: fn() -> ProgressDrawTarget) -> Bars {
        Bars { target, current: Mutex::new(None) }
    }

    fn bar(&self, label: &str, total: u64) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(Some(total), (self.target)());
        let style = ProgressStyle::with_template(
            "{prefix:>7} [{bar:32}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {elapsed}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(label.to_string());
        bar
    }
}

impl LoadProgress for Bars {
    fn update(&self, label: &str, done: u64, total: u64) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_none_or(|(l, _)| l != label) {
            if let Some((_, old)) = current.take() {
                old.finish();
            }
            *current = Some((label.to_string(), self.bar(label, total)));
        }
        if let Some((_, bar)) = current.as_ref() {
            bar.set_length(total);
            bar.set_position(done.min(total));
            if done >= total {
                bar.finish();
                *current = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_follow_loads_and_finish() {
        let bars = Bars::new(ProgressDrawTarget::hidden);
        bars.update("target", 0, 100);
        bars.update("target", 40, 100);
        {
            let cur = bars.current.lock().unwrap();
            let (label, bar) = cur.as_ref().unwrap();
            assert_eq!((label.as_str(), bar.position(), bar.length()), ("target", 40, Some(100)));
        }
        // A new load replaces an unfinished one; a finished one leaves no bar.
        bars.update("draft", 0, 10);
        assert_eq!(bars.current.lock().unwrap().as_ref().unwrap().0, "draft");
        bars.update("draft", 10, 10);
        assert!(bars.current.lock().unwrap().is_none());
        bars.update("empty", 0, 0);
        assert!(bars.current.lock().unwrap().is_none());
    }
}
