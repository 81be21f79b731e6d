//! Our tokenizer against the real Qwen3 `tokenizer.json` and llama.cpp's Qwen2 test vectors.
//!
//! The vectors (`ggml-vocab-qwen2.gguf.inp` / `.out`) were written by llama.cpp's
//! `convert_hf_to_gguf_update.py`, which encodes each text with the Python `transformers`
//! tokenizer and `add_special_tokens=False`. Qwen3 keeps Qwen2's BPE vocabulary and merges (it only
//! adds special tokens), so every id must match. The inputs are fetched, hash-pinned, by
//! `cargo xtask fetch-test-data`; when they are missing these tests fail rather than skip, so a
//! green run always means the comparison happened.

use dspark_model::checkpoint::tokenizer::{chat_prompt, Tokenizer};
use std::path::PathBuf;

fn test_data(rel: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.test-data").join(rel);
    assert!(
        path.is_file(),
        "missing test input {}: run `cargo xtask fetch-test-data` (or `cargo xtask test`) first",
        path.display()
    );
    path
}

fn qwen3() -> Tokenizer {
    let path = test_data("qwen3/tokenizer.json");
    Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// The llama.cpp test cases: (text, expected ids).
fn llama_cases() -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(test_data("llama.cpp/ggml-vocab-qwen2.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(test_data("llama.cpp/ggml-vocab-qwen2.gguf.out")).unwrap();
    // Each text is written followed by "\n__ggml_vocab_test__\n" (texts may themselves start or
    // end with newlines, so split on the whole separator, as llama.cpp's test-tokenizer-0 does).
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let body = inp.strip_suffix(SEP).expect(".inp should end with the separator");
    let texts: Vec<&str> = body.split(SEP).collect();
    // One line per text: " id id id" (each id preceded by a space), empty for the empty text.
    let ids: Vec<Vec<u32>> =
        out.lines().map(|line| line.split_whitespace().map(|t| t.parse().expect("id in .out")).collect()).collect();
    assert_eq!(texts.len(), ids.len(), ".inp and .out disagree on the number of cases");
    texts.into_iter().map(String::from).zip(ids).collect()
}

#[test]
fn llama_cpp_qwen2_vectors_match_exactly() {
    let tok = qwen3();
    let cases = llama_cases();
    assert_eq!(cases.len(), 46, "expected llama.cpp's 46 tokenizer test cases");
    let mut failures = Vec::new();
    for (i, (text, expected)) in cases.iter().enumerate() {
        let got = tok.encode(text).unwrap();
        if &got != expected {
            failures.push(format!("case {i}: text {text:?}\n  expected {expected:?}\n  got      {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn llama_cpp_vectors_round_trip_through_decode_and_stream() {
    let tok = qwen3();
    for (text, ids) in llama_cases() {
        // Qwen's tokenizer normalises to NFC, and every vector is already NFC, so decoding the
        // expected ids must give the text back byte for byte.
        assert_eq!(tok.decode(&ids).unwrap(), text);
        assert_eq!(streamed(&tok, &ids), text, "stream decode of {text:?}");
    }
}

#[test]
fn special_token_ids() {
    let tok = qwen3();
    for (token, id) in [
        ("<|endoftext|>", 151643),
        ("<|im_start|>", 151644),
        ("<|im_end|>", 151645),
        ("<think>", 151667),
        ("</think>", 151668),
    ] {
        assert_eq!(tok.token_to_id(token), Some(id), "{token}");
        // Written in text, each is one id, and it decodes back to itself.
        assert_eq!(tok.encode(token).unwrap(), vec![id], "{token}");
        assert_eq!(tok.decode(&[id]).unwrap(), token);
    }
    assert_eq!(tok.token_to_id("no such token"), None);
    assert_eq!(tok.vocab_size(), 151_643 + 26);
}

#[test]
fn chat_prompt_encodes_with_special_tokens() {
    let tok = qwen3();
    let prompt = chat_prompt("hi");
    let ids = tok.encode(&prompt).unwrap();
    assert_eq!(ids.first(), Some(&151644), "{ids:?}");
    assert!(ids.contains(&151645), "{ids:?}");
    assert!(ids.contains(&151668), "{ids:?}");
    assert_eq!(ids.iter().filter(|&&id| id == 151644).count(), 2, "{ids:?}");
    assert_eq!(tok.decode(&ids).unwrap(), prompt);
}

fn streamed(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut stream = tok.stream();
    let mut text = String::new();
    for &id in ids {
        text += &stream.push(id).unwrap();
    }
    text += &stream.finish().unwrap();
    text
}

#[test]
fn decode_and_stream_round_trip() {
    let tok = qwen3();
    for text in [
        "héllo 世界 🙂",
        "Hello, world!",
        "",
        "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\n\n",
        "🦙🦙 llama emoji, 한국어, العربية, Ελληνικά, русский",
        "<|im_start|>user\nçà ?<|im_end|>\n</think>",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
        assert_eq!(streamed(&tok, &ids), text, "stream decode of {text:?}");
    }
}

#[test]
fn stream_holds_back_partial_characters() {
    let tok = qwen3();
    // Find a character the vocabulary splits across tokens, then check that no pushed chunk
    // ever carries half of it.
    let text = "🙂🦙 世界";
    let ids = tok.encode(text).unwrap();
    assert!(ids.len() > 3, "expected the emoji to take several byte-level tokens: {ids:?}");
    let mut stream = tok.stream();
    let mut chunks = Vec::new();
    for &id in &ids {
        chunks.push(stream.push(id).unwrap());
    }
    chunks.push(stream.finish().unwrap());
    assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
    assert!(chunks.iter().any(|c| c.is_empty()), "no token was held back: {chunks:?}");
    assert_eq!(chunks.concat(), text);
}
