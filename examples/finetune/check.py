"""Reloads the fine-tuned model in transformers and checks it against the program that trained it.

    python check.py MODEL_DIR FINETUNED_DIR DATA_DIR LOGITS.npy METRICS.jsonl

- the exported model (FINETUNED_DIR, `train.py --export-hf`) loads with AutoModelForCausalLM, and its logits
  on the first batch equal the program's (`train.py --logits`);
- the program's first loss equals transformers' `cross_entropy(logits, targets, ignore_index=-100)` of the
  imported model on the first batch: the mask counted the assistant's tokens only;
- the loss over the assistant's tokens of the held-out conversations (DATA_DIR/val.bin, val.mask) went down.

Prints one JSON line of these numbers; exits 1 when a check fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

DATA_SEED = 1  # training.seed + 1: the order of the training windows (docs/program.md "Data")


def windows(ids, mask, seq, order):
    """Token and target rows (masked targets -100) of the windows in `order`, as the program reads them."""
    ids = ids.astype(np.int64)
    tokens = np.stack([ids[w * seq:w * seq + seq] for w in order]).astype(np.int64)
    targets = np.stack([np.where(mask[w * seq + 1:w * seq + seq + 1] != 0, ids[w * seq + 1:w * seq + seq + 1], -100)
                        for w in order]).astype(np.int64)
    return torch.tensor(tokens), torch.tensor(targets)


def masked_loss(model, tokens, targets):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100).item()


def main(argv: list[str]) -> int:
    model_dir, finetuned_dir, data_dir, logits_file, metrics_file = argv
    program_logits = np.load(logits_file)  # (batch, seq, vocab)
    batch, seq, _ = program_logits.shape
    dtype = json.loads(Path(data_dir, "data.json").read_text())["dtype"]
    ids = np.fromfile(f"{data_dir}/train.bin", dtype=dtype)
    mask = np.fromfile(f"{data_dir}/train.mask", dtype=np.uint8)
    order = np.random.default_rng([DATA_SEED, 0]).permutation((len(ids) - 1) // seq)[:batch]
    tokens, targets = windows(ids, mask, seq, order)
    val_ids = np.fromfile(f"{data_dir}/val.bin", dtype=dtype)
    val_mask = np.fromfile(f"{data_dir}/val.mask", dtype=np.uint8)
    val = windows(val_ids, val_mask, seq, range((len(val_ids) - 1) // seq))

    before = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    after = AutoModelForCausalLM.from_pretrained(finetuned_dir, dtype=torch.float32).eval()
    _, first_batch_loss = masked_loss(before, tokens, targets)
    _, unmasked_loss = masked_loss(before, tokens, torch.where(targets == -100, torch.roll(tokens, -1, 1), targets))
    logits, _ = masked_loss(after, tokens, targets)
    losses = [json.loads(line)["loss"] for line in Path(metrics_file).read_text().splitlines() if '"loss"' in line]
    result = {
        "logits_max_abs_diff": float(np.abs(logits.numpy() - program_logits).max()),
        "first_step_loss": losses[0],
        "first_step_loss_transformers": first_batch_loss,
        "first_step_loss_unmasked": unmasked_loss,  # every target counted: what the mask changes
        "last_step_loss": losses[-1],
        "val_loss_before": masked_loss(before, *val)[1],
        "val_loss_after": masked_loss(after, *val)[1],
        "counted_targets": int((targets != -100).sum()),
        "targets": int(targets.numel()),
    }
    print(json.dumps(result))
    ok = (result["logits_max_abs_diff"] < 1e-4
          and abs(result["first_step_loss"] - result["first_step_loss_transformers"]) < 1e-4
          and result["val_loss_after"] < result["val_loss_before"])
    print("check: " + ("the exported model reloads in transformers with the program's logits, and the masked "
                       "loss went down" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
