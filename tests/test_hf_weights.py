"""Hugging Face checkpoints in the JAX, PyTorch and MLX programs.

For a tiny random model of each family, built and saved locally with transformers (nothing is
downloaded), imported with `mithril-spec import hf`:
- one device: `--steps 0 --init-params MODEL_DIR --logits` equals transformers' logits on the program's
  first batch within 1e-4 (float32);
- a sharded mesh (fsdp=2, tensor=2: 4 JAX devices, each reading only its slices of the checkpoint, or 4
  torch ranks): 5 training steps from MODEL_DIR, then `--export-hf` loads in transformers with no missing
  or unexpected weight, and its logits equal the program's `--logits` after the run within 1e-4 (and
  differ from the initial ones: the weights trained).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import shutil

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
         "num_attention_heads": 4, "max_position_embeddings": 64}
FAMILIES = {  # name -> (config, model class)
    "llama-gqa": (lambda t: t.LlamaConfig(**SMALL, num_key_value_heads=2), "LlamaForCausalLM"),
    "llama-tied-bias": (lambda t: t.LlamaConfig(**SMALL, tie_word_embeddings=True, attention_bias=True),
                        "LlamaForCausalLM"),
    "mistral": (lambda t: t.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None), "MistralForCausalLM"),
    "qwen2": (lambda t: t.Qwen2Config(**SMALL, num_key_value_heads=2), "Qwen2ForCausalLM"),
    "gpt2": (lambda t: t.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64), "GPT2LMHeadModel"),
    "bert": (lambda t: t.BertConfig(**SMALL, num_labels=3), "BertForSequenceClassification"),
}
SHARDED = "fsdp=2,tensor=2"


@functools.cache
def model(family: str):
    """(model directory, spec) of the family's tiny random model (memoised)."""
    config, cls = FAMILIES[family]
    torch.manual_seed(0)
    directory = jr.WORK / "hf" / family
    getattr(transformers, cls)(config(transformers)).save_pretrained(directory)
    spec = jr.WORK / "hf" / f"{family}.yaml"
    assert cli(["import", "hf", str(directory), "-o", str(spec), "--seq", "16"]) == 0
    # a learning rate at which 5 steps visibly change the logits
    spec.write_text(spec.read_text().replace("lr: 2.0e-5", "lr: 1.0e-2"))
    return directory, spec


def reference(family: str, directory, **load) -> np.ndarray:
    """transformers' logits on the program's first batch (samples 0 .. 7); `load`: from_pretrained's options."""
    _, spec = model(family)
    samples = synthetic_samples(spec, 8)
    m = getattr(transformers, FAMILIES[family][1]).from_pretrained(directory, **load).eval()
    kw = {"input_ids": torch.tensor(samples["tokens"]).long()}
    if "token_type_ids" in samples:
        kw["token_type_ids"] = torch.tensor(samples["token_type_ids"]).long()
    with torch.no_grad():
        return m(**kw).logits.float().numpy()


def init_logits(runs, build, family):
    directory, spec = model(family)
    out = jr.WORK / "hf" / f"{family}-{build.__module__}-init.npy"
    runs.run(build(spec, "data=1"), "--steps", "0", "--init-params", str(directory), "--logits", str(out))
    return np.load(out)


TARGETS = [(jr, jr.build), (tr, tr.build), (mr, mr.build)]
# (family, runs, build) of the one-device logits tests: mistral and qwen2 name their weights as llama does
# (llama-tied-bias has qwen2's attention biases), so the jax program, the slowest to compile, reads llama's
LIKE_LLAMA = ("mistral", "qwen2")
ONE_DEVICE = [(f, r, b) for f in FAMILIES for r, b in TARGETS if not (r is jr and f in LIKE_LLAMA)]


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    """Every program run of the module, two at a time (memoised: the tests read their results). The models
    and builds first, one at a time."""
    for family, _, build in ONE_DEVICE:
        build(model(family)[1], "data=1")
    for runs, family in SHARDED_CASES:
        runs.build(model(family)[1], SHARDED)
    jobs = [functools.partial(init_logits, runs, build, family) for family, runs, build in ONE_DEVICE]
    jobs += [functools.partial(sharded_run, runs, family) for runs, family in SHARDED_CASES]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: job(), jobs))


@pytest.mark.slow
@pytest.mark.parametrize("family, runs, build", ONE_DEVICE, ids=[f"{f}-{r.__name__[:-5]}" for f, r, _ in ONE_DEVICE])
def test_logits_equal_transformers_from_its_checkpoint(family, runs, build):
    directory, _ = model(family)
    d = float(np.abs(init_logits(runs, build, family) - reference(family, directory)).max())
    jr.report(f"hf {family} {build.__module__}: logits vs transformers, one device", max_abs=d)
    assert d < 1e-4


def sharded_run(runs, family):
    """5 steps on the SHARDED mesh from the family's checkpoint: (tag, exported directory, logits file)."""
    directory, spec = model(family)
    tag = f"{family}-{runs.__name__}"
    export, after = jr.WORK / "hf" / f"{tag}-export", jr.WORK / "hf" / f"{tag}-after.npy"
    runs.run(runs.build(spec, SHARDED), "--steps", "5", "--init-params", str(directory), "--export-hf", str(export),
             "--logits", str(after))
    return tag, export, after


# Sharded training and export: one case per layout that sharding can break (grouped kv heads split over
# `tensor`, tied embeddings with biases, GPT-2's fused and transposed projections, BERT's encoder and
# classifier): torch runs each; jax, whose devices read only their slices of the checkpoint, the llama
# layouts (the names of gpt2 and bert are the one-device tests'); mistral and qwen2 map like llama (the
# one-device logits tests above cover their names).
SHARDED_CASES = ([(jr, family) for family in ("llama-gqa", "llama-tied-bias")]
                 + [(tr, family) for family in ("llama-gqa", "gpt2", "bert")])


@pytest.mark.slow
@pytest.mark.parametrize("runs, family", SHARDED_CASES, ids=lambda c: c if isinstance(c, str) else c.__name__[:-5])
def test_sharded_training_exports_a_checkpoint_transformers_loads(runs, family):
    directory, _ = model(family)
    tag, export, after = sharded_run(runs, family)
    _, info = getattr(transformers, FAMILIES[family][1]).from_pretrained(export, output_loading_info=True)
    assert not any(info.values()), info
    d = float(np.abs(np.load(after) - reference(family, export)).max())
    moved = float(np.abs(np.load(after) - reference(family, directory)).max())
    jr.report(f"hf {tag} {SHARDED}: after 5 steps, export vs program", max_abs=d, moved=moved)
    assert d < 1e-4 and moved > 1e-3


@pytest.mark.slow
def test_mlx_training_exports_a_checkpoint_transformers_loads():
    directory, spec = model("gpt2")
    export, after = jr.WORK / "hf" / "gpt2-mlx-export", jr.WORK / "hf" / "gpt2-mlx-after.npy"
    mr.run(mr.build(spec, "data=1"), "--steps", "5", "--init-params", str(directory), "--export-hf", str(export),
           "--logits", str(after))
    assert float(np.abs(np.load(after) - reference("gpt2", export)).max()) < 1e-4


@pytest.mark.runs
def test_a_checkpoint_of_another_model_is_refused():
    _, spec = model("gpt2")
    other, _ = model("bert")
    r = jr.run(jr.build(spec, "data=1"), "--steps", "0", "--init-params", str(other), expect_rc=2)
    assert "not this model's checkpoint" in r.output and "transformer.wte.weight" in r.output
    assert "Traceback" not in r.output


@pytest.mark.runs
def test_a_checkpoint_in_shards_loads_by_its_index():
    """model.safetensors.index.json and several files, as transformers writes large models."""
    _, spec = model("llama-gqa")
    torch.manual_seed(0)
    shards = jr.WORK / "hf" / "llama-gqa-shards"
    transformers.LlamaForCausalLM(FAMILIES["llama-gqa"][0](transformers)).save_pretrained(shards, max_shard_size="40KB")
    assert (shards / "model.safetensors.index.json").is_file() and len(list(shards.glob("*.safetensors"))) > 1
    out = jr.WORK / "hf" / "llama-gqa-shards.npy"
    jr.run(jr.build(spec, "data=1"), "--steps", "0", "--init-params", str(shards), "--logits", str(out))
    assert float(np.abs(np.load(out) - reference("llama-gqa", shards)).max()) < 1e-4
    # an index naming a tensor in a shard that lacks it: one line naming both
    index = json.loads((shards / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["lm_head.weight"]
    index["weight_map"]["lm_head.weight"] = next(f for f in index["weight_map"].values() if f != shard)
    broken = jr.WORK / "hf" / "llama-gqa-shards-broken"
    shutil.copytree(shards, broken, dirs_exist_ok=True)
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    r = jr.run(jr.build(spec, "data=1"), "--steps", "0", "--init-params", str(broken), expect_rc=2)
    assert "names tensors their shards lack: lm_head.weight" in r.output and "Traceback" not in r.output


@pytest.mark.runs
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_checkpoint_loads_and_exports_in_float32(dtype):
    """Models are mostly released in bfloat16 (which numpy lacks: the program widens its bits): the program's
    float32 parameters are the checkpoint's values, so its logits are transformers' of the checkpoint in
    float32. The spec imported from it (config.json's `dtype` a half precision) exports a float32
    checkpoint whose config says so: transformers loads it in float32."""
    torch.manual_seed(0)
    directory = jr.WORK / "hf" / f"llama-gqa-{dtype}"
    m = transformers.LlamaForCausalLM(FAMILIES["llama-gqa"][0](transformers))
    m.to(getattr(torch, dtype)).save_pretrained(directory)
    assert json.loads((directory / "config.json").read_text())["dtype"] == dtype
    spec = jr.WORK / "hf" / f"llama-gqa-{dtype}.yaml"
    assert cli(["import", "hf", str(directory), "-o", str(spec), "--seq", "16"]) == 0
    out, export = jr.WORK / "hf" / f"llama-gqa-{dtype}.npy", jr.WORK / "hf" / f"llama-gqa-{dtype}-export"
    tr.run(tr.build(spec, "data=1"), "--steps", "0", "--init-params", str(directory), "--export-hf", str(export),
           "--logits", str(out))
    assert float(np.abs(np.load(out) - reference("llama-gqa", directory, dtype=torch.float32)).max()) < 1e-4
    assert json.loads((export / "config.json").read_text())["dtype"] == "float32"
    assert transformers.LlamaForCausalLM.from_pretrained(export).dtype == torch.float32
