"""Helpers shared by test modules (no tests here): `kernel_data` builds the pools and reference
outputs of the Triton kernel tests. The SGLang harnesses live in `sglang_support`."""
