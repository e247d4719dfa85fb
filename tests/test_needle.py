"""`oscar-sgl eval needle`: prompt construction (exact length, needle at the requested depth),
scoring, flag errors, the kept-restore cache against `OscarCache`, and one tiny real run (JSON + PNG,
full precision retrieves the key at 256 tokens: measured 4 of 4 at depths 0.2 and 0.8)."""

from __future__ import annotations

import json

import pytest
import torch

from oscar_sgl import OscarCache, OscarConfig, cli
from oscar_sgl import needle as nd


@pytest.fixture(scope="module")
def tok():
    from oscar_sgl import model as models

    return models.load_tokenizer("default")


@pytest.fixture(scope="module")
def emma():
    return cli._text_path(cli.EMBEDDED_TEXT)[1]


NEW = 7


@pytest.mark.parametrize("haystack", ["filler", "text"])
@pytest.mark.parametrize("length", [160, 333, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_prompt_has_exact_length_and_the_needle_at_its_depth(tok, emma, haystack, length, depth):
    task = nd.NeedleTask(tok, haystack, emma)
    p = task.build(length, depth, trial=1, new_tokens=NEW, seed=3)
    assert len(p.ids) + NEW == length
    needle = task.needle_ids(p.passkey)
    assert p.ids[p.needle_start:p.needle_start + p.needle_len] == needle
    assert p.ids[:len(task.intro)] == task.intro and p.ids[p.question_start:] == task.question
    assert p.haystack_tokens == length - NEW - len(task.intro) - len(needle) - len(task.question)
    # At the requested depth, moved to a sentence end at most SNAP_WINDOW tokens away.
    before = p.needle_start - len(task.intro)
    assert abs(before - depth * p.haystack_tokens) <= nd.SNAP_WINDOW + 0.5
    assert p.actual_depth == before / p.haystack_tokens
    if 0 < before < p.haystack_tokens:
        assert tok.decode(p.ids[p.needle_start - 1]).rstrip(" ").endswith((".", "!", "?", "\n", '"'))
    text = tok.decode(p.ids)
    assert text.count(p.passkey) == 2 and text.endswith("What is the pass key? The pass key is")
    assert len(p.passkey) == 5 and p.passkey.isdigit()
    if haystack == "text":  # the haystack is a contiguous slice of the text's tokens
        hay = p.ids[len(task.intro):p.needle_start] + p.ids[p.needle_start + p.needle_len:p.question_start]
        assert hay == task._hay[p.haystack_offset:p.haystack_offset + p.haystack_tokens]
    else:
        assert "The grass is green. The sky is blue." in text


def test_prompts_are_seeded(tok):
    task = nd.NeedleTask(tok)
    a = task.build(512, 0.5, 0, NEW, seed=0)
    assert a == nd.NeedleTask(tok).build(512, 0.5, 0, NEW, seed=0)
    keys = {task.build(512, 0.5, t, NEW, seed=0).passkey for t in range(8)}
    assert len(keys) >= 7  # 8 draws from 90,000 keys
    assert keys != {task.build(512, 0.5, t, NEW, seed=1).passkey for t in range(8)}


def test_prompt_too_short_or_text_too_small(tok):
    task = nd.NeedleTask(tok)
    shortest = task.min_length(NEW)
    task.build(shortest, 0.5, 0, NEW)
    with pytest.raises(nd.NeedleError, match=f"the shortest length is {shortest}"):
        task.build(shortest - 1, 0.5, 0, NEW)
    small = nd.NeedleTask(tok, "text", "Call me Ishmael. " * 40)
    with pytest.raises(nd.NeedleError, match="haystack tokens, the text has"):
        small.build(1024, 0.5, 0, NEW)
    with pytest.raises(nd.NeedleError, match="depth must be between 0 and 1"):
        task.build(512, 1.5, 0, NEW)


@pytest.mark.parametrize("text, ok", [
    (" 12345.", True), ("12345", True), (" The pass key is 12345. Remember", True), (" 12345<|im_end|>", True),
    (" 1234", False), (" 123456", False), (" 12 345", False), (" a magical number", False), ("", False),
    (" 54321 or 12345", False),
])
def test_score_is_exact_match_of_the_first_number(text, ok):
    assert nd.score(text, "12345") is ok


def test_kept_restore_cache_attends_to_what_oscar_cache_restores(smollm2, emma_ids):
    """The evaluation speed-up (dequantize each sealed page once) changes no logit: same chunks and
    decode steps through both caches, bit for bit."""
    model = smollm2[0]
    cfg = OscarConfig(bits=2, k_group=32, v_group=32, page_size=32)
    ids = emma_ids[:, :110]
    a, b = OscarCache(model, cfg), nd._kept_restore_cache(model, cfg)
    with torch.inference_mode():  # a chunk over one page boundary, one over two, then decode steps
        for lo, hi in ((0, 40), (40, 100), *((i, i + 1) for i in range(100, 110))):
            la = model(ids[:, lo:hi], past_key_values=a, use_cache=True).logits
            lb = model(ids[:, lo:hi], past_key_values=b, use_cache=True).logits
            assert torch.equal(la, lb), (lo, hi)
    assert b.get_seq_length() == 110 and b.layers[0].sealed_k_tokens == 96


def test_generation_paths_agree_where_nothing_is_quantized(smollm2):
    """With no sealed page before the question, both prefill modes must give full precision's tokens."""
    model, tok = smollm2
    task = nd.NeedleTask(tok)
    p = task.build(140, 0.5, 0, NEW)  # 133 prompt tokens: fewer than one 256-token page
    cfg = OscarConfig(bits=2, page_size=256)
    full = nd.generate_full(model, p, NEW)
    assert nd.generate_quantized(model, p, cfg, NEW, "context") == full
    assert nd.generate_quantized(model, p, cfg, NEW, "position") == full
    with pytest.raises(nd.NeedleError, match="prefill must be one of context, position"):
        nd.generate_quantized(model, p, cfg, NEW, "exact")


def _main(capsys, *args):
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "needle", *args])
    out = capsys.readouterr()
    return e.value.code, out.err, out.out


@pytest.mark.parametrize("args, line", [
    (["--lengths", "1024", "9000"], "error: --lengths must be at most the model's context (8192 tokens, prompt + answer), got 9000"),
    (["--lengths", "50"], "error: --lengths must be at least 109 tokens for this prompt (70 tokens of instruction, needle "
     "and question, 32 of haystack, 7 generated), got 50"),
    (["--lengths", "120"], "error: --lengths must leave at least one sealed page (--page-size 128) before the question "
     "with --prefill context, got 120 (context of 101 tokens): nothing would be quantized"),
    (["--lengths", "0"], "error: --lengths must be a positive integer below 2^31, got 0"),
    (["--trials", "0"], "error: --trials must be a positive integer below 2^31, got 0"),
    (["--depths", "1.5"], "error: --depths must be numbers from 0 (haystack start) to 1 (its end), got 1.5"),
    (["--depths", "nan"], "error: --depths must be numbers from 0 (haystack start) to 1 (its end), got nan"),
    (["--lengths", "512", "512"], "error: --lengths must not repeat a value, got 512 512"),
    (["--depths", "0.5", "0.5"], "error: --depths must not repeat a value, got 0.5 0.5"),
    (["--bits", "3"], "error: --bits must be one of 2, 4, got 3"),
    (["--methods", "turbo"], "error: --methods must be one of 'kivi', 'oscar', 'rotation-only', 'scaling-only', got 'turbo'"),
    (["--prefill", "exact"], "error: --prefill must be one of 'context', 'position', got 'exact'"),
    (["--haystack", "bible"], "error: --haystack must be one of 'filler', 'text', got 'bible'"),
    (["--text", "/etc/hostname"], "error: --text is read only with --haystack text, got --haystack filler"),
    (["--haystack", "text", "--text", "/nonexistent.txt"], "error: --text must be a UTF-8 text file: /nonexistent.txt does not exist"),
    (["--server-only"], "error: --server-only needs at least one --server URL"),
    (["--page-size", "100"], "error: --page-size must be a positive multiple of --k-group (16), got 100: a page is sealed "
     "whole, and no key group may straddle a seal"),
    (["--png", "/missing-dir/n.png"], "error: --png must be a file in an existing folder, got /missing-dir/n.png "
     "(/missing-dir does not exist)"),
])
def test_bad_flags_fail_early_with_one_line(capsys, args, line):
    assert _main(capsys, *args) == (2, line + "\n", "")


def test_text_too_short_for_the_longest_length(capsys, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("It was the best of times, it was the worst of times. " * 100)
    code, err, _ = _main(capsys, "--haystack", "text", "--text", str(text), "--lengths", "1024", "4096")
    # 4096 - 7 generated - 70 of instruction, needle and question
    assert (code, err) == (2, f"error: --text must hold 4019 tokens of haystack for --lengths 4096: {text} has 1401\n")


def test_unreachable_server(capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err, _ = _main(capsys, "--server", f"http://127.0.0.1:{port}", "--lengths", "512")
    assert code == 2 and err.startswith(f"error: --server must be a running SGLang server, got http://127.0.0.1:{port}: "), err


def test_tiny_real_run_writes_json_and_png(tmp_path, capsys):
    out, png = tmp_path / "n.json", tmp_path / "n.png"
    assert cli.main(["eval", "needle", "--lengths", "256", "--depths", "0.2", "0.8", "--trials", "1", "--bits", "2",
                     "--methods", "oscar", "kivi", "--page-size", "64", "--json", str(out), "--png", str(png),
                     "--no-progress", "--threads", "1"]) == 0
    stdout = capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rep = json.loads(out.read_text())
    labels = [m["label"] for m in rep["methods"]]
    # the INT2 default format (page-grid ranges, min, clip values), labelled by how it differs from the paper's
    oscar = "INT2 oscar+min+clip-values+page-ranges"
    assert labels == ["full", oscar, "INT2 kivi"]
    bits = {m["label"]: m["effective_bits"] for m in rep["methods"]}
    # at 64-token pages its parameters cost what the paper's do (3.083 b): keys 1 + 0.5, values 0.5 bit per element
    assert bits == {"full": 32.0, oscar: pytest.approx(3.083, abs=1e-3), "INT2 kivi": 3.0}
    for lb in labels:  # every accuracy next to its effective bits, in the table too
        assert any(line.startswith(lb) and f"{bits[lb]:.3f}" in line for line in stdout.splitlines()), stdout
    acc = {r["label"]: r for r in rep["accuracy"]}
    assert all(acc[lb]["effective_bits"] == bits[lb] and acc[lb]["trials"] == 2 for lb in labels)
    assert len(rep["trial_results"]) == 2 and rep["prefill"] == "context" and rep["bos"] is False
    for t in rep["trial_results"]:
        assert t["correct"] == {lb: nd.score(t["outputs"][lb], t["passkey"]) for lb in labels}
    # Measured: full precision retrieves the key at 256 tokens (4 of 4 at depths 0.2 and 0.8).
    assert acc["full"]["retrieved"] == 2, rep["trial_results"]


def test_format_flags_give_one_method_each(smollm2):
    """`eval needle --key-ranges group page --offset ... --clip ...` runs every combination (as
    `eval ppl`), each a column labelled apart with its own effective bits."""
    args = cli.build_parser().parse_args(["eval", "needle", "--bits", "2", "--methods", "oscar", "--key-ranges", "group",
                                          "page", "--k-group", "16", "--v-group", "64", "--offset", "min", "--clip", "values"])
    configs = cli._configs(args)
    assert [c.label for c in configs] == ["oscar+min+clip-values", "oscar+min+clip-values+page-ranges"]
    methods = nd.methods_for(configs, smollm2[0])  # SmolLM2: 3 KV heads, head_dim 64
    assert [m.label for m in methods] == ["full", "INT2 oscar+min+clip-values", "INT2 oscar+min+clip-values+page-ranges"]
    assert [round(m.effective_bits, 3) for m in methods[1:]] == [3.333, 2.958]
