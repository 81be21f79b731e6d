//! End-to-end tests of the `dspark` binary's sampling: bad sampling flags and generation-config
//! fields refused by name, the settings' precedence (flags, then `generation_config.json` under
//! `--sampling model`, then greedy), and a sampled run reproduced from its seed.

mod cli_util;

use cli_util::*;

#[test]
fn bad_sampling_flags_name_the_flag_and_the_value() {
    // The weights are truncated: every refusal comes before they are read.
    let tmp = broken_copy("qwen3-tiny-f32");
    let p = tmp.path().join("model.safetensors");
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(10).unwrap();
    let t = tmp.path().to_str().unwrap();
    for (flag, value, wants) in [
        ("--temperature", "-0.5", "--temperature must be a finite number ≥ 0, got -0.5"),
        ("--temperature", "nan", "--temperature must be a finite number ≥ 0, got NaN"),
        ("--temperature", "inf", "--temperature must be a finite number ≥ 0, got inf"),
        ("--top-p", "1.5", "--top-p must be in (0, 1], got 1.5"),
        ("--top-p", "0", "--top-p must be in (0, 1], got 0"),
        ("--top-p", "-0.2", "--top-p must be in (0, 1], got -0.2"),
        ("--min-p", "1.01", "--min-p must be in [0, 1], got 1.01"),
        ("--min-p", "-1", "--min-p must be in [0, 1], got -1"),
        ("--top-k", "-1", "--top-k must be ≥ 0 (0: off), got -1"),
    ] {
        for sampling in ["flags", "model"] {
            let e = expect_error(&[
                "generate",
                "--target",
                t,
                "--prompt-ids",
                "1,2",
                "--device",
                "cpu",
                "--sampling",
                sampling,
                flag,
                value,
            ]);
            assert!(e.contains(wants) && !e.contains("safetensors"), "{flag} {value}: {e}");
        }
    }
    // Values that are not numbers at all: clap's error (with its --help hint), naming both.
    for (flag, value) in [("--temperature", "hot"), ("--top-k", "2.5"), ("--seed", "-3"), ("--top-p", "")] {
        let out = dspark(&["generate", "--target", t, "--prompt-ids", "1", flag, value]);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.starts_with("error: "), "{e}");
        assert!(e.contains(flag) && e.contains(&format!("'{value}'")), "{flag} {value}: {e}");
    }
    let out = dspark(&["generate", "--target", t, "--prompt-ids", "1", "--sampling", "file"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("--sampling") && e.contains("'file'"), "{e}");
}

#[test]
fn sampling_settings_come_from_flags_or_generation_config() {
    let dir = fixture("qwen3-tiny-f32");
    // Greedy by default: the settings are recorded, the seed is not (nothing is drawn).
    let v = generate_json(&dir, &[]);
    let greedy_tokens = v["tokens"].clone();
    let s = &v["stats"]["sampling"];
    assert_eq!(s["source"], "flags");
    assert_eq!((s["temperature"].as_f64(), s["top_k"].as_u64()), (Some(0.0), Some(0)));
    assert_eq!((s["top_p"].as_f64(), s["min_p"].as_f64()), (Some(1.0), Some(0.0)));
    assert!(s["seed"].is_null() && s.get("law").is_none(), "{s}");
    // Filters without a temperature stay greedy; --temperature 0 is the greedy run.
    let v = generate_json(&dir, &["--top-k", "3", "--top-p", "0.5", "--seed", "9"]);
    assert_eq!(v["tokens"], greedy_tokens);
    assert_eq!(v["stats"]["sampling"]["top_k"], 3);
    assert_eq!(v["stats"]["sampling"]["top_p"], 0.5);
    assert_eq!(generate_json(&dir, &["--temperature", "0"])["tokens"], greedy_tokens);
    // A speculative run records the draft's law.
    let draft = fixture("dspark-tiny-vanilla");
    let v = generate_json(&dir, &["--draft", draft.to_str().unwrap()]);
    assert_eq!(v["tokens"], greedy_tokens);
    assert_eq!(v["stats"]["sampling"]["law"], "greedy");

    // --sampling model on a folder whose generation_config.json does not sample (the fixture's):
    // greedy, as transformers reads it.
    let v = generate_json(&dir, &["--sampling", "model"]);
    assert_eq!(v["tokens"], greedy_tokens);
    assert_eq!(v["stats"]["sampling"]["source"], "model");
    assert_eq!(v["stats"]["sampling"]["temperature"], 0.0);
    // A file that samples: its filters are taken; do_sample false keeps it greedy, and flags
    // override the file's values.
    let tmp = broken_copy("qwen3-tiny-f32");
    let gc = tmp.path().join("generation_config.json");
    std::fs::write(
        &gc,
        r#"{"eos_token_id": [2, 0], "do_sample": false, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05}"#,
    )
    .unwrap();
    let v = generate_json(tmp.path(), &["--sampling", "model"]);
    assert_eq!(v["tokens"], greedy_tokens);
    let s = &v["stats"]["sampling"];
    assert_eq!((s["temperature"].as_f64(), s["top_k"].as_u64()), (Some(0.0), Some(20)), "{s}");
    assert_eq!((s["top_p"].as_f64(), s["min_p"].as_f64()), (Some(0.95), Some(0.05)), "{s}");
    let v = generate_json(tmp.path(), &["--sampling", "model", "--top-k", "7", "--min-p", "0"]);
    let s = &v["stats"]["sampling"];
    assert_eq!((s["top_k"].as_u64(), s["top_p"].as_f64(), s["min_p"].as_f64()), (Some(7), Some(0.95), Some(0.0)));
    // With --sampling flags the file's settings are not read.
    assert_eq!(generate_json(tmp.path(), &[])["stats"]["sampling"]["top_k"], 0);

    // A file that samples: its temperature and filters are used, and the seed is recorded.
    std::fs::write(
        &gc,
        r#"{"eos_token_id": [2, 0], "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95}"#,
    )
    .unwrap();
    let v = generate_json(tmp.path(), &["--sampling", "model", "--seed", "11"]);
    let s = &v["stats"]["sampling"];
    assert_eq!(
        (s["source"].as_str(), s["temperature"].as_f64(), s["top_k"].as_u64()),
        (Some("model"), Some(0.6), Some(20))
    );
    assert_eq!(
        (s["top_p"].as_f64(), s["min_p"].as_f64(), s["seed"].as_u64()),
        (Some(0.95), Some(0.0), Some(11)),
        "{s}"
    );
    assert_eq!(generate_json(tmp.path(), &["--sampling", "model", "--seed", "11"])["tokens"], v["tokens"]);
    // --temperature 0 overrides the file's: greedy.
    assert_eq!(generate_json(tmp.path(), &["--sampling", "model", "--temperature", "0"])["tokens"], greedy_tokens);
    let t = tmp.path().to_str().unwrap();

    // A bad field: the error names the file and the field, before the weights are read; with
    // --sampling flags only the file's eos ids are read, so it runs.
    std::fs::write(&gc, r#"{"eos_token_id": [2, 0], "do_sample": true, "top_p": 1.5}"#).unwrap();
    let e = expect_error(&["generate", "--target", t, "--prompt-ids", "1", "--device", "cpu", "--sampling", "model"]);
    assert!(e.contains("generation_config.json") && e.contains("`top_p`") && e.contains("1.5"), "{e}");
    generate_json(tmp.path(), &[]);
    std::fs::write(&gc, r#"{"do_sample": "yes"}"#).unwrap();
    let e = expect_error(&["generate", "--target", t, "--prompt-ids", "1", "--device", "cpu", "--sampling", "model"]);
    assert!(e.contains("generation_config.json") && e.contains("`do_sample`"), "{e}");
}

#[test]
fn sampled_generation_is_reproducible_from_its_seed() {
    let dir = fixture("qwen3-tiny-f32");
    let draft = fixture("dspark-tiny-vanilla");
    let dr = draft.to_str().unwrap();
    let greedy = generate_json(&dir, &[])["tokens"].clone();
    for with_draft in [false, true] {
        let run = |extra: &[&str]| {
            let mut args = vec![];
            if with_draft {
                args.extend(["--draft", dr]);
            }
            args.extend(extra);
            generate_json(&dir, &args)
        };
        let a = run(&["--temperature", "0.8", "--seed", "5"]);
        let b = run(&["--temperature", "0.8", "--seed", "5"]);
        assert_eq!(a["tokens"], b["tokens"], "draft {with_draft}: same seed, same tokens");
        assert!(!a["tokens"].as_array().unwrap().is_empty());
        let c = run(&["--temperature", "0.8", "--seed", "6"]);
        assert_ne!(a["tokens"], c["tokens"], "draft {with_draft}: another seed, (very likely) other tokens");
        assert_ne!(a["tokens"], run(&[])["tokens"], "draft {with_draft}: sampling differs from greedy");
        let s = &a["stats"]["sampling"];
        assert_eq!((s["temperature"].as_f64(), s["seed"].as_u64()), (Some(0.8), Some(5)), "{s}");
        // --temperature 0 is the greedy run, whatever the seed.
        assert_eq!(run(&["--temperature", "0", "--seed", "5"])["tokens"], greedy);
        // No --seed: a random one, recorded so the run can be repeated.
        let r = run(&["--temperature", "0.8", "--top-k", "8"]);
        let seed = r["stats"]["sampling"]["seed"].as_u64().expect("the seed used is recorded");
        let again = run(&["--temperature", "0.8", "--top-k", "8", "--seed", &seed.to_string()]);
        assert_eq!(again["tokens"], r["tokens"]);
        if with_draft {
            // The default draft law is the sampled one; --draft-law greedy overrides it.
            assert_eq!(s["law"], "sampled");
            let g = run(&["--temperature", "0.8", "--seed", "5", "--draft-law", "greedy"]);
            assert_eq!(g["stats"]["sampling"]["law"], "greedy");
            assert!(g["stats"]["speculative"]["rounds"].as_u64().unwrap() > 0);
            assert_eq!(
                run(&["--draft-law", "sampled"])["stats"]["sampling"]["law"],
                "greedy",
                "greedy decoding's draft"
            );
        } else {
            assert!(s.get("law").is_none(), "{s}");
        }
    }
    // The text stats line names the settings and the seed.
    let d = dir.to_str().unwrap();
    let (_, stderr) = expect_success(&[
        "generate",
        "--target",
        d,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "4",
        "--device",
        "cpu",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "5",
    ]);
    assert!(stderr.contains("sampled at temperature 0.8, top-k 0, top-p 0.9, min-p 0, seed 5"), "{stderr}");
    let e = expect_error(&["generate", "--target", d, "--prompt-ids", "1", "--draft-law", "greedy"]);
    assert!(e.contains("--draft-law needs --draft"), "{e}");
}
