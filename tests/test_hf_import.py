"""`mithril-spec import hf`: transformers configs -> specs.

Tiny models of every family are built with `transformers` from a config (nothing is downloaded), saved
with save_pretrained, imported, and the spec's plan must count exactly the parameters of the
transformers model. A Llama-2-7B-shaped config gives 6,738,415,616 parameters. Settings the spec language
cannot express are E070 at the field, unknown families E071, dropout W010.
"""

from __future__ import annotations

import json
import re

import pytest

from mithril_spec.cli import main as cli
from mithril_spec.frontend import compile_file

transformers = pytest.importorskip("transformers")  # a test extra (pyproject.toml [dev])

SMALL = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 64}


def configs():
    """(id, config, model class) of each family and variant."""
    t = transformers
    return [
        ("llama", t.LlamaConfig(**SMALL), t.LlamaForCausalLM),
        ("llama-gqa-tied", t.LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=True),
         t.LlamaForCausalLM),
        ("llama-bias-headdim", t.LlamaConfig(**SMALL, attention_bias=True, head_dim=16), t.LlamaForCausalLM),
        ("mistral", t.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None), t.MistralForCausalLM),
        ("qwen2", t.Qwen2Config(**SMALL, num_key_value_heads=2, rope_theta=1e6), t.Qwen2ForCausalLM),
        ("qwen3", t.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16), t.Qwen3ForCausalLM),
        ("qwen3-bias-tied", t.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8, attention_bias=True,
                                          tie_word_embeddings=True), t.Qwen3ForCausalLM),
        ("phi3-gqa", t.Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=0), t.Phi3ForCausalLM),
        ("internlm3", t.InternLM3Config(**SMALL, head_dim=8, pad_token_id=0), t.LlamaForCausalLM),
        ("seed_oss", t.SeedOssConfig(**SMALL, num_key_value_heads=2, head_dim=8, attention_out_bias=True),
         t.SeedOssForCausalLM),
        ("ministral", t.MinistralConfig(**SMALL, num_key_value_heads=2, head_dim=8, sliding_window=None),
         t.MinistralForCausalLM),
        ("starcoder2", t.Starcoder2Config(**SMALL, bos_token_id=0, eos_token_id=0), t.Starcoder2ForCausalLM),
        ("starcoder2-no-bias", t.Starcoder2Config(**SMALL, use_bias=False, tie_word_embeddings=False, bos_token_id=0,
                                                  eos_token_id=0), t.Starcoder2ForCausalLM),
        ("gpt2", t.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64), t.GPT2LMHeadModel),
        ("bert", t.BertConfig(**SMALL, num_labels=3), t.BertForSequenceClassification),
    ]


def _import(capsys, path, *args):
    rc = cli(["import", "hf", str(path), *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err
    return rc, out, err


@pytest.mark.parametrize("case", configs(), ids=lambda c: c[0])
def test_imported_spec_counts_the_models_parameters(case, tmp_path, capsys):
    name, config, model_class = case
    model = model_class(config)
    model.save_pretrained(tmp_path / name)
    rc, _, err = _import(capsys, tmp_path / name, "-o", str(tmp_path / "spec.yaml"), "--seq", "16")
    assert rc == 0, err
    plan = compile_file(tmp_path / "spec.yaml").plan
    assert plan.param_count == sum(p.numel() for p in model.parameters()), name
    assert f"{plan.param_count:,} parameters" in err


def test_llama_2_7b_config(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
        "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "hidden_act": "silu", "rope_scaling": None, "attention_bias": False}))
    rc, _, err = _import(capsys, cfg, "-o", str(tmp_path / "llama.yaml"), "--mesh", "fsdp=8")
    assert rc == 0, err
    c = compile_file(tmp_path / "llama.yaml")
    assert c.plan.param_count == 6_738_415_616 and c.plan.mesh.devices == 8 and c.plan.mesh.sizes["fsdp"] == 8
    assert c.spec.dims["seq"] == 2048  # max_position_embeddings, capped
    rc = cli(["plan", str(tmp_path / "llama.yaml")])
    assert rc == 0 and "6,738,415,616" in capsys.readouterr().out


def test_phi3_mini_config(tmp_path, capsys):
    """Phi-3-mini-4k-instruct's config.json (transformers 4's layout, its remote code named in auto_map): its
    window of 2047 tokens is exact with --seq 2047 (E070 with the default 2048), 3,821,079,552 parameters."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True, "vocab_size": 32064}))
    rc, diags = _diags(capsys, cfg)
    assert rc == 1 and [(d["code"], "--seq 2047" in d["help"]) for d in diags] == [("E070", True)], diags
    rc, _, err = _import(capsys, cfg, "-o", str(tmp_path / "phi3.yaml"), "--seq", "2047")
    assert rc == 0, err
    assert compile_file(tmp_path / "phi3.yaml").plan.param_count == 3_821_079_552


def _config(tmp_path, **fields):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"model_type": "llama", **SMALL, **fields}, indent=1))
    return path


def _diags(capsys, path, *args):
    rc = cli(["import", "hf", str(path), "-o", "-", "--format", "json", *args])
    out = capsys.readouterr().out
    return rc, json.loads(out) if rc else []


def test_rope_scaling_is_refused_at_the_field(tmp_path, capsys):
    path = _config(tmp_path, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    rc, diags = _diags(capsys, path)
    assert rc == 1 and [d["code"] for d in diags] == ["E070"]
    line = path.read_text().splitlines()[diags[0]["line"] - 1]
    assert '"rope_scaling"' in line and "rope_scaling" in diags[0]["message"] and "yarn" in diags[0]["message"]
    # transformers 5's layout: rope_parameters
    path = _config(tmp_path, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    rc, diags = _diags(capsys, path)
    assert rc == 1 and [d["code"] for d in diags] == ["E070"] and "rope_parameters" in diags[0]["message"]


def test_rope_theta_in_both_layouts(tmp_path, capsys):
    for fields in ({"rope_theta": 500000.0}, {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}):
        rc = cli(["import", "hf", str(_config(tmp_path, **fields)), "-o", "-"])
        out, err = capsys.readouterr()
        assert rc == 0 and "rotary_base: 500000.0" in out, err


@pytest.mark.parametrize("fields, named", [
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),  # a field the import does not know
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_a_field_that_changes_the_model_is_honoured_or_refused(tmp_path, capsys, fields, named):
    rc, diags = _diags(capsys, _config(tmp_path, **fields))
    assert rc == 1 and [d["code"] for d in diags] == ["E070"] and f"`{named}`" in diags[0]["message"], diags


def test_gpt2_untied_head_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 100,
                                "n_positions": 64, "tie_word_embeddings": False}))
    rc, diags = _diags(capsys, path)
    assert rc == 1 and [d["code"] for d in diags] == ["E070"] and "tie_word_embeddings" in diags[0]["message"]


def test_sliding_window_shorter_than_the_sequence(tmp_path, capsys):
    path = _config(tmp_path, model_type="mistral", sliding_window=32, num_key_value_heads=2)
    rc, diags = _diags(capsys, path)
    assert rc == 1 and diags[0]["code"] == "E070" and "--seq 32" in diags[0]["help"]
    rc, _ = _diags(capsys, path, "--seq", "32")  # the window then never cuts anything: exact
    assert rc == 0


def test_unknown_family_and_missing_sizes(tmp_path, capsys):
    rc, diags = _diags(capsys, _config(tmp_path, model_type="t5"))
    assert rc == 1 and diags[0]["code"] == "E071" and "llama" in diags[0]["help"]
    path = _config(tmp_path)
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "model_type"}))
    rc, diags = _diags(capsys, path)  # (before: "model_type None cannot be imported")
    assert rc == 1 and diags[0]["code"] == "E071" and diags[0]["message"] == "the config has no model_type"
    path = _config(tmp_path, hidden_size=0)
    rc, diags = _diags(capsys, path)
    assert rc == 1 and diags[0]["code"] == "E071" and "hidden_size" in diags[0]["message"]


@pytest.mark.parametrize("family, missing", [
    ("gemma3_text", "rope_local_base_freq"), ("helium", "interleaved pairs"), ("smollm3", "no_rope_layers"),
    ("olmo2", "all heads together"), ("granite", "residual_multiplier"),
])
def test_families_not_yet_imported_are_refused_with_the_reason(tmp_path, capsys, family, missing):
    """(before, for helium, smollm3, olmo2 and granite: "model_type ... cannot be imported", E071)"""
    rc, diags = _diags(capsys, _config(tmp_path, model_type=family))
    assert rc == 1 and [d["code"] for d in diags] == ["E070"] and family in diags[0]["message"]
    assert "not imported yet" in diags[0]["message"] and missing in diags[0]["message"]
    assert "llama" in diags[0]["help"] and "phi3" in diags[0]["help"]


def test_the_hf_sections_families_are_those_that_import():
    import typing

    from mithril_spec.hf_import import ARCHITECTURES, FAMILIES, NAME_RULES, PREFIXES
    from mithril_spec.spec.hf import HfSource

    named = set(typing.get_args(HfSource.model_fields["model_type"].annotation))
    assert named == set(FAMILIES) == set(NAME_RULES) == set(PREFIXES) == set(ARCHITECTURES)


@pytest.mark.parametrize("family, fields, named", [
    # Phi-3.5 and Phi-3-128k's longrope, Phi-4-mini's partial rotary: not in the spec language
    ("phi3", {"rope_parameters": None, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4,
                                                        "long_factor": [2.0] * 4}}, "longrope"),
    ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}},
     "partial_rotary_factor"),
    ("phi3", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
     "Phi-3 takes only longrope"),
    ("phi3", {"sliding_window": 8}, "sliding_window"),
    ("seed_oss", {"attention_bias": False, "attention_out_bias": True}, "attention_out_bias"),
    ("internlm3", {"qkv_bias": True, "attention_bias": False}, "qkv_bias"),
    ("ministral", {"sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]}, "sliding_window"),
    ("starcoder2", {"hidden_act": "gelu"}, "hidden_act"),
    ("starcoder2", {"sliding_window": 8}, "sliding_window"),
])
def test_new_families_refuse_what_the_spec_cannot_express(tmp_path, capsys, family, fields, named):
    data = _family_config(tmp_path, family)
    path = tmp_path / "bad" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({k: v for k, v in {**data, **fields}.items() if v is not None}, indent=1))
    rc, diags = _diags(capsys, path, "--seq", "16")
    errors = [d for d in diags if d["severity"] == "error"]
    assert rc == 1 and [d["code"] for d in errors] == ["E070"] and named in errors[0]["message"], diags


def test_ministral_window_on_full_attention_layers_only_is_exact(tmp_path):
    """A window shorter than the sequence where no layer slides (layer_types) cuts nothing."""
    data = _family_config(tmp_path, "ministral")
    path = tmp_path / "full" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**data, "sliding_window": 8, "layer_types": ["full_attention"] * 2}))
    assert isinstance(_spec_of(path), list)


def test_dropout_is_a_warning_and_the_spec_goes_to_stdout(tmp_path, capsys):
    rc = cli(["import", "hf", str(_config(tmp_path, attention_dropout=0.1)), "-o", "-", "--name", "my-llama"])
    out, err = capsys.readouterr()
    assert rc == 0 and "warning[W010]" in err and "attention_dropout" in err
    assert 'name: "my-llama"' in out and "op: attention" in out


def test_usage_errors(tmp_path, capsys):
    assert cli(["import", "hf", str(tmp_path / "nowhere"), "-o", "-"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert cli(["import", "hf", str(_config(tmp_path)), "-o", "-", "--mesh", "dtaa=2"]) == 2


# config.json of each family (written by transformers) for the tests of fields left out or mistyped
FAMILY_CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 8}),
    "gemma": ("GemmaConfig", {"head_dim": 8}),
    "gemma2": ("Gemma2Config", {"head_dim": 8, "sliding_window": 16}),
    "gpt2": ("GPT2Config", {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 100, "n_positions": 64}),
    "bert": ("BertConfig", {}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4}),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 4, "moe_intermediate_size": 16,
                                     "shared_expert_intermediate_size": 32}),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 16}),
    "phi3": ("Phi3Config", {}),
    "internlm3": ("InternLM3Config", {"head_dim": 8}),
    "seed_oss": ("SeedOssConfig", {"head_dim": 8}),
    "ministral": ("MinistralConfig", {"head_dim": 8}),
    "starcoder2": ("Starcoder2Config", {}),
}


def _spec_of(path):
    """The imported spec without its comments and `hf.config` (the config's own text), or the errors' codes."""
    from mithril_spec.diagnostics import DiagnosticError
    from mithril_spec.hf_import import import_hf

    try:
        text = import_hf(path, name="m", seq=16).spec
    except DiagnosticError as e:
        return sorted(d.code for d in e.diagnostics if d.severity == "error")
    return [line for line in text.splitlines() if not line.startswith(("#", "  config:"))]


def _family_config(tmp_path, family) -> dict:
    cls, fields = FAMILY_CONFIGS[family]
    small = {k: v for k, v in SMALL.items() if family != "gpt2"}
    # (32 heads: each family's default num_key_value_heads divides them, so that leaving it out imports)
    extra = {} if family in ("gpt2", "bert") else {"num_key_value_heads": 2, "hidden_size": 64, "num_attention_heads": 32}
    getattr(transformers, cls)(**{**small, **extra, **fields}).save_pretrained(tmp_path / "written")
    return json.loads((tmp_path / "written" / "config.json").read_text())


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_a_field_left_out_is_read_as_transformers_reads_it(tmp_path, family):
    """config.json without one of its fields (older configs lack head_dim, num_key_value_heads, rope_theta,
    ...; transformers 4's layout): the spec is that of the config transformers reads from it (its classes'
    defaults, DEFAULTS in hf_import.py), or a refusal (a size the import needs)."""
    data = _family_config(tmp_path, family)
    assert isinstance(_spec_of(tmp_path / "written" / "config.json"), list)
    v4 = {k: v for k, v in data.items() if k not in ("rope_parameters", "dtype", "layer_types")}
    if "rope_parameters" in data:  # transformers 4's layout
        v4["rope_theta"] = data["rope_parameters"]["rope_theta"]
    variants = {f"no-{key}": {k: v for k, v in data.items() if k != key} for key in data if key != "model_type"}
    variants["v4"] = v4
    variants["v4-sparse"] = {k: v for k, v in v4.items() if k not in (
        "head_dim", "tie_word_embeddings", "rope_theta", "sliding_window", "rms_norm_eps")}
    checked = []
    for tag, variant in variants.items():
        path = tmp_path / tag / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(variant, indent=1))
        try:  # how transformers reads it, written back whole
            transformers.AutoConfig.from_pretrained(path.parent).save_pretrained(tmp_path / tag / "read")
        except Exception:  # noqa: BLE001, S112 (transformers refuses it too: nothing to compare)
            continue
        got = _spec_of(path)
        if "E071" not in got:  # (a refusal of a missing size, or of one that does not fit the others, is right)
            assert got == _spec_of(tmp_path / tag / "read" / "config.json"), tag
            checked.append(tag)
    assert "v4" in checked and "v4-sparse" in checked and len(checked) > 10, checked


@pytest.mark.parametrize("field, value", [
    ("rms_norm_eps", None), ("rms_norm_eps", "1e-5"), ("tie_word_embeddings", "false"), ("attention_bias", "false"),
    ("sliding_window", "16"), ("num_key_value_heads", "2"), ("num_key_value_heads", 0), ("num_key_value_heads", 3),
    ("head_dim", 0), ("head_dim", "8"), ("max_position_embeddings", "64"), ("layer_types", "full_attention"),
    ("layer_types", ["full_attention"]), ("rope_theta", "1e6"),
])
def test_a_field_of_the_wrong_type_is_refused_at_the_field(tmp_path, capsys, field, value):
    """(before: internal errors, or "false" read as true, 0 heads as all of them)"""
    path = _config(tmp_path, **{"model_type": "mistral", "num_key_value_heads": 2, "sliding_window": None, field: value})
    rc, diags = _diags(capsys, path, "--seq", "16")
    assert rc == 1 and [d["code"] for d in diags] in (["E071"], ["E070"]) and field in diags[0]["message"], diags
    assert f'"{field}"' in path.read_text().splitlines()[diags[0]["line"] - 1]


@pytest.mark.parametrize("family, fields", [
    ("qwen2_moe", {"qkv_bias": "yes"}), ("qwen2_moe", {"norm_topk_prob": 1}), ("gemma2", {"final_logit_softcapping": "30"}),
    ("gemma2", {"query_pre_attn_scalar": None}), ("gpt2", {"layer_norm_epsilon": None}), ("gpt2", {"n_inner": 0}),
    ("bert", {"layer_norm_eps": None}), ("mixtral", {"router_jitter_noise": "0"}),
])
def test_other_families_refuse_a_wrong_type_too(tmp_path, capsys, family, fields):
    data = _family_config(tmp_path, family)
    path = tmp_path / "bad" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**data, **fields}, indent=1))
    rc, diags = _diags(capsys, path, "--seq", "16")
    errors = [d for d in diags if d["severity"] == "error"]
    assert rc == 1 and len(errors) == 1 and next(iter(fields)) in errors[0]["message"], diags
    assert errors[0]["code"] in ("E070", "E071")


def test_gemma_legacy_gelu_is_the_tanh_gelu(tmp_path):
    """The first Gemma releases name the tanh gelu `gelu`; transformers reads it as gelu_pytorch_tanh."""
    data = _family_config(tmp_path, "gemma")
    path = tmp_path / "legacy" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**data, "hidden_act": "gelu"}))
    assert _spec_of(path) == _spec_of(tmp_path / "written" / "config.json")


def _embeddings(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "op: embedding" in line]


def _padding_idx(line: str) -> int | None:
    found = re.search(r"padding_idx: (\d+)[,}]", line)
    return int(found.group(1)) if found else None


@pytest.mark.parametrize("fields, padding", [
    ({"pad_token_id": 7}, 7), ({"pad_token_id": 0}, 0),
    ({"pad_token_id": -1}, 99),  # (torch counts a negative padding_idx from the end)
    ({"pad_token_id": None}, None), ({}, None),
])
def test_pad_token_id_is_the_embeddings_padding_idx(tmp_path, capsys, fields, padding):
    """transformers' Llama builds embed_tokens as nn.Embedding(vocab, d, padding_idx=pad_token_id): the lookups of
    that id do not train its row. (Before: pad_token_id was a field that changes nothing, and the row trained.)"""
    rc, out, err = _import(capsys, _config(tmp_path, **fields), "-o", "-")
    (line,) = _embeddings(out)
    assert rc == 0 and "warning" not in err
    assert _padding_idx(line) == padding, line


def test_pad_token_id_outside_the_vocabulary_is_a_warning(tmp_path, capsys):
    """(transformers builds no model with such a padding_idx: the spec trains every row, and says so)"""
    rc, out, err = _import(capsys, _config(tmp_path, pad_token_id=100), "-o", "-")
    assert rc == 0 and "warning[W010]" in err and "pad_token_id: 100" in err
    assert "padding_idx" not in out
    rc, diags = _diags(capsys, _config(tmp_path, pad_token_id="0"))
    assert rc == 1 and [d["code"] for d in diags] == ["E071"] and "pad_token_id" in diags[0]["message"]


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_each_family_reads_pad_token_id_as_transformers_builds_its_embeddings(tmp_path, family):
    """A config without pad_token_id takes the family's default (Phi-3: 32000, Gemma: 0); GPT-2's wte has no
    padding_idx; BERT's word embeddings have it, its other tables not."""
    data = {k: v for k, v in _family_config(tmp_path, family).items() if k != "pad_token_id"}
    vocab = data["vocab_size"]
    default = transformers.AutoConfig.for_model(family).pad_token_id
    for pad in (3, None, "absent"):
        path = tmp_path / f"pad-{pad}" / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**data, **({} if pad == "absent" else {"pad_token_id": pad})}))
        want = getattr(transformers, FAMILY_CONFIGS[family][0]).from_pretrained(path.parent).pad_token_id
        assert want == (default if pad == "absent" else pad)
        spec = "\n".join(_spec_of(path))
        (first, *others) = _embeddings(spec)
        # (GPT-2 builds wte without padding_idx whatever pad_token_id says)
        assert _padding_idx(first) == (None if family == "gpt2" or want is None or want >= vocab else want), first
        assert not any("padding_idx" in line for line in others)
