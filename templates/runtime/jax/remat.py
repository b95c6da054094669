"""Activation recomputation in the JAX programs (the spec's `training.remat`): what the backward pass of a block
keeps from its forward pass, and what it computes again."""

import jax


def remat(fn, mode, ring=False):
    """`fn` under jax.checkpoint with the policy of the spec's `remat` (`mode`):
    - "full": only the inputs are kept, everything else is recomputed;
    - "selective": the weight matmuls' outputs are kept;
    - "none" (a repeated block's copy under lax.scan): the output of every matmul, and every value laid out
      anew (which XLA may have moved between devices); with `ring`, also the key/value blocks ring attention
      received (the backward pass does not pass them around again). The elementwise work between them
      (normalisations, activations, softmax) is recomputed inside the backward pass's fused kernels:
      lax.scan writes each value it keeps into a stack over the copies, and keeping those as well would write
      and read back several arrays per matmul (the tanh GELU alone five the size of its input), which XLA's
      fusion of an unrolled model never materialises."""
    if mode == "full":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)
    if mode == "selective":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)

    def keep(prim, *args, **params):
        return (
            jax.checkpoint_policies.checkpoint_dots(prim, *args, **params)
            or prim.name == "sharding_constraint"
            or (ring and prim.name == "ppermute")
        )

    # no CSE barrier: inside lax.scan the recomputation cannot be merged into the forward pass anyway
    return jax.checkpoint(fn, policy=keep, prevent_cse=False)
