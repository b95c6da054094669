"""Checks for gpt_train.py (run: python prototypes/jax/verify.py [check ...]).

Every check launches gpt_train.py as a subprocess (the device count is fixed per
process) and compares the metrics / exported parameters. Prints one line per
check with the measured numbers; exits 1 if any check fails.
"""

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "gpt_train.py")
PY = sys.executable
TMP = tempfile.mkdtemp(prefix="gptv_")
RESULTS = []


def run(name, *flags, env=None, expect_rc=0):
    """Run gpt_train.py; return (metrics list, exported params dict or None, stdout)."""
    metrics = os.path.join(TMP, name + ".jsonl")
    export = os.path.join(TMP, name + ".npz")
    cmd = [PY, TRAIN, "--metrics", metrics, "--export-params", export, *flags]
    e = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, env=e)
    if p.returncode != expect_rc:
        print(p.stdout[-2000:], p.stderr[-4000:])
        raise RuntimeError(f"{name}: rc {p.returncode} != {expect_rc}")
    return read(metrics), (dict(np.load(export)) if os.path.exists(export) else None), p.stdout + p.stderr


def read(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def losses(m):
    return np.array([r["loss"] for r in m])


def max_param_diff(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def check(name, ok, detail):
    RESULTS.append((name, ok))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_ref = {}


def reference(steps=6):
    if steps not in _ref:
        _ref[steps] = run(f"ref{steps}", "--steps", str(steps), "--mesh", "data=1")
    return _ref[steps]


def check_meshes():
    ref_m, ref_p, _ = reference()
    for mesh in ["data=2,fsdp=2,tensor=2", "data=8", "fsdp=8", "data=2,tensor=4"]:
        m, p, _ = run("mesh_" + mesh.replace(",", "_").replace("=", ""), "--steps", "6", "--mesh", mesh)
        dl = float(np.abs(losses(m) - losses(ref_m)).max())
        dg = max(abs(a["grad_norm"] - b["grad_norm"]) for a, b in zip(m, ref_m))
        dp = max_param_diff(p, ref_p)
        check(f"mesh {mesh} vs 1 device (6 steps)", len(m) == 6 and dl < 1e-5,
              f"max|dloss|={dl:.2e} max|dgnorm|={dg:.2e} max|dparam|={dp:.2e}")


def check_resume():
    full_m, full_p, _ = run("full10", "--steps", "10", "--mesh", "data=2,fsdp=2,tensor=2")
    ck = os.path.join(TMP, "ckpt")
    a_m, _, _ = run("part5", "--steps", "5", "--mesh", "data=2,fsdp=2,tensor=2", "--checkpoint-dir", ck,
                    "--checkpoint-every", "2")
    saved = sorted(os.listdir(ck))
    b_m, b_p, out = run("resume10", "--steps", "10", "--mesh", "data=2,fsdp=2,tensor=2", "--resume", ck)
    both = losses(a_m) .tolist() + losses(b_m).tolist()
    dl = float(np.abs(np.array(both) - losses(full_m)).max())
    dp = max_param_diff(b_p, full_p)
    steps = [r["step"] for r in b_m]
    check("10 steps == 5 + resume 5 (8 dev)", dl <= 1e-6 and steps == list(range(6, 11)),
          f"max|dloss|={dl:.2e} max|dparam|={dp:.2e} resumed steps {steps[0]}..{steps[-1]} ckpt dirs {saved}")
    # resume onto a different mesh (orbax reshards on restore)
    c_m, _, _ = run("resume10_1dev", "--steps", "10", "--mesh", "data=1", "--resume", ck)
    dl = float(np.abs(losses(c_m) - losses(full_m)[5:]).max())
    check("resume an 8-device checkpoint on 1 device", dl < 1e-5, f"max|dloss|={dl:.2e}")


def check_multiprocess():
    ref_m, ref_p, _ = run("mp_ref", "--steps", "6", "--mesh", "data=2,fsdp=2,tensor=2")
    port = free_port()
    procs = []
    t0 = time.time()
    for pid in range(2):
        env = dict(os.environ, MITHRIL_COORDINATOR=f"127.0.0.1:{port}", MITHRIL_NUM_PROCESSES="2",
                   MITHRIL_PROCESS_ID=str(pid))
        cmd = [PY, TRAIN, "--steps", "6", "--mesh", "data=2,fsdp=2,tensor=2",
               "--metrics", os.path.join(TMP, f"mp{pid}.jsonl"), "--export-params", os.path.join(TMP, f"mp{pid}.npz"),
               "--checkpoint-dir", os.path.join(TMP, "mp_ckpt")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    wall = time.time() - t0
    if any(p.returncode for p in procs):
        print(outs[0][-3000:], outs[1][-3000:])
        check("2 processes x 4 devices == 1 process x 8", False, f"rc {[p.returncode for p in procs]}")
        return
    m = read(os.path.join(TMP, "mp0.jsonl"))
    p = dict(np.load(os.path.join(TMP, "mp0.npz")))
    dl = float(np.abs(losses(m) - losses(ref_m)).max())
    dp = max_param_diff(p, ref_p)
    only0 = not os.path.exists(os.path.join(TMP, "mp1.jsonl")) and not os.path.exists(os.path.join(TMP, "mp1.npz"))
    check("2 processes x 4 devices == 1 process x 8", dl < 1e-5 and only0,
          f"max|dloss|={dl:.2e} max|dparam|={dp:.2e} rank1 wrote nothing={only0} wall={wall:.1f}s")
    # and resume that multi-process checkpoint in a single process
    r_m, _, _ = run("mp_resume", "--steps", "8", "--mesh", "data=2,fsdp=2,tensor=2",
                    "--resume", os.path.join(TMP, "mp_ckpt"))
    full8, _, _ = run("mp_full8", "--steps", "8", "--mesh", "data=2,fsdp=2,tensor=2")
    dl = float(np.abs(losses(r_m) - losses(full8)[6:]).max())
    check("resume the 2-process checkpoint in 1 process", dl <= 1e-6, f"max|dloss|={dl:.2e}")


def check_grad_accum():
    for mesh in ["data=1", "data=2,fsdp=2,tensor=2"]:
        a1, p1, _ = run("ga1_" + mesh[:6], "--steps", "6", "--mesh", mesh, "--grad-accum", "1")
        a2, p2, _ = run("ga2_" + mesh[:6], "--steps", "6", "--mesh", mesh, "--grad-accum", "2")
        dl = float(np.abs(losses(a1) - losses(a2)).max())
        check(f"grad_accum 2 == 1 ({mesh})", dl < 1e-5, f"max|dloss|={dl:.2e} max|dparam|={max_param_diff(p1, p2):.2e}")


def check_remat_bf16():
    ref_m, _, _ = reference()
    for mode in ["selective", "full"]:
        m, _, _ = run("remat_" + mode, "--steps", "6", "--mesh", "data=2,fsdp=2,tensor=2", "--remat", mode)
        dl = float(np.abs(losses(m) - losses(ref_m)).max())
        check(f"remat {mode} == none", dl < 1e-5, f"max|dloss|={dl:.2e}")
    m, _, _ = run("bf16", "--steps", "6", "--mesh", "data=2,fsdp=2,tensor=2", "--compute-dtype", "bfloat16")
    dl = float(np.abs(losses(m) - losses(ref_m)).max())
    check("bf16 compute close to fp32", dl < 5e-2, f"max|dloss|={dl:.2e} (tolerance 5e-2)")


def check_schedule_and_init():
    ref_m, _, _ = run("ref20", "--steps", "20")
    lr, W, T = 3e-4, 5, 20

    def documented(t):
        if t < W:
            return lr * (t + 1) / W
        return lr * (0.5 * (1 + math.cos(math.pi * (t - W) / max(1, T - W))))

    d = max(abs(r["lr"] - documented(r["step"] - 1)) for r in ref_m)
    check("lr == documented cosine formula (20 steps)", d < 1e-10, f"max|dlr|={d:.2e} final loss {ref_m[-1]['loss']:.4f}")
    _, p, _ = run("init0", "--steps", "0", "--mesh", "data=2,fsdp=2,tensor=2")
    worst = 0.0
    for name, v in p.items():
        if name.endswith("bias"):
            want = np.zeros_like(v)
        elif ".ln" in name or name.startswith("ln_f"):
            want = np.ones_like(v)
        else:
            rng = np.random.default_rng([0, zlib.crc32(name.encode())])
            want = (rng.standard_normal(v.shape, dtype=np.float32) * 0.02).astype(np.float32)
        worst = max(worst, float(np.abs(v - want).max()))
    check("--steps 0 exports the numpy init (52 params)", worst == 0.0 and len(p) == 52, f"max diff {worst}")
    # --init-params round trip: start from the exported init, same trajectory as the reference
    m, _, _ = run("initp", "--steps", "6", "--mesh", "data=2,tensor=4", "--init-params", os.path.join(TMP, "init0.npz"))
    dl = float(np.abs(losses(m) - losses(reference()[0])).max())
    check("--init-params round trip", dl < 1e-5, f"max|dloss|={dl:.2e}")


def check_data_and_errors():
    # arrays dir: write exactly the synthetic samples 0..N-1; must reproduce the synthetic run
    n = 6 * 16
    d = os.path.join(TMP, "arrays")
    os.makedirs(d, exist_ok=True)
    tok = np.empty((n, 64), np.int32)
    tgt = np.empty((n, 64), np.int32)
    for i in range(n):
        rng = np.random.default_rng([1, i])
        tok[i] = rng.integers(0, 256, size=(64,), dtype=np.int64)
        tgt[i] = rng.integers(0, 256, size=(64,), dtype=np.int64)
    np.save(os.path.join(d, "tokens.npy"), tok)
    np.save(os.path.join(d, "targets.npy"), tgt)
    m, _, _ = run("arrays", "--steps", "6", "--mesh", "data=2,fsdp=2,tensor=2", "--data", d)
    dl = float(np.abs(losses(m) - losses(reference()[0])).max())
    check("--data arrays dir == synthetic", dl < 1e-5, f"max|dloss|={dl:.2e}")
    txt = os.path.join(TMP, "text.txt")
    with open(txt, "w") as f:
        f.write(open(TRAIN).read() * 3)
    m, _, _ = run("text", "--steps", "20", "--mesh", "data=2,fsdp=2,tensor=2", "--data", txt)
    check("--data text file trains", m[-1]["loss"] < m[0]["loss"] - 0.5,
          f"loss {m[0]['loss']:.3f} -> {m[-1]['loss']:.3f}")
    _, _, out = run("wrongdev", "--steps", "1", "--mesh", "data=2,fsdp=2,tensor=2",
                    env={"JAX_NUM_CPU_DEVICES": "4"}, expect_rc=2)
    check("wrong device count exits 2", "needs 8 devices" in out, out.strip().splitlines()[-1])


def check_dry_run_bytes():
    _, _, out = run("dry", "--dry-run", "--mesh", "data=2,fsdp=2,tensor=2")
    line = [l for l in out.splitlines() if l.startswith("device 0 bytes")][0]
    printed = int(line.rsplit("=", 1)[1])
    # Cross-check against the real shards: build params + opt state in a child with 8 devices.
    code = f"""
import sys; sys.path.insert(0, {HERE!r})
import jax; jax.config.update("jax_num_cpu_devices", 8)
import gpt_train as g, jax.numpy as jnp
from jax.sharding import AxisType
mesh = jax.make_mesh((2, 2, 2), g.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
t = g.param_table(); sh = g.make_param_shardings(mesh, t)
params = g.init_params(t, sh, 0, jnp.float32)
opt = g.make_optimizer(g.TRAIN, {{n: jax.ShapeDtypeStruct(p.shape, p.dtype) for n, p in params.items()}}, 20)
osh = g.opt_state_shardings(opt, params, sh, mesh)
state = jax.jit(opt.init, out_shardings=osh)(params)
d0 = jax.devices()[0]
print(sum(s.data.nbytes for x in jax.tree.leaves((params, state)) for s in x.addressable_shards if s.device == d0))
"""
    actual = int(subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1])
    check("--dry-run device-0 bytes == real addressable shards on device 0", printed == actual,
          f"{line} (measured {actual}; unsharded params+adam = {832256 * 4 * 3 + 8})")


def check_reference_model():
    """Step-1 loss and grad norm vs an independent float64 torch forward/backward of the spec'd model."""
    import torch
    ref_m, _, _ = reference()
    _, p0, _ = run("init0_ref", "--steps", "0")
    P_ = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in p0.items()}
    tok = np.empty((16, 64), np.int64)
    tgt = np.empty((16, 64), np.int64)
    for i in range(16):
        rng = np.random.default_rng([1, i])
        tok[i] = rng.integers(0, 256, size=(64,), dtype=np.int64)
        tgt[i] = rng.integers(0, 256, size=(64,), dtype=np.int64)
    tok, tgt = torch.tensor(tok), torch.tensor(tgt)
    F = torch.nn.functional
    x = P_["wte.weight"][tok] + P_["wpe.weight"][None]
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    for i in range(4):
        b = f"blocks.{i}."
        h = F.layer_norm(x, (128,), P_[b + "ln1.weight"], P_[b + "ln1.bias"], 1e-5)
        q, k, v = (h @ P_[b + f"attn.{n}.weight"] for n in "qkv")
        q, k, v = (t.view(16, 64, 4, 32).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(32)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        x = x + (a @ v).transpose(1, 2).reshape(16, 64, 128) @ P_[b + "attn.o.weight"]
        h = F.layer_norm(x, (128,), P_[b + "ln2.weight"], P_[b + "ln2.bias"], 1e-5)
        h = F.gelu(h @ P_[b + "mlp.fc.weight"] + P_[b + "mlp.fc.bias"], approximate="tanh")
        x = x + h @ P_[b + "mlp.proj.weight"] + P_[b + "mlp.proj.bias"]
    x = F.layer_norm(x, (128,), P_["ln_f.weight"], P_["ln_f.bias"], 1e-5)
    loss = F.cross_entropy((x @ P_["wte.weight"].T).reshape(-1, 256), tgt.reshape(-1))
    loss.backward()
    loss = loss.detach()
    gn = math.sqrt(sum(float((t.grad ** 2).sum()) for t in P_.values()))
    dl, dg = abs(float(loss) - ref_m[0]["loss"]), abs(gn - ref_m[0]["grad_norm"])
    check("step-1 loss/grad-norm == float64 torch reference", dl < 1e-5 and dg < 1e-5,
          f"|dloss|={dl:.2e} |dgnorm|={dg:.2e} (loss {float(loss):.6f}, gnorm {gn:.6f})")


CHECKS = {
    "reference": check_reference_model,
    "meshes": check_meshes, "resume": check_resume, "multiprocess": check_multiprocess,
    "grad_accum": check_grad_accum, "remat_bf16": check_remat_bf16, "schedule_init": check_schedule_and_init,
    "data_errors": check_data_and_errors, "dry_run": check_dry_run_bytes,
}

if __name__ == "__main__":
    t0 = time.time()
    for name in sys.argv[1:] or CHECKS:
        CHECKS[name]()
    print(f"{sum(ok for _, ok in RESULTS)}/{len(RESULTS)} passed in {time.time() - t0:.0f}s (tmp {TMP})")
    sys.exit(0 if all(ok for _, ok in RESULTS) else 1)
