//! End-to-end tests of the `dspark` binary: the golden continuation through `generate
//! --json`, the `info` summary (snapshot), and bad input — every case must end with a one-line
//! error naming the problem and a non-zero exit, never a panic.

mod cli_util;

use cli_util::*;
use std::path::Path;
use std::process::{Command, Output};

#[test]
fn generate_json_reproduces_the_golden_continuation() {
    for name in ["qwen3-tiny-f32", "qwen3-tiny-sharded", "qwen3-tiny-bf16", "qwen3-tiny-tied"] {
        let prompt = csv(&golden_ids(name, "prompt_ids"));
        let dir = fixture(name);
        let out = dspark(&[
            "generate",
            "--target",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            "64",
            "--device",
            "cpu",
            "--json",
        ]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
        let tokens: Vec<u64> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(tokens, golden_ids(name, "continuation"), "{name}");
        assert_eq!(v["stats"]["generated_tokens"], 64);
        assert_eq!(v["stats"]["stop_reason"], "max_tokens");
        assert!(v["text"].is_string(), "{name}: fixture has a tokenizer, so text is decoded");
    }
}

/// The demo's default prompt (`src/demo.rs`), given explicitly to the fixtures-folder run.
const DEMO_PROMPT: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";

fn tokens_of(out: &Output) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn the_demo_runs_from_a_copied_binary() {
    // The binary alone, copied elsewhere and run from another directory, with no model
    // arguments: it must need nothing beside it, and run the same pair as fixtures/.
    let bin_dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let bin = bin_dir.path().join("dspark");
    std::fs::copy(env!("CARGO_BIN_EXE_dspark"), &bin).unwrap();
    let embedded = Command::new(&bin)
        .current_dir(cwd.path())
        .args(["generate", "--device", "cpu", "--max-tokens", "16", "--json"])
        .output()
        .unwrap();
    assert!(embedded.status.success(), "{}", String::from_utf8_lossy(&embedded.stderr));
    let (t, d) = (fixture("coder-target"), fixture("coder-draft"));
    let from_folders = dspark(&[
        "generate",
        "--target",
        t.to_str().unwrap(),
        "--draft",
        d.to_str().unwrap(),
        "--prompt",
        DEMO_PROMPT,
        "--device",
        "cpu",
        "--max-tokens",
        "16",
        "--json",
    ]);
    assert!(from_folders.status.success(), "{}", String::from_utf8_lossy(&from_folders.stderr));
    let (a, b): (serde_json::Value, serde_json::Value) =
        (serde_json::from_slice(&embedded.stdout).unwrap(), serde_json::from_slice(&from_folders.stdout).unwrap());
    assert_eq!(tokens_of(&embedded), tokens_of(&from_folders));
    assert_eq!(tokens_of(&embedded).len(), 16);
    assert_eq!(a["text"], b["text"]);
    assert_eq!(a["stats"]["prompt_tokens"], b["stats"]["prompt_tokens"]);
    // The embedded draft ran, and drafted as the folder's does.
    assert_eq!(a["stats"]["speculative"], b["stats"]["speculative"]);
    assert!(a["stats"]["speculative"]["rounds"].as_u64().unwrap() > 0);
    assert!(a["stats"]["load_ms"].as_f64().unwrap() > 0.0);
    // And the demo target's greedy output without a draft is the same too.
    let plain = dspark(&[
        "generate",
        "--target",
        t.to_str().unwrap(),
        "--prompt",
        DEMO_PROMPT,
        "--device",
        "cpu",
        "--max-tokens",
        "16",
        "--json",
    ]);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    assert_eq!(tokens_of(&plain), tokens_of(&embedded));
}

#[test]
fn stats_report_load_and_prefill_times() {
    let dir = fixture("qwen3-tiny-f32");
    let d = dir.to_str().unwrap();
    let out =
        dspark(&["generate", "--target", d, "--prompt-ids", "1,2,3", "--max-tokens", "4", "--device", "cpu", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in ["load_ms", "prefill_ms", "decode_ms"] {
        assert!(v["stats"][field].as_f64().is_some_and(|ms| ms >= 0.0), "{field}: {v}");
    }
    assert!(v["stats"]["load_ms"].as_f64().unwrap() > 0.0);
    let (_, stderr) =
        expect_success(&["generate", "--target", d, "--prompt-ids", "1,2,3", "--max-tokens", "4", "--device", "cpu"]);
    assert!(stderr.contains("load ") && stderr.contains(" ms, prefill "), "{stderr}");
}

#[test]
fn generate_text_mode_streams_and_reports() {
    let dir = fixture("qwen3-tiny-f32");
    let (out, stderr) = expect_success(&[
        "generate",
        "--target",
        dir.to_str().unwrap(),
        "--prompt",
        "def fib(n):",
        "--chat",
        "--max-tokens",
        "8",
    ]);
    assert!(stderr.contains("generated") && stderr.contains("tok/s"), "{stderr}");
    assert!(!out.stdout.is_empty());
}

#[test]
fn info_summary() {
    for name in [
        "qwen3-tiny-f32",
        "qwen3-tiny-sharded",
        "qwen3-tiny-tied",
        "dspark-tiny-rnn",
        "dflash-tiny",
        "dspark-tiny-speculators",
    ] {
        let out = dspark(&["info", fixture(name).to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        insta::assert_snapshot!(name, String::from_utf8_lossy(&out.stdout));
    }
}

fn gen_args(dir: &Path) -> Vec<String> {
    ["generate", "--target", dir.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-tokens", "4", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn expect_generate_error(dir: &Path) -> String {
    let args = gen_args(dir);
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    expect_error(&refs)
}

#[test]
fn truncated_safetensors() {
    let tmp = broken_copy("qwen3-tiny-f32");
    let p = tmp.path().join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len - 100).unwrap();
    let e = expect_generate_error(tmp.path());
    assert!(e.contains("model.safetensors") && e.contains("truncated"), "{e}");
}

#[test]
fn header_offsets_that_lie() {
    let tmp = broken_copy("qwen3-tiny-f32");
    let p = tmp.path().join("model.safetensors");
    edit_header(&p, |h| {
        let offs = h["model.norm.weight"]["data_offsets"].as_array_mut().unwrap();
        let end = offs[1].as_u64().unwrap();
        offs[1] = serde_json::json!(end + 4);
    });
    let e = expect_generate_error(tmp.path());
    assert!(e.contains("model.norm.weight") && e.contains("data_offsets"), "{e}");
}

#[test]
fn config_without_num_hidden_layers() {
    let tmp = broken_copy("qwen3-tiny-f32");
    let p = tmp.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("num_hidden_layers");
    std::fs::write(&p, cfg.to_string()).unwrap();
    let e = expect_generate_error(tmp.path());
    assert!(e.contains("config.json") && e.contains("num_hidden_layers"), "{e}");
    let e = expect_error(&["info", tmp.path().to_str().unwrap()]);
    assert!(e.contains("num_hidden_layers"), "{e}");
}

#[test]
fn tensor_of_the_wrong_dtype() {
    let tmp = broken_copy("qwen3-tiny-f32");
    let p = tmp.path().join("model.safetensors");
    edit_header(&p, |h| h["model.layers.1.mlp.up_proj.weight"]["dtype"] = serde_json::json!("I32"));
    let e = expect_generate_error(tmp.path());
    assert!(e.contains("model.layers.1.mlp.up_proj.weight") && e.contains("I32"), "{e}");
}

#[test]
fn tensor_of_the_wrong_shape_or_missing() {
    let tmp = broken_copy("qwen3-tiny-f32");
    let p = tmp.path().join("model.safetensors");
    edit_header(&p, |h| {
        h.as_object_mut().unwrap().remove("model.layers.2.self_attn.k_norm.weight");
    });
    let e = expect_generate_error(tmp.path());
    assert!(e.contains("model.layers.2.self_attn.k_norm.weight") && e.contains("missing"), "{e}");
}

#[test]
fn prompt_longer_than_the_context() {
    // qwen3-tiny-f32 has max_position_embeddings 256; the message names it and --max-context,
    // whichever is the smaller.
    let dir = fixture("qwen3-tiny-f32");
    let d = dir.to_str().unwrap();
    let ids = csv(&(0..300).map(|i| i % 200 + 10).collect::<Vec<u64>>());
    let e = expect_error(&["generate", "--target", d, "--prompt-ids", &ids, "--device", "cpu", "--json"]);
    assert!(e.contains("300") && e.contains("--max-context 8192") && e.contains("max_position_embeddings 256"), "{e}");
    let ids = csv(&(0..20).map(|i| i + 10).collect::<Vec<u64>>());
    let e = expect_error(&["generate", "--target", d, "--prompt-ids", &ids, "--max-context", "16", "--device", "cpu"]);
    assert!(e.contains("20") && e.contains("--max-context 16") && e.contains("max_position_embeddings 256"), "{e}");
    // The prompt and one generated token must fit: a prompt filling the context is refused, one
    // position fewer runs (and stops there).
    let full = csv(&(0..16).map(|i| i + 10).collect::<Vec<u64>>());
    let e = expect_error(&["generate", "--target", d, "--prompt-ids", &full, "--max-context", "16", "--device", "cpu"]);
    assert!(e.contains("--max-context 16"), "{e}");
    // The check comes before the weights are read: a truncated safetensors is not reached.
    let tmp = broken_copy("qwen3-tiny-f32");
    let p = tmp.path().join("model.safetensors");
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(10).unwrap();
    let t = tmp.path().to_str().unwrap();
    let e = expect_error(&["generate", "--target", t, "--prompt-ids", &full, "--max-context", "16", "--device", "cpu"]);
    assert!(e.contains("max_position_embeddings 256") && !e.contains("safetensors"), "{e}");
    let fits = csv(&(0..15).map(|i| i + 10).collect::<Vec<u64>>());
    let out =
        dspark(&["generate", "--target", d, "--prompt-ids", &fits, "--max-context", "16", "--device", "cpu", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["stats"]["generated_tokens"].as_u64().unwrap() >= 1);
}

#[test]
fn token_id_outside_the_vocabulary() {
    let dir = fixture("qwen3-tiny-f32");
    let e = expect_error(&["generate", "--target", dir.to_str().unwrap(), "--prompt-ids", "1,99999", "--json"]);
    assert!(e.contains("99999") && e.contains("vocab"), "{e}");
}

#[test]
fn missing_folder_and_unsupported_options() {
    let e = expect_error(&["generate", "--target", "/nonexistent/model", "--prompt-ids", "1", "--json"]);
    assert!(e.contains("/nonexistent/model"), "{e}");
    let dir = fixture("qwen3-tiny-f32");
    let d = dir.to_str().unwrap();
    let e = expect_error(&["generate", "--target", d, "--prompt-ids", "1", "--device", "cuda"]);
    assert!(e.contains("cuda"), "{e}");
}

#[test]
fn generate_with_a_draft_prints_the_plain_greedy_tokens_and_round_stats() {
    let target = fixture("qwen3-tiny-f32");
    let prompt = csv(&golden_ids("qwen3-tiny-f32", "prompt_ids"));
    for (draft, verify) in [("dspark-tiny-vanilla", "7"), ("dspark-tiny-rnn", "auto"), ("dflash-tiny", "3")] {
        let d = fixture(draft);
        let out = dspark(&[
            "generate",
            "--target",
            target.to_str().unwrap(),
            "--draft",
            d.to_str().unwrap(),
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            "64",
            "--device",
            "cpu",
            "--verify-len",
            verify,
            "--json",
        ]);
        assert!(out.status.success(), "{draft}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let tokens: Vec<u64> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(tokens, golden_ids("qwen3-tiny-f32", "continuation"), "{draft}");
        // The vanilla draft's own embed_tokens / lm_head are byte copies of the target's: shared.
        let shared = if draft == "dspark-tiny-vanilla" { 2 * 512 * 64 * 4 } else { 0 };
        assert_eq!(v["stats"]["draft_shared_bytes"].as_u64(), Some(shared), "{draft}");
        let s = &v["stats"]["speculative"];
        let rounds = s["rounds"].as_u64().unwrap();
        assert!(rounds > 0);
        assert_eq!(s["accepted_per_round"].as_array().unwrap().len() as u64, rounds);
        assert_eq!(
            s["accepted_histogram"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).sum::<u64>(),
            rounds
        );
        assert!(s["mean_accepted_length"].as_f64().unwrap() >= 1.0);
        if verify == "3" {
            assert!(s["verified_per_round"].as_array().unwrap().iter().all(|k| k.as_u64().unwrap() <= 3));
        }
    }
}

#[test]
fn a_draft_that_accepts_nothing_is_warned_about_and_a_trained_one_is_not() {
    // The tiny fixture drafts are random, so on the tiny target they accept ~nothing: the run
    // stays exact but must say so, on stderr and in the JSON stats.
    let (t, d) = (fixture("qwen3-tiny-f32"), fixture("dspark-tiny-vanilla"));
    let prompt = csv(&golden_ids("qwen3-tiny-f32", "prompt_ids"));
    let mut args = vec!["generate", "--target", t.to_str().unwrap(), "--draft", d.to_str().unwrap()];
    args.extend(["--prompt-ids", &prompt, "--max-tokens", "64", "--device", "cpu"]);
    let out = dspark(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning: the draft's first 16 rounds committed 1."), "{err}");
    args.push("--json");
    let out = dspark(&args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings = v["stats"]["warnings"].as_array().expect("a warnings array");
    assert!(warnings[0].as_str().unwrap().contains("target_layer_ids"), "{warnings:?}");
    assert_eq!(v["tokens"].as_array().unwrap().len(), 64);
    // The trained demo pair (τ ≈ 4 greedy) is not warned about.
    let out = dspark(&["generate", "--device", "cpu", "--max-tokens", "64", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["stats"]["speculative"]["rounds"].as_u64().unwrap() >= 16);
    assert!(v["stats"].get("warnings").is_none(), "{}", v["stats"]);
}

#[test]
fn generate_with_a_bf16_kv_cache_stays_lossless() {
    // With --kv-cache bf16 the target rounds its keys and values to bf16 as it caches them, so
    // its greedy output may differ from the f32 cache's; speculative decoding on the same cache
    // must still reproduce that greedy output exactly.
    let target = fixture("qwen3-tiny-f32");
    let draft = fixture("dspark-tiny-vanilla");
    let prompt = csv(&golden_ids("qwen3-tiny-f32", "prompt_ids"));
    let run = |with_draft: bool| -> Vec<u64> {
        let mut args = vec!["generate", "--target", target.to_str().unwrap(), "--prompt-ids", &prompt];
        if with_draft {
            args.extend(["--draft", draft.to_str().unwrap()]);
        }
        args.extend(["--max-tokens", "48", "--device", "cpu", "--kv-cache", "bf16", "--json"]);
        let out = dspark(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
    };
    let plain = run(false);
    assert_eq!(plain.len(), 48);
    assert_eq!(run(true), plain);
    let d = target.to_str().unwrap();
    // A value clap refuses: its usual error (with a --help hint line), naming the flag.
    let out = dspark(&["generate", "--target", d, "--prompt-ids", "1", "--kv-cache", "f16"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.starts_with("error: "), "{e}");
    assert!(e.contains("--kv-cache") && e.contains("expected f32 or bf16"), "{e}");
}

/// `--embeddings` and `--prefill-chunk` (the CUDA memory plan) and `--activations`: a bad value,
/// or a flag the CPU backend has no use for, is a one-line error naming the flag and what it
/// takes; `auto` (and `--activations f32`) is taken.
#[test]
fn memory_flags_are_checked_and_named() {
    let cases: [(&[&str], &[&str]); 9] = [
        (&["--activations", "fp8"], &["--activations", "expected f32, bf16 or e4m3"]),
        (&["--activations", "bf16"], &["--activations bf16:", "--device cuda"]),
        (&["--activations", "e4m3"], &["--activations e4m3:", "--device cuda"]),
        (&["--embeddings", "disk"], &["--embeddings", "expected auto, device or host"]),
        (&["--prefill-chunk", "lots"], &["--prefill-chunk", "expected auto or a number of rows"]),
        (&["--prefill-chunk", "0"], &["--prefill-chunk 0: must be 1 to 2048 rows"]),
        (&["--prefill-chunk", "4096"], &["--prefill-chunk 4096: must be 1 to 2048 rows"]),
        (&["--embeddings", "host"], &["--embeddings host:", "--device cuda"]),
        (&["--prefill-chunk", "256"], &["--prefill-chunk 256:", "--device cuda"]),
    ];
    for (flags, want) in cases {
        let mut args = vec!["generate", "--prompt-ids", "1,2", "--max-tokens", "2", "--device", "cpu"];
        args.extend(flags);
        let out = dspark(&args);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.starts_with("error: "), "{flags:?}: {e}");
        for w in want {
            assert!(e.contains(w), "{flags:?}: {e}");
        }
    }
    // The default plan on the CPU runs, named or left to `auto`.
    for flags in [
        &["--embeddings", "device"][..],
        &["--embeddings", "auto", "--prefill-chunk", "auto"],
        &["--activations", "f32"],
    ] {
        let mut args = vec!["generate", "--prompt-ids", "1,2", "--max-tokens", "2", "--device", "cpu"];
        args.extend(flags);
        let out = dspark(&args);
        assert!(out.status.success(), "{flags:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `--tensor-parallel`: a bad count, the embedded demo and the CPU are refused in one line naming
/// the flag (the split itself runs in the GPU tier, `gpu_model::tp`).
#[test]
fn tensor_parallel_flags_are_checked() {
    let target = repo().join("fixtures/qwen3-tiny-f32");
    let t = target.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--tensor-parallel", "0"], "at least 1 GPU"),
        (&["--tensor-parallel", "two"], "expected a number of GPUs"),
        (&["--tensor-parallel", "2"], "--tensor-parallel 2: give --target DIR"),
        (&["--tensor-parallel", "2", "--target", t], "--tensor-parallel 2: needs --device cuda"),
    ];
    for (flags, want) in cases {
        let mut args = vec!["generate", "--prompt-ids", "1,2", "--max-tokens", "2", "--device", "cpu"];
        args.extend(flags);
        let out = dspark(&args);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.starts_with("error: ") && e.contains(want), "{flags:?}: {e}");
    }
}

#[test]
fn generate_with_a_mismatched_draft_fails_cleanly() {
    let target = fixture("qwen3-tiny-f32");
    let e = expect_error(&[
        "generate",
        "--target",
        target.to_str().unwrap(),
        "--draft",
        fixture("qwen3-tiny-bf16").to_str().unwrap(),
        "--prompt-ids",
        "1,2",
        "--json",
    ]);
    assert!(e.contains("architectures"), "{e}");
}
