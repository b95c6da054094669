"""A tiny Llama-3-style model and its tokenizer, built locally (random weights; nothing is downloaded).

    python make_model.py OUT_DIR

writes OUT_DIR/config.json + model.safetensors (transformers' save_pretrained: LlamaConfig with GQA and
the `llama3` rope scaling, in transformers 5's `rope_parameters` layout) and OUT_DIR/tokenizer.json +
tokenizer_config.json (a byte-level BPE trained here on the project's docs/*.md, with bos/eos tokens and a
Llama-3-like chat template). The vocabulary size of the tokenizer is the model's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
VOCAB = 512
BOS, EOS, HEADER_START, HEADER_END = "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def make_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS, HEADER_START, HEADER_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [p.read_text() for p in sorted(DOCS.glob("*.md"))]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "chat_template": CHAT_TEMPLATE, "model_max_length": 128}, indent=2) + "\n")
    return tok.get_vocab_size()


def make_model(out: Path, vocab: int, bos: int, eos: int) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,  # grouped-query attention, as Llama 3
        max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=0.1,  # (not 0.02: logits far enough from uniform that the mask changes the loss)
        bos_token_id=bos, eos_token_id=eos,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    transformers.LlamaForCausalLM(config).save_pretrained(out)


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "model")
    out.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    make_model(out, vocab, tok.token_to_id(BOS), tok.token_to_id(EOS))
    print(f"{out}: a Llama-3-style model (2 layers, GQA 4/2 heads, rope llama3) and its tokenizer ({vocab} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
