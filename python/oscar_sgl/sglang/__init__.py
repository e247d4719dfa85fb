"""The SGLang glue of OScaR: the only place in `oscar_sgl` that imports `sglang`, always lazily.

- `plugin.register` — the `sglang.srt.plugins` entry point: adds `--kv-cache {default,oscar}` and
  the `--oscar-*` flags to `python -m sglang.launch_server`, and registers the hooks below.
- `validate` — startup checks (flags, then the model) with messages that name the problem.
- `pool.OscarKVPool` — packed INT2/INT4 codes + fp16 params + fp32 token scales per page, BF16
  staging for open pages (docs/LAYOUT.md, paged).
- `backend.OscarAttnBackend` — the `oscar` attention backend (torch reference on CPU).
- `metrics` — compression ratio, pages by state, seals and staging use, per TP rank, as of after
  the last step.

Importing this package imports nothing from SGLang or torch.
"""
