"""Instruction data and the masked loss (issue 36 item 3; docs/program.md "Data" and "Numerics").

- `data prepare --format chat|prompt-response FILE.jsonl --tokenizer MODEL_DIR`: the examples encoded with
  the model's chat template (or `role: content` lines without one), packed, separated by the end-of-sequence
  token (one: none added after a template that ends the example with it); train.mask / val.mask count exactly the assistant's tokens and the end-of-sequence token after them.
- `data: {kind: tokens, path, mask}`: the first step's loss of a tiny Llama (built locally with
  transformers, imported with `import hf`, started from its checkpoint) equals
  torch.nn.functional.cross_entropy(transformers' logits, targets, ignore_index=-100) on the first batch;
  PyTorch, JAX and MLX on data=2 (a mask spread unevenly over the two ranks or processes) equal the
  one-device build, within 1e-5, over two steps; so do PyTorch and JAX with 2 micro-batches per step, and on data=2 x tensor=2 with the logits split over
  `tensor` on the vocabulary (PyTorch's loss_parallel).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
import torch_runs as tr
from test_cli import run as cli_run
from test_data_prepare import model_tokenizer
from tokenizers import Tokenizer

WORK = jr.WORK / "masked-loss"
TEMPLATE = ("{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
EXAMPLES = [
    {"prompt": "hello world", "response": "hello model"},
    {"prompt": "Sharding splits", "response": "a tensor over devices."},
    {"prompt": "hello", "response": "world"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("template", [None, TEMPLATE], ids=["plain", "chat-template"])
def test_prepare_instructions_masks_the_prompts(tmp_path, capsys, template):
    model = model_tokenizer(tmp_path, chat_template=template)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    data = write_jsonl(tmp_path / "pr.jsonl", EXAMPLES * 10)
    rc, out, err = cli_run(capsys, "data", "prepare", "--format", "prompt-response", data, "--tokenizer", model,
                           "-o", tmp_path / "d")
    assert rc == 0, err
    assert "mask: " in out
    d = tmp_path / "d"
    ids = np.concatenate([np.fromfile(d / f, dtype="<u2") for f in ("train.bin", "val.bin")]).tolist()
    mask = np.concatenate([np.fromfile(d / f, dtype=np.uint8) for f in ("train.mask", "val.mask")]).tolist()
    assert len(ids) == len(mask)
    meta = json.loads((d / "data.json").read_text())
    assert meta["chat_template"] is (template is not None) and meta["format"] == "prompt-response"
    # the examples one after the other, each followed by the end-of-sequence token (counted: the model learns
    # to stop); the counted ids of each example decode to its response
    k = 0
    for ex in EXAMPLES * 10:
        if template:
            # the template ends the turn with the end-of-sequence token: that one, no second after it
            text = f"<s>user\n{ex['prompt']}</s><s>assistant\n{ex['response']}"
        else:
            text = f"user: {ex['prompt']}\nassistant: {ex['response']}\n"
        want = tok.encode(text, add_special_tokens=False).ids
        assert ids[k:k + len(want)] == want and ids[k + len(want)] == eos
        counted = [i for i, m in zip(ids[k:k + len(want)], mask[k:k + len(want)]) if m]
        assert tok.decode(counted).strip().startswith(ex["response"].strip()[:5]), (tok.decode(counted), ex)
        assert ex["prompt"] not in tok.decode(counted)
        assert mask[k + len(want)] == 1
        k += len(want) + 1
    assert k == len(ids)
    # chat format: the same conversations as messages give the same files
    chat = write_jsonl(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": e["prompt"]}, {"role": "assistant", "content": e["response"]}]}
        for e in EXAMPLES * 10])
    rc, _out, err = cli_run(capsys, "data", "prepare", "--format", "chat", chat, "--tokenizer", model, "-o", tmp_path / "c")
    assert rc == 0, err
    for f in ("train.bin", "val.bin", "train.mask", "val.mask"):
        assert (tmp_path / "c" / f).read_bytes() == (d / f).read_bytes(), f


def test_prepare_instructions_refuses_bad_input_in_one_line(tmp_path, capsys):
    """Each line that is not an example of the format stops the preparation with one line naming the file,
    the line (counted with the blank ones) and what is wrong in it: nothing is dropped silently."""
    model = model_tokenizer(tmp_path)
    bad = tmp_path / "bad.jsonl"
    ok = '{"prompt": "a", "response": "b"}\n\n'  # a good line and a blank one before the bad line 3
    chat = ["--format", "chat"]
    for text, argv, says in (
        ('{"prompt": "x"}\n', ["--format", "prompt-response"],
         'bad.jsonl:1: no "response" (its keys: prompt): --format prompt-response reads {"prompt"'),
        (ok + '{"prompt": "x", "response": 5}\n', ["--format", "prompt-response"],
         'bad.jsonl:3: "response" is a number, not a string'),
        (ok + '{"prompt": "x", "response": "y", "completion": "z"}\n', ["--format", "prompt-response"],
         'bad.jsonl:3: both "response" and "completion"'),
        ('{"instruction": "x", "input": "", "output": "y"}\n', ["--format", "prompt-response"],
         'bad.jsonl:1: no "prompt" (its keys: instruction, input, output)'),
        (ok + "not json\n", ["--format", "prompt-response"], "bad.jsonl:3: not a JSON object"),
        ('[\n  {"prompt": "x", "response": "y"}\n]\n', chat, "the file is one JSON array: write one object per line"),
        ('["x"]\n', chat, "bad.jsonl:1: a list, not a JSON object"),
        (ok, chat, 'bad.jsonl:1: no "messages" (its keys: prompt, response): --format chat reads {"messages"'),
        ('{"messages": []}\n', chat, 'bad.jsonl:1: "messages" is empty'),
        ('{"messages": [{"role": "user", "content": "x"}, "y"]}\n', chat, "bad.jsonl:1: message 2 is a string"),
        ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}\n', chat,
         'bad.jsonl:1: message 2: no "content"'),
        ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}]}\n', chat,
         'bad.jsonl:1: message 2: "content" is null, not a string'),
        ('{"messages": [{"role": "assistant", "content": [{"type": "text", "text": "y"}]}]}\n', chat,
         '"content" is a list, not a string (content parts are not read: join their text into one string)'),
        ('{"messages": [{"role": "human", "content": "x"}, {"role": "gpt", "content": "y"}]}\n', chat,
         'no "assistant" message (roles: human, gpt)'),
        ("\n \n", chat, "bad.jsonl: no examples"),
        ('{"prompt": "x", "response": "y"}\n', [*chat, "--vocab", "300"], "give --tokenizer"),
    ):
        bad.write_text(text)
        tokenizer = [] if "--vocab" in argv else ["--tokenizer", str(model)]
        rc, _out, err = cli_run(capsys, "data", "prepare", bad, *argv, *tokenizer, "-o", tmp_path / "o")
        assert rc == 2 and says in err and err.count("\n") == 1, (text, err)
    (tmp_path / "adir").mkdir()
    rc, _out, err = cli_run(capsys, "data", "prepare", tmp_path / "adir", *chat, "--tokenizer", model, "-o", tmp_path / "o")
    assert rc == 2 and "adir: a directory: --format chat reads one JSONL file" in err and err.count("\n") == 1, err


def test_prepare_instructions_reads_jsonl_as_people_write_it(tmp_path, capsys):
    """CRLF and LF lines mixed, blank lines, a byte-order mark, strings holding U+2028 / U+0085 / U+001C (which
    str.splitlines() breaks at, JSON does not), ensure_ascii or not, and TRL's {"prompt", "completion"}: the
    same files as the plain JSONL of the same examples."""
    model = model_tokenizer(tmp_path)
    rows = [{"prompt": f"caf\u00e9 {i}\u2028line \U0001f680", "response": f"na\u00efve\x85 {i}\x1c end"} for i in range(30)]
    clean = write_jsonl(tmp_path / "clean.jsonl", rows)
    messy = tmp_path / "messy.jsonl"
    with open(messy, "w", encoding="utf-8-sig", newline="") as f:
        for i, r in enumerate(rows):
            r = {"prompt": r["prompt"], "completion": r["response"]}
            f.write(json.dumps(r, ensure_ascii=bool(i % 2)) + ("\r\n" if i % 3 else "\n") + ("\n" if i % 7 == 0 else ""))
    for name, f in (("c", clean), ("m", messy)):
        rc, out, err = cli_run(capsys, "data", "prepare", "--format", "prompt-response", f, "--tokenizer", model,
                               "-o", tmp_path / name)
        assert rc == 0 and out.startswith("30 document(s)"), err
    for f in ("train.bin", "val.bin", "train.mask", "val.mask"):
        assert (tmp_path / "m" / f).read_bytes() == (tmp_path / "c" / f).read_bytes(), f
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = np.fromfile(tmp_path / "c" / "train.bin", dtype="<u2").tolist()
    first = ids[: ids.index(tok.token_to_id("</s>"))]  # the first example, as written
    assert first == tok.encode(f"user: {rows[0]['prompt']}\nassistant: {rows[0]['response']}\n").ids


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_prepare_instructions_refuses_a_tokenizer_without_the_templates_tokens(tmp_path, capsys):
    """The chat template's special tokens and the configured end-of-sequence token must be tokens of the
    tokenizer: otherwise their text would be trained as ordinary pieces, or the examples separated by another
    token than the one the model stops at. One line (exit 2) names the token."""
    from tokenizers import AddedToken

    data = write_jsonl(tmp_path / "pr.jsonl", EXAMPLES * 4)
    model = model_tokenizer(tmp_path, chat_template=CHATML)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    cfg = json.loads((model / "tokenizer_config.json").read_text())

    def prepare():
        return cli_run(capsys, "data", "prepare", "--format", "prompt-response", data, "--tokenizer", model,
                       "-o", tmp_path / "o")

    rc, _out, err = prepare()  # the template's <|im_start|>, <|im_end|> are text pieces of this tokenizer
    assert rc == 2 and "the chat template writes '<|im_end|>'" in err and "does not hold as one token" in err, err
    assert err.count("\n") == 1
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    tok.save(str(model / "tokenizer.json"))
    rc, _out, err = prepare()
    assert rc == 2 and "the chat template writes '<|im_start|>'" in err and err.count("\n") == 1, err
    # a special token of tokenizer_config.json the template writes (here as bos_token): held, or refused
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "bos_token": "[BOS]",
                                                             "chat_template": "{{ bos_token }}" + CHATML}))
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True)])
    tok.save(str(model / "tokenizer.json"))
    rc, _out, err = prepare()
    assert rc == 2 and "the chat template writes '[BOS]'" in err, err
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": CHATML}))
    assert prepare()[0] == 0
    # a user's text that holds such a string is text, not markup: not refused
    write_jsonl(data, [{"prompt": "what is <|tool|>?", "response": "a string"}] * 4)
    assert prepare()[0] == 0
    # the configured end-of-sequence token: tokenizer_config.json's eos_token first (as documented), then
    # config.json's eos_token_id; one the tokenizer lacks is refused, not replaced by another
    (model / "config.json").write_text(json.dumps({"eos_token_id": [tok.token_to_id("<s>"), 5]}))
    assert prepare()[0] == 0
    assert json.loads((tmp_path / "o" / "data.json").read_text())["eot"] == tok.token_to_id("</s>")
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": CHATML, "eos_token": "<|eos|>"}))
    rc, _out, err = prepare()
    assert rc == 2 and "eos_token '<|eos|>' is not a token of" in err and err.count("\n") == 1, err
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    (model / "config.json").write_text(json.dumps({"eos_token_id": 10**6}))
    rc, _out, err = prepare()
    assert rc == 2 and "eos_token_id 1000000 is not an id of" in err and err.count("\n") == 1, err


SEQ, BATCH = 16, 8
ACCUM = (("batch_size: 8", "batch_size: 8\n  grad_accum: 2"),)  # micro-batches of 4 samples
VOCAB_TP = (("mlp: tensor}", "mlp: tensor, vocab: tensor}"),)


@pytest.fixture(scope="module")
def llama():
    """A tiny Llama (transformers, built here), its imported spec with masked token data, the data."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    WORK.mkdir(parents=True, exist_ok=True)
    model = WORK / "llama"
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(model)
    spec = WORK / "llama.yaml"
    from mithril_spec.cli import main as cli

    assert cli(["import", "hf", str(model), "-o", str(spec), "--seq", str(SEQ)]) == 0
    windows = 40
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 100, windows * SEQ + 1)
    # an uneven mask: each window keeps a fraction of its targets of its own, from none to all
    frac = rng.permutation(np.linspace(0.0, 1.0, windows))
    mask = np.zeros(len(ids), np.uint8)
    for w in range(windows):
        mask[w * SEQ + 1:(w + 1) * SEQ + 1] = rng.random(SEQ) < frac[w]
    ids.astype("<u2").tofile(WORK / "ids.bin")
    mask.tofile(WORK / "ids.mask")
    text = spec.read_text().replace(
        "data: {kind: synthetic}", f"data: {{kind: tokens, path: {WORK / 'ids.bin'}, mask: {WORK / 'ids.mask'}}}")
    spec.write_text(text.replace("clip_grad_norm: 1.0", "clip_grad_norm: 1.0e+9"))
    return model, spec, ids, mask


def first_batch(ids, mask):
    """Samples 0 .. BATCH - 1 (docs/program.md "Data": epoch 0's order from the data seed, seed + 1 = 1)."""
    windows = (len(ids) - 1) // SEQ
    order = np.random.default_rng([1, 0]).permutation(windows)[:BATCH]
    tokens = np.stack([ids[w * SEQ:w * SEQ + SEQ] for w in order])
    targets = np.stack([np.where(mask[w * SEQ + 1:w * SEQ + SEQ + 1] != 0, ids[w * SEQ + 1:w * SEQ + SEQ + 1], -100)
                        for w in order])
    return tokens, targets


@pytest.mark.slow
def test_masked_loss_equals_cross_entropy_with_ignore_index_on_every_mesh(llama):
    import torch
    import transformers

    model, spec, ids, mask = llama
    tokens, targets = first_batch(ids, mask)
    counts = (targets != -100).sum(axis=1)
    assert counts[:BATCH // 2].sum() != counts[BATCH // 2:].sum()  # the two ranks count differently
    m = transformers.LlamaForCausalLM.from_pretrained(model).eval()
    with torch.no_grad():
        logits = m(input_ids=torch.tensor(tokens).long()).logits.float()
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.tensor(targets).flatten().long(),
                                             ignore_index=-100).item()
    unmasked = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.tensor(
        np.where(targets == -100, 0, targets)).flatten().long()).item()
    args = ("--steps", "2", "--init-params", str(model))
    runs = {
        "torch data=1": tr.run(tr.build(spec, "data=1"), *args),
        "torch data=2": tr.run(tr.build(spec, "data=2"), *args),
        "jax data=1": jr.run(jr.build(spec, "data=1"), *args),
        "jax data=2": jr.run(jr.build(spec, "data=2"), *args),
        "mlx data=1": mr.run(mr.build(spec, "data=1"), *args),
        "mlx data=2": mr.run(mr.build(spec, "data=2"), *args, processes=2),
        "torch data=2 grad_accum=2": tr.run(tr.build(spec, "data=2", ACCUM), *args),
        "jax data=2 grad_accum=2": jr.run(jr.build(spec, "data=2", ACCUM), *args),
        # the logits split over `tensor` on the vocabulary: PyTorch's loss_parallel
        "torch data=2,tensor=2 vocab-parallel": tr.run(tr.build(spec, "data=2,tensor=2", VOCAB_TP), *args),
        "jax data=2,tensor=2 vocab-parallel": jr.run(jr.build(spec, "data=2,tensor=2", VOCAB_TP), *args),
    }
    losses = {k: r.losses for k, r in runs.items()}
    first = {k: float(v[0]) for k, v in losses.items()}
    for k, v in first.items():
        assert abs(v - want) < 1e-5, (k, v, want)
    assert abs(unmasked - want) > 1e-3  # the mask matters
    one = losses["torch data=1"]
    for k, v in losses.items():
        assert np.abs(v - one).max() < 1e-5, (k, v, one)
    jr.report("masked loss", reference=want, first_step=first,
              second_step={k: float(v[1]) for k, v in losses.items()})


@pytest.mark.runs
def test_validate_refuses_a_mask_it_cannot_apply(llama, capsys):
    _, spec, _, _ = llama
    assert cli_run(capsys, "validate", spec)[0] == 0
    for argv, says in (
        (["--mesh", "data=1,pipe=2"], "`data.mask` on a mesh with `pipe`"),
        (["--set", "+eval={split: 0.1}"], "`data.mask` with `eval`"),
    ):
        rc, _out, err = cli_run(capsys, "validate", spec, *argv)
        assert rc == 1 and "error[E013]" in err and says in err, (argv, err)
