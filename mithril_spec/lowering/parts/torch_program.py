"""The parts of torch's other templates (generate, optimizer, config, README, ...) (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def generate(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """generate.py's slots (templates/torch/generate_parts.py.j2); empty where the program has no generate.py."""
    t, s = ctx["torch"], ctx["sampling"]
    if s is None:
        return {slot: [] for slot in GENERATE_SLOTS}
    pp, split = bool(s["stages"]), s["tensor"] > 1
    return {
        # the docstring's usage: torchrun on a mesh of several ranks, else plain python
        "usage": ["usage_torchrun" if t.distributed else "usage_python"],
        # the docstring's sentences on how the decode runs split: over pipeline stages, over `tensor`
        "decode_docstring": (["pipeline_sentence"] if pp else []) + (["tensor_sentence"] if split else []),
        # TOKENIZER's comment when the spec names none (the prompt's bytes are the tokens)
        "tokenizer_comment": [] if s["tokenizer"] else ["no_tokenizer"],
        # the layers that stay split over `tensor` while decoding, when the model is split over it
        "tensor_local": ["tensor_local"] if split else [],
        # a pipeline's load_model: its docstring on the stages' parallelisation, then the calls that build
        # each stage on the meta device as train.py does (its parameters stored apart, then parallelised)
        "stages_built": ["stages_parallelised"] if t.parallelized else [],
        "stages_read": ["stage_shards"] if t.parallelized else [],
        "stage_built": (["store_stage_params"] if t.store_params else []) + (["parallelize_stage"] if t.parallelized else []),
        # --resume's checkpoint load: with the Shards the optimizer steps on (ZeRO, master weights), or without
        "resume": ["load_checkpoint_shards" if t.shards else "load_checkpoint"],
        # the pipeline's full forward pass under autocast when the compute dtype is not the parameters'
        "stages_context": ["autocast" if t.autocast else "no_autocast"],
        # the same for the whole model (no pipeline): docstring, build calls, the forward pass of --check, its
        # sequence split over `context` (this rank's places in, every rank's logits gathered out)
        "model_built": ["model_parallelised"] if t.parallelized else [],
        "model_built_calls": (["store_model_params"] if t.store_params else []) + (["parallelize_model"] if t.parallelized else []),
        "full_tokens": ["context_places"] if t.context else [],
        "full_logits": ["forward_autocast" if t.autocast else "forward"],
        "full_gathered": ["context_gather"] if t.context else [],
        # main: the context ring joined (the full forward pass of --check needs it), the model (a pipeline's:
        # this rank's stages and its pipe rank), the decoder's split arguments, --check's forward pass
        "after_setup": ["join_context"] if t.context else [],
        "load_model": ["load_stages" if pp else "load_model"],
        "decode_weights_args": ["tensor_local_arg"] if split else [],
        "decoder_args": (["tensor_group_arg"] if split else []) + (["pipe_args"] if pp else []),
        "print_result": ["print_result_stages" if pp else "print_result"],
    }


GENERATE_SLOTS = (
    "usage", "decode_docstring", "tokenizer_comment", "tensor_local", "stages_built", "stages_read", "stage_built",
    "resume", "stages_context", "model_built", "model_built_calls", "full_tokens", "full_logits", "full_gathered",
    "after_setup", "load_model", "decode_weights_args", "decoder_args", "print_result",
)


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {**generate(ctx)}
