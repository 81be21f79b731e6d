//! GPU tier, loading: [`CheckpointUpload`] (pinned staging, parallel reads, overlapped copies)
//! against the plain per-tensor path of `impl WeightSource for Checkpoint`.
//!
//! * every matrix, vector, stacked q|k|v and interleaved gate|up of every fixture target and a
//!   draft: the same dtype and the same bytes on the device, and the same arena counts, under
//!   the default staging and under rings of a few KiB that split every tensor into many
//!   chunks and pieces;
//! * tensors of tens of MiB in bf16, f16 and f32 (several chunks, every reader thread);
//! * whole models loaded both ways: bit-identical logits, identical draft proposals;
//! * a checkpoint that does not fit the free memory fails before any allocation, naming the
//!   bytes needed and free; progress is reported from 0 to the total.
//!
//! `load_speed_qwen3_8b_shapes` (ignored; run by name) writes a Qwen3-8B-shaped bf16
//! checkpoint (16.4 GB of random bytes) to `DSPARK_LOAD_BENCH_DIR` if it holds none and times
//! loading it from the page cache.
//!
//! Compiled only with `--features gpu-tests`.
#![cfg(feature = "gpu-tests")]

use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::Gpu;
use dspark_kernels::KvDtype;
use dspark_model::checkpoint::draft_config::DraftConfig;
use dspark_model::checkpoint::safetensors::{serialize, Checkpoint};
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::cuda::upload::{LoadProgress, UploadOptions};
use dspark_model::cuda::weights::{CheckpointUpload, WeightSource};
use dspark_model::testing::Rng;
use dspark_model::{Drafter, LogitRows, Qwen3Config, TargetModel};
use dspark_tensor::arena::Arena;
use dspark_tensor::DType;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// The repository root (`DSPARK_ROOT` on the bundle's machine).
fn root() -> PathBuf {
    dspark_model::testing::repo_root()
}

fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| Arc::new(Gpu::new(0).expect("the GPU tier needs a CUDA device"))).clone()
}

/// A device buffer's dtype and bytes.
fn download(gpu: &Gpu, w: &WeightBuf) -> (&'static str, Vec<u8>) {
    match w {
        WeightBuf::F32(s) => ("f32", gpu.stream.clone_dtoh(s).unwrap().iter().flat_map(|x| x.to_le_bytes()).collect()),
        WeightBuf::Bf16(s) => {
            ("bf16", gpu.stream.clone_dtoh(s).unwrap().iter().flat_map(|x| x.to_le_bytes()).collect())
        }
        WeightBuf::F16(s) => ("f16", gpu.stream.clone_dtoh(s).unwrap().iter().flat_map(|x| x.to_le_bytes()).collect()),
        // The bytes, then the scale table and the row map.
        WeightBuf::Fp8(f) => {
            let mut b = gpu.stream.clone_dtoh(&f.q).unwrap();
            b.extend(gpu.stream.clone_dtoh(&f.scale).unwrap().iter().flat_map(|x| x.to_le_bytes()));
            b.extend(gpu.stream.clone_dtoh(&f.srow).unwrap().iter().flat_map(|x| x.to_le_bytes()));
            ("fp8", b)
        }
    }
}

/// The FP8 fixture's projections (q|k|v stacked, o, gate|up interleaved, down) through the
/// plain path and through staging rings of every size: the same bytes, scales and row maps; and
/// the whole target loaded both ways gives the same logits bit for bit.
#[test]
fn fp8_projections_upload_bit_for_bit() {
    use dspark_model::cuda::fp8::RowOrder;
    let dir = root().join("fixtures/qwen3-tiny-fp8");
    let ck = Checkpoint::open_dir(&dir).unwrap();
    let cfg = Qwen3Config::from_dir(&dir).unwrap();
    let quant = cfg.quantization.clone().expect("the FP8 fixture has a quantization_config");
    let gpu = gpu();
    let (h, i, q, kv) = (cfg.hidden_size, cfg.intermediate_size, cfg.q_dim(), cfg.kv_dim());
    for opts in [None, Some(tiny_rings()[0]), Some(tiny_rings()[1])] {
        let (plain_arena, fast_arena) = (Arena::new(gpu.stream.clone()), Arena::new(gpu.stream.clone()));
        let fast = CheckpointUpload::with_options(&ck, &gpu.ctx, opts).unwrap();
        for l in 0..cfg.num_hidden_layers {
            let m = |s: &str| format!("model.layers.{l}.{s}");
            let (qn, kn, vn, on) =
                (m("self_attn.q_proj"), m("self_attn.k_proj"), m("self_attn.v_proj"), m("self_attn.o_proj"));
            let (gn, un, dn) = (m("mlp.gate_proj"), m("mlp.up_proj"), m("mlp.down_proj"));
            type Projection<'a> = (Vec<(&'a str, [usize; 2])>, RowOrder);
            let projections: [Projection; 4] = [
                (vec![(&qn, [q, h]), (&kn, [kv, h]), (&vn, [kv, h])], RowOrder::Stacked),
                (vec![(&on, [h, q])], RowOrder::Stacked),
                (vec![(&gn, [i, h]), (&un, [i, h])], RowOrder::Interleaved),
                (vec![(&dn, [h, i])], RowOrder::Stacked),
            ];
            for (modules, order) in projections {
                let a = ck.fp8_linears(&plain_arena, &quant, &modules, order).unwrap();
                let b = fast.fp8_linears(&fast_arena, &quant, &modules, order).unwrap();
                assert!(matches!(a, WeightBuf::Fp8(_)), "{}: not loaded as FP8", modules[0].0);
                let (da, ba) = download(&gpu, &a);
                let (db, bb) = download(&gpu, &b);
                assert_eq!((da, ba.len()), (db, bb.len()), "{}: {opts:?}", modules[0].0);
                assert!(ba == bb, "{}: bytes differ ({opts:?})", modules[0].0);
            }
        }
        fast.finish().unwrap();
    }
    let mut plain = CudaQwen3::from_source_kv(gpu.clone(), cfg.clone(), &ck, 256, KvDtype::F32).unwrap();
    let up = CheckpointUpload::with_options(&ck, &gpu.ctx, Some(tiny_rings()[1])).unwrap();
    let mut fast = CudaQwen3::from_source_kv(gpu.clone(), cfg, &up, 256, KvDtype::F32).unwrap();
    drop(up);
    let p = prompt(plain.config().vocab_size);
    let a = plain.forward(&p, LogitRows::All).unwrap();
    let b = fast.forward(&p, LogitRows::All).unwrap();
    assert!(a.logits.iter().map(|x| x.to_bits()).eq(b.logits.iter().map(|x| x.to_bits())), "fp8: logits");
}

/// Rings small enough that every tensor is many chunks, each split among threads.
fn tiny_rings() -> [UploadOptions; 2] {
    [
        UploadOptions { chunk: 4096, staging: 3 * 4096, threads: 4, min_piece: 256 },
        UploadOptions { chunk: 1000, staging: 2500, threads: 3, min_piece: 100 },
    ]
}

/// Loads every tensor of `ck` both ways — 2-D as matrices, 1-D as vectors, and each layer's
/// q|k|v stacked and gate|up interleaved — and compares dtypes, bytes and arena counts.
fn compare_all(ck: &Checkpoint, what: &str, opts: Option<UploadOptions>) {
    let gpu = gpu();
    let (plain_arena, fast_arena) = (Arena::new(gpu.stream.clone()), Arena::new(gpu.stream.clone()));
    let fast = match opts {
        Some(o) => CheckpointUpload::with_options(ck, &gpu.ctx, Some(o)).unwrap(),
        None => CheckpointUpload::new(ck, &gpu.ctx, 0).unwrap(),
    };
    let check = |name: &str, a: WeightBuf, b: WeightBuf| {
        let (da, ba) = download(&gpu, &a);
        let (db, bb) = download(&gpu, &b);
        assert_eq!(db, da, "{what}: {name}: dtype");
        assert!(ba == bb, "{what}: {name}: bytes differ ({opts:?})");
    };
    let mut matrices = 0;
    for (name, t) in &ck.tensors {
        if t.dtype.is_none() {
            continue;
        }
        if t.shape.len() >= 2 {
            let a = ck.matrix(&plain_arena, name, &t.shape).unwrap();
            let b = fast.matrix(&fast_arena, name, &t.shape).unwrap();
            check(name, a, b);
            matrices += 1;
        } else {
            let a = gpu.stream.clone_dtoh(&ck.vector(&plain_arena, name, &t.shape).unwrap()).unwrap();
            let b = gpu.stream.clone_dtoh(&fast.vector(&fast_arena, name, &t.shape).unwrap()).unwrap();
            assert!(a.iter().map(|x| x.to_bits()).eq(b.iter().map(|x| x.to_bits())), "{what}: {name}: vector");
        }
        if let Some(prefix) = name.strip_suffix("self_attn.q_proj.weight") {
            let shape = |s: &str| ck.tensors[&format!("{prefix}{s}")].shape.clone();
            let names = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"]
                .map(|s| (format!("{prefix}{s}"), shape(s)));
            let parts: Vec<(&str, &[usize])> = names.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
            let a = ck.stacked(&plain_arena, &parts).unwrap();
            let b = fast.stacked(&fast_arena, &parts).unwrap();
            check(&format!("{prefix}q|k|v"), a, b);
            let (g, u) = (format!("{prefix}mlp.gate_proj.weight"), format!("{prefix}mlp.up_proj.weight"));
            let s = shape("mlp.gate_proj.weight");
            let a = ck.interleaved(&plain_arena, &g, &u, &s).unwrap();
            let b = fast.interleaved(&fast_arena, &g, &u, &s).unwrap();
            check(&format!("{prefix}gate|up"), a, b);
        }
    }
    assert!(matrices > 0, "{what}: no matrices");
    assert_eq!(fast_arena.allocations(), plain_arena.allocations(), "{what}: allocations");
    assert_eq!(fast_arena.bytes(), plain_arena.bytes(), "{what}: bytes");
    fast.finish().unwrap();
}

#[test]
fn fixture_uploads_match_the_plain_path_bit_for_bit() {
    let dirs = ["qwen3-tiny-f32", "qwen3-tiny-bf16", "qwen3-tiny-sharded", "qwen3-tiny-tied", "dspark-tiny-gated"];
    for name in dirs {
        let ck = Checkpoint::open_dir(&root().join("fixtures").join(name)).unwrap();
        compare_all(&ck, name, None);
        for o in tiny_rings() {
            compare_all(&ck, name, Some(o));
        }
    }
}

/// Random bytes that are finite numbers of `dtype` (the plain path widens f32 through `f32`
/// values, which keeps every bit anyway; finite values keep the comparison about layout).
fn tensor(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    match dtype {
        DType::F32 => (0..n).flat_map(|_| (rng.f32() - 0.5).to_le_bytes()).collect(),
        DType::BF16 | DType::F16 => (0..n).flat_map(|_| ((rng.next_u64() as u16) & 0x3bff).to_le_bytes()).collect(),
    }
}

#[test]
fn large_tensors_match_in_every_dtype() {
    let mut rng = Rng(17);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let (h, q, kv, i) = (2048, 2048, 512, 3072 + 8);
        let shapes: [(&str, Vec<usize>); 6] = [
            ("l.self_attn.q_proj.weight", vec![q, h]),
            ("l.self_attn.k_proj.weight", vec![kv, h]),
            ("l.self_attn.v_proj.weight", vec![kv, h]),
            ("l.mlp.gate_proj.weight", vec![i, h]),
            ("l.mlp.up_proj.weight", vec![i, h]),
            ("l.mlp.down_proj.weight", vec![h, i]),
        ];
        let tensors: Vec<(&str, DType, Vec<usize>, Vec<u8>)> =
            shapes.iter().map(|(n, s)| (*n, dtype, s.clone(), tensor(&mut rng, dtype, s.iter().product()))).collect();
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("model.safetensors"), serialize(&tensors)).unwrap();
        let ck = Checkpoint::open_dir(d.path()).unwrap();
        compare_all(&ck, &format!("{dtype:?}"), None);
        compare_all(
            &ck,
            &format!("{dtype:?}, 8 threads, 3 MiB chunks"),
            Some(UploadOptions { chunk: 3 << 20, staging: 10 << 20, threads: 8, min_piece: 64 << 10 }),
        );
    }
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..23).map(|i| ((i * 37 + 5) % vocab) as u32).collect()
}

#[test]
fn models_loaded_through_staging_run_bit_identically() {
    for name in ["qwen3-tiny-f32", "qwen3-tiny-bf16", "qwen3-tiny-tied"] {
        let dir = root().join("fixtures").join(name);
        let mut plain = CudaQwen3::load(gpu(), &dir, 256).unwrap();
        let ck = Checkpoint::open_dir(&dir).unwrap();
        let up = CheckpointUpload::new(&ck, &gpu().ctx, 0).unwrap();
        let mut fast =
            CudaQwen3::from_source_kv(gpu(), Qwen3Config::from_dir(&dir).unwrap(), &up, 256, KvDtype::F32).unwrap();
        drop(up);
        assert_eq!(fast.arena.allocations(), plain.arena.allocations(), "{name}: allocations");
        let p = prompt(plain.config().vocab_size);
        let a = plain.forward(&p, LogitRows::All).unwrap();
        let b = fast.forward(&p, LogitRows::All).unwrap();
        assert!(a.logits.iter().map(|x| x.to_bits()).eq(b.logits.iter().map(|x| x.to_bits())), "{name}: logits");
    }
    // A draft: its k|v rows are copied on the device right after its layers load, so this also
    // checks that the queued uploads are ordered before that copy.
    let tdir = root().join("fixtures/qwen3-tiny-f32");
    let target = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
    for name in ["dspark-tiny-gated", "dspark-tiny-rnn", "dflash-tiny"] {
        let ddir = root().join("fixtures").join(name);
        let mut plain = CudaDraft::load(&ddir, &target).unwrap();
        let ck = Checkpoint::open_dir(&ddir).unwrap();
        let up = CheckpointUpload::with_options(&ck, &gpu().ctx, Some(tiny_rings()[1])).unwrap();
        let mut fast = CudaDraft::from_source(DraftConfig::from_dir(&ddir).unwrap(), &up, &target).unwrap();
        drop(up);
        let row = plain.config().num_taps() * target.config().hidden_size;
        let mut rng = Rng(3);
        for round in 0..3 {
            let feats = rng.normal_vec([9, 1, 4][round] * row, 1.0);
            plain.append_context(&feats).unwrap();
            fast.append_context(&feats).unwrap();
            let anchor = rng.below(target.config().vocab_size) as u32;
            let (a, b) = (plain.propose(anchor).unwrap(), fast.propose(anchor).unwrap());
            assert_eq!(b.tokens, a.tokens, "{name} round {round}");
        }
    }
}

#[derive(Default)]
struct Record(Mutex<Vec<(String, u64, u64)>>);

impl LoadProgress for Record {
    fn update(&self, label: &str, done: u64, total: u64) {
        self.0.lock().unwrap().push((label.to_string(), done, total));
    }
}

#[test]
fn too_large_fails_before_allocating_and_progress_runs_to_the_total() {
    let dir = root().join("fixtures/qwen3-tiny-bf16");
    let ck = Checkpoint::open_dir(&dir).unwrap();
    let (free, _) = gpu().ctx.mem_get_info().unwrap();
    let e = CheckpointUpload::new(&ck, &gpu().ctx, free).err().expect("does not fit").to_string();
    assert!(e.contains(&format!("checkpoint {}", dir.display())) && e.contains("needs") && e.contains("free"), "{e}");

    let rec = Arc::new(Record::default());
    let up = CheckpointUpload::new(&ck, &gpu().ctx, 0).unwrap().with_progress(Some(rec.clone()), "target");
    let total = up.weight_bytes() as u64;
    let t = CudaQwen3::from_source(gpu(), Qwen3Config::from_dir(&dir).unwrap(), &up, 64).unwrap();
    up.finish().unwrap();
    drop(t);
    let log = rec.0.lock().unwrap();
    assert_eq!(log.first().unwrap(), &("target".to_string(), 0, total));
    assert_eq!(log.last().unwrap(), &("target".to_string(), total, total));
    assert!(log.windows(2).all(|w| w[0].1 <= w[1].1 && w[1].1 <= w[1].2), "not monotone: {log:?}");
    assert!(log.len() > 3, "{log:?}");
}

/// Writes a Qwen3-8B-shaped bf16 checkpoint of random bytes (finite values) to `dir`.
fn write_8b(dir: &Path) {
    let cfg = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 40960, "tie_word_embeddings": false,
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let (v, h, i, q, kv, hd) = (151936usize, 4096usize, 12288usize, 4096usize, 1024usize, 128usize);
    let mut t: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![v, h])];
    for l in 0..36 {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("input_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("self_attn.q_norm.weight", vec![hd]),
            ("self_attn.k_norm.weight", vec![hd]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ] {
            t.push((format!("{p}{n}"), s));
        }
    }
    t.push(("model.norm.weight".into(), vec![h]));
    t.push(("lm_head.weight".into(), vec![v, h]));
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (n, s) in &t {
        let len = 2 * s.iter().product::<usize>();
        header.insert(n.clone(), serde_json::json!({"dtype": "BF16", "shape": s, "data_offsets": [off, off + len]}));
        off += len;
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f =
        std::io::BufWriter::with_capacity(64 << 20, std::fs::File::create(dir.join("model.safetensors")).unwrap());
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    let mut buf = vec![0u8; 64 << 20];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut left = off;
    while left > 0 {
        for c in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&(x & 0x3bff_3bff_3bff_3bff).to_le_bytes());
        }
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    f.flush().unwrap();
}

/// Loads `dir` through `up`'s options (or the plain path) and returns the seconds it took.
fn time_load(dir: &Path, opts: Option<Option<UploadOptions>>) -> f64 {
    let gpu = gpu();
    gpu.stream.synchronize().unwrap();
    let start = Instant::now();
    let cfg = Qwen3Config::from_dir(dir).unwrap();
    let ck = Checkpoint::open_dir(dir).unwrap();
    let t = match opts {
        Some(o) => {
            let up = match o {
                Some(o) => CheckpointUpload::with_options(&ck, &gpu.ctx, Some(o)).unwrap(),
                None => CheckpointUpload::new(&ck, &gpu.ctx, 0).unwrap(),
            };
            let t = CudaQwen3::from_source_kv(gpu.clone(), cfg, &up, 4096, KvDtype::F32).unwrap();
            up.finish().unwrap();
            t
        }
        None => CudaQwen3::from_source_kv(gpu.clone(), cfg, &ck, 4096, KvDtype::F32).unwrap(),
    };
    gpu.stream.synchronize().unwrap();
    let s = start.elapsed().as_secs_f64();
    drop(t);
    s
}

#[test]
#[ignore = "writes a 16.4 GB checkpoint to DSPARK_LOAD_BENCH_DIR; run by name on the GPU machine"]
fn load_speed_qwen3_8b_shapes() {
    let dir = PathBuf::from(std::env::var("DSPARK_LOAD_BENCH_DIR").expect("DSPARK_LOAD_BENCH_DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    if !dir.join("model.safetensors").exists() {
        let start = Instant::now();
        write_8b(&dir);
        eprintln!("wrote the checkpoint in {:.1} s", start.elapsed().as_secs_f64());
    }
    let bytes = std::fs::metadata(dir.join("model.safetensors")).unwrap().len() as f64;
    // Pull the file into the page cache (the condition the target is stated for).
    let start = Instant::now();
    let mut f = std::fs::File::open(dir.join("model.safetensors")).unwrap();
    std::io::copy(&mut f, &mut std::io::sink()).unwrap();
    eprintln!("read through once: {:.2} s", start.elapsed().as_secs_f64());
    let report = |what: &str, s: f64| eprintln!("{what}: {s:.2} s, {:.1} GB/s", bytes / s / 1e9);
    report("staged (defaults)", time_load(&dir, Some(None)));
    report("staged (defaults, again)", time_load(&dir, Some(None)));
    let base = UploadOptions::from_env(bytes as usize);
    let threads = std::env::var("DSPARK_LOAD_BENCH_THREADS").unwrap_or_else(|_| "1,4,8,16".into());
    for n in threads.split(',').filter_map(|n| n.trim().parse().ok()) {
        report(&format!("staged, {n} threads"), time_load(&dir, Some(Some(UploadOptions { threads: n, ..base }))));
    }
    if std::env::var("DSPARK_LOAD_BENCH_PLAIN").is_ok_and(|v| v == "1") {
        report("plain", time_load(&dir, None));
    }
}
