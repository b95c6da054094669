"""`mithril-spec import hf`: transformers configs -> specs.

Tiny models of every family are built with `transformers` from a config (nothing is downloaded), saved
with save_pretrained, imported, and the spec's plan must count exactly the parameters of the
transformers model. A Llama-2-7B-shaped config gives 6,738,415,616 parameters. Settings the spec language
cannot express are E070 at the field, unknown families E071, dropout W010.
"""

from __future__ import annotations

import json

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
    path = _config(tmp_path, model_type="mistral", sliding_window=32)
    rc, diags = _diags(capsys, path)
    assert rc == 1 and diags[0]["code"] == "E070" and "--seq 32" in diags[0]["help"]
    rc, _ = _diags(capsys, path, "--seq", "32")  # the window then never cuts anything: exact
    assert rc == 0


def test_unknown_family_and_missing_sizes(tmp_path, capsys):
    rc, diags = _diags(capsys, _config(tmp_path, model_type="t5"))
    assert rc == 1 and diags[0]["code"] == "E071" and "llama" in diags[0]["help"]
    path = _config(tmp_path, hidden_size=0)
    rc, diags = _diags(capsys, path)
    assert rc == 1 and diags[0]["code"] == "E071" and "hidden_size" in diags[0]["message"]


@pytest.mark.parametrize("family", ["gemma3_text"])
def test_families_not_yet_imported_are_refused_with_the_reason(tmp_path, capsys, family):
    rc, diags = _diags(capsys, _config(tmp_path, model_type=family))
    assert rc == 1 and [d["code"] for d in diags] == ["E070"] and family in diags[0]["message"]
    assert "not imported yet" in diags[0]["message"] and "llama" in diags[0]["help"]


def test_dropout_is_a_warning_and_the_spec_goes_to_stdout(tmp_path, capsys):
    rc = cli(["import", "hf", str(_config(tmp_path, attention_dropout=0.1)), "-o", "-", "--name", "my-llama"])
    out, err = capsys.readouterr()
    assert rc == 0 and "warning[W010]" in err and "attention_dropout" in err
    assert 'name: "my-llama"' in out and "op: attention" in out


def test_usage_errors(tmp_path, capsys):
    assert cli(["import", "hf", str(tmp_path / "nowhere"), "-o", "-"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert cli(["import", "hf", str(_config(tmp_path)), "-o", "-", "--mesh", "dtaa=2"]) == 2
