"""train.py's command line (docs/program.md "Command line"): the options every target shares, and their
checks before any work. A wrong command line stops the program with one line and exit code 2 (`require`):
argparse's own errors, a negative --steps, and paths that cannot be read or written. train.py passes in what
its spec decided (the defaults, the data's kind, which optional features it has) and adds its own options."""

import argparse
import os

from .errors import require
from .profile import profile_window

ASYNC_SAVE = {
    "jax": "orbax's asynchronous checkpointing",
    "torch": "torch.distributed.checkpoint.async_save",
}
PROFILES = {"jax", "torch"}  # the targets whose programs trace --profile
DEFAULT_DATA = "(default: the spec's data.path, data.py's DATA_PATH)"
DATA_HELP = {
    "arrays": f"the training data: a directory of .npy arrays, one per input {DEFAULT_DATA}",
    "text": f"the training data: a text file, its bytes the tokens {DEFAULT_DATA}",
    "tokens": "the training data: a file of token ids (data.py's TOKEN_DTYPE, nanoGPT's train.bin; "
    f"data.mask, if any, stays the spec's) {DEFAULT_DATA}",
    "synthetic": "not used: this program draws synthetic data",
}


def train_parser(
    about, target, data, steps, seed, checkpoint_dir, checkpoint_every, hf=None, evaluates=False
):
    """train.py's command line (`about`: its description) for `target` (torch, jax or mlx: which of
    --async-checkpoint and --profile it supports) and data of kind `data` (the spec's data.kind); the
    defaults of --steps, --seed, --checkpoint-dir and --checkpoint-every are the spec's; `hf`: the
    transformers architecture of a spec imported from Hugging Face (--export-hf, --logits);
    `evaluates`: whether the spec evaluates (--eval-only)."""
    # argparse %-formats a description that mentions %(prog): then a `%` in the file name is only text
    ap = argparse.ArgumentParser(
        description=about.replace("%", "%%") if "%(prog)" in about else about
    )
    ap.error = lambda message: require(False, f"{message} (train.py --help lists the options)")
    ap.add_argument(
        "--steps", type=int, default=steps, help="optimizer steps in total (default: %(default)s)"
    )
    ap.add_argument("--metrics", help="write one JSON line per step to this file")
    ap.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write loss, lr, grad_norm and tokens/s per step as "
        "tensorboard scalars to DIR (needs tensorboardX)",
    )
    ap.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="log the same scalars to this Weights & Biases project "
        "(needs wandb; WANDB_MODE=offline keeps the run on this machine)",
    )
    if hf:
        init = (
            "start from these parameters: a transformers checkpoint (model directory or "
            ".safetensors), or canonical .safetensors / .npz"
        )
    else:
        init = (
            "start from these parameters (.safetensors or .npz, canonical names and layout; each "
            "process reads only its slices of a .safetensors file)"
        )
    ap.add_argument("--init-params", help=init)
    ap.add_argument(
        "--export-params",
        help="write the final parameters here (.safetensors, or .npz for any other "
        "name); with --steps 0, the initial",
    )
    ap.add_argument(
        "--export-grads",
        metavar="FILE",
        help="write the gradients of the run's first step here, what its update steps on (the mean "
        "over the global batch, unscaled, before clipping; canonical names and layout, float32; "
        ".safetensors, or .npz for any other name)",
    )
    ap.add_argument(
        "--resume",
        help="continue from the newest usable checkpoint in this directory; `auto`: from the "
        "checkpoint directory's when it holds one, else start fresh",
    )
    ap.add_argument("--checkpoint-dir", default=checkpoint_dir, help="where to save checkpoints")
    ap.add_argument(
        "--checkpoint-every", type=int, default=checkpoint_every, help="steps between checkpoints"
    )
    if target in ASYNC_SAVE:
        ap.add_argument(
            "--async-checkpoint",
            action="store_true",
            help="write checkpoints in the background while training goes on "
            f"({ASYNC_SAVE[target]}; a save on SIGTERM / SIGUSR1 is synchronous)",
        )
    ap.add_argument("--data", help=DATA_HELP[data])
    if evaluates:
        ap.add_argument(
            "--eval-only",
            action="store_true",
            help="evaluate the starting parameters (after --resume or --init-params) once, write one "
            "metrics row, and exit",
        )
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument(
        "--dry-run", action="store_true", help="print the mesh and layouts, run no step"
    )
    if target in PROFILES:
        profile = (
            f"trace the steps of --profile-steps ({target}.profiler) into DIR, and print the time "
            "per step, per collective kind and the peak memory per device next to the plan's"
        )
    else:
        profile = "not supported by this program (build for torch or jax)"
    ap.add_argument("--profile", metavar="DIR", help=profile)
    ap.add_argument(
        "--profile-steps",
        metavar="A:B",
        help="the first and last step --profile traces, numbered "
        "from 1 (default: 2:3, the first step compiles)",
    )
    if hf:
        ap.add_argument(
            "--export-hf",
            metavar="DIR",
            help="after the run, write DIR/model.safetensors and config.json "
            f"for transformers' {hf}",
        )
        ap.add_argument(
            "--logits",
            metavar="FILE.npy",
            help="after the run, save the model's output (float32) for "
            "the first batch's samples (0 .. BATCH_SIZE-1)",
        )
    return ap


def process_options(ap):
    """The options of a jax program's processes (train.py's and generate.py's), by default from the
    environment that launch.sh sets."""
    ap.add_argument(
        "--coordinator",
        default=os.environ.get("MITHRIL_COORDINATOR"),
        help="host:port of process 0 (several processes)",
    )
    ap.add_argument(
        "--num-processes", type=int, default=int(os.environ.get("MITHRIL_NUM_PROCESSES", "1"))
    )
    ap.add_argument(
        "--process-id", type=int, default=int(os.environ.get("MITHRIL_PROCESS_ID", "0"))
    )


def existing_ancestor(path):
    """`path`, or the nearest of its parents that exists: where a directory written under `path` begins."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def check_arguments(args, target, data):
    """The command line's numbers and paths, checked before any work (`target`, `data`: as for
    train_parser): what is read exists, a file written at the end has a writable directory and is no
    directory, and a directory written is no file and lies in a writable directory (its nearest existing
    parent, where it is yet to be made); --profile's steps (torch, jax: args.profile_window). Opening the
    data (train.py's) checks its files."""
    require(args.steps >= 0, "--steps must be >= 0")
    require(
        data != "synthetic" or not args.data,
        "--data: this program's spec draws synthetic data; build it from a spec with "
        "`data: {kind: arrays}`, `{kind: text}` or `{kind: tokens}` to read from disk",
    )
    if args.tensorboard:
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            require(False, "--tensorboard needs tensorboardX: pip install tensorboardX")
    if args.wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            require(False, "--wandb needs wandb: pip install wandb")
    require(
        not args.init_params or os.path.exists(args.init_params),
        f"--init-params {args.init_params}: no such file",
    )
    files = {
        "--metrics": args.metrics,
        "--export-params": args.export_params,
        "--export-grads": args.export_grads,
        "--logits": getattr(args, "logits", None),
    }
    for flag, path in files.items():
        where = os.path.dirname(os.path.abspath(path or "."))
        require(not path or not os.path.isdir(path), f"{flag} {path}: is a directory, not a file")
        require(
            not path or (os.path.isdir(where) and os.access(where, os.W_OK)),
            f"{flag} {path}: cannot write there ({where} is not a writable directory)",
        )
    directories = {
        "--checkpoint-dir": args.checkpoint_dir,
        "--tensorboard": args.tensorboard,
        "--profile": args.profile,
        "--export-hf": getattr(args, "export_hf", None),
    }
    for flag, path in directories.items():
        require(not path or not os.path.isfile(path), f"{flag} {path}: is a file, not a directory")
        where = existing_ancestor(path) if path else None
        require(
            not where or (os.path.isdir(where) and os.access(where, os.W_OK | os.X_OK)),
            f"{flag} {path}: cannot write there ({where} is "
            f"{'a file' if where and os.path.isfile(where) else 'not a writable directory'})",
        )
    require(
        target in PROFILES or not args.profile,
        "--profile: not supported by the mlx program (MLX has no trace of its collectives); "
        "build the spec with --target torch or --target jax to profile it",
    )
    require(args.profile or args.profile_steps is None, "--profile-steps needs --profile DIR")
    if target in PROFILES:
        args.profile_window = (
            profile_window(args.profile_steps, args.steps) if args.profile else None
        )
    return args
