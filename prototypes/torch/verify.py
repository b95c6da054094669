"""Check gpt_train.py against itself on 1 process: meshes, resume, resharding, accumulation, memory.

    python verify.py                 # every check (about 5 minutes on 2 CPU cores)
    python verify.py parity resume   # some of them

Multi-rank runs use launch.py (torch.multiprocessing.spawn); the `torchrun` check uses the real
launcher. Prints one line per comparison and writes a JSON summary (--out).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PROG = os.path.join(HERE, "gpt_train.py")
PY = sys.executable
sys.path.insert(0, HERE)
import launch  # noqa: E402

TOL = 1e-5
WORK = tempfile.mkdtemp(prefix="gptverify_")
RESULTS = {}


def n_ranks(mesh):
    n = 1
    for part in (mesh or "").split(","):
        if part:
            n *= int(part.split("=")[1])
    return n


def train(tag, mesh=None, *args):
    """Run the program; returns (metrics list, export path). mesh None: one plain process, no dist."""
    metrics = os.path.join(WORK, tag + ".jsonl")
    export = os.path.join(WORK, tag + ".npz")
    argv = ["--metrics", metrics, "--export-params", export, *args]
    t0 = time.time()
    if mesh is None:
        subprocess.run([PY, PROG, *argv], check=True, stdout=subprocess.DEVNULL)
    else:
        launch.run(n_ranks(mesh), PROG, ["--mesh", mesh, *argv])
    print(f"  [{tag}: {time.time() - t0:.1f} s]", flush=True)
    with open(metrics) as f:
        return [json.loads(line) for line in f], export


def diff(a, b, key="loss"):
    assert len(a) == len(b) and all(x["step"] == y["step"] for x, y in zip(a, b)), (len(a), len(b))
    return max(abs(x[key] - y[key]) for x, y in zip(a, b))


def params_diff(pa, pb):
    with np.load(pa) as a, np.load(pb) as b:
        assert sorted(a.files) == sorted(b.files)
        return max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files)


def report(name, value, tol=TOL):
    ok = value < tol
    RESULTS[name] = {"value": value, "tol": tol, "ok": ok}
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {value:.3g} (tol {tol:g})", flush=True)


MESHES = ["data=4", "fsdp=4", "data=2,fsdp=2", "fsdp=2,tensor=2", "data=2,tensor=2", "tensor=4",
          "data=2,fsdp=2,tensor=2"]


def check_parity():
    ref, ref_p = train("ref6", None, "--steps", "6")
    for mesh in MESHES:
        tag = "p_" + mesh.replace(",", "_").replace("=", "")
        mem = os.path.join(WORK, tag + "_mem.json")
        m, p = train(tag, mesh, "--steps", "6", "--memory-report", mem)
        report(f"parity {mesh}: loss", diff(ref, m))
        report(f"parity {mesh}: grad_norm", diff(ref, m, "grad_norm"))
        report(f"parity {mesh}: params after 6 steps", params_diff(ref_p, p))
        with open(mem) as f:
            RESULTS[f"memory {mesh}"] = json.load(f)
            print(f"  bytes per rank (params, grads, optimizer): "
                  f"{[(r['params'], r['grads'], r['optimizer']) for r in RESULTS[f'memory {mesh}']]}")
    mem = os.path.join(WORK, "ref_mem.json")
    train("ref_mem", None, "--steps", "1", "--memory-report", mem)
    with open(mem) as f:
        RESULTS["memory 1 process"] = json.load(f)
    print(f"  1 process bytes: {RESULTS['memory 1 process']}")


def check_init_export():
    # --steps 0 exports the initial params: identical on every mesh
    _, p1 = train("init1", None, "--steps", "0")
    _, p8 = train("init8", "data=2,fsdp=2,tensor=2", "--steps", "0")
    report("steps 0 export: 1 process vs 3-D mesh", params_diff(p1, p8), 1e-12)
    # --init-params round trip: start a sharded run from a file, export again unchanged
    _, p4 = train("init_rt", "fsdp=2,tensor=2", "--steps", "0", "--init-params", p1)
    report("init-params -> export round trip", params_diff(p1, p4), 1e-12)


def check_resume():
    ref, ref_p = train("ref10", None, "--steps", "10")
    for mesh in (None, "data=2,fsdp=2"):
        tag = "r_" + (mesh or "1").replace(",", "_").replace("=", "")
        ck = os.path.join(WORK, tag + "_ckpt")
        same, same_p = (ref, ref_p) if mesh is None else train(tag + "_10", mesh, "--steps", "10")
        a, _ = train(tag + "_a", mesh, "--steps", "5", "--checkpoint-dir", ck)
        b, p = train(tag + "_b", mesh, "--steps", "10", "--resume", ck)
        report(f"resume {mesh or '1 process'}: 5 + 5 vs 10 steps (same mesh), loss", diff(same, a + b), 1e-6)
        report(f"resume {mesh or '1 process'}: final params (same mesh)", params_diff(same_p, p), 1e-6)
        report(f"resume {mesh or '1 process'}: 5 + 5 vs 10 steps on 1 process, loss", diff(ref, a + b), 1e-5)
    # reshard: saved on 4 ranks (fsdp=4), resumed on 2 ranks (fsdp=2), 1 process, and TP
    ck = os.path.join(WORK, "rs_ckpt")
    train("rs_a", "fsdp=4", "--steps", "5", "--checkpoint-dir", ck, "--checkpoint-every", "5")
    assert os.listdir(ck) == ["step_00000005"], os.listdir(ck)  # no temp dir left behind
    for mesh in ("fsdp=2", None, "fsdp=2,tensor=2"):
        tag = "rs_b_" + (mesh or "1").replace(",", "_").replace("=", "")
        b, _ = train(tag, mesh, "--steps", "8", "--resume", ck)
        report(f"reshard fsdp=4 -> {mesh or '1 process'}: steps 6-8 loss", diff(ref[5:8], b), 1e-6)


def check_accum():
    ref, _ = train("acc1", None, "--steps", "6")
    a, _ = train("acc2", None, "--steps", "6", "--grad-accum", "2")
    report("grad_accum 2 vs 1, 1 process", diff(ref, a))
    for mesh in ("data=2", "data=2,fsdp=2", "fsdp=2,tensor=2"):
        tag = "acc2_" + mesh.replace(",", "_").replace("=", "")
        a, _ = train(tag, mesh, "--steps", "6", "--grad-accum", "2")
        report(f"grad_accum 2 on {mesh} vs 1 process", diff(ref, a))


def check_options():
    ref, _ = train("opt_ref", None, "--steps", "5")
    a, _ = train("ac1", None, "--steps", "5", "--activation-checkpointing")
    report("activation checkpointing, 1 process", diff(ref, a), 1e-6)
    a, _ = train("ac4", "fsdp=2,tensor=2", "--steps", "5", "--activation-checkpointing")
    report("activation checkpointing, fsdp=2,tensor=2", diff(ref, a))
    a, _ = train("bf16_1", None, "--steps", "5", "--compute", "bfloat16")
    report("bf16 autocast vs fp32 (1 process)", diff(ref, a), 5e-2)
    a, _ = train("bf16_fsdp", "fsdp=2", "--steps", "5", "--compute", "bfloat16")
    report("bf16 FSDP2 MixedPrecisionPolicy vs fp32", diff(ref, a), 5e-2)
    a, _ = train("bf16_ddp", "data=2", "--steps", "5", "--compute", "bfloat16")
    report("bf16 DDP + autocast vs fp32", diff(ref, a), 5e-2)
    a, _ = train("compile1", None, "--steps", "5", "--compile")
    report("torch.compile per block, 1 process", diff(ref, a), 1e-5)
    # arrays on disk: write the synthetic samples, train from them, same losses
    sys.path.insert(0, HERE)
    import gpt_train

    ddir = os.path.join(WORK, "arrays")
    os.makedirs(ddir, exist_ok=True)
    n = 5 * 16
    cols = gpt_train.Data(None, 0).get(0, n)
    for (name, *_), arr in zip(gpt_train.INPUTS, cols):
        np.save(os.path.join(ddir, name + ".npy"), arr)
    a, _ = train("data_arrays", "data=2,fsdp=2", "--steps", "5", "--data", ddir)
    report("--data arrays (mmap) on data=2,fsdp=2 vs synthetic", diff(ref, a), 1e-6)


def check_launch():
    # real torchrun path, and the wrong-world-size exit
    metrics = os.path.join(WORK, "torchrun.jsonl")
    t0 = time.time()
    subprocess.run(["torchrun", "--nproc-per-node", "4", PROG, "--mesh", "data=2,fsdp=2", "--steps", "5",
                    "--metrics", metrics], check=True, stdout=subprocess.DEVNULL, env=_env())
    print(f"  [torchrun 4 ranks: {time.time() - t0:.1f} s]")
    ref, _ = train("tr_ref", None, "--steps", "5")
    with open(metrics) as f:
        report("torchrun data=2,fsdp=2 vs 1 process", diff(ref, [json.loads(x) for x in f]))
    r = subprocess.run(["torchrun", "--nproc-per-node", "2", PROG, "--mesh", "fsdp=4", "--steps", "1"],
                       capture_output=True, text=True, env=_env())
    msg = [line for line in r.stderr.splitlines() if "needs 4 ranks" in line]
    print(f"  wrong world size: torchrun rc {r.returncode}; message: {msg[:1]}")
    r1 = subprocess.run([PY, PROG, "--mesh", "fsdp=2"], capture_output=True, text=True)
    RESULTS["wrong world size"] = {"torchrun_rc": r.returncode, "plain_rc": r1.returncode, "message": r1.stderr.strip()}
    report("wrong world size: plain process exit code is 2", abs(r1.returncode - 2), 0.5)
    d = subprocess.run(["torchrun", "--nproc-per-node", "8", PROG, "--mesh", "data=2,fsdp=2,tensor=2", "--dry-run"],
                       capture_output=True, text=True, env=_env())
    print(d.stdout)
    RESULTS["dry-run 8 ranks"] = d.stdout


def _env():
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


CHECKS = {"parity": check_parity, "init_export": check_init_export, "resume": check_resume,
          "accum": check_accum, "options": check_options, "launch": check_launch}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("checks", nargs="*", default=list(CHECKS))
    ap.add_argument("--out", default=os.path.join(WORK, "results.json"))
    args = ap.parse_args()
    t0 = time.time()
    for name in args.checks:
        print(f"== {name}", flush=True)
        CHECKS[name]()
    with open(args.out, "w") as f:
        json.dump(RESULTS, f, indent=1)
    bad = [k for k, v in RESULTS.items() if isinstance(v, dict) and v.get("ok") is False]
    print(f"{len(bad)} failed {bad}; {time.time() - t0:.0f} s; results in {args.out}")
    sys.exit(1 if bad else 0)
