"""The parts of the templates every target shares (templates/common; lowering/parts/__init__.py says what parts
are): the Data class of the spec's data kind, piece by piece, and the evaluation's samples."""

from __future__ import annotations

from typing import Any


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    data, ev = ctx["data"], ctx["eval"]
    kind = data["kind"]
    synthetic = kind == "synthetic"
    bounded = not synthetic and any(i["bounded"] for i in ctx["inputs"])  # values checked against their bound
    split = bool(ev and ev["split"]) and not synthetic  # eval.split: the data's end held out
    held = bool(ev and ev["path"]) and not synthetic  # eval.path: a file of its own, named in verdicts
    return {
        "data": _data_class(kind, bool(ev), bool(data["mask"]), bounded, split),
        # the evaluation's samples and its helpers: another file, the training data's held-out end, or draws
        "eval_data": ([] if not ev else
                      ["eval_data_synthetic" if synthetic else "eval_data_file" if ev["path"] else
                       "eval_data_split", "eval_helpers"]),
        # the inline pieces: Data(..., held_out=True) gives the evaluation's samples
        "held_out_param": ["held_out_param"] if ev else [],
        "synthetic_eval_note": ["synthetic_eval_note"] if ev else [],
        "held_flag": ["held_flag"] if held else [],
        "window_eval_note": ["window_eval_note"] if ev else [],
        "window_held_out": ["window_in_order"] if ev else [],
        "check_eval_note": ["check_eval_note"] if ev else [],
        "batch_cast": ["batch_cast"] if kind == "arrays" else [],  # .npy rows come in the file's dtype
        **_cli(ctx, synthetic),
        **_config(ctx, synthetic),
        **_params(ctx),
        # the README's table of the build's files: how the model is written, what parallel.py applies,
        # generate.py where there is one, and --profile's predictions (not in the mlx program)
        "readme_model": ["modules_model" if ctx["target"] == "torch" else "functions_model"],
        "readme_mesh": ["mesh_applied"] if ctx["mesh"]["devices"] > 1 else [],
        "readme_generate": ["generate_file"] if ctx["sampling"] else [],
        "readme_profile": [] if ctx["target"] == "mlx" else ["profile_reads_plan"],
        # generate.py's --check compares the decode with the training forward pass: not where that drops out
        "sampling_checks": ["refuse_check"] if ctx["sampling"] and ctx["sampling"]["has_dropout"] else [],
    }


def _params(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """Parameter files (common/init.py.j2) and an imported model's checkpoints (common/hf.py.j2): the
    transformers names, per copy of a repeated block where there are blocks, and the experts' other layout."""
    hf = ctx["hf"]
    if not hf:
        return {"hf_names": [], "hf_save_experts": [], "init_hf_note": [], "init_read": ["read_params"]}
    return {
        "hf_names": ["hf_names_by_copy" if hf["block_names"] else "hf_names",
                     *(["hf_alt_names"] if hf["experts"] else [])],
        "hf_save_experts": ["hf_save_experts"] if hf["experts"] else [],
        "init_hf_note": ["init_hf_note"],
        "init_read": ["read_hf_params"],
    }


def _cli(ctx: dict[str, Any], synthetic: bool) -> dict[str, list[str]]:
    """common/cli.py.j2: what parse_args passes to runtime/cli.py and checks after parsing."""
    ev = ctx["eval"]
    return {
        "cli_opens_note": [] if synthetic else ["cli_opens_note"],
        # train_parser's options of an imported model (--export-hf) and of an evaluation (--eval-only, ...)
        "cli_keywords": [*(["hf_keyword"] if ctx["hf"] else []), *(["eval_keyword"] if ev else [])],
        # --profile's predictions (the mlx program does not profile), then the data opened: it checks its files
        "cli_checks": [*([] if ctx["target"] == "mlx" else ["predicted_args"]),
                       *([] if synthetic else ["open_data"]),
                       *(["open_eval_data"] if ev and ev["path"] and not synthetic else [])],
        "cli_eval_only": ["eval_only"] if ev else [],
    }


def _config(ctx: dict[str, Any], synthetic: bool) -> dict[str, list[str]]:
    """The config blocks every target shares: the data's files, the evaluation, loss scaling, offload."""
    data, ev, ls = ctx["data"], ctx["eval"], ctx["training"]["loss_scaling"]
    tokens = data["kind"] == "tokens"
    return {
        "data_config": [
            "no_data_path" if synthetic else "data_path",
            *(["token_dtype"] if tokens else []), *(["mask_path"] if tokens and data["mask"] else []),
            *(["eval_head", *(["eval_path"] if ev["path"] else ["eval_split"] if ev["split"] else []),
               "eval_schedule"] if ev else [])],
        # float16 compute's scale: dynamic (GradScaler's rule) or fixed
        "loss_scale_note": ["backs_off_note"] if ls and ls["dynamic"] else [],
        "loss_scale": (["dynamic_scale"] if ls["dynamic"] else ["fixed_scale"]) if ls else [],
        "offload_config": ["offload_config"] if ctx["predicted"].get("offload") else [],
        # which column of PEAK_FLOPS the console's MFU reads (the mlx program has no such table)
        "train_compute": [] if ctx["target"] == "mlx" else ["train_compute"],
    }


def _data_class(kind: str, ev: bool, mask: bool, bounded: bool, split: bool) -> list[str]:
    """The Data class, in order: __init__ opens and checks the kind's files (and holds out eval.split's end),
    then sample() reads one sample, batch() stacks them, and check() stops the program on a value outside an
    integer input's bound."""
    if kind == "synthetic":
        return ["synthetic_class"]
    out = ["class_head", *(["bounds_table"] if bounded else []), "init_head"]
    if kind == "arrays":
        out += ["arrays_open", *(["arrays_split"] if split else [])]
    elif kind == "text":
        out += ["text_open", *(["text_split"] if split else []), *(["text_stride"] if ev else [])]
    else:  # tokens: windows of ids, permuted per epoch; the loss mask beside them
        out += ["tokens_open", *(["tokens_mask"] if mask else []), "tokens_windows",
                *(["tokens_split"] if split else []), *(["tokens_held_out"] if ev else []), "tokens_orders"]
    out += [*(["checked_none"] if bounded else []), *(["loss_scale"] if mask else []),
            *(["window"] if kind == "tokens" else []), "sample_head",
            {"arrays": "sample_arrays", "text": "sample_text", "tokens": "sample_tokens"}[kind]]
    if kind == "tokens":
        out.append("targets_masked" if mask else "targets")
    out += ["batch_head", *(["batch_check"] if bounded else []), "batch_stack"]
    if bounded:
        arrays = kind == "arrays"
        out += ["check_head", "check_rows" if arrays else "check_samples", "check_loop",
                "values_of_rows" if arrays else "values_of_samples", *(["values_unmasked"] if mask else []),
                "check_found", "where_row" if arrays else "where_window" if kind == "tokens" else "where_sample",
                "check_refusal"]
    if kind == "arrays":
        out.append("open_samples")
    return out
