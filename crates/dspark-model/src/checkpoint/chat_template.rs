//! The model's own chat template: `chat_template` from the folder's `tokenizer_config.json`,
//! rendered with a Jinja engine, so a conversation reaches the model in exactly the format it
//! was trained on.
//!
//! Hugging Face stores the template as a Jinja string (`"chat_template": "..."`), as a list of
//! named templates (`[{"name": "default", "template": "..."}, ...]`, of which we take
//! `default`), or, in newer exports, in a separate `chat_template.jinja` next to the config
//! (which then takes precedence, as in `transformers`). We render it with minijinja under the
//! settings `transformers`' `apply_chat_template` uses: `trim_blocks` and `lstrip_blocks` on,
//! Python's string methods (`startswith`, `strip`, `split`, ...) through `minijinja-contrib`'s
//! `pycompat`, a `raise_exception` function, and the special tokens (`bos_token`,
//! `eos_token`, ...) of the config as variables.
//!
//! A folder with no template gets the built-in Qwen3 format ([`ChatTemplate::builtin`]), written
//! out in Rust: it is what Qwen3's template renders for system, user and assistant messages
//! without tools, and the tests check the two against each other byte for byte.
//!
//! `enable_thinking` is always passed: Qwen3's template emits the empty think block
//! (`<think>\n\n</think>\n\n`) after the generation prompt only for an explicit
//! `enable_thinking=false`, which is the mode the published DSpark drafts were trained on.

use crate::checkpoint::json::JsonObject;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (a folder's template may accept others, such as `tool`).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// A chat template: a model's Jinja template, or the built-in Qwen3 format.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Builtin,
    Jinja {
        /// The file the template came from, for error messages.
        path: PathBuf,
        source: String,
        /// `bos_token`, `eos_token`, ... from `tokenizer_config.json`.
        special_tokens: Vec<(String, String)>,
    },
}

/// The special-token fields of `tokenizer_config.json` passed to the template as variables,
/// as `transformers` passes its `special_tokens_map`.
const SPECIAL_TOKENS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

impl ChatTemplate {
    /// The built-in Qwen3 format (see [`render_builtin`]).
    pub fn builtin() -> ChatTemplate {
        ChatTemplate { kind: Kind::Builtin }
    }

    /// The template of a model folder: `<dir>/chat_template.jinja` if it exists, else
    /// `chat_template` in `<dir>/tokenizer_config.json`; the built-in Qwen3 format when the
    /// folder has neither (no config, or a config without a template).
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate> {
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.exists() { Some(JsonObject::read(&config_path)?) } else { None };
        let jinja_path = dir.join("chat_template.jinja");
        if jinja_path.exists() {
            let text = std::fs::read_to_string(&jinja_path).map_err(|e| Error::io(&jinja_path, e))?;
            let special = match &config {
                Some(c) => special_tokens(c)?,
                None => Vec::new(),
            };
            return Self::jinja(jinja_path, text, special);
        }
        match config {
            Some(c) => Self::from_config(&c),
            None => Ok(Self::builtin()),
        }
    }

    /// The template in the text of a `tokenizer_config.json` (read from a file, or compiled
    /// into the binary); `path` names it in messages.
    pub fn from_str(path: &Path, text: &str) -> Result<ChatTemplate> {
        Self::from_config(&JsonObject::parse(path, text)?)
    }

    /// A Jinja template given as its source text; `path` names it in messages.
    pub fn from_jinja(path: &Path, source: &str) -> Result<ChatTemplate> {
        Self::jinja(path.to_path_buf(), source.to_string(), Vec::new())
    }

    fn from_config(config: &JsonObject) -> Result<ChatTemplate> {
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(Self::builtin()),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => named_default(config, list)?,
            Some(_) => {
                return Err(config.err("chat_template", "expected a string or a list of {name, template} objects"))
            }
        };
        Self::jinja(config.path.clone(), source, special_tokens(config)?)
    }

    fn jinja(path: PathBuf, source: String, special_tokens: Vec<(String, String)>) -> Result<ChatTemplate> {
        // Compile once here so that a broken template is an error at load time, not at the
        // first request.
        environment().template_from_str(&source).map_err(|e| template_error(&path, "not a valid chat template", &e))?;
        Ok(ChatTemplate { kind: Kind::Jinja { path, source, special_tokens } })
    }

    /// Whether this is the built-in Qwen3 format (the folder had no template).
    pub fn is_builtin(&self) -> bool {
        matches!(self.kind, Kind::Builtin)
    }

    /// The file the template came from; `None` for the built-in format.
    pub fn path(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Builtin => None,
            Kind::Jinja { path, .. } => Some(path),
        }
    }

    /// Formats a conversation as the model's prompt text. `add_generation_prompt` appends the
    /// start of the assistant's turn; `enable_thinking` is passed to the template as is
    /// (Qwen3: `false` adds the empty think block that asks for a direct answer).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        let (path, source, special_tokens) = match &self.kind {
            Kind::Builtin => return render_builtin(messages, add_generation_prompt, enable_thinking),
            Kind::Jinja { path, source, special_tokens } => (path, source, special_tokens),
        };
        let env = environment();
        let template =
            env.template_from_str(source).map_err(|e| template_error(path, "not a valid chat template", &e))?;
        let mut ctx: std::collections::BTreeMap<String, minijinja::Value> =
            special_tokens.iter().map(|(k, v)| (k.clone(), minijinja::Value::from(v.as_str()))).collect();
        ctx.insert("messages".into(), minijinja::value::Serde(messages).into());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("enable_thinking".into(), enable_thinking.into());
        let ctx = minijinja::Value::from_object(ctx);
        template.render(ctx).map_err(|e| template_error(path, "rendering the chat template", &e))
    }
}

/// The Jinja environment of `transformers`' `apply_chat_template`.
fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .expect("the default delimiters are valid");
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env
}

/// A minijinja error with its whole chain and the template line, naming the file.
fn template_error(path: &Path, what: &str, e: &minijinja::Error) -> Error {
    let mut msg = format!("{what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg += &format!(": {s}");
        source = s.source();
    }
    Error::Tokenizer { path: path.to_path_buf(), msg }
}

/// The `default` entry of a list of named templates.
fn named_default(config: &JsonObject, list: &[serde_json::Value]) -> Result<String> {
    let bad = || config.err("chat_template", "expected a string or a list of {name, template} objects");
    for entry in list {
        let name = entry.get("name").and_then(|n| n.as_str()).ok_or_else(bad)?;
        let template = entry.get("template").and_then(|t| t.as_str()).ok_or_else(bad)?;
        if name == "default" {
            return Ok(template.to_string());
        }
    }
    let names: Vec<&str> = list.iter().filter_map(|e| e.get("name").and_then(|n| n.as_str())).collect();
    Err(config.err("chat_template", format!("a list of named templates ({}) with no `default`", names.join(", "))))
}

/// The special tokens of a `tokenizer_config.json`: each a string or an `AddedToken` object
/// (`{"content": ...}`); absent or null ones are left out.
fn special_tokens(config: &JsonObject) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for field in SPECIAL_TOKENS {
        let content = match config.get(field) {
            None | Some(serde_json::Value::Null) => continue,
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => match v.get("content").and_then(|c| c.as_str()) {
                Some(s) => s.to_string(),
                None => return Err(config.err(field, "expected a string or an object with `content`")),
            },
        };
        out.push((field.to_string(), content));
    }
    Ok(out)
}

/// Qwen3's chat format, as its template renders it for `system`, `user` and `assistant`
/// messages without tools:
///
/// * a `system` message first becomes `<|im_start|>system\n{content}<|im_end|>\n`, as does a
///   `user` message (or a later `system` one) with its role;
/// * an `assistant` message becomes `<|im_start|>assistant\n{content}<|im_end|>\n`, its
///   reasoning split off at `</think>` and dropped, except that the last message of the
///   conversation, if it is an assistant's after the last user message (and any assistant
///   message there with reasoning), keeps a think block:
///   `<think>\n{reasoning}\n</think>\n\n{content}`;
/// * the generation prompt is `<|im_start|>assistant\n`, followed by the empty think block
///   `<think>\n\n</think>\n\n` when thinking is off.
///
/// Other roles, and an empty conversation, are errors (the template drops or reformats the
/// former and fails on the latter).
pub fn render_builtin(messages: &[ChatMessage], add_generation_prompt: bool, enable_thinking: bool) -> Result<String> {
    let path = Path::new("<built-in Qwen3 chat template>");
    if messages.is_empty() {
        return Err(Error::Tokenizer { path: path.to_path_buf(), msg: "no messages to format".into() });
    }
    let mut out = String::new();
    // The index of the last user message that is not a tool response (the template's
    // `last_query_index`; the last message's index when there is none).
    let last_query = messages
        .iter()
        .rposition(|m| {
            m.role == "user" && !(m.content.starts_with("<tool_response>") && m.content.ends_with("</tool_response>"))
        })
        .unwrap_or(messages.len().saturating_sub(1));
    for (i, m) in messages.iter().enumerate() {
        match m.role.as_str() {
            "system" | "user" => {
                out += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
            }
            "assistant" => {
                let (reasoning, content) = match m.content.find("</think>") {
                    Some(_) => {
                        // Python's `split('</think>')[-1].lstrip('\n')` and
                        // `split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')`.
                        let after = m.content.rsplit("</think>").next().unwrap_or("");
                        let before = m.content.split("</think>").next().unwrap_or("");
                        let reasoning = before.trim_end_matches('\n');
                        let reasoning = reasoning.rsplit("<think>").next().unwrap_or("").trim_start_matches('\n');
                        (reasoning, after.trim_start_matches('\n'))
                    }
                    None => ("", m.content.as_str()),
                };
                let last = i + 1 == messages.len();
                if i > last_query && (last || !reasoning.is_empty()) {
                    out += &format!(
                        "<|im_start|>assistant\n<think>\n{}\n</think>\n\n{}",
                        reasoning.trim_matches('\n'),
                        content.trim_start_matches('\n')
                    );
                } else {
                    out += &format!("<|im_start|>assistant\n{content}");
                }
                out += "<|im_end|>\n";
            }
            other => {
                return Err(Error::Tokenizer {
                    path: path.to_path_buf(),
                    msg: format!("message {i}: role `{other}` is not one of system, user, assistant"),
                })
            }
        }
    }
    if add_generation_prompt {
        out += "<|im_start|>assistant\n";
        if !enable_thinking {
            out += "<think>\n\n</think>\n\n";
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tokenizer::chat_prompt;

    #[test]
    fn builtin_single_user_turn_is_chat_prompt() {
        let t = ChatTemplate::builtin();
        assert!(t.is_builtin() && t.path().is_none());
        for text in ["hi", "a\nb", ""] {
            assert_eq!(t.render(&[ChatMessage::user(text)], true, false).unwrap(), chat_prompt(text));
        }
        assert_eq!(
            t.render(&[ChatMessage::user("hi")], true, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.render(&[ChatMessage::user("hi")], false, false).unwrap(), "<|im_start|>user\nhi<|im_end|>\n");
    }

    #[test]
    fn builtin_rejects_unknown_roles() {
        let e = render_builtin(&[ChatMessage::new("tool", "x")], true, false).unwrap_err().to_string();
        assert!(e.contains("built-in Qwen3 chat template") && e.contains("`tool`"), "{e}");
        let e = render_builtin(&[], true, false).unwrap_err().to_string();
        assert!(e.contains("no messages"), "{e}");
    }

    #[test]
    fn folder_without_template_is_builtin() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_builtin());
        std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"eos_token": "<|im_end|>"}"#).unwrap();
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_builtin());
        std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"chat_template": null}"#).unwrap();
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_builtin());
    }

    #[test]
    fn string_template_with_special_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let config = r#"{
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "pad_token": null,
            "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content.strip() }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ enable_thinking }}{{ eos_token }}"
        }"#;
        std::fs::write(dir.path().join("tokenizer_config.json"), config).unwrap();
        let t = ChatTemplate::from_dir(dir.path()).unwrap();
        assert!(!t.is_builtin());
        assert_eq!(t.path().unwrap(), dir.path().join("tokenizer_config.json"));
        let msgs = [ChatMessage::system(" s "), ChatMessage::user("u\n")];
        // Booleans print as Jinja2 prints them (Python's `False`).
        assert_eq!(t.render(&msgs, true, false).unwrap(), "<s>[system:s][user:u]>False</s>");
        assert_eq!(t.render(&msgs, false, true).unwrap(), "<s>[system:s][user:u]True</s>");
    }

    #[test]
    fn named_templates_take_default_and_jinja_file_wins() {
        let dir = tempfile::tempdir().unwrap();
        let config = r#"{"chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D{{ messages|length }}"}
        ]}"#;
        std::fs::write(dir.path().join("tokenizer_config.json"), config).unwrap();
        let t = ChatTemplate::from_dir(dir.path()).unwrap();
        assert_eq!(t.render(&[ChatMessage::user("x")], true, false).unwrap(), "D1");
        std::fs::write(dir.path().join("chat_template.jinja"), "J{{ messages[0].content }}\n").unwrap();
        let t = ChatTemplate::from_dir(dir.path()).unwrap();
        assert_eq!(t.path().unwrap(), dir.path().join("chat_template.jinja"));
        // Jinja drops the template's one trailing newline, as `transformers` does.
        assert_eq!(t.render(&[ChatMessage::user("x")], true, false).unwrap(), "Jx");
    }

    #[test]
    fn errors_name_the_file_and_the_template_error() {
        let p = Path::new("m/tokenizer_config.json");
        let e = ChatTemplate::from_str(p, r#"{"chat_template": "{% for %}"}"#).unwrap_err().to_string();
        assert!(e.contains("m/tokenizer_config.json") && e.contains("not a valid chat template"), "{e}");
        let e = ChatTemplate::from_str(p, r#"{"chat_template": 3}"#).unwrap_err().to_string();
        assert!(e.contains("m/tokenizer_config.json") && e.contains("chat_template"), "{e}");
        let e = ChatTemplate::from_str(p, r#"{"chat_template": [{"name": "a", "template": "x"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `default`") && e.contains("a"), "{e}");
        let t = ChatTemplate::from_str(p, r#"{"chat_template": "{{ raise_exception('only user turns') }}"}"#).unwrap();
        let e = t.render(&[ChatMessage::user("x")], true, false).unwrap_err().to_string();
        assert!(e.contains("m/tokenizer_config.json") && e.contains("only user turns"), "{e}");
        let e = ChatTemplate::from_str(p, "{oops").unwrap_err().to_string();
        assert!(e.contains("m/tokenizer_config.json"), "{e}");
    }
}
