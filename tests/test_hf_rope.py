"""Rope settings of imported Hugging Face models, in both config layouts (transformers 5's
`rope_parameters`, transformers 4's top-level `rope_theta` / `rope_scaling`).

A tiny random Llama of each rope setting, built and saved locally by transformers (nothing is downloaded),
imported with `mithril-spec import hf`: the programs' logits (`--steps 0 --init-params DIR --logits`) equal
transformers' within 1e-4 (float32), for torch and jax, on one device and with tensor=2.
"""

from __future__ import annotations

import functools
import json

import jax_runs as jr
import numpy as np
import pytest
import torch_runs as tr
from test_jax_program import synthetic_samples

from mithril_spec.cli import main as cli

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
ROPES = {  # name -> rope_parameters (transformers 5)
    "theta": {"rope_type": "default", "rope_theta": 500000.0},
}


def legacy(config: dict) -> dict:
    """The transformers-4 layout of a transformers-5 config.json: top-level rope_theta and rope_scaling."""
    config = dict(config)
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    return config


@functools.cache
def model(name: str, layout: str = "v5"):
    """(model directory, spec) of the tiny Llama with rope `name`, its config.json in `layout` (memoised)."""
    torch.manual_seed(0)
    directory = jr.WORK / "hf-rope" / f"{name}-{layout}"
    config = transformers.LlamaConfig(**SMALL, rope_parameters=dict(ROPES[name]))
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    if layout == "v4":
        path = directory / "config.json"
        path.write_text(json.dumps(legacy(json.loads(path.read_text())), indent=2))
    spec = jr.WORK / "hf-rope" / f"{name}-{layout}.yaml"
    assert cli(["import", "hf", str(directory), "-o", str(spec), "--seq", "16"]) == 0
    return directory, spec


def reference(name: str, layout: str = "v5") -> np.ndarray:
    directory, spec = model(name, layout)
    samples = synthetic_samples(spec, 8)
    m = transformers.LlamaForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return m(input_ids=torch.tensor(samples["tokens"]).long()).logits.float().numpy()


def test_both_layouts_import_the_same_model():
    for name in ROPES:
        specs = [model(name, layout)[1].read_text() for layout in ("v5", "v4")]
        attn = [next(line for line in s.splitlines() if "op: attention" in line) for s in specs]
        assert attn[0] == attn[1], name
    assert "rotary_base: 500000.0" in model("theta")[1].read_text()
    # transformers reads both layouts as the same model
    assert float(np.abs(reference("theta", "v4") - reference("theta", "v5")).max()) == 0


CASES = [(name, runs, mesh) for name in ROPES for runs in (tr, jr) for mesh in ("data=1", "tensor=2")]


@pytest.mark.slow
@pytest.mark.parametrize("name, runs, mesh", CASES, ids=[f"{n}-{r.__name__[:-5]}-{m}" for n, r, m in CASES])
def test_logits_equal_transformers(name, runs, mesh):
    directory, spec = model(name)
    out = jr.WORK / "hf-rope" / f"{name}-{runs.__name__}-{mesh.replace('=', '')}.npy"
    runs.run(runs.build(spec, mesh), "--steps", "0", "--init-params", str(directory), "--logits", str(out))
    d = float(np.abs(np.load(out) - reference(name)).max())
    jr.report(f"hf rope {name} {runs.__name__} {mesh}: logits vs transformers", max_abs=d)
    assert d < 1e-4
