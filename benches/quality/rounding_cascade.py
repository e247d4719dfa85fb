"""Why the server's reference path computes prefill page by page with fixed shapes (issue 20):
two chunkings with the same attention semantics (page-aligned chunks of 32, 16 and 8 tokens
through `OscarCache`, each token over the codes of the pages below its own and its page exactly)
differ only in fp32 rounding (matmul shapes); INT2/INT4 rounding turns that into flipped codes
whose effect grows layer after layer. BF16 (no quantization) shows the rounding alone.

    .venv/bin/python benches/quality/rounding_cascade.py    # SmolLM2, 500 tokens of the packaged Emma text
"""

from __future__ import annotations

from importlib.resources import files

import torch
from transformers import DynamicCache

from oscar_sgl import OscarCache, OscarConfig
from oscar_sgl import model as models


def main() -> None:
    torch.set_num_threads(1)
    model, tok = models.load(str(models.convert_default()))
    text = files("oscar_sgl.data").joinpath("emma_opening.txt").read_text()
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids[:500]])

    def run(cache, step):
        outs = []
        with torch.inference_mode():
            for a in range(0, ids.shape[1], step):
                outs.append(model(ids[:, a:a + step], past_key_values=cache).logits[0].float())
        return torch.log_softmax(torch.cat(outs), -1)

    for name, mk in [("BF16 (fp32, DynamicCache)", lambda: DynamicCache(config=model.config)),
                     ("OScaR INT2", lambda: OscarCache(model, OscarConfig(bits=2, k_group=32, v_group=32, page_size=32))),
                     ("OScaR INT4", lambda: OscarCache(model, OscarConfig(bits=4, k_group=32, v_group=32, page_size=32)))]:
        a, b, c = run(mk(), 32), run(mk(), 16), run(mk(), 8)
        print(f"{name}: max |delta log-prob| over all 500 positions, chunks 32 vs 16: {(a - b).abs().max().item():.2e}; "
              f"last token, 32 vs 16: {(a[-1] - b[-1]).abs().max().item():.2e}, 32 vs 8: {(a[-1] - c[-1]).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
