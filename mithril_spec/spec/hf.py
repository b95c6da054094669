"""The `hf` section: the Hugging Face transformers model a spec was imported from (`mithril-spec import hf`
writes it). With it, the generated programs read that model's checkpoints and write them back
(`--init-params DIR`, `--export-hf DIR`; docs/fine-tuning.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .common import Strict


class HfSource(Strict):
    # (hf_import.FAMILIES' names: tests/test_hf_import.py checks that they are these)
    model_type: Literal["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2", "bert", "mixtral", "qwen2_moe",
                        "qwen3_moe", "phi3", "internlm3", "seed_oss", "ministral", "starcoder2"] = Field(
        description="the transformers family: decides the checkpoint names of every parameter")
    architecture: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$", max_length=100,
                              description="the transformers class, e.g. LlamaForCausalLM (written to config.json)")
    config: dict[str, Any] = Field(description="the model's config.json, written back by --export-hf")
