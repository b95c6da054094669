"""gpt-pipe: the model as pure functions of a dict of parameters by canonical name."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from runtime.jax.remat import remat

# what the spec decided that only this file uses (the settings several files share: config.py)
REMAT = "none"  # none | selective | full


def project_together(x, weights, parts):
    """[x @ w for w in weights] as one matmul, so that the gradient of x is one partial sum over the
    tensor-parallel axes (one all-reduce, Megatron's count) rather than one per weight. Each weight
    [D, n] is viewed as [D, parts, n / parts], the shards of its output features on the middle axis,
    and the views are joined along the last axis: no shard moves."""
    joined = jnp.concatenate([w.reshape(w.shape[0], parts, -1) for w in weights], axis=-1)
    y = jnp.einsum("...d,dsn->...sn", x, joined)
    cuts = np.cumsum([w.shape[1] // parts for w in weights])[:-1]
    return [part.reshape(*x.shape[:-1], -1) for part in jnp.split(y, cuts, axis=-1)]


def attention(x, p, pre, heads, head_dim, causal=False, bias=False, parts=1):
    """Multi-head self-attention over [B, T, D] with parameters pre + "q.weight" etc.
    q, k and v come from one matmul (project_together: `parts` shards of their output features).
    Scores and softmax in float32."""
    B, T, _ = x.shape
    names = [pre + n + ".weight" for n in "qkv"]
    q, k, v = project_together(x, [p[n] for n in names], parts)
    if bias:
        q, k, v = (y + p[n[: -len("weight")] + "bias"] for y, n in zip((q, k, v), names))
    q, k, v = (y.reshape(B, T, heads, head_dim) for y in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(head_dim)
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones((T, T), dtype=bool)), scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, heads * head_dim)
    out = out @ p[pre + "o.weight"]
    return out + p[pre + "o.bias"] if bias else out


def embedding(ids, table):
    """Row lookup from a replicated copy of the table, so the result follows the batch layout of `ids`.
    (Gathering from a table sharded along its features gives a result sharded along features, which XLA
    then reshards with an "involuntary full rematerialization".)"""
    return jax.lax.with_sharding_constraint(table, P())[ids]


def layer_norm(x, weight, bias, eps):
    """Over the last dimension. Statistics in float32 whatever the compute dtype: the mean and variance
    of a few hundred bfloat16 values would keep little of their mantissa."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps) * weight
    return (y if bias is None else y + bias).astype(x.dtype)


def mlp(x, p, pre, activation, bias):
    """The feed-forward block: proj(act(fc(x))).
    Its gelu is the tanh approximation (GPT-2's).
    """

    def dense(name, h):
        y = h @ p[pre + name + ".weight"]
        return y + p[pre + name + ".bias"] if bias else y

    act = {
        "gelu": lambda h: jax.nn.gelu(h, approximate=True),
        "relu": jax.nn.relu,
        "silu": jax.nn.silu,
    }
    return dense("proj", act[activation](dense("fc", x)))


def cross_entropy(logits, targets):
    """Mean over every target position of the (micro-)batch, in float32."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    return losses.mean()


def decoder_block(p, block_input):
    """One copy of the `decoder` block. `p`: its parameters by their names inside the block
    ("<layer>.<param>"). Returns its output."""
    ln1 = layer_norm(block_input, p["ln1.weight"], p["ln1.bias"], eps=1e-05)
    attn = attention(ln1, p, "attn.", heads=4, head_dim=16, causal=True, parts=2)
    res1 = block_input + attn
    ln2 = layer_norm(res1, p["ln2.weight"], p["ln2.bias"], eps=1e-05)
    mlp_ = mlp(ln2, p, "mlp.", activation="gelu", bias=True)
    res2 = res1 + mlp_
    return res2


def decoder_stack(p, name, x):
    """The copies of the `decoder` block that the repeat `name` holds, one after the other: one lax.scan over
    the rows of its stacked parameters "<name>.*.<param>" in `p`, so that the block is traced and compiled
    once, however many copies there are.
    For the backward pass each copy keeps its inputs and its matmuls' outputs only (runtime/jax/remat.py).
    """
    pre = name + ".*."
    rows = {"p": {k[len(pre) :]: w for k, w in p.items() if k.startswith(pre)}}
    block = remat(decoder_block, REMAT)

    def step(x, row):
        x = block(row["p"], x)
        # Pin the residual stream between blocks (batch split, features whole): otherwise XLA may
        # keep it split along features after an fsdp-sharded weight and add collectives.
        x = jax.lax.with_sharding_constraint(x, P("data", None, None))
        return x, None

    x, _ = jax.lax.scan(step, x, rows)
    return x
