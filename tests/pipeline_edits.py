"""Edits of specs/gpt-pipe.yaml that the jax and torch pipeline tests share (spec_variant pairs)."""

GPIPE = (("schedule: 1f1b}", "schedule: gpipe}"),)
REMAT = (("  seed: 0\n", "  seed: 0\n  remat: full\n"),)

# batch_norm after `wpe` (before the pipelined block), in every copy of the block and after it (before ln_f).
# Each pipeline micro-batch normalises with its own statistics (over the data shards) and moves the running
# ones once, in micro-batch order, as the one-device build's micro-batches do one after the other; neither a
# recomputation in the backward pass (remat, jax's 1f1b), a schedule's idle ticks nor torch's shape
# inference moves them again.
BATCH_NORM = (
    ("    - {op: pos_embedding, name: wpe, max_len: seq}",
     "    - {op: pos_embedding, name: wpe, max_len: seq}\n    - {op: batch_norm, name: bn_in}"),
    ("      - {op: add, name: res2, inputs: [res1, mlp]}",
     "      - {op: batch_norm, name: bn}\n      - {op: add, name: res2, inputs: [res1, bn]}"),
    ("    - {op: layer_norm, name: ln_f}", "    - {op: batch_norm, name: bn_out}\n    - {op: layer_norm, name: ln_f}"),
)
