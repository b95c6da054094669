"""Count gradient collectives per micro-step of an accumulation step (equal losses alone do not show
that non-final micro-steps skipped the gradient sync).

    python check_nosync.py data=2 data=2,fsdp=2 fsdp=2,tensor=2

FSDP2 issues reduce-scatters through torch.distributed.reduce_scatter_single and the HSDP
all-reduce through torch.distributed.all_reduce (both patched here to count); DDP reduces in C++,
so a counting comm hook (wrapping the default all-reduce hook) is registered instead.
"""

import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _child(rank, world, port, mesh_text, q):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import gpt_train as g

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    counts = {"reduce_scatter": 0, "all_reduce": 0, "ddp_bucket_allreduce": 0}
    for name, key in (("reduce_scatter_single", "reduce_scatter"), ("all_reduce", "all_reduce")):
        orig = getattr(dist, name)

        def counted(*a, _orig=orig, _key=key, **k):
            counts[_key] += 1
            return _orig(*a, **k)

        setattr(dist, name, counted)
    sizes = g.parse_mesh(mesh_text)
    model = g.GPT(**g.MODEL)
    plan = g.param_plan(model)
    g.load_canonical(model, plan, g.init_canonical(plan, 0))
    model, mesh, kind, _ = g.setup_parallel(model, sizes, torch.device("cpu"), torch.float32)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state, bucket):
            counts["ddp_bucket_allreduce"] += 1
            return allreduce_hook(state, bucket)

        model.register_comm_hook(mesh.get_group("data"), hook)
    tokens = torch.randint(0, 256, (2, 64))
    per_micro = []
    for k, last in enumerate((False, True)):
        before = dict(counts)
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        ctx = model.no_sync() if (hasattr(model, "no_sync") and not last) else torch.enable_grad()
        with ctx:
            model(tokens, tokens).backward()
        per_micro.append({c: counts[c] - before[c] for c in counts})
    if rank == 0:
        q.put((mesh_text, kind, per_micro))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    import launch

    ctx = mp.get_context("spawn")
    for mesh_text in sys.argv[1:] or ["data=2", "data=2,fsdp=2", "fsdp=2,tensor=2"]:
        n = 1
        for part in mesh_text.split(","):
            n *= int(part.split("=")[1])
        q = ctx.SimpleQueue()
        mp.spawn(_child, args=(n, launch.free_port(), mesh_text, q), nprocs=n)
        mesh_text, kind, per_micro = q.get()
        print(f"{mesh_text} ({kind}): micro-step 1 (no sync) {per_micro[0]}; micro-step 2 (sync) {per_micro[1]}")
