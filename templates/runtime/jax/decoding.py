"""The spec-independent part of a JAX program's generate.py: the key/value caches' layouts on the mesh and the
jitted decode of one position at a time that keeps them there. The program passes its decode step (the
model at one position) and its caches' shapes."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from runtime.jax.checkpoints import to_host
from runtime.sampling import encode_prompt, load_tokenizer, print_result, sample_tokens


def cache_layouts(mesh, caches, dtype, piped=None):
    """The caches' shapes, dtypes (`dtype`: the compute dtype) and shardings: {layer: {"k": ..., "v": ...}}
    of `caches` ({layer, or repeat: {layer}}: (shape, the mesh axes its heads are split over)); the
    `piped` repeat's copies (its first dimension) split over `pipe`, as its stacked parameters are."""

    def one(shape, heads, split=False):
        spec = P(*(["pipe"] if split else [None]), *[None] * (len(shape) - 3), heads or None, None)
        s = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
        return {"k": s, "v": s}

    return {
        name: {k: one(*v, split=name == piped) for k, v in entry.items()}
        if isinstance(entry, dict)
        else one(*entry)
        for name, entry in caches.items()
    }


def cached_decoder(decode_step, params, mesh, caches):
    """step(token, pos) -> the logits of the next position (numpy) of decode_step(params, caches, ids, pos)
    -> (logits, caches), the caches (of cache_layouts) kept on the mesh."""
    shardings = jax.tree.map(lambda s: s.sharding, caches)
    cache = jax.jit(
        lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), caches),
        out_shardings=shardings,
    )()
    run = jax.jit(
        decode_step, out_shardings=(NamedSharding(mesh, P()), shardings), donate_argnums=1
    )
    state = {"cache": cache}

    def step(token, pos):
        logits, state["cache"] = run(
            params, state["cache"], np.full((1, 1), token, np.int32), np.int32(pos)
        )
        return to_host(logits)[0]

    return step


def full_logits(logits_of, params, sharding, shape, tokens, order=None):
    """full(ids) -> the logits of each position [len(ids), vocab] (numpy) of the first row of
    logits_of(params, {tokens: a batch of `shape` (..., sequence), laid out by `sharding`, every row the ids
    padded}): the training program's forward pass over the whole sequence. `order`: the order of positions
    the program holds a sequence (and its logits) in (context parallelism), if not their own."""

    def full(ids):
        batch = np.zeros(shape, np.int32)
        batch[..., : len(ids)] = ids
        if order is not None:
            batch = np.ascontiguousarray(batch[..., order])
        tokens_in = jax.make_array_from_callback(batch.shape, sharding, lambda index: batch[index])
        logits = to_host(logits_of(params, {tokens: tokens_in}))
        logits = logits.reshape(-1, *logits.shape[-2:])[0]
        return (logits if order is None else logits[np.argsort(order)])[: len(ids)]

    return full


def generate(args, vocab, seq, setup_devices, make_mesh, load_model, decoder, full_forward):
    """generate.py's run: the prompt (runtime/sampling.py), the devices and the mesh, the parameters
    load_model(args, mesh), the tokens sampled with decoder(params, mesh) (a cached_decoder), and what is
    printed (--check: against full_forward(params, mesh), the training program's forward pass)."""
    tokenizer = load_tokenizer(args.tokenizer)
    ids = encode_prompt(args, tokenizer, vocab, seq)
    setup_devices(args)  # train.py's: the mesh's devices (simulated on CPU), several processes
    mesh = make_mesh()
    with jax.set_mesh(mesh):
        params = load_model(args, mesh)
        out, seen, seconds = sample_tokens(decoder(params, mesh), ids, args, seq)
        full, first = full_forward(params, mesh), jax.process_index() == 0
        print_result(args, ids, out, seen, seconds, tokenizer, full, first, seq)
    if jax.process_count() > 1:
        jax.distributed.shutdown()
