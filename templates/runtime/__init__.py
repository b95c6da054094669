"""Helpers every program mithril-spec generates carries, the same files byte for byte in every build and
target of one mithril-spec version: nothing here depends on the spec, and nothing imports a framework (numpy at most). The
program beside this package (train.py and the files it imports) passes in what its spec decided.

errors: the one way a program refuses what it was asked (exit 2, one line).
console: the console lines, the metrics file, --tensorboard and --wandb.
checkpoints: checkpoint manifests, their verification, and --resume's choice of a checkpoint.
preemption: SIGTERM / SIGUSR1 ask the run to stop after the current step.
processes: a sharded run's host memory kept compact; a rank that dies with its launcher (torch).
data: the checks of a token file on disk.
params: the initial values of parameters, and the per-parameter tables by canonical name.
param_files: --init-params' reading (lazily, by slices; Hugging Face's names and layouts) and
    --export-params' writing.
cli: train.py's command line, its checks, and the jax programs' process options.
sampling: generate.py's command line, prompt, sampling and output.
profile: --profile's summary, measured next to planned.
"""
