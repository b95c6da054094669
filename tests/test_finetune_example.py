"""The fine-tuning walk-through (issue 36 item 6; docs/fine-tuning.md "Walk-through", examples/finetune/).

- docs/fine-tuning.md's walk-through block is examples/finetune/run.sh's, line for line (they cannot drift);
- run.sh, as written, builds a tiny Llama 3 and its tokenizer with transformers and tokenizers, imports it on
  fsdp=2, prepares chat data from the docs with its tokenizer and mask, fine-tunes it on 2 processes from its
  checkpoint with the build's launch.sh, exports it, and its check.py passes; and here, against transformers
  itself: the exported model's logits on the first batch equal the program's within 1e-4, the program's first
  loss is `cross_entropy(logits, targets, ignore_index=-100)` of the imported model (the mask honoured: every
  target counted gives another number), and the masked loss went down, in training and on held-out data.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "finetune"
DOC = ROOT / "docs" / "fine-tuning.md"


def run_sh_block() -> str:
    text = (EXAMPLE / "run.sh").read_text()
    return text.split("# --- walk-through ---\n", 1)[1].split("# --- end ---", 1)[0]


def doc_block() -> str:
    section = DOC.read_text().split("## Walk-through", 1)[1]
    m = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert m, "docs/fine-tuning.md: no ```bash block in the walk-through"
    return m.group(1)


def test_the_docs_walk_through_is_run_sh():
    assert doc_block() == run_sh_block()


def first_batch(data: Path, seq: int, batch: int, seed: int = 1):
    """Samples 0 .. batch - 1 as the program reads them (docs/program.md "Data": epoch 0's order from the data
    seed, training.seed + 1), masked targets -100."""
    ids = np.fromfile(data / "train.bin", dtype="<u2").astype(np.int64)
    mask = np.fromfile(data / "train.mask", dtype=np.uint8)
    order = np.random.default_rng([seed, 0]).permutation((len(ids) - 1) // seq)[:batch]
    tokens = np.stack([ids[w * seq:w * seq + seq] for w in order])
    nxt = np.stack([ids[w * seq + 1:w * seq + seq + 1] for w in order])
    counted = np.stack([mask[w * seq + 1:w * seq + seq + 1] for w in order]) != 0
    return tokens, np.where(counted, nxt, -100), nxt


@pytest.mark.slow
def test_the_walk_through_runs_as_written(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    work = tmp_path / "work"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    start = time.perf_counter()
    p = subprocess.run(["bash", str(EXAMPLE / "run.sh"), str(work)], env=env, check=False, capture_output=True, text=True,
                       timeout=600)
    took = time.perf_counter() - start
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "check: the exported model reloads" in p.stdout
    assert 'What does spec.md say under "Data"?' in p.stdout  # generate.py's prompt and answer, on 2 ranks
    got = json.loads(next(line for line in p.stdout.splitlines() if line.startswith('{"logits_max_abs_diff"')))

    # the model run.sh built: Llama 3's rope scaling and grouped-query attention, imported as such
    config = json.loads((work / "model" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "llama3" and config["num_key_value_heads"] < config["num_attention_heads"]
    spec = (work / "model.yaml").read_text()
    assert "type: llama3" in spec and "mesh: {fsdp: 2}" in spec
    assert json.loads((work / "out" / "plan.json").read_text())["mesh"]["axes"] == {"fsdp": 2}

    # one end-of-sequence token after each conversation: Llama 3's template ends each turn with it already
    ids = np.fromfile(work / "sft" / "train.bin", dtype="<u2")
    eos = config["eos_token_id"]
    assert (ids == eos).sum() > 10 and not np.any((ids[1:] == eos) & (ids[:-1] == eos))

    # against transformers itself, here
    program_logits = np.load(work / "logits.npy")
    batch, seq, vocab = program_logits.shape
    assert vocab == config["vocab_size"]
    tokens, targets, nxt = first_batch(work / "sft", seq, batch)
    assert 0 < (targets != -100).sum() < targets.size  # prompts masked, answers counted
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        before = transformers.AutoModelForCausalLM.from_pretrained(work / "model").eval()
        after = transformers.AutoModelForCausalLM.from_pretrained(work / "finetuned").eval()
        x = torch.tensor(tokens)
        logits0 = before(input_ids=x).logits.float().flatten(0, 1)
        logits1 = after(input_ids=x).logits.float()
    diff = float(np.abs(logits1.numpy() - program_logits).max())
    assert diff < 1e-4, diff
    want = ce(logits0, torch.tensor(targets).flatten(), ignore_index=-100).item()
    unmasked = ce(logits0, torch.tensor(nxt).flatten()).item()
    losses = [json.loads(line)["loss"] for line in (work / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(losses) == 30
    # The first loss is the masked loss (the answers' targets only) to float32's agreement with transformers,
    # and a program that ignored the mask would be told apart: the loss over every target lies several times
    # that tolerance away. (A random model's per-token losses are all near log(vocab), so the two are close:
    # make_model.py's initializer_range keeps them some 1e-4 apart on this data, which the docs give.)
    tol = 2e-5
    assert abs(losses[0] - want) < tol, (losses[0], want)
    assert abs(unmasked - want) > 5 * tol, (unmasked, want)  # the mask changes the loss: it was honoured
    assert np.mean(losses[-5:]) < losses[0] - 0.5, losses
    assert got["val_loss_after"] < got["val_loss_before"] - 0.5, got
    assert got["logits_max_abs_diff"] < 1e-4 and abs(got["first_step_loss"] - want) < 1e-4, got
    print(f"\nwalk-through: {took:.0f} s | loss {losses[0]:.4f} -> {losses[-1]:.4f} (last 5 mean "
          f"{np.mean(losses[-5:]):.4f}) | held-out {got['val_loss_before']:.4f} -> {got['val_loss_after']:.4f} | "
          f"first loss {losses[0]:.6f} vs transformers {want:.6f} (every target counted: {unmasked:.6f}) | "
          f"logits max diff {diff:.2e}")
