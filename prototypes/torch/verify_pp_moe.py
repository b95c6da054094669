"""Equivalence of pipeline_moe.py on simulated meshes against 1 process (gloo ranks via launch.py).

    python verify_pp_moe.py            # every case
    python verify_pp_moe.py pipe moe   # a group
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PROG = os.path.join(HERE, "pipeline_moe.py")
sys.path.insert(0, HERE)
import launch  # noqa: E402

WORK = tempfile.mkdtemp(prefix="ppmoe_")
STEPS = "5"
RESULTS = {}

CASES = {
    "rest": [
        ("gpt-pipe", "pipe=2,tensor=2", ["--schedule", "interleaved", "--virtual-stages", "2"]),
        ("gpt-pipe", "pipe=2,fsdp=2", ["--schedule", "gpipe"]),
        ("gpt-pipe", "pipe=2,data=2,tensor=2", ["--schedule", "1f1b"]),
        ("moe-dp", "data=2", []),
    ],
    "pipe": [
        ("gpt-pipe", "pipe=2", ["--schedule", "gpipe"]),
        ("gpt-pipe", "pipe=2", ["--schedule", "1f1b"]),
        ("gpt-pipe", "pipe=2", ["--schedule", "interleaved", "--virtual-stages", "2"]),
        ("gpt-pipe", "pipe=4", ["--schedule", "1f1b"]),
        ("gpt-pipe", "pipe=4", ["--schedule", "gpipe"]),
        ("gpt-pipe", "pipe=2,data=2", ["--schedule", "1f1b"]),
        ("gpt-pipe", "pipe=2,tensor=2", ["--schedule", "interleaved", "--virtual-stages", "2"]),
        ("gpt-pipe", "pipe=2,fsdp=2", ["--schedule", "gpipe"]),
        ("gpt-pipe", "pipe=2,data=2,tensor=2", ["--schedule", "1f1b"]),
    ],
    "moe": [
        ("moe-dp", "expert=2", []),
        ("moe-dp", "data=2", []),
        ("moe-dp", "data=2,expert=2", []),
        ("moe-dp", "data=2,expert=4", []),
    ],
}


def ranks(mesh):
    n = 1
    for part in mesh.split(","):
        n *= int(part.split("=")[1])
    return n


def run(tag, model, mesh, extra):
    metrics, export = os.path.join(WORK, tag + ".jsonl"), os.path.join(WORK, tag + ".npz")
    argv = ["--model", model, "--steps", STEPS, "--metrics", metrics, "--export-params", export, *extra]
    t0 = time.time()
    if mesh is None:
        subprocess.run([sys.executable, PROG, "--mesh", "data=1", *argv], check=True, stdout=subprocess.DEVNULL)
    else:
        launch.run(ranks(mesh), PROG, ["--mesh", mesh, *argv])
    print(f"  [{tag}: {time.time() - t0:.1f} s]", flush=True)
    with open(metrics) as f:
        return [json.loads(x) for x in f], export


def cmp(a, b, key):
    assert len(a) == len(b) == int(STEPS)
    return max(abs(x[key] - y[key]) for x, y in zip(a, b))


def pdiff(pa, pb):
    with np.load(pa) as a, np.load(pb) as b:
        assert sorted(a.files) == sorted(b.files), set(a.files) ^ set(b.files)
        return max(float(np.abs(a[k] - b[k]).max()) for k in a.files)


def main(groups):
    refs = {}
    bad = []
    for g in groups:
        for model, mesh, extra in CASES[g]:
            if model not in refs:
                refs[model] = run(model + "_ref", model, None, [])
            tag = f"{model}_{mesh}_{'_'.join(extra)}".replace(",", "_").replace("=", "").replace("-", "")
            m, p = run(tag, model, mesh, extra)
            ref, ref_p = refs[model]
            r = {"loss": cmp(ref, m, "loss"), "grad_norm": cmp(ref, m, "grad_norm"), "params": pdiff(ref_p, p)}
            RESULTS[f"{model} {mesh} {' '.join(extra)}"] = r
            ok = r["loss"] < 1e-5
            bad += [] if ok else [tag]
            print(f"{'ok  ' if ok else 'FAIL'} {model} {mesh} {' '.join(extra)}: loss {r['loss']:.2e} "
                  f"grad_norm {r['grad_norm']:.2e} params {r['params']:.2e}", flush=True)
    print(json.dumps(RESULTS, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(CASES)))
