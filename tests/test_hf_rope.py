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
import mlx_runs as mr
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
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
}


def legacy(config: dict) -> dict:
    """The transformers-4 layout of a transformers-5 config.json: top-level rope_theta and rope_scaling."""
    config = dict(config)
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    return config


@functools.cache
def model(name: str, layout: str):
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
    assert "rotary_base: 500000.0" in model("theta", "v5")[1].read_text()
    assert "rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, " \
        "original_max_position_embeddings: 16}" in model("llama3", "v4")[1].read_text()
    assert "rope_scaling: {type: linear, factor: 4.0}" in model("linear", "v4")[1].read_text()
    # transformers reads both layouts as the same model
    for name in ROPES:
        assert float(np.abs(reference(name, "v4") - reference(name, "v5")).max()) == 0, name


@pytest.mark.parametrize("name", [n for n in ROPES if n != "theta"])
def test_scaled_frequencies_are_transformers(name):
    """The attention's rope_scaling gives transformers' inverse frequencies (and changes them)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mithril_spec.ops.attention import rope_inv_freq

    config = transformers.LlamaConfig(**SMALL, rope_parameters=dict(ROPES[name]))
    expected, factor = ROPE_INIT_FUNCTIONS[name](config, "cpu")
    scaling = {"type": name, **{k: v for k, v in ROPES[name].items() if k not in ("rope_type", "rope_theta")}}
    ours = np.array(rope_inv_freq(10000.0, 8, scaling))
    assert factor == 1.0 and np.allclose(ours, expected.numpy(), rtol=1e-6, atol=0)
    assert not np.allclose(ours, rope_inv_freq(10000.0, 8), rtol=1e-3)


CASES = [(name, runs, mesh) for name in ROPES for runs in (tr, jr) for mesh in ("data=1", "tensor=2")]
CASES += [(name, mr, "data=1") for name in ("llama3", "linear")]


@pytest.mark.slow
@pytest.mark.parametrize("name, runs, mesh", CASES, ids=[f"{n}-{r.__name__[:-5]}-{m}" for n, r, m in CASES])
def test_logits_equal_transformers(name, runs, mesh):
    directory, spec = model(name, "v5")
    out = jr.WORK / "hf-rope" / f"{name}-{runs.__name__}-{mesh.replace('=', '')}.npy"
    program = runs.build(spec, mesh)
    (jr if runs is mr else runs).run(program, "--steps", "0", "--init-params", str(directory), "--logits", str(out))
    d = float(np.abs(np.load(out) - reference(name)).max())
    jr.report(f"hf rope {name} {runs.__name__} {mesh}: logits vs transformers", max_abs=d)
    assert d < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["v4", "v5"])
def test_export_writes_the_rope_settings_back(layout):
    """The transformers-4 layout's model through the torch program (tensor=2): logits equal transformers',
    and --export-hf writes config.json with the same rope settings, which transformers loads as the model."""
    directory, spec = model("llama3", layout)
    export = jr.WORK / "hf-rope" / f"llama3-{layout}-export"
    out = jr.WORK / "hf-rope" / f"llama3-{layout}-export.npy"
    tr.run(tr.build(spec, "tensor=2"), "--steps", "0", "--init-params", str(directory), "--export-hf", str(export),
           "--logits", str(out))
    d = float(np.abs(np.load(out) - reference("llama3", layout)).max())
    jr.report(f"hf rope llama3 ({layout} layout) torch tensor=2: logits vs transformers", max_abs=d)
    assert d < 1e-4
    original, written = (json.loads((p / "config.json").read_text()) for p in (directory, export))
    for key in ("rope_parameters", "rope_theta", "rope_scaling"):
        assert written.get(key) == original.get(key), key
    m = transformers.LlamaForCausalLM.from_pretrained(export).eval()
    samples = synthetic_samples(spec, 8)
    with torch.no_grad():
        again = m(input_ids=torch.tensor(samples["tokens"]).long()).logits.float().numpy()
    assert float(np.abs(again - np.load(out)).max()) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("runs", [tr, jr], ids=["torch", "jax"])
def test_generate_decodes_with_the_scaled_rope(runs):
    """generate.py's cached decode of the llama3-scaled model equals the training forward pass (--check)."""
    from test_generate import _generate

    directory, spec = model("llama3", "v5")
    program = runs.build(spec, "data=1")
    params = jr.WORK / "hf-rope" / f"llama3-{runs.__name__}.safetensors"
    runs.run(program, "--steps", "0", "--init-params", str(directory), "--export-params", str(params), export=False)
    got = _generate("jax" if runs is jr else "torch", program,
                    ("--params", str(params), "--prompt-ids", "1,2,3", "--temperature", "0", "--check", "--json"))
    assert got["rc"] == 0, got["stderr"][-3000:]
    check = got["json"]["check"]
    assert check["argmax_differs"] == [] and check["max_abs_diff"] < 1e-4, check
    jr.report(f"hf rope llama3 {runs.__name__} generate --check", max_abs=check["max_abs_diff"])


def test_rope_scaling_needs_rotary(capsys):
    from mithril_spec.frontend import compile_file

    _, spec = model("linear", "v5")
    bad = jr.spec_variant(spec, (("rotary: true", "rotary: false"),))
    with pytest.raises(Exception) as e:
        compile_file(bad)
    assert "E030" in str(getattr(e.value, "diagnostics", e.value)) and "rope_scaling" in str(
        getattr(e.value, "diagnostics", e.value))
