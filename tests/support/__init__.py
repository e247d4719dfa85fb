"""Helpers shared by test modules (no tests here): `kernel_data` builds the pools and reference
outputs of the Triton kernel tests; `models` says whether the second real model (gemma-3-270m) is
installed. The SGLang harnesses live in `sglang_support`."""
