"""Why rotation hurts some heads, and whether the weights tell which (issue 15, item 3).

For one window of a text (BOS prepended when the tokenizer adds one) this records the post-RoPE
queries and keys of every layer, then per (layer, KV head):

- rho: `oscar_sgl.reference.qk_channel_alignment`, from the weights only;
- the query-weighted INT2 key error, rotated / unrotated: sum_c E[q_c^2] * E[range_c^2] over
  `k_group`-token groups, with and without the Walsh-Hadamard rotation of q and k (> 1: rotation hurts);
- the plain key MSE ratio rotated / unrotated (rotation changes the total error little: where it
  hurts, it moves the error onto the channels the queries read);
- the attention-output relative error at INT2 (K and V quantized, all tokens, causal, window
  respected) of kivi, oscar with every head rotated, and oscar with the rule's choice.

    python benches/quality/key_rotation_rule.py --model gemma-3-270m > benches/results/key_rotation_rule_gemma.txt
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from oscar_sgl import model as models
from oscar_sgl import reference as ref
from oscar_sgl.config import OscarConfig

G = 32


def _record(model, ids):
    rec = {}

    def record(module, query, key, value, attention_mask, **kw):
        rec[module.layer_idx] = (query[0].float(), key[0].float(), value[0].float(), kw.get("scaling"), kw.get("sliding_window"))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("oscar_record", record)
    model.set_attn_implementation("oscar_record")
    with torch.inference_mode():
        model(ids, past_key_values=DynamicCache(), use_cache=True)
    model.set_attn_implementation("sdpa")
    return rec


def _qdq_k(k, rotate, scale, bits=2):
    x = ref.hadamard(k) if rotate else k
    s = x.norm(dim=-1, keepdim=True).clamp_min(1e-12) if scale else torch.ones(x.shape[0], 1)
    t, d = x.shape
    q, sc, off = ref.quantize_groups((x / s).reshape(t // G, G, d), bits, dim=1)
    y = (q.float() * sc.float() + off.float()).reshape(t, d) * s
    return ref.hadamard(y) if rotate else y


def _qdq_v(v, rotate, bits=2):
    x = ref.hadamard(v) if rotate else v
    t, d = x.shape
    q, sc, off = ref.quantize_groups(x.reshape(t, d // G, G), bits, dim=2)
    y = (q.float() * sc.float() + off.float()).reshape(t, d)
    return ref.hadamard(y) if rotate else y


def _attn(q, k, v, scaling, window, q0):
    t = k.shape[0]
    lg = torch.einsum("gtd,nd->gtn", q[:, q0:], k) * scaling
    pq, pk = torch.arange(q0, t)[:, None], torch.arange(t)[None]
    m = pk <= pq
    if window:
        m &= pk > pq - window
    return torch.softmax(lg.masked_fill(~m, float("-inf")), -1) @ v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--text", type=Path, default=Path("/work/shared/eval-data/austen_emma.txt"))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-alignment", type=float, default=None,
                    help="the rule's threshold on rho, OscarConfig.key_rotation_min_alignment (default: its default)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = models.load(args.model)
    ids = tok(args.text.read_text(encoding="utf-8"), return_tensors="pt").input_ids[:, : args.tokens]
    rec = _record(model, ids)
    rho = ref.qk_channel_alignment(model)
    cfg = OscarConfig() if args.min_alignment is None else OscarConfig(key_rotation_min_alignment=args.min_alignment)
    plan = ref.key_rotation_plan(model, cfg)
    print(f"model {args.model}, {args.text.name}, first {ids.shape[1]} tokens (BOS: {ids[0, 0].item() == tok.bos_token_id}); "
          f"INT2, k_group = v_group = {G}; rule: rotate keys where rho >= {cfg.key_rotation_min_alignment}")
    print(f"{'layer':>5} {'head':>4} {'window':>6} {'rho':>6} {'rotate':>6} | {'qw-err rot/raw':>14} {'mse rot/raw':>11} | "
          f"{'out-err kivi':>12} {'oscar-all':>9} {'oscar-rule':>10}")
    pts = []
    for layer in sorted(rec):
        q, k, v, scaling, window = rec[layer]
        h, hq = k.shape[0], q.shape[0]
        g = hq // h
        for i in range(h):
            kk, vv, qq = k[i], v[i], q[i * g:(i + 1) * g]
            t = (kk.shape[0] // G) * G
            kk, vv, qq = kk[:t], vv[:t], qq[:, :t]

            def qw(x, qx):
                r = (x.reshape(t // G, G, -1).amax(1) - x.reshape(t // G, G, -1).amin(1)).pow(2).mean(0)
                return (qx.reshape(-1, x.shape[1]).pow(2).mean(0) * r).sum().item(), r.sum().item()

            a_rot, m_rot = qw(ref.hadamard(kk), ref.hadamard(qq))
            a_raw, m_raw = qw(kk, qq)
            exact = _attn(qq, kk, vv, scaling, window, 256)

            def err(k2, v2):
                return ((_attn(qq, k2, v2, scaling, window, 256) - exact).norm() / exact.norm()).item()

            e_kivi = err(_qdq_k(kk, False, False), _qdq_v(vv, False))
            e_all = err(_qdq_k(kk, True, True), _qdq_v(vv, True))
            e_rule = err(_qdq_k(kk, plan[layer][i], ref.scales_tokens(cfg, plan[layer])),
                         _qdq_v(vv, ref.rotates_values(cfg, plan[layer])))
            pts.append((rho[layer][i], a_rot / a_raw))
            print(f"{layer:>5} {i:>4} {str(window or '-'):>6} {rho[layer][i]:>6.3f} {str(plan[layer][i]):>6} | "
                  f"{a_rot / a_raw:>14.3f} {m_rot / m_raw:>11.3f} | {e_kivi:>12.3f} {e_all:>9.3f} {e_rule:>10.3f}")
    x = torch.tensor([[math.log(a), math.log(b)] for a, b in pts])
    print(f"correlation of log(rho) with log(query-weighted error rotated/unrotated): {torch.corrcoef(x.T)[0, 1].item():.3f} "
          f"over {len(pts)} heads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
