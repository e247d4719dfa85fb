"""What `--oscar-prefill position` (the default) costs against `exact` and BF16 (issue 20), on CPU.

One window of real text (SmolLM2-135M-Instruct, fp32), OScaR INT2 and INT4 with the server's pages:

1. Prompt tokens, through `OscarCache`: every token of the window scored by the logits its prefill
   computes. BF16 (exact attention, `DynamicCache`); position (page-aligned chunks: each token over
   the codes of the pages below its own page and its page exactly, what the server computes
   whatever its chunking); exact with the server's 256-token chunks (each token over the codes of
   the pages before its chunk and its chunk exactly, what `--oscar-prefill exact
   --chunked-prefill-size 256` computes for a cold prompt). (Exact prefill of the whole window in
   one chunk is BF16 attention: 0 difference by construction.)
2. The continuation: the first `--prefix` tokens prefilled in each mode (position: page chunks;
   exact: one chunk, then sealed), then the next `--score` tokens scored page by page (decode
   semantics, as `oscar-sgl eval ppl`): what the prefill mode leaves in the cache for generation.
3. Through the CPU server (`--server`): the same window's input-token log-probs
   (`logprob_start_len=0`, top-`K` log-probs) from `--kv-cache default`, `oscar` (position) and
   `oscar --oscar-prefill exact` at `--chunked-prefill-size 256`: delta PPL, top-1 agreement and a
   lower bound of KL(BF16 || server) from the top-K tokens plus one bucket for the rest.

ΔPPL and KL are against BF16, with the effective bits of each config. Writes JSON + a markdown table.

    .venv/bin/python benches/quality/prefill_modes.py --text ../shared/eval-data/austen_persuasion.txt \
        --tokens 2048 --prefix 1536 --score 512 --server --out benches/results/determinism_quality
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from oscar_sgl import OscarCache, OscarConfig
from oscar_sgl import model as models
from oscar_sgl.evaluate import chunk_bounds, position_logits, tokenize


def _lp(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def _stats(lp: torch.Tensor, base: torch.Tensor, targets: torch.Tensor) -> dict:
    nll = -lp.gather(1, targets[:, None]).mean().item()
    base_nll = -base.gather(1, targets[:, None]).mean().item()
    return {"ppl": math.exp(nll), "delta_ppl_pct": 100 * (math.exp(nll - base_nll) - 1),
            "kl": (base.exp() * (base - lp)).sum(-1).mean().item(),
            "top1": (lp.argmax(-1) == base.argmax(-1)).float().mean().item()}


def prompt_part(model, ids, cfg, chunk: int) -> dict:
    """Log-probs of every window token predicting the next, per mode."""
    from transformers import DynamicCache

    with torch.inference_mode():
        base = _lp(model(ids, past_key_values=DynamicCache(config=model.config)).logits[0])
        pos = _lp(position_logits(model, ids, OscarCache(model, cfg)))
        cache, outs = OscarCache(model, cfg), []
        for a in range(0, ids.shape[1], chunk):
            outs.append(model(ids[:, a:a + chunk], past_key_values=cache).logits[0])
        exact = _lp(torch.cat(outs))
    t = ids[0, 1:]
    return {"bf16_ppl": math.exp(-base[:-1].gather(1, t[:, None]).mean().item()),
            "position": _stats(pos[:-1], base[:-1], t), f"exact_chunk{chunk}": _stats(exact[:-1], base[:-1], t),
            "position_vs_exact": (exact[:-1].exp() * (exact[:-1] - pos[:-1])).sum(-1).mean().item()}


def continuation_part(model, ids, cfg, prefix: int) -> dict:
    """The tokens after a `prefix`-token prompt, scored page by page, per prefill mode."""
    from transformers import DynamicCache

    def score(cache) -> torch.Tensor:
        outs = []
        with torch.inference_mode():
            for a, b in chunk_bounds(prefix, ids.shape[1] - 1, getattr(cache, "cfg", None)):
                outs.append(model(ids[:, a:b], past_key_values=cache).logits[0])
        return _lp(torch.cat(outs))

    res = {}
    with torch.inference_mode():
        bf16 = DynamicCache(config=model.config)
        first_b = model(ids[:, :prefix], past_key_values=bf16).logits[0, -1:]
        base = torch.cat((_lp(first_b), score(bf16)))
        c_pos = OscarCache(model, cfg)
        first_p = position_logits(model, ids[:, :prefix], c_pos)[-1:]
        c_ex = OscarCache(model, cfg)
        first_e = model(ids[:, :prefix], past_key_values=c_ex).logits[0, -1:]
        c_ex.flush()
        t = ids[0, prefix:]
        res["position"] = _stats(torch.cat((_lp(first_p), score(c_pos))), base, t)
        res["exact"] = _stats(torch.cat((_lp(first_e), score(c_ex))), base, t)
    res["bf16_ppl"] = math.exp(-base.gather(1, t[:, None]).mean().item())
    return res


def server_part(path: str, ids: list[int], bits: int, page: int, top_k: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from sglang_support.harness import launch

    oscar = ("--kv-cache", "oscar", "--oscar-bits", str(bits), "--oscar-page-size", str(page), "--oscar-k-group", "32")
    runs = {"bf16": ("--attention-backend", "torch_native", "--page-size", str(page)),
            "position": oscar, "exact": oscar + ("--oscar-prefill", "exact")}
    got = {}
    for name, args in runs.items():
        with launch(path, *args, "--chunked-prefill-size", "256", max_total_tokens=8192) as s:
            r = s.post("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                                     "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": top_k})
            m = r["meta_info"]
            # position 0 has no log-prob (nothing predicts it): SGLang gives None there
            got[name] = ([t[0] for t in m["input_token_logprobs"]][1:],
                         [{t[1]: t[0] for t in (tops or [])} for tops in m["input_top_logprobs"]][1:])
    res = {}
    base_lp, base_top = got["bf16"]
    for name in ("position", "exact"):
        lp, top = got[name]
        kl, agree = [], 0
        for bt, ot in zip(base_top, top):
            # KL lower bound on the top-K of BF16 (+ one bucket for the rest of the mass)
            lo = min(ot.values())
            p = {t: math.exp(v) for t, v in bt.items()}
            q = {t: math.exp(ot.get(t, lo)) for t in bt}
            rest_p, rest_q = max(1e-12, 1 - sum(p.values())), max(1e-12, 1 - sum(q.values()))
            kl.append(sum(pv * math.log(pv / max(q[t], 1e-12)) for t, pv in p.items()) + rest_p * math.log(rest_p / rest_q))
            agree += max(bt, key=bt.get) == max(ot, key=ot.get)
        n = len(lp)
        res[name] = {"ppl": math.exp(-sum(lp) / n), "delta_ppl_pct": 100 * (math.exp((sum(base_lp) - sum(lp)) / n) - 1),
                     "kl_lower_bound": sum(kl) / n, "top1": agree / n}
    res["bf16_ppl"] = math.exp(-sum(base_lp) / len(base_lp))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--prefix", type=int, default=1536)
    ap.add_argument("--score", type=int, default=512)
    ap.add_argument("--page", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--bits", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--server", action="store_true", help="also through the CPU server (INT2 only)")
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--out", required=True, help="output path without extension (.json and .md)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    path = str(models.convert_default())
    model, tok = models.load(path)
    text = Path(a.text).read_text()
    ids = tokenize(tok, text, a.tokens, a.text)
    ids_c = tokenize(tok, text, a.prefix + a.score, a.text)
    h, d = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
    out = {"text": a.text, "tokens": a.tokens, "page": a.page, "chunk": a.chunk, "prefix": a.prefix, "score": a.score,
           "configs": {}}
    for bits in a.bits:
        cfg = OscarConfig(bits=bits, k_group=32, v_group=32, page_size=a.page)
        row = {"effective_bits": cfg.effective_bits(h, d), "prompt": prompt_part(model, ids, cfg, a.chunk),
               "continuation": continuation_part(model, ids_c, cfg, a.prefix)}
        out["configs"][f"int{bits}"] = row
        Path(a.out + ".json").write_text(json.dumps(out, indent=1))  # kept if a later part fails
        if a.server and bits == 2:
            row["server"] = server_part(path, ids[0].tolist(), bits, a.page, a.top_k)
        print(json.dumps({f"int{bits}": row}, indent=1), flush=True)
    Path(a.out + ".json").write_text(json.dumps(out, indent=1))
    lines = [f"Text `{Path(a.text).name}`, SmolLM2-135M-Instruct fp32, pages of {a.page}, K/V groups 32; "
             f"prompt: {a.tokens} tokens; continuation: prefix {a.prefix}, {a.score} scored.", "",
             "| bits (eff.) | part | mode | PPL | ΔPPL % vs BF16 | KL vs BF16 | top-1 vs BF16 |", "|---|---|---|---|---|---|---|"]
    for name, row in out["configs"].items():
        eb = f"{name[3:]} ({row['effective_bits']:.2f})"
        pr = row["prompt"]
        lines.append(f"| {eb} | prompt | BF16 | {pr['bf16_ppl']:.3f} | 0 | 0 | 1 |")
        for mode in ("position", f"exact_chunk{a.chunk}"):
            s = pr[mode]
            lines.append(f"| {eb} | prompt | {mode} | {s['ppl']:.3f} | {s['delta_ppl_pct']:+.2f} | {s['kl']:.4f} | {s['top1']:.3f} |")
        co = row["continuation"]
        lines.append(f"| {eb} | continuation | BF16 | {co['bf16_ppl']:.3f} | 0 | 0 | 1 |")
        for mode in ("position", "exact"):
            s = co[mode]
            lines.append(f"| {eb} | continuation | {mode} | {s['ppl']:.3f} | {s['delta_ppl_pct']:+.2f} | {s['kl']:.4f} | {s['top1']:.3f} |")
        if "server" in row:
            sv = row["server"]
            lines.append(f"| {eb} | server prompt (chunks of 256) | BF16 | {sv['bf16_ppl']:.3f} | 0 | 0 | 1 |")
            for mode in ("position", "exact"):
                s = sv[mode]
                lines.append(f"| {eb} | server prompt (chunks of 256) | {mode} | {s['ppl']:.3f} | {s['delta_ppl_pct']:+.2f} | "
                             f">= {s['kl_lower_bound']:.4f} (top-{a.top_k}) | {s['top1']:.3f} |")
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
