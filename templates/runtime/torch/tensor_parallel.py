"""Tensor and sequence parallelism: the parallelize_module styles a plan names (TP_PLAN: module FQN ->
style name), built for the modules they apply to."""

from torch.distributed.tensor.parallel import parallelize_module


def tp_styles():
    """style name -> a function making its ParallelStyle. (The styles `experts` and `gather` are not here:
    those layers split their own parameters over `tensor`.)"""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    return {
        # output features split: no communication
        "colwise": lambda: ColwiseParallel(),
        # input features split: all-reduce the output
        "rowwise": lambda: RowwiseParallel(),
        # vocab-parallel table: each rank holds a slice of the rows and looks up the tokens in it (zeros
        # elsewhere); the lookups are all-reduced
        "vocab_rows": lambda: RowwiseParallel(input_layouts=Replicate()),
        # vocab-parallel output: each rank's logits for its slice of the vocabulary, left split (a
        # DTensor) for the cross-entropy under loss_parallel
        "colwise_logits": lambda: ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
        # all-gather the sequence, then output features split
        "colwise_sp": lambda: ColwiseParallel(input_layouts=Shard(1)),
        # input features split: reduce-scatter the output over the sequence
        "rowwise_sp": lambda: RowwiseParallel(output_layouts=Shard(1)),
        # whole (replicated) weights applied to this rank's positions; their gradients are summed
        "sequence": lambda: SequenceParallel(use_local_output=True),
        # an attention's q/k norm on this rank's heads ([B, T, heads, h]: split on dimension 2): its whole
        # weight's gradient is summed over `tensor`
        "heads_norm": lambda: SequenceParallel(sequence_dim=2, use_local_output=True),
        # the layer's input projections read one DTensor: their input gradients add up as partial sums
        # and are all-reduced once (Megatron's count), not once per projection
        "replicate_input": lambda: PrepareModuleInput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Replicate(),),
            use_local_output=False,
        ),
        # all-gather the sequence once for all of the layer's input projections (and, their gradients
        # added up first, reduce-scatter once in the backward pass)
        "gather_input": lambda: PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=False
        ),
        # into the blocks: keep this rank's positions (a slice, no communication)
        "split_sequence": lambda: PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
        ),
        # out of the blocks: every position again
        "gather_sequence": lambda: PrepareModuleOutput(
            output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True
        ),
        # one copy of the block: split the sequence going in, gather it coming out
        "split_and_gather": lambda: PrepareModuleInputOutput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Shard(1),),
            output_layouts=(Shard(1),),
            desired_output_layouts=(Replicate(),),
            use_local_input=True,
            use_local_output=True,
        ),
        # a moe layer in a sequence-parallel block reads the whole sequence (its capacity is filled in
        # token order over the whole sample): all-gather it going in, keep this rank's positions coming
        # out (the layer's input and output gradients are whole on every rank: the backward keeps this
        # rank's slice of one and all-gathers the other)
        "experts_sp": lambda: PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),),
            use_local_input=True,
            use_local_output=True,
        ),
    }


def apply_tp_plan(model, tensor_mesh, plan):
    """parallelize_module over `tensor_mesh` with `plan` (module FQN, `*` for every copy of a repeated
    block -> style name), each style made for its modules; the layers that split their own parameters
    (`experts`, `gather`) are left to themselves."""
    styles = tp_styles()
    parallelize_module(
        model, tensor_mesh, {fqn: styles[s]() for fqn, s in plan.items() if s in styles}
    )
