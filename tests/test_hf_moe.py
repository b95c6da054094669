"""Mixtral, Qwen2-MoE and Qwen3-MoE imported from tiny random transformers models (built and saved locally,
nothing is downloaded), `mithril-spec import hf --seq 16`. Their moe layers: SwiGLU experts, top-k gates
renormalised (Mixtral; Qwen2-MoE and Qwen3-MoE with norm_topk_prob) or not, dropless routing, Qwen2-MoE's
shared expert with its sigmoid gate; Qwen3-MoE's q/k norms.

Checkpoints in both layouts: what save_pretrained writes (one tensor per expert, `experts.N.w1.weight`, the
layout of transformers 4 checkpoints, which transformers 5 converts to on saving) and transformers 5's own
(its state dict: a layer's experts fused, `experts.gate_up_proj`, Mixtral's `block_sparse_moe` as `mlp`).
The programs' logits (`--steps 0 --init-params DIR --logits`) equal transformers' within 1e-4 (float32):
torch and jax on one device, with the experts split over `expert`, and on `tensor=2` (the experts' and the
shared expert's hidden features split, Megatron style in torch). An exported checkpoint loads in
transformers with the program's logits after 3 training steps. Config fields the import cannot honour are
E070 naming them.
"""

from __future__ import annotations

import functools
import json

import jax_runs as jr
import numpy as np
import pytest
import torch_runs as tr
from hf_models import import_spec, transformers_logits

from mithril_spec.cli import main as cli

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64, "num_experts_per_tok": 2}
MODELS = {  # name -> (config class, fields, model class)
    "mixtral": ("MixtralConfig", {"intermediate_size": 48, "num_local_experts": 4}, "MixtralForCausalLM"),
    "qwen2-moe": ("Qwen2MoeConfig", {"intermediate_size": 64, "moe_intermediate_size": 24, "num_experts": 4,
                                     "shared_expert_intermediate_size": 40}, "Qwen2MoeForCausalLM"),
    "qwen2-moe-norm": ("Qwen2MoeConfig", {"intermediate_size": 64, "moe_intermediate_size": 24, "num_experts": 4,
                                          "shared_expert_intermediate_size": 40, "norm_topk_prob": True,
                                          "num_experts_per_tok": 3}, "Qwen2MoeForCausalLM"),
    # Qwen3-MoE: Qwen3's attention (q/k norms), Qwen2-MoE's moe layer without the shared expert
    "qwen3-moe": ("Qwen3MoeConfig", {"intermediate_size": 64, "moe_intermediate_size": 24, "num_experts": 4,
                                     "head_dim": 16, "norm_topk_prob": True}, "Qwen3MoeForCausalLM"),
}


@functools.cache
def model(name: str, layout: str = "per-expert"):
    """(model directory, spec) of the tiny random model (memoised). `layout`: per-expert (save_pretrained) or
    fused (the model's own state dict, transformers 5's layout)."""
    config, fields, cls = MODELS[name]
    torch.manual_seed(0)
    directory = jr.WORK / "hf-moe" / f"{name}-{layout}"
    m = getattr(transformers, cls)(getattr(transformers, config)(**{**SMALL, **fields}))
    with torch.no_grad():  # norms away from one, every router and gate random (Qwen2-MoE's router starts at zero)
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith(("gate.weight", "shared_expert_gate.weight")):
                p.add_(0.5 * torch.randn_like(p))
    m.save_pretrained(directory)
    if layout == "fused":
        from safetensors.torch import save_file

        state = {k: v.contiguous() for k, v in m.state_dict().items()}
        assert any(k.endswith("experts.gate_up_proj") for k in state)
        (directory / "model.safetensors").unlink()
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory, import_spec(directory, jr.WORK / "hf-moe" / f"{name}.yaml")


def reference(name: str, directory=None) -> np.ndarray:
    default, spec = model(name)
    return transformers_logits(MODELS[name][2], directory or default, spec)


def test_the_layouts_are_the_ones_described():
    from safetensors import safe_open

    keys = {}
    for layout in ("per-expert", "fused"):
        with safe_open(str(model("mixtral", layout)[0] / "model.safetensors"), "np") as f:
            keys[layout] = set(f.keys())
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in keys["per-expert"]
    assert "model.layers.0.block_sparse_moe.gate.weight" in keys["per-expert"]
    assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.gate.weight"} <= keys["fused"]
    assert not any("block_sparse_moe" in k for k in keys["fused"])
    mixtral = model("mixtral")[1].read_text()
    assert ("{op: moe, name: block_sparse_moe, experts: experts, top_k: top_k, hidden: ff, activation: swiglu, "
            "normalize_gates: true, dropless: true, aux_loss_weight: 0.0}") in mixtral
    qwen = model("qwen2-moe")[1].read_text()
    assert "normalize_gates: false" in qwen and "shared_hidden: shared_ff, shared_gate: true" in qwen
    assert "bias: qkv" in qwen and "normalize_gates: true" in model("qwen2-moe-norm")[1].read_text()
    qwen3 = model("qwen3-moe")[1].read_text()
    assert "qk_norm: true" in qwen3 and "normalize_gates: true" in qwen3 and "shared" not in qwen3


CASES = [(name, layout, runs, mesh) for name in MODELS for layout in ("per-expert", "fused") for runs in (tr, jr)
         for mesh in ("data=1", "data=2,expert=2", "tensor=2")]


@pytest.mark.slow
@pytest.mark.parametrize("name, layout, runs, mesh", CASES,
                         ids=[f"{n}-{la}-{r.__name__[:-5]}-{m}" for n, la, r, m in CASES])
def test_logits_equal_transformers(name, layout, runs, mesh):
    directory, spec = model(name, layout)
    out = jr.WORK / "hf-moe" / f"{name}-{layout}-{runs.__name__}-{mesh.replace('=', '').replace(',', '')}.npy"
    program = runs.build(spec, mesh)
    if mesh == "tensor=2":  # the experts' (and the shared expert's) hidden features split, as planned
        layers = json.loads((program / "plan.json").read_text())["repeats"][0]["params"]
        split = {p["name"]: p["layout"] for p in layers if ".experts." in p["name"] or ".shared." in p["name"]}
        assert split and all(["tensor"] in layout for layout in split.values()), split
    runs.run(program, "--steps", "0", "--init-params", str(directory), "--logits", str(out))
    d = float(np.abs(np.load(out) - reference(name)).max())
    jr.report(f"hf {name} ({layout}) {runs.__name__} {mesh}: logits vs transformers", max_abs=d)
    assert d < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("runs, mesh", [(tr, "data=2,expert=2"), (jr, "data=2,expert=2"), (tr, "tensor=2")],
                         ids=["torch", "jax", "torch-tensor2"])
@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe"])
def test_trains_and_exports_a_checkpoint_transformers_loads(runs, mesh, name):
    """3 steps from the (fused) checkpoint with the experts split over `expert` (or, torch, their hidden
    features over `tensor`); the export (one tensor per expert) loads in transformers with the program's
    logits."""
    directory, spec = model(name, "fused")
    tag = f"{name}-{runs.__name__}-{mesh.replace('=', '').replace(',', '')}"
    export, after = jr.WORK / "hf-moe" / f"{tag}-export", jr.WORK / "hf-moe" / f"{tag}-after.npy"
    runs.run(runs.build(spec, mesh), "--steps", "3", "--init-params", str(directory), "--export-hf", str(export),
             "--logits", str(after))
    _, info = getattr(transformers, MODELS[name][2]).from_pretrained(export, output_loading_info=True)
    assert not any(info.values()), info
    d = float(np.abs(np.load(after) - reference(name, export)).max())
    moved = float(np.abs(np.load(after) - reference(name)).max())
    written = json.loads((export / "config.json").read_text())
    assert written["architectures"] == [MODELS[name][2]]
    jr.report(f"hf {tag} {mesh}: after 3 steps, export vs program", max_abs=d, moved=moved)
    assert d < 1e-4 and moved > 1e-3


@pytest.mark.parametrize("name, field, value", [
    ("mixtral", "router_jitter_noise", 0.1),
    ("mixtral", "output_router_logits", True),
    ("qwen2-moe", "output_router_logits", True),
    ("qwen2-moe", "decoder_sparse_step", 2),
    ("qwen2-moe", "mlp_only_layers", [1]),
    ("qwen2-moe", "use_sliding_window", True),
    ("qwen3-moe", "decoder_sparse_step", 2),
    ("qwen3-moe", "output_router_logits", True),
])
def test_fields_that_change_the_model_are_refused(tmp_path, capsys, name, field, value):
    directory, _ = model(name)
    config = json.loads((directory / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, field: value}, indent=1))
    rc = cli(["import", "hf", str(path), "-o", "-", "--seq", "16", "--format", "json"])
    diags = json.loads(capsys.readouterr().out)
    assert rc == 1 and [d["code"] for d in diags] == ["E070"] and field in diags[0]["message"], diags


@pytest.mark.parametrize("name", ["qwen2-moe", "qwen3-moe"])
def test_transformers_4_config_imports_alike(tmp_path, name):
    """A transformers 4 config (top-level rope_theta, no qkv_bias, no layer_types, Qwen3-MoE's num_experts for
    num_local_experts) gives the same model."""
    directory, spec = model(name)
    config = json.loads((directory / "config.json").read_text())
    theta = config.pop("rope_parameters")["rope_theta"]
    for key in ("qkv_bias", "layer_types"):
        config.pop(key, None)
    if "num_local_experts" in config:
        config["num_experts"] = config.pop("num_local_experts")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "rope_theta": theta, "rope_scaling": None, "transformers_version": "4.51.0"}))
    out = tmp_path / "old.yaml"
    assert cli(["import", "hf", str(path), "-o", str(out), "--seq", "16"]) == 0
    model_part = lambda t: t[t.index("dims:"):t.index("hf:")]  # noqa: E731
    assert model_part(out.read_text()) == model_part(spec.read_text().replace("lr: 1.0e-2", "lr: 2.0e-5"))
