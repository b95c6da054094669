"""Qwen3, Qwen2.5 and Mistral (sliding window) imported from tiny random transformers models.

Each model is built and saved locally by transformers (nothing is downloaded), imported with `mithril-spec
import hf --seq 16`; the programs' logits (`--steps 0 --init-params DIR --logits`) equal transformers' within
1e-4 (float32): torch on one device and with tensor=2, jax with tensor=2, mlx on one device. Qwen3's q/k norms are the
attention's qk_norm; a tensor=2 torch run trains 3 steps and exports a checkpoint transformers loads with
the program's logits (the norms' gradients summed over the heads' ranks).
"""

from __future__ import annotations

import functools
import json

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
import torch_runs as tr
from hf_models import import_spec, transformers_logits
from test_jax_program import synthetic_samples

from mithril_spec.cli import main as cli

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
FAMILIES = {  # name -> (config class, fields, model class)
    "qwen3": ("Qwen3Config", {"head_dim": 16}, "Qwen3ForCausalLM"),
    "qwen3-bias-tied": ("Qwen3Config", {"head_dim": 8, "attention_bias": True, "tie_word_embeddings": True,
                                        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                        "Qwen3ForCausalLM"),
    # Qwen2.5: the qwen2 family with its q/k/v biases, tied embeddings, a window it does not use
    "qwen2.5": ("Qwen2Config", {"tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 8,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                "Qwen2ForCausalLM"),
    # Gemma: GeGLU (tanh gelu gate), (1 + weight) RMS norms, embeddings scaled by sqrt(hidden_size), tied head
    "gemma": ("GemmaConfig", {"head_dim": 16}, "GemmaForCausalLM"),
    # Gemma 2: norms before and after each sub-layer, scores scaled by query_pre_attn_scalar ** -0.5 and
    # soft-capped, alternating sliding-window layers (a window of the sequence: exact), soft-capped logits. Small
    # caps, so that the capping shows in the logits
    "gemma2": ("Gemma2Config", {"head_dim": 16, "attn_logit_softcapping": 0.5, "final_logit_softcapping": 0.3,
                                "query_pre_attn_scalar": 24, "sliding_window": 16}, "Gemma2ForCausalLM"),
    # a window as long as the sequence cuts nothing: exact (a shorter one is E070)
    "mistral-window": ("MistralConfig", {"sliding_window": 16}, "MistralForCausalLM"),
    # Phi-3 and Phi-4: Llama's model, q, k and v fused in qkv_proj (fewer key/value heads: parts of unequal
    # sizes), gate and up in gate_up_proj (pad_token_id: the vocabulary's, as its default 32000 is not here)
    "phi3": ("Phi3Config", {"pad_token_id": 0, "sliding_window": 16}, "Phi3ForCausalLM"),
    # InternLM3: transformers' Llama (its attribute_map names the biases qkv_bias and bias)
    "internlm3": ("InternLM3Config", {"head_dim": 16, "pad_token_id": 0}, "LlamaForCausalLM"),
    # Seed-OSS: biases on q, k and v (attention_bias), none on o (attention_out_bias)
    "seed_oss": ("SeedOssConfig", {"head_dim": 16, "attention_dropout": 0.0, "residual_dropout": 0.0},
                 "SeedOssForCausalLM"),
    # Ministral: Mistral with layer_types, the window (of the sequence: exact) on its sliding_attention layers
    "ministral": ("MinistralConfig", {"head_dim": 8, "sliding_window": 16,
                                      "layer_types": ["sliding_attention", "full_attention"]}, "MinistralForCausalLM"),
    # StarCoder2: layer norms with biases, a biased gelu (tanh) MLP c_fc / c_proj, biased GQA attention
    "starcoder2": ("Starcoder2Config", {"sliding_window": 16, "bos_token_id": 0, "eos_token_id": 0},
                   "Starcoder2ForCausalLM"),
}


@functools.cache
def model(name: str):
    """(model directory, spec) of the family's tiny random model (memoised)."""
    config, fields, cls = FAMILIES[name]
    torch.manual_seed(0)
    directory = jr.WORK / "hf-families" / name
    m = getattr(transformers, cls)(getattr(transformers, config)(**SMALL, **fields))
    with torch.no_grad():  # norms away from their initial ones, so that a weight read wrongly shows
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(0.5 * torch.randn_like(p))
    m.save_pretrained(directory)
    return directory, import_spec(directory, jr.WORK / "hf-families" / f"{name}.yaml")


def reference(name: str, directory=None) -> np.ndarray:
    default, spec = model(name)
    return transformers_logits(FAMILIES[name][2], directory or default, spec)


def test_qwen3_imports_with_qk_norm():
    text = model("qwen3")[1].read_text()
    assert "qk_norm: true, qk_norm_eps: 1e-06" in text and "head_dim: 16" in text and "bias: false" in text
    assert "bias: true" in model("qwen3-bias-tied")[1].read_text()
    assert "bias: qkv" in model("qwen2.5")[1].read_text()
    gemma = model("gemma")[1].read_text()
    assert "gate_activation: gelu" in gemma and "weight_offset: 1.0" in gemma and "scale: 5.656854249492381" in gemma


# torch on one device and with tensor=2 (its tensor-parallel layers are other code: DTensor styles); jax with
# tensor=2 only (one program whichever the mesh: the sharding is the compiler's, so one device adds nothing);
# InternLM3, Seed-OSS and Ministral are Llama's model read from other fields: the import is what differs
LLAMA_READ_OTHERWISE = ("internlm3", "seed_oss", "ministral")
CASES = [(name, tr, mesh) for name in FAMILIES for mesh in ("data=1", "tensor=2")
         if not (name in LLAMA_READ_OTHERWISE and mesh == "data=1")]
CASES += [(name, jr, "tensor=2") for name in FAMILIES]
CASES += [(name, mr, "data=1") for name in ("qwen3", "qwen3-bias-tied", "gemma", "gemma2", "phi3", "starcoder2")]


@pytest.mark.slow
@pytest.mark.parametrize("name, runs, mesh", CASES, ids=[f"{n}-{r.__name__[:-5]}-{m}" for n, r, m in CASES])
def test_logits_equal_transformers(name, runs, mesh):
    directory, spec = model(name)
    out = jr.WORK / "hf-families" / f"{name}-{runs.__name__}-{mesh.replace('=', '')}.npy"
    program = runs.build(spec, mesh)
    (jr if runs is mr else runs).run(program, "--steps", "0", "--init-params", str(directory), "--logits", str(out))
    d = float(np.abs(np.load(out) - reference(name)).max())
    jr.report(f"hf {name} {runs.__name__} {mesh}: logits vs transformers", max_abs=d)
    assert d < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("runs, mesh", [(tr, "tensor=2"), (jr, "tensor=2"), (tr, "data=1")],
                         ids=["torch-tensor2", "jax-tensor2", "torch-one"])
def test_qwen3_trains_and_exports_a_checkpoint_transformers_loads(runs, mesh):
    """3 steps from the checkpoint: the same parameters on one device and with the heads split (the q/k
    norms' gradients summed over the heads' ranks), and the export loads in transformers."""
    directory, spec = model("qwen3")
    tag = f"qwen3-{runs.__name__}-{mesh.replace('=', '')}"
    export, after = jr.WORK / "hf-families" / f"{tag}-export", jr.WORK / "hf-families" / f"{tag}-after.npy"
    runs.run(runs.build(spec, mesh), "--steps", "3", "--init-params", str(directory), "--export-hf", str(export),
             "--logits", str(after))
    _, info = transformers.Qwen3ForCausalLM.from_pretrained(export, output_loading_info=True)
    assert not any(info.values()), info
    d = float(np.abs(np.load(after) - reference("qwen3", export)).max())
    moved = float(np.abs(np.load(after) - reference("qwen3")).max())
    written = json.loads((export / "config.json").read_text())
    assert written["model_type"] == "qwen3" and written["architectures"] == ["Qwen3ForCausalLM"]
    jr.report(f"hf {tag}: after 3 steps, export vs program", max_abs=d, moved=moved)
    assert d < 1e-4 and moved > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("runs, mesh", [(tr, "tensor=2"), (jr, "tensor=2")], ids=["torch-tensor2", "jax-tensor2"])
@pytest.mark.parametrize("name", ["gemma", "gemma2", "phi3", "starcoder2"])
def test_family_trains_and_exports_a_checkpoint_transformers_loads(runs, mesh, name):
    """3 steps from the checkpoint, exported: transformers loads it (every tensor: Phi-3's q, k and v fused
    again in qkv_proj, gate and up in gate_up_proj) with the program's logits."""
    directory, spec = model(name)
    tag = f"{name}-{runs.__name__}-{mesh.replace('=', '')}"
    export, after = jr.WORK / "hf-families" / f"{tag}-export", jr.WORK / "hf-families" / f"{tag}-after.npy"
    runs.run(runs.build(spec, mesh), "--steps", "3", "--init-params", str(directory), "--export-hf", str(export),
             "--logits", str(after))
    _, info = getattr(transformers, FAMILIES[name][2]).from_pretrained(export, output_loading_info=True)
    assert not any(info.values()), info
    d = float(np.abs(np.load(after) - reference(name, export)).max())
    moved = float(np.abs(np.load(after) - reference(name)).max())
    jr.report(f"hf {tag}: after 3 steps, export vs program", max_abs=d, moved=moved)
    assert d < 1e-4 and moved > 1e-3


@pytest.mark.slow
def test_qwen3_norm_weights_train_alike_on_every_mesh():
    """After 3 steps the exported q/k norm weights of tensor=2 (torch, jax) equal those of one device."""
    from safetensors.numpy import load_file

    got = {}
    for runs, mesh in [(tr, "tensor=2"), (jr, "tensor=2"), (tr, "data=1")]:
        test_qwen3_trains_and_exports_a_checkpoint_transformers_loads(runs, mesh)
        tag = f"qwen3-{runs.__name__}-{mesh.replace('=', '')}"
        got[tag] = load_file(str(jr.WORK / "hf-families" / f"{tag}-export" / "model.safetensors"))
    one = got.pop("qwen3-torch_runs-data1")
    for tag, tensors in got.items():
        for key in [k for k in one if "_norm" in k]:
            d = float(np.abs(tensors[key] - one[key]).max())
            assert d < 1e-4, (tag, key, d)


def test_gemma2_window_shorter_than_the_sequence_is_refused(tmp_path, capsys):
    directory, _ = model("gemma2")
    config = json.loads((directory / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "sliding_window": 8}, indent=1))
    rc = cli(["import", "hf", str(path), "-o", "-", "--seq", "16", "--format", "json"])
    diags = json.loads(capsys.readouterr().out)
    assert rc == 1 and [d["code"] for d in diags] == ["E070"] and "sliding_window" in diags[0]["message"]


def test_mlx_refuses_qk_norm_with_tensor_parallelism(capsys):
    _, spec = model("qwen3")
    rc = cli(["build", str(spec), "--target", "mlx", "--mesh", "tensor=2", "-o", str(jr.WORK / "mlx-qk")])
    err = capsys.readouterr().err
    assert rc == 1 and "E049" in err and "qk_norm" in err


@pytest.mark.slow
@pytest.mark.parametrize("runs, mesh", [(tr, "data=1"), (tr, "tensor=2"), (jr, "data=1")],
                         ids=["torch", "torch-tensor2", "jax"])
@pytest.mark.parametrize("name", ["qwen3", "gemma", "gemma2"])
def test_generate_decodes_as_the_training_forward_pass(runs, mesh, name):
    """generate.py's cached decode of Qwen3 (qk_norm) and Gemma (scaled embeddings, offset norms, GeGLU)
    equals the training forward pass (--check)."""
    from test_generate import _generate

    directory, spec = model(name)
    program = runs.build(spec, mesh)
    params = jr.WORK / "hf-families" / f"{name}-{runs.__name__}.safetensors"
    runs.run(runs.build(spec, "data=1"), "--steps", "0", "--init-params", str(directory), "--export-params",
             str(params), export=False)
    got = _generate("jax" if runs is jr else "torch", program,
                    ("--params", str(params), "--prompt-ids", "1,2,3", "--temperature", "0", "--check", "--json"),
                    ranks=2 if mesh == "tensor=2" else 1)
    assert got["rc"] == 0, got["stderr"][-3000:]
    check = got["json"]["check"]
    assert check["argmax_differs"] == [] and check["max_abs_diff"] < 1e-4, check
    jr.report(f"hf {name} {runs.__name__} {mesh} generate --check", max_abs=check["max_abs_diff"])


@pytest.mark.parametrize("edit, code, named", [
    (("causal: true,", "causal: true, dropout: 0.1,"), "E030", "dropout"),
    (("activation: swiglu, gate_activation: gelu", "activation: gelu, gate_activation: gelu"), "E030",
     "gate_activation"),
])
def test_new_attributes_refuse_what_they_do_not_combine_with(capsys, edit, code, named):
    _, spec = model("gemma2")
    bad = jr.spec_variant(spec, (edit,))
    rc = cli(["validate", str(bad)])
    err = capsys.readouterr().err
    assert rc == 1 and code in err and named in err, err


@functools.cache
def padded_llama(tie: bool):
    """(model directory, spec, pad id) of a tiny Llama whose pad_token_id is a token of the first batch (three
    times in it: Phi-3's pad_token_id is its eos, which packed data is full of)."""
    fields = {**SMALL, "tie_word_embeddings": tie}
    base = jr.WORK / "hf-pad" / f"tied{int(tie)}"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).save_pretrained(base / "no-pad")
    tokens = synthetic_samples(import_spec(base / "no-pad", base / "no-pad.yaml"), 8)["tokens"]
    ids, counts = np.unique(tokens, return_counts=True)
    pad = int(ids[np.argmax(counts == 3)])
    assert (tokens == pad).sum() == 3
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields, pad_token_id=pad)).save_pretrained(base / "pad")
    spec = import_spec(base / "pad", base / "pad.yaml")
    assert f"padding_idx: {pad}" in spec.read_text()
    return base / "pad", spec, pad


def transformers_grads(directory, spec, names) -> dict:
    """The gradients of transformers' model at `directory` for the mean cross-entropy of the spec's first batch
    (synthetic samples 0..7), under the canonical `names` (hf_name: their transformers names), canonical layout."""
    from mithril_spec.hf_import import hf_name

    batch = synthetic_samples(spec, 8)
    m = transformers.LlamaForCausalLM.from_pretrained(directory)
    logits = m(input_ids=torch.tensor(batch["tokens"]).long()).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.tensor(batch["targets"]).long().flatten()).backward()
    grads = {n: p.grad.numpy() for n, p in m.named_parameters()}  # (a tied lm_head is embed_tokens)
    out = {}
    for name, like in names.items():
        hf, transposed, _, _ = hf_name("llama", name, like.ndim)
        out[name] = grads[hf].T if transposed else grads[hf]
    return out


VOCAB_ROWS = ("embed: fsdp,", "embed: fsdp, vocab: tensor,")  # the table split on its rows over `tensor`
TARGETS = [(tr, "data=1", (), False), (jr, "data=1", (), False), (mr, "data=1", (), False),
           (tr, "tensor=2", (VOCAB_ROWS,), False), (jr, "tensor=2", (VOCAB_ROWS,), False),
           (tr, "data=1", (), True), (tr, "tensor=2", (VOCAB_ROWS,), True), (mr, "data=1", (), True)]


@pytest.mark.slow
@pytest.mark.parametrize("runs, mesh, layout, tie", TARGETS,
                         ids=[f"{r.__name__[:-5]}-{m}{'-tied' if t else ''}" for r, m, _, t in TARGETS])
def test_the_pad_row_trains_as_in_transformers(runs, mesh, layout, tie):
    """A Llama with pad_token_id, its first batch holding that id: the program's first-step gradients (every
    parameter, by canonical name) equal transformers' loss.backward() ones, the pad row's included (zero: untied,
    the lookups do not train it), on one device and with the table split on its vocabulary over `tensor` (the
    pad row on one rank); tied to the head, the head's gradient still reaches the pad row. The same program without `padding_idx` fails that check on the pad row alone: every
    other gradient equals the padded program's (before: the pad row trained)."""
    from gradients import assert_same_gradients

    directory, spec, pad = padded_llama(tie)
    target = f"{runs.__name__[:-5]} {mesh}{' tied' if tie else ''}"
    got = {}
    for tag, edits in (("pad", layout), ("no-pad", (*layout, (f", padding_idx: {pad}", "")))):
        program = runs.build(spec, mesh, edits)
        r = (jr if runs is mr else runs).run(program, "--steps", "1", "--init-params", str(directory),
                                             "--export-grads", "grads.npz")
        got[tag] = dict(np.load(r.cwd / "grads.npz"))
    ref = transformers_grads(directory, spec, got["pad"])
    assert ref["embed_tokens.weight"][pad].any() == tie and ref["embed_tokens.weight"].any()
    worst = assert_same_gradients(ref, got["pad"], 1e-4, f"{target} padding_idx vs transformers")
    with pytest.raises(AssertionError, match="embed_tokens.weight"):
        assert_same_gradients(ref, got["no-pad"], 1e-4, f"{target} without padding_idx vs transformers")
    assert got["no-pad"]["embed_tokens.weight"][pad].any()
    if not tie:  # the pad row zero; every other gradient the same bits as without padding_idx
        assert not got["pad"]["embed_tokens.weight"][pad].any()
        rows = np.arange(SMALL["vocab_size"]) != pad
        for name, g in got["pad"].items():
            other = got["no-pad"][name]
            assert np.array_equal(g[rows], other[rows]) if name == "embed_tokens.weight" else np.array_equal(g, other), name
    jr.report(f"hf llama {target}: first-step gradients vs transformers (pad id {pad} x3)", worst=worst)
