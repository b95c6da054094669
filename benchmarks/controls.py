"""Memory and communication controls on the examples: what the generated programs move, next to the plan.

    .venv/bin/python benchmarks/controls.py [--specs SPEC.yaml ...] [--steps N] [--only KIND,...] [--keep DIR]

For each spec (default: examples/*/*.yaml) it builds the spec's programs with `mithril-spec build --set ...`
(the example's own model; its data replaced by `data: {kind: synthetic}` and no `eval`, so that nothing
depends on a prepared corpus: the bytes below do not depend on the token values) and prints a table

    control | target | mesh | planned | measured | ratio | note

with, per row:

- compression (fp16, bf16, PowerSGD rank 4 from step 2) over data=2: planned, the gradient collective of
  `mithril-spec plan --format json` (its payload bytes); measured, torch: the bytes every `dist.all_reduce`
  the program's DDP communication hook calls sends in one synchronised backward pass (the program's own
  `replicate` and `compress_gradients`, as tests/communication_check.py does, on the model's inputs; the
  third pass, from PowerSGD's start step 2 on); jax: the gradient collectives of the compiled train step
  (the program's own `make_train_step`, compiled as `main` does): the 16-bit all-to-all's bytes (the
  all-gather after it moves as many: the note) and PowerSGD's f32 all-reduces in the compressing branch
  of its start-step switch.
- context (the ring attention's key/value traffic) over context=2 and data=2 x context=2: planned, the
  plan's send/recv collectives over `context` (forward + backward, per device per step); measured, jax:
  the collective-permutes of the compiled train step, each times how often its computation runs (the
  trip counts of the while loops around it, from the compiled HLO); torch: the bytes each rank sends with
  `batch_isend_irecv` over --steps steps, divided by the steps.
- offload (torch; jax and mlx refuse it: their E049 in the table) at two thresholds: planned, the plan's
  `offload_per_step` (--target torch); measured, the `offloaded_bytes` the program's metrics report for
  each of --steps steps (the program run in-process, its ActivationOffload's bytes also tallied by saved
  tensor: printed after the table, next to the plan's saved bytes by op, where the two differ).

A setting a target refuses (E049 from `mithril-spec build`) gets the diagnostic's reason instead of a
measurement. Every figure comes from the generated programs and the planner; nothing is modelled here.
Runs one measurement at a time (the machine is small).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
MS = str(Path(PY).parent / "mithril-spec")
SYNTHETIC = ["++data={kind: synthetic}", "++eval=null"]  # (`++`: whether the spec has them or not)
COMPRESSION = {
    "fp16": ["++communication.compression=fp16"],
    "bf16": ["++communication.compression=bf16"],
    "powersgd": ["++communication.compression={name: powersgd, rank: 4, start_step: 2}"],
}
SYNCED_PASSES = 3  # torch: PowerSGD compresses from its start step (2) on: the third synchronised pass
CONTEXT_MESHES = ("context=2", "data=2,context=2")
OFFLOAD_THRESHOLDS = (1, 300_000)  # elements: every saved tensor; only those above [16, 128, 128]-sized


# ------------------------------------------------------------------------------------------ the CLI


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([MS, *argv], capture_output=True, text=True, check=False, cwd=ROOT)


def overrides(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def refusal(stderr: str) -> str:
    """The first error diagnostic's code, message and help, in one line."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"error\[(E\d+)\]: (.*)", line)
        if m:
            helps = [h.split("= help:", 1)[1].strip() for h in lines[i + 1:i + 12] if "= help:" in h][:1]
            return f"{m.group(1)}: {m.group(2)}" + (f" ({helps[0]})" if helps else "")
    return stderr.strip().splitlines()[-1] if stderr.strip() else "failed"


def plan(spec: Path, mesh: str, sets: list[str], target: str) -> dict:
    p = cli("plan", str(spec), "--mesh", mesh, "--target", target, "--format", "json", *overrides(sets))
    if p.returncode != 0:
        raise RuntimeError(f"plan {spec} --mesh {mesh} {sets}: {refusal(p.stderr)}")
    return json.loads(p.stdout)


def build(spec: Path, mesh: str, sets: list[str], target: str, out: Path) -> str | None:
    """Builds into `out`; returns None, or the reason the build was refused."""
    p = cli("build", str(spec), "--target", target, "--mesh", mesh, "-o", str(out), "--force", *overrides(sets))
    return None if p.returncode == 0 else refusal(p.stderr)


def gradient_sync(doc: dict) -> dict:
    (c,) = [c for c in doc["costs"]["collectives"] if c["what"].startswith("gradient all-reduce")]
    return c


def ring_bytes(doc: dict) -> int:
    return sum(c["total_bytes"] for c in doc["costs"]["collectives"] if c["kind"] == "send/recv"
               and "context" in c["axes"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(extra: dict | None = None) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    e.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu")
    e.update(extra or {})
    return e


def worker(*argv: str, extra: dict | None = None, timeout: int = 1200) -> None:
    p = subprocess.run([PY, __file__, *argv], capture_output=True, text=True, check=False, env=env(extra),
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])}: exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")


# ------------------------------------------------------------------------------ the compiled JAX HLO

# `%name = SHAPE(S) KIND(operands)` (the shapes: the results; a long tuple's carry /*index=N*/ comments)
COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) (all-reduce|all-gather|all-to-all|reduce-scatter|"
                        r"collective-permute)(-start)?\(")
BYTES = {"u16": 2, "s16": 2, "f16": 2, "bf16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "u8": 1, "s8": 1}
HEADER = re.compile(r"^(ENTRY )?%?([^\s(]+) .*\{\s*$")
CALLS = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def hlo_collectives(text: str) -> list[dict]:
    """Every collective of a compiled module: kind, element types, bytes of its results, the lax.cond
    branch it sits in (from its op name), and `times`: how often it runs per call of the module (the
    product of the known trip counts of the while loops around it; None where one is unknown)."""
    comps: dict[str, list[str]] = {}
    entry, cur = None, None
    for line in text.splitlines():
        if cur is None:
            m = HEADER.match(line)
            if m and not line.startswith(" ") and not line.startswith("HloModule"):
                cur = m.group(2)
                comps[cur] = []
                entry = cur if m.group(1) else entry
        elif line.startswith("}"):
            cur = None
        else:
            comps[cur].append(line)
    callers: dict[str, list[tuple[str, int | None]]] = {}
    for name, lines in comps.items():
        for line in lines:
            trip = TRIP.search(line)
            for role, callee in CALLS.findall(line):
                factor = (int(trip.group(1)) if trip else None) if role == "body" else 1
                callers.setdefault(callee, []).append((name, factor))
            for group in BRANCHES.findall(line):
                for callee in group.split(","):
                    callers.setdefault(callee.strip().lstrip("%"), []).append((name, 1))
    memo: dict[str, int | None] = {}

    def times(name: str) -> int | None:
        if name == entry:
            return 1
        if name not in memo:
            memo[name] = 0
            total: int | None = 0
            for caller, factor in callers.get(name, []):
                t = times(caller)
                total = None if (t is None or factor is None or total is None) else total + t * factor
            memo[name] = total
        return memo[name]

    out = []
    for name, lines in comps.items():
        for line in lines:
            m = COLLECTIVE.match(line)
            if not m:
                continue
            shapes = re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", m.group(1))
            if m.group(3):  # an async start's result: (operands, results, ...): count the results only
                shapes = shapes[len(shapes) // 2:]
            branch = re.search(r"/branch_(\d+)_fun/", line)
            out.append({"kind": m.group(2), "types": sorted({t for t, _ in shapes}), "times": times(name),
                        "branch": int(branch.group(1)) if branch else None,
                        "bytes": sum(BYTES[t] * _prod(dims) for t, dims in shapes)})
    return out


def _prod(dims: str) -> int:
    n = 1
    for d in dims.split(","):
        if d:
            n *= int(d)
    return n


def jax_hlo_worker(out: str, *builds: str) -> None:
    """(In its own process, XLA_FLAGS set by the caller.) Each build's train step as `main` compiles it."""
    import argparse as ap

    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    result = {}
    for b in builds:
        mod = _load(b)
        mesh = mod.make_mesh()
        with jax.set_mesh(mesh):
            optimizer = mod.make_optimizer()
            shardings, batch_shardings, abstract = mod.layouts(mesh, optimizer)
            state = mod.init_state(ap.Namespace(resume=None, init_params=None, seed=0), optimizer, shardings, abstract)
            batch = mod.global_batch(mod.Data(None, seed=1), 0, batch_shardings)
            step = jax.jit(mod.make_train_step(optimizer, 0), in_shardings=(shardings, batch_shardings),
                           out_shardings=(shardings, NamedSharding(mesh, P())))
            t0 = time.perf_counter()
            text = step.lower(state, batch).compile().as_text()
        result[b] = {"collectives": hlo_collectives(text), "compile_s": time.perf_counter() - t0}
    Path(out).write_text(json.dumps(result))


# --------------------------------------------------------------------------------- torch, in ranks


def _load(build_dir: str):
    """The build's program, its files imported afresh (tests/program_import.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from program_import import load_program

    return load_program(build_dir)


def _ddp_rank(rank: int, world: int, ports: list[int], builds: list[str], out: str) -> None:
    """A rank of the compression check: the program's DDP wrapper and hook, counting all_reduce bytes."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "tests"))
    from communication_check import compressed_ddp

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1")
    torch.set_num_threads(1)
    results = {}
    for port, b in zip(ports, builds):
        os.environ["MASTER_PORT"] = str(port)
        mod = _load(b)
        device, model, ddp = compressed_ddp(mod)
        # this rank's own samples of the model's inputs (synthetic, as the program draws them)
        inputs = mod.to_tensors(mod.Data(None, seed=100 + rank).batch(0, mod.MICRO_BATCH // world), device)
        sent: list[int] = []
        plain = dist.all_reduce

        def counting(tensor, *args, _plain=plain, _sent=sent, **kwargs):
            _sent.append(tensor.numel() * tensor.element_size())
            return _plain(tensor, *args, **kwargs)

        passes = []
        for _ in range(SYNCED_PASSES):
            model.zero_grad(set_to_none=False)
            sent.clear()
            dist.all_reduce = counting
            ddp(*inputs).backward()
            dist.all_reduce = plain
            passes.append(sum(sent))
        results[b] = {"bytes": passes, "numel": sum(p.numel() for p in model.parameters())}
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def torch_ddp_worker(out: str, *builds: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_ddp_rank, args=(2, [free_port() for _ in builds], list(builds), out), nprocs=2)


def _program_rank(rank: int, world: int, port: int, build_dir: str, run_dir: str, argv: list[str]) -> None:
    """A rank of `train.py ARGV` (the environment torchrun sets), counting the bytes it sends point to point."""
    import runpy

    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    os.chdir(run_dir)
    counts = {"sent_bytes": 0, "batches": 0}
    batch = dist.batch_isend_irecv

    def counted(ops, _orig=batch):
        counts["sent_bytes"] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        counts["batches"] += 1
        return _orig(ops)

    dist.batch_isend_irecv = counted
    destroy = dist.destroy_process_group

    def write(*a, **k):
        Path(run_dir, f"sent.{rank}.json").write_text(json.dumps(counts))
        return destroy(*a, **k)

    dist.destroy_process_group = write
    train = os.path.join(build_dir, "train.py")
    sys.argv = [train, *argv]
    try:
        runpy.run_path(train, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    Path(run_dir, f"sent.{rank}.json").write_text(json.dumps(counts))


def torch_offload_worker(build_dir: str, run_dir: str, *argv: str) -> None:
    """`train.py ARGV` in this process, its ActivationOffload's moved bytes tallied by the kind of saved
    tensor (shape, dtype, the autograd node that made it) into RUN_DIR/offloaded.json (over all steps)."""
    mod = _load(build_dir)
    kinds: dict[str, int] = {}
    pack = mod.ActivationOffload.pack

    def tallied(self, t):
        before = self.moved
        packed = pack(self, t)
        if self.moved != before:
            key = f"{list(t.shape)} {str(t.dtype).replace('torch.', '')} {t.grad_fn.name() if t.grad_fn else '-'}"
            kinds[key] = kinds.get(key, 0) + self.moved - before
        return packed

    mod.ActivationOffload.pack = tallied
    os.chdir(run_dir)
    mod.main(mod.parse_args(list(argv)))
    Path(run_dir, "offloaded.json").write_text(json.dumps(dict(sorted(kinds.items(), key=lambda kv: -kv[1]))))


def torch_ranks_worker(build_dir: str, run_dir: str, world: str, *argv: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_program_rank, args=(int(world), free_port(), build_dir, run_dir, list(argv)), nprocs=int(world))


# ------------------------------------------------------------------------------------- measurements


def ratio(planned, measured) -> str:
    if not isinstance(planned, (int, float)) or not isinstance(measured, (int, float)) or not planned:
        return "-"
    return f"{measured / planned:.4f}"


class Bench:
    def __init__(self, work: Path, steps: int):
        self.work, self.steps, self.rows = work, steps, []

    def row(self, control, target, mesh, planned, measured, note=""):
        r = {"control": control, "target": target, "mesh": mesh, "planned": planned, "measured": measured,
             "ratio": ratio(planned, measured), "note": note}
        self.rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)

    def out(self, *parts: str) -> Path:
        d = self.work / "-".join(p.replace("=", "").replace(",", "_") for p in parts)
        if d.exists():
            shutil.rmtree(d)
        return d

    # -- gradient compression over data=2

    def compression(self, spec: Path, base: list[str]) -> None:
        mesh = "data=2"
        for target in ("torch", "jax"):
            builds, planned = {}, {}
            for kind, sets in COMPRESSION.items():
                doc = plan(spec, mesh, base + sets, target)
                planned[kind] = gradient_sync(doc)["bytes"]
                out = self.out(spec.stem, target, kind)
                why = build(spec, mesh, base + sets, target, out)
                if why:
                    self.row(f"compression {kind}", target, mesh, planned[kind], None, why)
                else:
                    builds[kind] = str(out)
            if not builds:
                continue
            result = self.work / f"{spec.stem}-{target}-compression.json"
            if target == "torch":
                worker("_torch_ddp", str(result), *builds.values())
                got = json.loads(result.read_text())
                for kind, b in builds.items():
                    r = got[b]
                    passes = r["bytes"]
                    note = f"bytes per synced pass {passes}; uncompressed {4 * r['numel']}"
                    self.row(f"compression {kind}", target, mesh, planned[kind], passes[-1], note)
            else:
                worker("_jax_hlo", str(result), *builds.values(),
                       extra={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
                got = json.loads(result.read_text())
                for kind, b in builds.items():
                    cs = got[b]["collectives"]

                    def total(pred, cs=cs):
                        return sum(c["bytes"] * (c["times"] or 0) for c in cs if pred(c))

                    if kind == "powersgd":
                        measured = total(lambda c: c["branch"] == 1)
                        note = (f"f32 all-reduces in the compressing branch; before step 2 (branch 0): "
                                f"{total(lambda c: c['branch'] == 0)}")
                    else:
                        measured = total(lambda c: c["kind"] == "all-to-all")
                        note = (f"all-to-all {sorted({t for c in cs if c['kind'] == 'all-to-all' for t in c['types']})}"
                                f" {measured} + all-gather {total(lambda c: c['kind'] == 'all-gather')}; other "
                                f"all-reduce {total(lambda c: c['kind'] == 'all-reduce')}")
                    if any(c["times"] is None for c in cs):
                        note += "; a loop without a known trip count"
                    self.row(f"compression {kind}", target, mesh, planned[kind], measured,
                             note + f"; compile {got[b]['compile_s']:.0f}s")

    # -- context parallelism: the ring's traffic

    def context(self, spec: Path, base: list[str]) -> None:
        for target in ("jax", "torch"):
            for mesh in CONTEXT_MESHES:
                doc = plan(spec, mesh, base, target)
                planned = ring_bytes(doc)
                out = self.out(spec.stem, target, mesh)
                why = build(spec, mesh, base, target, out)
                if why:
                    self.row("context ring", target, mesh, planned, None, why)
                    continue
                devices = int(doc["mesh"]["devices"])
                if target == "jax":
                    result = self.work / f"{out.name}.json"
                    worker("_jax_hlo", str(result), str(out),
                           extra={"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"})
                    cs = json.loads(result.read_text())[str(out)]["collectives"]
                    permutes = [c for c in cs if c["kind"] == "collective-permute"]
                    measured = sum(c["bytes"] * (c["times"] or 0) for c in permutes)
                    note = (f"{len(permutes)} collective-permutes in the HLO, run {sum(c['times'] or 0 for c in permutes)}"
                            f" times a step; all-gathers {sum(1 for c in cs if c['kind'] == 'all-gather')}")
                    self.row("context ring", target, mesh, planned, measured, note)
                else:
                    run = out.parent / f"{out.name}-run"
                    run.mkdir(exist_ok=True)
                    t0 = time.perf_counter()
                    worker("_torch_ranks", str(out), str(run), str(devices), "--steps", str(self.steps),
                           "--checkpoint-dir", "", "--metrics", str(run / "metrics.jsonl"))
                    sent = [json.loads((run / f"sent.{r}.json").read_text())["sent_bytes"] for r in range(devices)]
                    per_step = sorted({s // self.steps if s % self.steps == 0 else s / self.steps for s in sent})
                    measured = per_step[0] if len(per_step) == 1 else per_step
                    self.row("context ring", target, mesh, planned, measured,
                             f"sent per rank over {self.steps} steps: {sent}; {time.perf_counter() - t0:.0f}s")

    # -- activation offload (one device)

    def offload(self, spec: Path, base: list[str]) -> None:
        mesh = "data=1"
        for threshold in OFFLOAD_THRESHOLDS:
            sets = base + [f"++training.offload={{activations: true, threshold: {threshold}}}"]
            control = f"offload threshold {threshold}"
            for target in ("torch", "jax", "mlx"):
                doc = plan(spec, mesh, sets, target)
                acts = doc["costs"]["stages"][0]["activations"]
                planned = acts["offload_per_step"]
                out = self.out(spec.stem, target, f"offload{threshold}")
                why = build(spec, mesh, sets, target, out)
                if why or target != "torch":
                    self.row(control, target, mesh, planned, None, why or "(built; not run here)")
                    continue
                run = out.parent / f"{out.name}-run"
                run.mkdir(exist_ok=True)
                t0 = time.perf_counter()
                worker("_torch_offload", str(out), str(run), "--steps", str(self.steps), "--checkpoint-dir", "",
                       "--metrics", str(run / "metrics.jsonl"))
                moved = [json.loads(line)["offloaded_bytes"] for line in (run / "metrics.jsonl").read_text().splitlines()]
                measured = moved[0] if len(set(moved)) == 1 else moved
                self.row(control, target, mesh, planned, measured,
                         f"per step {moved}; saved activations planned {acts['saved']}; "
                         f"{time.perf_counter() - t0:.0f}s")
                kinds = json.loads((run / "offloaded.json").read_text())
                self.rows[-1]["breakdown"] = {"measured per step": {k: v // self.steps for k, v in kinds.items()},
                                              "planned by op": acts["by_op"]}


def table(rows: list[dict]) -> str:
    cols = ["spec", "control", "target", "mesh", "planned", "measured", "ratio", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="+", type=Path, default=sorted(ROOT.glob("examples/*/*.yaml")))
    parser.add_argument("--steps", type=int, default=2, help="training steps of the torch runs (context, offload)")
    parser.add_argument("--only", default="compression,context,offload", help="which controls, comma-separated")
    parser.add_argument("--keep", type=Path, help="keep the builds and runs in this directory")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="mithril-controls-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work, args.steps)
    t0 = time.perf_counter()
    for spec in args.specs:
        spec = spec.resolve()
        n = len(bench.rows)
        for control in args.only.split(","):
            getattr(bench, control.strip())(spec, SYNTHETIC)
        for r in bench.rows[n:]:
            r["spec"] = spec.stem
    print(table(bench.rows))
    for r in bench.rows:
        if "breakdown" in r and r["measured"] != r["planned"]:
            print(f"\n{r['spec']} {r['control']} {r['target']}: bytes moved per step by saved tensor "
                  "(shape dtype autograd node), and the plan's saved bytes by op:")
            for what, figures in r["breakdown"].items():
                print(f"  {what}: " + "; ".join(f"{k}: {v}" for k, v in figures.items()))
    print(f"\n{time.perf_counter() - t0:.0f} s; data: synthetic (`--set '++data={{kind: synthetic}}' --set ++eval=null`);"
          f" torch runs: {args.steps} steps")
    if args.json:
        args.json.write_text(json.dumps(bench.rows, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


WORKERS = {"_torch_offload": torch_offload_worker, "_torch_ddp": torch_ddp_worker, "_torch_ranks": torch_ranks_worker, "_jax_hlo": jax_hlo_worker}

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in WORKERS:
        WORKERS[sys.argv[1]](*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
