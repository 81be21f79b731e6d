"""`dspark serve` driven by the real OpenAI Python client (openai, pinned in requirements.txt).

Run by crates/dspark-cli/tests/serve_openai.rs with the venv that `cargo xtask fetch-test-data`
builds (.test-data/openai-venv/), against a server on the embedded demo pair:

    python openai_client.py --base-url http://127.0.0.1:PORT/v1 --dspark path/to/dspark

Every check compares the server with `dspark generate --json` on the same prompt (greedy, so
the tokens must be equal) or with the server's own non-streamed answer. Exits non-zero on the
first failed check; prints one line per check.

`n` > 1 and logprobs are checked too. Until the server supports them (it answers 400), those
checks print an EXPECTED-TO-FAIL line and are skipped; once it accepts them they must pass.
"""

import argparse
import json
import subprocess
import sys
import time

import openai

PROMPT = "def fibonacci(n):\n"
CHAT = "Write a sort function"
SKIPPED = []


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def generate(dspark, args):
    """`dspark generate --json` on the CPU: {"tokens", "text", "stats"}."""
    out = subprocess.run(
        [dspark, "generate", "--device", "cpu", "--json", *args], capture_output=True, text=True, timeout=300
    )
    check(out.returncode == 0, f"dspark generate {args} failed: {out.stderr}")
    return json.loads(out.stdout)


def extra(obj, key):
    """A field outside OpenAI's schema (the server's `dspark` object): openai's models keep them."""
    d = obj.model_dump() if hasattr(obj, "model_dump") else obj
    return d.get(key)


def stream_all(stream):
    """The chunks of a stream, each checked to be one of OpenAI's chunk objects."""
    chunks = list(stream)
    check(len(chunks) >= 1, "a stream with no chunks")
    return chunks


def joined(chunks, chat, index=0):
    """(concatenated text, finish_reason, dspark tokens) of choice `index` in a stream."""
    text, finish, tokens = "", None, None
    for c in chunks:
        for ch in c.choices:
            if ch.index != index:
                continue
            piece = ch.delta.content if chat else ch.text
            text += piece or ""
            if ch.finish_reason is not None:
                check(finish is None, f"two finish_reasons in one stream for choice {index}")
                finish = ch.finish_reason
                d = extra(c, "dspark")
                if d is not None:
                    tokens = d.get("tokens")
    return text, finish, tokens


def test_models(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    check(ids == ["dspark-demo-coder"], f"models.list() ids {ids}")
    check(models.data[0].object == "model", "model object")
    m = client.models.retrieve("dspark-demo-coder")
    check(m.id == "dspark-demo-coder", f"models.retrieve {m}")
    try:
        client.models.retrieve("no-such-model")
        check(False, "retrieving an unknown model must raise NotFoundError")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"unknown model: {e.status_code}")


def test_completions(client, dspark):
    want = generate(dspark, ["--prompt", PROMPT, "--max-tokens", "24"])
    r = client.completions.create(model="dspark-demo-coder", prompt=PROMPT, max_tokens=24, temperature=0)
    check(r.object == "text_completion", f"object {r.object}")
    check(len(r.choices) == 1, "one choice")
    c = r.choices[0]
    check(c.text == want["text"], f"completion text {c.text!r} != generate's {want['text']!r}")
    check(extra(r, "dspark")["tokens"] == want["tokens"], "completion tokens != generate's")
    check(c.finish_reason == "length", f"finish_reason {c.finish_reason}")
    check(r.usage.completion_tokens == 24, f"usage {r.usage}")
    check(r.usage.prompt_tokens == want["stats"]["prompt_tokens"], f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + 24, f"usage {r.usage}")

    chunks = stream_all(
        client.completions.create(model="dspark-demo-coder", prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
    )
    text, finish, tokens = joined(chunks, chat=False)
    check(text == c.text, f"streamed deltas {text!r} != non-streamed {c.text!r}")
    check(finish == "length", f"streamed finish_reason {finish}")
    check(tokens in (None, want["tokens"]), "streamed tokens != generate's")
    check(all(ch.id == chunks[0].id for ch in chunks), "one id for every chunk")
    check(all(ch.usage is None for ch in chunks), "usage only with include_usage")

    # Token ids as the prompt.
    want_ids = generate(dspark, ["--prompt-ids", "202,479,361,414", "--max-tokens", "12"])
    r = client.completions.create(model="x", prompt=[202, 479, 361, 414], max_tokens=12, temperature=0)
    check(extra(r, "dspark")["tokens"] == want_ids["tokens"], "token-id prompt tokens != generate's")
    check(r.choices[0].text == want_ids["text"], "token-id prompt text != generate's")


def test_chat(client, dspark):
    want = generate(dspark, ["--prompt", CHAT, "--chat", "--max-tokens", "20"])
    msgs = [{"role": "user", "content": CHAT}]
    r = client.chat.completions.create(model="dspark-demo-coder", messages=msgs, max_tokens=20, temperature=0)
    check(r.object == "chat.completion", f"object {r.object}")
    m = r.choices[0].message
    check(m.role == "assistant", f"role {m.role}")
    check(extra(r, "dspark")["tokens"] == want["tokens"], "chat tokens != generate --chat's")
    # generate's text may go on past a chat end-of-turn token the server does not return.
    check(want["text"].startswith(m.content), f"chat text {m.content!r} not a prefix of {want['text']!r}")
    check(r.usage.completion_tokens == len(want["tokens"]), f"usage {r.usage}")

    chunks = stream_all(
        client.chat.completions.create(
            model="dspark-demo-coder",
            messages=msgs,
            max_completion_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    check(chunks[0].object == "chat.completion.chunk", f"object {chunks[0].object}")
    check(chunks[0].choices[0].delta.role == "assistant", "first delta carries the role")
    text, finish, tokens = joined(chunks, chat=True)
    check(text == m.content, f"streamed deltas {text!r} != non-streamed {m.content!r}")
    check(finish == r.choices[0].finish_reason, f"streamed finish_reason {finish}")
    check(tokens in (None, want["tokens"]), "streamed chat tokens != generate's")
    last = chunks[-1]
    check(last.choices == [], f"include_usage: the last chunk's choices must be [], got {last.choices}")
    check(last.usage is not None and last.usage.completion_tokens == r.usage.completion_tokens, f"usage {last.usage}")
    check(last.usage.prompt_tokens == r.usage.prompt_tokens, f"usage {last.usage}")
    check(all(c.usage is None for c in chunks[:-1]), "usage only on the last chunk")


def test_stop(client):
    full = client.completions.create(model="m", prompt=PROMPT, max_tokens=32, temperature=0).choices[0].text
    mid = len(full) // 2
    stop = full[mid : mid + 3]
    check(len(stop) == 3, f"text too short for a stop string: {full!r}")
    cut = full.index(stop)
    for stream in (False, True):
        r = client.completions.create(
            model="m", prompt=PROMPT, max_tokens=32, temperature=0, stop=["\x01never", stop], stream=stream
        )
        if stream:
            text, finish, _ = joined(stream_all(r), chat=False)
        else:
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        check(stop not in text, f"stop string {stop!r} in the text {text!r} (stream={stream})")
        check(text == full[:cut], f"stopped text {text!r} != {full[:cut]!r} (stream={stream})")
        check(finish == "stop", f"finish_reason {finish} (stream={stream})")

    msgs = [{"role": "system", "content": "You write code."}, {"role": "user", "content": "sort"}]
    full = client.chat.completions.create(model="m", messages=msgs, max_tokens=24, temperature=0)
    full = full.choices[0].message.content
    check(len(full) >= 4, f"chat text too short for a stop string: {full!r}")
    stop = full[len(full) // 2 :][:2]
    cut = full.index(stop)
    for stream in (False, True):
        r = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=24, temperature=0, stop=stop, stream=stream
        )
        if stream:
            text, finish, _ = joined(stream_all(r), chat=True)
        else:
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        check(stop not in text, f"chat stop string {stop!r} in {text!r} (stream={stream})")
        check(text == full[:cut], f"chat stopped text {text!r} != {full[:cut]!r} (stream={stream})")
        check(finish == "stop", f"chat finish_reason {finish} (stream={stream})")


def test_errors(client):
    msgs = [{"role": "user", "content": "hi"}]
    for bad, what in [
        ({"temperature": 3}, "temperature > 2"),
        ({"max_tokens": 0}, "max_tokens 0"),
        ({"top_p": 1.5}, "top_p > 1"),
    ]:
        try:
            client.chat.completions.create(model="m", messages=msgs, **bad)
            check(False, f"{what}: expected BadRequestError")
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"{what}: status {e.status_code}")
            body = e.body if isinstance(e.body, dict) else {}
            check(isinstance(body.get("message"), str), f"{what}: error body {e.body}")


def expected_to_fail(what, e):
    line = f"EXPECTED-TO-FAIL until n/logprobs land: {what}: the server answered {e.status_code}: {e.message}"
    print("!" * 100)
    print(f"!!! {line}")
    print("!" * 100)
    SKIPPED.append(what)
    return "skipped"


def test_n(client):
    msgs = [{"role": "user", "content": CHAT}]
    try:
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0.9, seed=7, n=2)
    except openai.BadRequestError as e:
        return expected_to_fail("n=2", e)
    check(len(r.choices) == 2, f"n=2: {len(r.choices)} choices")
    check(sorted(c.index for c in r.choices) == [0, 1], "n=2: indices 0 and 1")
    texts = {c.index: c.message.content for c in r.choices}
    again = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0.9, seed=7, n=2)
    check({c.index: c.message.content for c in again.choices} == texts, "n=2 with a seed is not repeatable")
    check(r.usage.completion_tokens >= 2, f"n=2 usage {r.usage}")
    # The choices are separate draws: over a few seeds, some pair differs (one seed could give
    # two equal choices by chance; every seed doing so means the choices share their draws).
    differ = texts[0] != texts[1]
    for seed in (8, 9, 10):
        if differ:
            break
        o = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=1.5, seed=seed, n=2)
        differ = o.choices[0].message.content != o.choices[1].message.content
    check(differ, "n=2: the two choices are equal for every seed tried (the same draws?)")
    chunks = stream_all(
        client.chat.completions.create(
            model="m", messages=msgs, max_tokens=16, temperature=0.9, seed=7, n=2, stream=True
        )
    )
    for i in (0, 1):
        text, finish, _ = joined(chunks, chat=True, index=i)
        check(text == texts[i], f"n=2 streamed choice {i} {text!r} != non-streamed {texts[i]!r}")
        check(finish in ("stop", "length"), f"n=2 streamed choice {i} finish_reason {finish}")
    # Greedy: both choices are the one greedy output.
    g = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0, n=2)
    solo = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0)
    check([c.text for c in sorted(g.choices, key=lambda c: c.index)] == [solo.choices[0].text] * 2, "greedy n=2")


def test_logprobs(client):
    msgs = [{"role": "user", "content": CHAT}]
    try:
        r = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3
        )
    except openai.BadRequestError as e:
        return expected_to_fail("chat logprobs", e)
    c = r.choices[0]
    check(c.logprobs is not None and c.logprobs.content is not None, f"chat logprobs missing: {c}")
    lp = c.logprobs.content
    check(len(lp) == r.usage.completion_tokens, f"{len(lp)} logprobs for {r.usage.completion_tokens} tokens")
    for t in lp:
        check(t.logprob <= 1e-6, f"logprob {t.logprob} > 0")
        check(len(t.top_logprobs) == 3, f"top_logprobs {len(t.top_logprobs)} != 3")
        best = max(x.logprob for x in t.top_logprobs)
        # Greedy: the chosen token is the most likely one.
        check(abs(best - t.logprob) < 1e-4, f"greedy token's logprob {t.logprob} below the best {best}")
    if all(t.bytes is not None for t in lp):
        got = b"".join(bytes(t.bytes) for t in lp).decode("utf-8", "replace")
        check(c.message.content.startswith(got) or got.startswith(c.message.content), "logprob bytes != the text")

    try:
        r = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    except openai.BadRequestError as e:
        return expected_to_fail("completions logprobs", e)
    lp = r.choices[0].logprobs
    check(lp is not None, "completions logprobs missing")
    n = r.usage.completion_tokens
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n, f"completions logprobs lengths {lp}")
    check(all(x <= 1e-6 for x in lp.token_logprobs), "completions logprob > 0")
    # The 2 most likely and the chosen token (at temperature 0, one of them).
    check(all(1 <= len(t) <= 3 for t in lp.top_logprobs), f"completions top_logprobs sizes {lp.top_logprobs}")
    check("".join(lp.tokens) == r.choices[0].text, f"tokens {lp.tokens} != text {r.choices[0].text!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--dspark", required=True)
    args = ap.parse_args()
    print(f"openai {openai.__version__} against {args.base_url}")
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    tests = [
        ("models", lambda: test_models(client)),
        ("completions", lambda: test_completions(client, args.dspark)),
        ("chat", lambda: test_chat(client, args.dspark)),
        ("stop", lambda: test_stop(client)),
        ("errors", lambda: test_errors(client)),
        ("n", lambda: test_n(client)),
        ("logprobs", lambda: test_logprobs(client)),
    ]
    failed = skipped = 0
    for name, f in tests:
        t0 = time.monotonic()
        try:
            if f() == "skipped":
                skipped += 1
                print(f"SKIP   {name} (EXPECTED-TO-FAIL, see above)")
            else:
                print(f"ok     {name} ({time.monotonic() - t0:.2f} s)")
        except Exception as e:  # noqa: BLE001: every failure is reported, the run goes on
            failed += 1
            print(f"FAILED {name}: {type(e).__name__}: {e}")
    if SKIPPED:
        print(f"!!! {len(SKIPPED)} check(s) EXPECTED-TO-FAIL and skipped: {', '.join(SKIPPED)}")
    print(f"openai client checks: {len(tests) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
