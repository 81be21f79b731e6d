//! Whether a checkpoint fits the GPU: the bytes its tensors take on the device, and the check
//! of those plus what a load plans beside them against the driver's free memory, before
//! anything is allocated — an error naming the checkpoint and the levers that plan less, never
//! an out-of-memory halfway through a load.

use crate::checkpoint::safetensors::Checkpoint;
use crate::cuda::layers::drv;
use crate::error::{Error, Result};
use cudarc::driver::CudaContext;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes a checkpoint's tensors take on the device: matrices in their stored dtype, tensors
/// of one dimension (norms, biases) widened to f32 as the CUDA backends keep them.
pub fn device_bytes(ck: &Checkpoint) -> usize {
    device_bytes_without(ck, &[])
}

/// [`device_bytes`] of every tensor but those named in `skip` (a draft's copies of the target's
/// matrices that it will not upload).
pub fn device_bytes_without(ck: &Checkpoint, skip: &[&str]) -> usize {
    ck.tensors
        .iter()
        .filter(|(name, _)| !skip.contains(&name.as_str()))
        .map(|(_, t)| t)
        .map(|t| match t.dtype {
            Some(_) if t.shape.len() <= 1 => 4 * t.numel(),
            _ => t.end - t.start,
        })
        .sum()
}

/// The folder a checkpoint was opened from, for messages.
pub fn checkpoint_dir(ck: &Checkpoint) -> PathBuf {
    let file = ck.describe();
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => file,
    }
}

/// Whether `weights + reserve` bytes fit in `free`, else the error naming the checkpoint `dir`.
pub fn fits(dir: &Path, weights: usize, reserve: usize, free: usize) -> Result<()> {
    let need = weights.saturating_add(reserve);
    if need <= free {
        return Ok(());
    }
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    let what = if reserve == 0 {
        "weights".to_string()
    } else {
        format!("{weights} for the weights + {reserve} for the KV cache and buffers")
    };
    // A target's load (it plans caches and buffers) can ask for less; say how.
    let hint = if reserve == 0 {
        ""
    } else {
        "; to plan less: --max-context N, --kv-cache bf16, --embeddings host, --prefill-chunk ROWS"
    };
    Err(Error::Request(format!(
        "checkpoint {} needs {need} bytes ({:.2} GiB) of GPU memory ({what}), the GPU has {free} ({:.2} GiB) free{hint}",
        dir.display(),
        gib(need),
        gib(free)
    )))
}

/// [`fits`] against the driver's free memory of `ctx`'s device.
pub fn check_fits(ctx: &Arc<CudaContext>, dir: &Path, weights: usize, reserve: usize) -> Result<()> {
    let (free, _total) = ctx.mem_get_info().map_err(drv)?;
    fits(dir, weights, reserve, free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_check_names_the_bytes_needed_and_free() {
        assert!(fits(Path::new("m"), 10, 5, 15).is_ok());
        let e = fits(Path::new("/models/Qwen3-8B"), 16_400_000_000, 0, 8_000_000_000).unwrap_err().to_string();
        assert!(
            e.contains("checkpoint /models/Qwen3-8B needs 16400000000 bytes")
                && e.contains("(weights)")
                && e.contains("8000000000 (7.45 GiB) free"),
            "{e}"
        );
        let e = fits(Path::new("d"), 100, 50, 120).unwrap_err().to_string();
        assert!(e.contains("needs 150 bytes") && e.contains("100 for the weights + 50 for the KV cache"), "{e}");
        assert!(e.contains("--embeddings host, --prefill-chunk ROWS"), "a target's load names the levers: {e}");
    }

    #[test]
    fn device_bytes_count_matrices_as_stored_and_vectors_as_f32() {
        use crate::checkpoint::safetensors::serialize;
        use dspark_tensor::DType;
        let d = tempfile::tempdir().unwrap();
        let bytes = serialize(&[
            ("w", DType::BF16, vec![3, 4], vec![0; 24]),
            ("x", DType::F32, vec![2, 2], vec![0; 16]),
            ("norm", DType::BF16, vec![5], vec![0; 10]),
        ]);
        std::fs::write(d.path().join("model.safetensors"), bytes).unwrap();
        let ck = Checkpoint::open_dir(d.path()).unwrap();
        assert_eq!(device_bytes(&ck), 24 + 16 + 4 * 5);
        assert_eq!(checkpoint_dir(&ck), d.path());
    }
}
