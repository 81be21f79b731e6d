//! Incremental detokenization: text out one id at a time, always whole characters.
//!
//! One token is not one piece of text. Qwen3's byte-level BPE splits many characters (CJK,
//! emoji) across tokens, and decoding such a token on its own yields U+FFFD; some decoders also
//! depend on the left context of a token. So, as vLLM and TGI do, [`IncrementalDecoder`]
//! keeps two offsets into the ids it was given:
//!
//! * `prefix` — the start of the window decoded each step (the ids of the last emitted chunk,
//!   kept as left context), and
//! * `read` — the end of what was already emitted.
//!
//! Each step decodes `ids[prefix..read]` and `ids[prefix..]`; when the latter is longer and
//! does not end in U+FFFD (an incomplete byte sequence), the part past the former is new text:
//! it is returned and both offsets move forward. Otherwise the text is held back until a later
//! id completes the character. Ids before `prefix` are dropped, so the work and memory per
//! step stay small however long the output grows.
//!
//! The concatenation of every [`push`](IncrementalDecoder::push) and the final
//! [`finish`](IncrementalDecoder::finish) equals [`Tokenizer::decode`] of all the ids; a chunk
//! contains U+FFFD only where that full decode has one (bytes that can never form a
//! character), and a held-back incomplete character comes out of `finish` as U+FFFD, as
//! `decode` writes it.

use crate::checkpoint::tokenizer::Tokenizer;
use crate::error::Result;
use std::borrow::Borrow;

/// A streaming decoder over a tokenizer held as `T`: `&Tokenizer`, or an `Arc<Tokenizer>` for
/// a decoder that must own its tokenizer.
pub struct IncrementalDecoder<T: Borrow<Tokenizer>> {
    tokenizer: T,
    /// Ids from `prefix` on (earlier ones were dropped); `ids[..read]` were emitted.
    ids: Vec<u32>,
    read: usize,
    /// `decode(ids[..read])`, the left context's text.
    read_text: String,
}

impl<T: Borrow<Tokenizer>> IncrementalDecoder<T> {
    pub fn new(tokenizer: T) -> IncrementalDecoder<T> {
        IncrementalDecoder { tokenizer, ids: Vec::new(), read: 0, read_text: String::new() }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.tokenizer.borrow()
    }

    /// Adds one id; returns the newly completed text (empty while a character is still split
    /// across tokens).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer().decode(&self.ids)?;
        if text.len() <= self.read_text.len() || text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new = self.past_context(&text)?;
        // The ids just emitted become the next step's left context.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.read_text = self.tokenizer().decode(&self.ids)?;
        Ok(new)
    }

    /// Adds several ids; returns the text they completed.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out += &self.push(id)?;
        }
        Ok(out)
    }

    /// Whether ids are held back (text not yet emitted).
    pub fn has_pending(&self) -> bool {
        self.ids.len() > self.read
    }

    /// Flushes whatever is held back (an incomplete character comes out as U+FFFD) and resets
    /// the decoder, which may then start a new stream.
    pub fn finish(&mut self) -> Result<String> {
        let rest = if self.has_pending() {
            let text = self.tokenizer().decode(&self.ids)?;
            self.past_context(&text)?
        } else {
            String::new()
        };
        self.ids.clear();
        self.read = 0;
        self.read_text.clear();
        Ok(rest)
    }

    /// The part of `text` (the decode of context + pending ids) past the context's text.
    fn past_context(&self, text: &str) -> Result<String> {
        match text.strip_prefix(self.read_text.as_str()) {
            Some(new) => Ok(new.to_string()),
            None => Err(self.tokenizer().err(
                "incremental decode",
                format!(
                    "decoding ids {:?} gave {text:?}, which does not extend the text already emitted ({:?})",
                    self.ids, self.read_text
                ),
            )),
        }
    }
}
