#!/usr/bin/env bash
# The fine-tuning walk-through of docs/fine-tuning.md ("Walk-through: a tiny Llama 3 fine-tuned on the docs"),
# end to end on CPU in about a minute:
#
#   examples/finetune/run.sh [WORK_DIR]      (default: examples/finetune/work)
#
# with `python` (torch, transformers, tokenizers) and `mithril-spec` on PATH. The commands between the two
# markers are the documentation's, line for line (tests/test_finetune_example.py checks it and runs this).
set -euo pipefail
EX="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "${1:-$EX/work}"
cd "${1:-$EX/work}"
# --- walk-through ---
python $EX/make_model.py model          # a tiny Llama 3 (GQA, rope llama3) and its BPE tokenizer
python $EX/make_data.py chats.jsonl     # a doc section's heading -> its first sentences
mithril-spec import hf model -o model.yaml --mesh fsdp=2 --seq 64
mithril-spec data prepare --format chat chats.jsonl --tokenizer model -o sft
mithril-spec build model.yaml --target torch -o out \
    --set '++data={kind: tokens, path: sft/train.bin, dtype: uint16, mask: sft/train.mask, tokenizer: sft/tokenizer.json}' \
    --set training.steps=30 --set training.optimizer.lr=3e-3 --set training.schedule.warmup_steps=3
out/launch.sh --init-params model --export-hf finetuned --logits logits.npy --metrics metrics.jsonl
python $EX/check.py model finetuned sft logits.npy metrics.jsonl
torchrun --standalone --nproc-per-node 2 out/generate.py --params finetuned --temperature 0 --max-new-tokens 16 --prompt \
    $'<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat does spec.md say under "Data"?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
# --- end ---
