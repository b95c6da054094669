"""What the tests of imported Hugging Face models share: the spec `import hf` writes for a model directory, and
transformers' logits for the tests' synthetic samples of that spec (the reference the programs' logits are
compared with)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_jax_program import synthetic_samples

from mithril_spec.cli import main as cli


def import_spec(directory: Path, spec: Path) -> Path:
    """`import hf DIRECTORY -o SPEC --seq 16`, with a learning rate that moves a tiny model in a few steps."""
    assert cli(["import", "hf", str(directory), "-o", str(spec), "--seq", "16"]) == 0
    spec.write_text(spec.read_text().replace("lr: 2.0e-5", "lr: 1.0e-2"))
    return spec


def transformers_logits(model_class: str, directory: Path, spec: Path, samples: int = 8) -> np.ndarray:
    """The logits transformers' `model_class` loaded from `directory` gives for the first `samples` synthetic
    samples of `spec`, float32."""
    import torch
    import transformers

    tokens = synthetic_samples(spec, samples)["tokens"]
    m = getattr(transformers, model_class).from_pretrained(directory).eval()
    with torch.no_grad():
        return m(input_ids=torch.tensor(tokens).long()).logits.float().numpy()
