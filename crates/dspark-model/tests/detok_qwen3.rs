//! `IncrementalDecoder` on the real Qwen3 tokenizer: for random id sequences (multi-byte
//! characters that byte-level BPE splits, random vocabulary and special ids) the streamed
//! chunks concatenate to `decode(all ids)`, each chunk is whole characters, and nothing is held
//! back at the end unless the full text ends in an incomplete character.

use dspark_model::checkpoint::detok::IncrementalDecoder;
use dspark_model::checkpoint::tokenizer::Tokenizer;
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

fn qwen3() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.test-data/qwen3/tokenizer.json");
        assert!(path.is_file(), "missing {}: run `cargo xtask fetch-test-data` first", path.display());
        Arc::new(Tokenizer::from_file(&path).unwrap())
    })
    .clone()
}

/// Streams `ids`; returns the chunks, the last one from `finish`.
fn chunks(tok: Arc<Tokenizer>, ids: &[u32]) -> Vec<String> {
    let mut d = IncrementalDecoder::new(tok);
    let mut out: Vec<String> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
    out.push(d.finish().unwrap());
    out
}

fn check(ids: &[u32]) -> std::result::Result<(), TestCaseError> {
    let tok = qwen3();
    let full = tok.decode(ids).unwrap();
    let parts = chunks(tok, ids);
    prop_assert_eq!(parts.concat(), full.clone(), "ids {:?}", ids);
    // A chunk has U+FFFD only where the full decode has it.
    let mut at = 0;
    for p in &parts {
        for (i, c) in p.char_indices() {
            if c == '\u{FFFD}' {
                prop_assert!(full[at + i..].starts_with(char::REPLACEMENT_CHARACTER), "ids {:?}", ids);
            }
        }
        at += p.len();
    }
    // Only an incomplete trailing character is left for `finish`.
    if !full.ends_with('\u{FFFD}') {
        prop_assert_eq!(parts.last().unwrap().as_str(), "", "ids {:?}", ids);
    }
    Ok(())
}

fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z ]{1,4}",
        "[世界你好日本語한국어]{1,3}",
        "[🙂🦙🎉👍🏽😀]{1,2}",
        "[éàçøß]{1,2}",
        Just("<|im_end|>".to_string()),
        Just("\n".to_string()),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Ids of real text, so the full decode is valid and no chunk may hold U+FFFD.
    #[test]
    fn stream_of_encoded_text(s in text()) {
        let ids = qwen3().encode(&s).unwrap();
        prop_assert_eq!(qwen3().decode(&ids).unwrap(), s.clone());
        check(&ids)?;
        let parts = chunks(qwen3(), &ids);
        prop_assert!(parts.iter().all(|p| !p.contains('\u{FFFD}')), "{:?}", parts);
    }

    /// Slices and splices of encoded text plus random ids (any vocabulary entry, added tokens,
    /// ids past the vocabulary), so characters are cut and bytes never complete.
    #[test]
    fn stream_of_random_ids(
        a in text(),
        b in text(),
        cut in 0usize..64,
        random in proptest::collection::vec(0u32..152_000, 0..6),
        order in any::<u8>(),
    ) {
        let tok = qwen3();
        let ea = tok.encode(&a).unwrap();
        let eb = tok.encode(&b).unwrap();
        let mut ids: Vec<u32> = ea[cut.min(ea.len())..].to_vec();
        match order % 3 {
            0 => { ids.extend(&random); ids.extend(&eb); }
            1 => { ids.extend(&eb); ids.extend(&random); }
            _ => { let mut r = random.clone(); r.extend(&ids); ids = r; ids.extend(&eb[..eb.len() / 2]); }
        }
        check(&ids)?;
    }
}

#[test]
fn split_emoji_is_held_back_and_arc_works() {
    let tok = qwen3();
    let ids = tok.encode("🦙🎉 👍🏽").unwrap();
    assert!(ids.len() > 4, "{ids:?}");
    let parts = chunks(tok.clone(), &ids);
    assert!(parts.iter().any(|p| p.is_empty()), "{parts:?}");
    assert_eq!(parts.concat(), "🦙🎉 👍🏽");
    // A stream cut inside a character flushes it as U+FFFD, like `decode`.
    let half = *ids.iter().find(|&&id| tok.decode(&[id]).unwrap().ends_with('\u{FFFD}')).unwrap();
    let mut d = IncrementalDecoder::new(&*tok);
    assert_eq!(d.push(half).unwrap(), "");
    assert!(d.has_pending());
    assert_eq!(d.finish().unwrap(), tok.decode(&[half]).unwrap());
    assert!(!d.has_pending());
    assert_eq!(d.push_all(&ids).unwrap(), "🦙🎉 👍🏽");
}
