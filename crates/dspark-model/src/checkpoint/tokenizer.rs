//! Text in and out of the model: the checkpoint's `tokenizer.json`, Qwen3's chat format, and the
//! ids that end a generation.
//!
//! Speculative decoding is only lossless if the target sees exactly the ids it was trained on,
//! so we do not reimplement BPE: we hand `tokenizer.json` to the Hugging Face `tokenizers` crate,
//! the same code the Python library runs, and the tests check its output against vectors that
//! llama.cpp generated with the Python tokenizer. This module only narrows that crate's generic
//! API to the few calls the engine needs and turns its boxed errors into our error type, naming
//! the file the tokenizer came from.
//!
//! Encoding never adds BOS or other post-processing tokens, because the prompt the engine feeds
//! is already fully formatted by the chat template
//! ([`chat_template`](crate::checkpoint::chat_template); [`chat_prompt`] for one user turn); special tokens written literally in the text
//! (such as `<|im_start|>`) are still recognised as their single ids. Decoding keeps special
//! tokens, so what the user sees is exactly what the model produced.
//!
//! Streaming needs its own decoder because one token is not one piece of text: Qwen3's
//! byte-level BPE splits many characters (CJK, emoji) across tokens, and decoding such a token on
//! its own yields a replacement character. [`Tokenizer::stream`]'s [`IncrementalDecoder`]
//! (in [`detok`](crate::checkpoint::detok)) holds text back until the bytes seen so far form
//! complete characters, so concatenating its output equals decoding all ids at once.
//!
//! Stop ids come from two places that disagree in practice: `config.json` names one
//! `eos_token_id`, while `generation_config.json` often lists the chat end marker as well
//! (Qwen3: `<|im_end|>` and `<|endoftext|>`). Stopping on the union is what `transformers`'
//! `generate` does, so [`eos_ids`] takes both.

pub use crate::checkpoint::detok::IncrementalDecoder;
use crate::checkpoint::json::JsonObject;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A Hugging Face tokenizer loaded from `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Where it was loaded from, for error messages.
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("path", &self.path).field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(path, &bytes)
    }

    /// Parses the contents of a `tokenizer.json` (read from a file, or compiled into the
    /// binary); `path` names it in messages.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            msg: format!("not a valid tokenizer.json: {e}"),
        })?;
        Ok(Tokenizer { inner, path: path.to_path_buf() })
    }

    /// `<dir>/tokenizer.json` if it exists, else `Ok(None)`.
    pub fn from_dir(dir: &Path) -> Result<Option<Tokenizer>> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        Self::from_file(&path).map(Some)
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn err(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer { path: self.path.clone(), msg: format!("{what}: {e}") }
    }

    /// Encodes raw text. No BOS or post-processing tokens are added; special tokens written in
    /// the text (such as `<|im_start|>`) are recognised as their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode_fast(text, false).map_err(|e| self.err("encode", e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes ids to text, keeping special tokens. Ids outside the vocabulary (a model's
    /// embedding table is usually padded past the tokenizer's size) decode to nothing, as in
    /// the Python library; byte sequences that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| self.err("decode", e))
    }

    /// The id of one token (a vocabulary entry or an added token), if it exists.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of ids, including added tokens (Qwen3: 151,643 BPE entries + 26 added).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// An incremental decoder for streaming output; see [`IncrementalDecoder`].
    pub fn stream(&self) -> TextStream<'_> {
        IncrementalDecoder::new(self)
    }
}

/// The streaming decoder of [`Tokenizer::stream`]; see [`IncrementalDecoder`].
pub type TextStream<'a> = IncrementalDecoder<&'a Tokenizer>;

/// Qwen3 chat formatting, non-thinking mode, one user turn: the built-in format of
/// [`ChatTemplate::builtin`](crate::checkpoint::chat_template::ChatTemplate::builtin) for one
/// user message.
///
/// This is what Qwen3's chat template renders for a single user message with
/// `add_generation_prompt=True, enable_thinking=False`: the empty think block tells the model to
/// answer directly.
pub fn chat_prompt(user: &str) -> String {
    format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
}

/// Stop ids: the union of `eos_token_id` in `<dir>/generation_config.json` (an integer or a
/// list; the file is optional) and `config_eos` (from `config.json`), deduplicated, with
/// `generation_config.json`'s ids first.
pub fn eos_ids(dir: &Path, config_eos: &[u32]) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    let generation_config = if path.exists() { Some(JsonObject::read(&path)?) } else { None };
    eos_ids_from(generation_config.as_ref(), config_eos)
}

/// [`eos_ids`] with `generation_config.json` already parsed (`None` when the model has none).
pub fn eos_ids_from(generation_config: Option<&JsonObject>, config_eos: &[u32]) -> Result<Vec<u32>> {
    let mut ids = match generation_config {
        Some(j) => j.id_list("eos_token_id")?,
        None => Vec::new(),
    };
    ids.extend_from_slice(config_eos);
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_matches_qwen3_template() {
        assert_eq!(chat_prompt("hi"), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        // The user text goes in verbatim, newlines and all.
        assert_eq!(
            chat_prompt("a\nb"),
            "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
    }

    fn write(dir: &Path, text: &str) {
        std::fs::write(dir.join("generation_config.json"), text).unwrap();
    }

    #[test]
    fn eos_ids_without_generation_config_uses_config() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(eos_ids(dir.path(), &[151645]).unwrap(), vec![151645]);
        assert_eq!(eos_ids(dir.path(), &[]).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn eos_ids_list_comes_first_and_is_deduplicated() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), r#"{"bos_token_id": 151643, "eos_token_id": [151645, 151643]}"#);
        assert_eq!(eos_ids(dir.path(), &[151643]).unwrap(), vec![151645, 151643]);
        assert_eq!(eos_ids(dir.path(), &[7, 151645, 7]).unwrap(), vec![151645, 151643, 7]);
    }

    #[test]
    fn eos_ids_single_integer() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), r#"{"eos_token_id": 151643}"#);
        assert_eq!(eos_ids(dir.path(), &[151645]).unwrap(), vec![151643, 151645]);
    }

    #[test]
    fn eos_ids_absent_or_null_field() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), r#"{"temperature": 0.6}"#);
        assert_eq!(eos_ids(dir.path(), &[2]).unwrap(), vec![2]);
        write(dir.path(), r#"{"eos_token_id": null}"#);
        assert_eq!(eos_ids(dir.path(), &[2]).unwrap(), vec![2]);
    }

    #[test]
    fn eos_ids_bad_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), r#"{"eos_token_id": "oops"}"#);
        let e = eos_ids(dir.path(), &[]).unwrap_err().to_string();
        assert!(e.contains("generation_config.json") && e.contains("eos_token_id"), "{e}");
        write(dir.path(), "{not json");
        let e = eos_ids(dir.path(), &[]).unwrap_err().to_string();
        assert!(e.contains("generation_config.json"), "{e}");
        write(dir.path(), r#"{"eos_token_id": [-1]}"#);
        assert!(eos_ids(dir.path(), &[]).is_err());
    }

    /// A byte-level BPE whose only entries are `a` and the two bytes of `é` (C3 A9, which
    /// byte-level BPE spells `Ã` and `©`), so `é` always takes two tokens.
    fn tiny() -> Tokenizer {
        let json = r#"{
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "post_processor": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                              "trim_offsets": false, "use_regex": false},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false,
                        "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false,
                      "vocab": {"a": 0, "\u00c3": 1, "\u00a9": 2}, "merges": []}
        }"#;
        let inner = tokenizers::Tokenizer::from_bytes(json).unwrap();
        Tokenizer { inner, path: PathBuf::from("tiny.json") }
    }

    #[test]
    fn stream_holds_back_split_characters() {
        let tok = tiny();
        assert_eq!(tok.encode("aé").unwrap(), vec![0, 1, 2]);
        let mut s = tok.stream();
        assert_eq!(s.push(0).unwrap(), "a");
        assert_eq!(s.push(1).unwrap(), "");
        assert_eq!(s.push(2).unwrap(), "é");
        assert_eq!(s.push(0).unwrap(), "a");
        assert_eq!(s.finish().unwrap(), "");
        // A stream cut inside a character flushes it as U+FFFD, like `decode` would.
        assert_eq!(s.push(1).unwrap(), "");
        assert_eq!(s.finish().unwrap(), "\u{FFFD}");
        assert_eq!(tok.decode(&[1]).unwrap(), "\u{FFFD}");
        // Ids past the vocabulary decode to nothing.
        assert_eq!(tok.decode(&[0, 99, 0]).unwrap(), "aa");
    }

    #[test]
    fn eos_ids_from_parsed_json() {
        let j = JsonObject::parse(Path::new("<embedded>/generation_config.json"), r#"{"eos_token_id": [5, 2]}"#);
        assert_eq!(eos_ids_from(Some(&j.unwrap()), &[2, 9]).unwrap(), vec![5, 2, 9]);
        assert_eq!(eos_ids_from(None, &[2]).unwrap(), vec![2]);
        let j = JsonObject::parse(Path::new("<embedded>/generation_config.json"), r#"{"eos_token_id": "x"}"#);
        let e = eos_ids_from(Some(&j.unwrap()), &[]).unwrap_err().to_string();
        assert!(e.contains("<embedded>/generation_config.json") && e.contains("eos_token_id"), "{e}");
    }

    #[test]
    fn from_bytes_names_the_given_path() {
        let e = Tokenizer::from_bytes(Path::new("<embedded>/tokenizer.json"), b"{\"model\": 3}").unwrap_err();
        assert!(e.to_string().contains("<embedded>/tokenizer.json"), "{e}");
    }

    #[test]
    fn from_dir_without_tokenizer_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Tokenizer::from_dir(dir.path()).unwrap().is_none());
    }

    #[test]
    fn from_file_rejects_garbage_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, "{\"model\": 3}").unwrap();
        let e = Tokenizer::from_dir(dir.path()).unwrap_err();
        assert!(matches!(e, Error::Tokenizer { .. }), "{e:?}");
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
    }
}
