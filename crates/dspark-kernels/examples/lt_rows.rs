//! Probe (branch only): do cuBLASLt's algorithms give each output row the same bits at every M,
//! and what do they cost at 1–64 rows on Qwen3-8B's projection shapes?
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DevicePtrMut};
use std::ffi::c_void;

fn ok(s: lt::cublasStatus_t, what: &str) {
    if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        panic!("{what}: {s:?}");
    }
}

fn bf16(x: f32) -> u16 {
    (x.to_bits().wrapping_add(0x7fff + ((x.to_bits() >> 16) & 1)) >> 16) as u16
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn main() {
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let mut h: lt::cublasLtHandle_t = std::ptr::null_mut();
    unsafe { ok(lt::cublasLtCreate(&mut h), "create") };
    let ws_bytes = 32usize << 20;
    let mut ws: CudaSlice<u8> = stream.alloc_zeros(ws_bytes).unwrap();
    let shapes: &[(&str, usize, usize)] = &[
        ("q", 4096, 4096),
        ("qkv", 6144, 4096),
        ("gate_up", 24576, 4096),
        ("down", 4096, 12288),
        ("fc", 4096, 20480),
        ("lm_head", 151936, 4096),
    ];
    let only: Option<String> = std::env::args().nth(1);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for &(name, n, k) in shapes {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let w_host: Vec<u16> = (0..n * k).map(|_| bf16(rng.f() * 0.05)).collect();
        let x_host: Vec<u16> = (0..64 * k).map(|_| bf16(rng.f())).collect();
        let w = stream.memcpy_stod(&w_host).unwrap();
        let x = stream.memcpy_stod(&x_host).unwrap();
        let mut y: CudaSlice<f32> = stream.alloc_zeros(64 * n).unwrap();
        let (wp, _g1) = w.device_ptr(&stream);
        let (xp, _g2) = x.device_ptr(&stream);
        let (yp, _g3) = y.device_ptr_mut(&stream);
        let (wsp, _g4) = ws.device_ptr_mut(&stream);
        let (wp, xp, yp, wsp) = (wp, xp, yp, wsp);
        drop((_g1, _g2, _g3, _g4));
        unsafe {
            let mut desc: lt::cublasLtMatmulDesc_t = std::ptr::null_mut();
            ok(
                lt::cublasLtMatmulDescCreate(
                    &mut desc,
                    lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    lt::cudaDataType::CUDA_R_32F,
                ),
                "desc",
            );
            let ta = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
            let tb = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
            let sz = std::mem::size_of::<cudarc::cublas::sys::cublasOperation_t>();
            ok(lt::cublasLtMatmulDescSetAttribute(desc, lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &ta as *const _ as *const c_void, sz), "ta");
            ok(lt::cublasLtMatmulDescSetAttribute(desc, lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &tb as *const _ as *const c_void, sz), "tb");
            let layout = |t: lt::cudaDataType, r: usize, c: usize, ld: usize| {
                let mut l: lt::cublasLtMatrixLayout_t = std::ptr::null_mut();
                ok(lt::cublasLtMatrixLayoutCreate(&mut l, t, r as u64, c as u64, ld as i64), "layout");
                l
            };
            let a = layout(lt::cudaDataType::CUDA_R_16BF, k, n, k);
            let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
            ok(lt::cublasLtMatmulPreferenceCreate(&mut pref), "pref");
            ok(lt::cublasLtMatmulPreferenceSetAttribute(pref, lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes as *const _ as *const c_void, 8), "ws");
            // Candidate algorithms: the heuristics' lists at 64, 32 and 8 rows.
            let mut cands: Vec<(usize, lt::cublasLtMatmulAlgo_t)> = vec![];
            for hm in [64usize, 32, 8] {
                let b = layout(lt::cudaDataType::CUDA_R_16BF, k, hm, k);
                let c = layout(lt::cudaDataType::CUDA_R_32F, n, hm, n);
                let mut res: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); 12];
                let mut got = 0;
                ok(lt::cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, c, pref, 12, res.as_mut_ptr(), &mut got), "heur");
                for r in &res[..got as usize] {
                    if !cands.iter().any(|(_, c)| c.data == r.algo.data) {
                        cands.push((hm, r.algo));
                    }
                }
            }
            let attr = |al: &lt::cublasLtMatmulAlgo_t, at: lt::cublasLtMatmulAlgoConfigAttributes_t| -> u64 {
                let mut v: u64 = 0;
                let mut wr = 0usize;
                lt::cublasLtMatmulAlgoConfigGetAttribute(al, at, &mut v as *mut _ as *mut c_void, 8, &mut wr);
                v & if wr >= 8 { u64::MAX } else { (1u64 << (wr * 8)) - 1 }
            };
            use lt::cublasLtMatmulAlgoConfigAttributes_t as A;
            println!("== {name} {n}x{k}: {} candidates", cands.len());
            let ms = [1usize, 2, 7, 8, 9, 16, 24, 32, 33, 40, 48, 56, 64];
            for (hm, al) in &cands {
                let cfg = format!(
                    "from{hm} id{} tile{} splitk{} red{} swz{} cust{} stages{} inner{} cluster{}",
                    attr(al, A::CUBLASLT_ALGO_CONFIG_ID),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_TILE_ID),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
                    attr(al, A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                );
                // Reference: 64 rows; then every m from the list at row offsets 0 and 64 - m.
                let run = |m: usize, xoff: usize, yoff: usize| -> lt::cublasStatus_t {
                    let b = layout(lt::cudaDataType::CUDA_R_16BF, k, m, k);
                    let c = layout(lt::cudaDataType::CUDA_R_32F, n, m, n);
                    let (al1, be) = (1f32, 0f32);
                    let s = lt::cublasLtMatmul(
                        h, desc, &al1 as *const _ as *const c_void,
                        wp as *const c_void, a, (xp + (xoff * k * 2) as u64) as *const c_void, b,
                        &be as *const _ as *const c_void,
                        (yp + (yoff * n * 4) as u64) as *const c_void, c,
                        (yp + (yoff * n * 4) as u64) as *mut c_void, c,
                        al, wsp as *mut c_void, ws_bytes, stream.cu_stream() as _,
                    );
                    lt::cublasLtMatrixLayoutDestroy(b);
                    lt::cublasLtMatrixLayoutDestroy(c);
                    s
                };
                let mut okm = String::new();
                if run(64, 0, 0) != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    println!("{cfg}: fails at 64");
                    continue;
                }
                let y64 = stream.memcpy_dtov(&y).unwrap();
                let again = run(64, 0, 0);
                let y64b = stream.memcpy_dtov(&y).unwrap();
                let det = again == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && y64.iter().zip(&y64b).all(|(p, q)| p.to_bits() == q.to_bits());
                let mut all_same = det;
                for &m in &ms {
                    let mut same = true;
                    for off in [0, 64 - m] {
                        stream.memset_zeros(&mut y).unwrap();
                        if run(m, off, off) != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                            same = false;
                            break;
                        }
                        let ym = stream.memcpy_dtov(&y).unwrap();
                        same &= ym[off * n..(off + m) * n].iter().zip(&y64[off * n..(off + m) * n]).all(|(p, q)| p.to_bits() == q.to_bits());
                    }
                    okm.push(if same { '=' } else { 'x' });
                    all_same &= same;
                }
                // Times: 40 launches back to back after 5 warm-ups.
                let mut times = vec![];
                for m in [1usize, 8, 16, 32, 64] {
                    for _ in 0..5 {
                        run(m, 0, 0);
                    }
                    stream.synchronize().unwrap();
                    let t = std::time::Instant::now();
                    for _ in 0..40 {
                        run(m, 0, 0);
                    }
                    stream.synchronize().unwrap();
                    times.push(format!("{m}:{:.1}", t.elapsed().as_secs_f64() * 1e6 / 40.0));
                }
                println!("{cfg} det{} rows[{okm}] {} | µs {}", det as u8, if all_same { "ROW-EXACT" } else { "-" }, times.join(" "));
            }
        }
    }
}
