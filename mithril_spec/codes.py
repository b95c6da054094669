"""The diagnostic code catalog: every code, a one-line title, the text `mithril-spec explain` prints and an
example spec that triggers it.

Errors are E..., warnings W... (`--strict` turns warnings into errors). Every code here is triggered by at
least one spec of tests/specs/broken/ (tests/test_codes_covered.py) and by its own example (tests/test_explain.py).
docs/diagnostics.md is generated from this catalog: `python -m mithril_spec.docs_gen`.
"""

from __future__ import annotations

from typing import NamedTuple


class Example(NamedTuple):
    """A small spec that triggers a code: `mithril-spec validate FILE ARGS` reports it."""

    spec: str  # the spec's text
    args: tuple[str, ...] = ()  # extra `mithril-spec validate` arguments
    file: str = "example.yaml"  # the spec's file name (`.toml` for TOML)
    files: tuple[tuple[str, str], ...] = ()  # other files it needs (relative path, text), e.g. a base spec
    command: tuple[str, ...] = ("validate",)  # the mithril-spec command that reads `file` (before ARGS)


class Entry(NamedTuple):
    title: str
    text: str
    example: Example


_TEXTS: dict[str, tuple[str, str]] = {
    # ---- reading the file
    "E001": (
        "YAML syntax error",
        (
            "The file is not valid YAML. A bracket (`{`, `[`) or quote that is never closed is reported where "
            "it opens, and a key without its `:` (`steps 10`, or a word over an indented mapping) at the key, each "
            "with a label where the parser stopped (often lines later). Other errors are reported where the parser "
            "stopped; the real mistake is often just before it (a mis-indented key). A tab used for indentation is "
            "reported where it stands. Also refused: a mapping key that is not a plain scalar, an escape that is "
            "not a Unicode character (a lone surrogate such as `\\ud800`), an alias inside the node it names, tags "
            "other than the standard ones (`!!python/object`), several documents in one file."
        ),
    ),
    "E002": (
        "TOML syntax error",
        (
            "The file is not valid TOML (`tomllib` fails). A bracket (`[`, `{`, a `[table]` header) or string "
            "that is never closed is reported where it opens, and a key without its `=` at the key, each with a "
            "label where the parser stopped; an inline table (`{ ... }`) and a one-line string must close on "
            "their line. An escape that TOML does not know (`\\q`) is reported at its backslash. Other errors "
            "are reported where the parser stopped: check `key = value` syntax, quotes around strings and "
            "brackets near the position."
        ),
    ),
    "E003": (
        "duplicate key",
        (
            "A mapping defines the same key twice (YAML), or a TOML key or table is defined twice. YAML parsers "
            "usually keep the last one silently; mithril-spec refuses, because one of the two values is a "
            "mistake. A label points at the first definition. Remove or rename one of the two. In TOML, a "
            "table or array written whole inline (`optimizer = { ... }`, `layers = [ ... ]`) cannot be extended "
            "afterwards by a dotted key or a header (`optimizer.lr = 0.1`, `[[layers]]`): write all of it in one "
            "place."
        ),
    ),
    "E004": (
        "bad `extends`",
        (
            "`extends:` names a base spec that is merged under this one. It must be a non-empty string: a "
            "relative path to a `.yaml`, `.yml` or `.toml` file that stays inside the directory tree of the spec "
            "that names it, exists, and does not lead back to a spec already being extended (no cycles; chains at "
            "most 16 deep). Merge rules: mappings merge key by key (the extending spec wins), lists and scalars "
            "are replaced whole, and a key set to null in the extending spec is removed. A diagnostic in a base "
            "spec carries a label on the `extends` that reached it."
        ),
    ),
    "E005": (
        "document is not a mapping",
        (
            "A spec is a mapping at the top level (`version: 1`, `name: ...`, `model: ...`, ...); so is a base "
            "spec reached through `extends`. The file (or base spec) is a list, a scalar or empty."
        ),
    ),
    "E006": (
        "spec too large",
        (
            "A spec is checked within limits that keep every check fast, whatever the file holds: a spec file "
            "(and each base spec it extends) holds at most 1 MiB, nests mappings and lists at most 100 levels "
            "deep, and holds at most 20,000 values once YAML aliases and `<<` merge keys are expanded. Aliases "
            "and merge keys are counted as they are met, before anything is expanded, so a few lines that would "
            "expand into millions of values (an \"alias bomb\") are refused at once; the position is the alias, "
            "node or bracket that passes the limit. Real specs stay far below these limits: write a repeated "
            "stack of layers once, as a block with `repeat`. docs/spec.md (Limits) lists every limit."
        ),
    ),
    "E007": (
        "`--set` names nothing in the spec",
        (
            "An override names a key the spec must have, or must not have, by how it is spelt (as in Hydra): "
            "`--set KEY=VALUE` changes a key that the spec has after `extends` and the earlier `--set`s "
            "(`KEY=null` removes it), `--set +KEY=VALUE` adds a key that it does not have (creating the "
            "mappings on the way; a list's length as the index appends), and `--set ++KEY=VALUE` sets KEY "
            "either way (`++KEY=null` removes it if it is there). So a misspelt KEY is an error rather than a "
            "new key that nothing reads, and so is a `+` on a key that is there, a list index beyond the list, "
            "or a KEY that goes on past a number or a string. The position is the part of KEY that names "
            "nothing, in the argument (`--set #N`, the N-th `--set`); the help suggests the closest key, or "
            "lists the keys there, and the `+` spelling that adds it."
        ),
    ),
    # ---- the spec's structure
    "E010": (
        "unknown key",
        (
            "The key is not part of the spec language at this place. Typos are never ignored: a misspelt "
            "`weight_decay` would otherwise silently train without weight decay. The help suggests the closest "
            "key or lists the accepted ones; see docs/spec.md for the keys each section accepts, or `mithril-spec "
            "schema` for the JSON Schema. A key that a spec sets to null through `extends` (to remove it from the "
            "base) must be a key of its section too, when no base spec has it."
        ),
    ),
    "E011": (
        "missing key",
        (
            "A required key is absent (`name`, `model`, `training`, the `op` of a layer, the `targets` of the "
            "loss, ...). The message names it and the section that needs it, and points at that section. (A "
            "misspelt key reports only E010 with its did-you-mean, not also E011 for the key it meant.)"
        ),
    ),
    "E012": (
        "wrong type",
        (
            "The value has the wrong type: a string for a number, `2.0` for an integer, `1` for a boolean, a list "
            "for a mapping. Write the value with the expected type."
        ),
    ),
    "E013": (
        "invalid value",
        (
            "The value has the right type but is not allowed here: out of range (`seed: -1`, steps and batch "
            "sizes must be positive), not one of the accepted choices (`data: {kind: csv}`, a loss `op`), a name "
            "that is not an identifier or is a Python keyword (names become Python identifiers in the generated "
            "program), `batch` not first in an input shape, `input` and `inputs` together, a `repeat` inside a "
            "block; data that does not fit the model: a token file that is a `.npy` file, or whose `data.json` "
            "(from `data prepare`) records another dtype than `data.dtype` or a tokenizer of more ids than the "
            "model's vocab, a `data.mask` the loss or the mesh cannot apply. The help lists the accepted values "
            "or the fix. (A mesh axis size that is not a positive integer is E047.)"
        ),
    ),
    "E014": (
        "unsupported spec version",
        "`version` must be 1, the only version of the spec language this mithril-spec understands.",
    ),
    "E015": (
        "number out of range",
        (
            "Integers (sizes, dims, batch sizes, steps, mesh axis sizes, ...) must be below 2^53, and so must "
            "the products they make: the elements of each tensor (with the batch) and the devices of a mesh. "
            "Floating-point values (learning rates, weight decay, eps, clip norms, hardware figures) must be "
            "finite: `.inf`, `.nan` and numbers beyond the float range (`1e400` reads as infinity) are refused. "
            "Such values pass a type check but cannot run: the generated program would overflow, or train on "
            "infinities and NaN."
        ),
    ),
    # ---- the model graph
    "E020": (
        "undefined dim",
        (
            "A size names a dim that `dims` does not define. Define it (`dims: {d: 128}`) or write a number. "
            "`batch` is the only size that needs no definition, and only as the first dimension of a model input: "
            "it is the per-step batch."
        ),
    ),
    "E021": (
        "bad size expression",
        (
            "Sizes are positive integers, dim names, or arithmetic on them (`4*d`, `d/heads`). The expression "
            "could not be evaluated to a positive integer (a division that leaves a remainder, a negative or "
            "zero result, or an unsupported operator), or is longer than 200 characters (name the size in `dims` "
            "instead). A size or an intermediate result of 2^53 or more is E015."
        ),
    ),
    "E022": (
        "undefined tensor",
        (
            "A layer's `input`/`inputs`, the loss's `logits`/`predictions`/`targets`, or `tie` names nothing in "
            "scope: neither a model input nor an earlier layer of the same list (inside a block only "
            "`block_input` and the block's layers are in scope; `tie` needs an earlier top-level layer). Layers "
            "may only refer to layers that come before them. The help suggests the closest name."
        ),
    ),
    "E023": (
        "undefined block",
        "A `repeat` names a block that is not defined in `model.blocks`.",
    ),
    "E024": (
        "unknown operator",
        (
            "A layer's `op` is not one of the operators mithril-spec knows; the help suggests the closest. See "
            "the operator reference in docs/spec.md."
        ),
    ),
    "E025": (
        "duplicate name",
        (
            "Two layers of one list have the same name (given, or automatic for unnamed layers), or a top-level "
            "layer has a model input's name. Names identify outputs and parameters (`blocks.3.attn.q.weight`), so "
            "they must be unique: rename one. A label points at the first definition."
        ),
    ),
    "E026": (
        "graph cycle",
        (
            "A layer reads its own output or a layer written after it. Layers form a directed acyclic graph in "
            "the order they are written: move the layer, or read an earlier tensor."
        ),
    ),
    "E027": (
        "dangling tensor",
        (
            "A model input is never read, a layer output is read by nothing (the last layer of a list and the "
            "loss's prediction excepted), or a block never reads `block_input`. Remove it, or wire it in with "
            "`input:`/`inputs:`; dead parameters would be trained for nothing and unused inputs loaded for "
            "nothing."
        ),
    ),
    "E028": (
        "shape mismatch",
        (
            "An operator gets a shape it cannot take: the wrong rank, `add` of different shapes (e.g. [batch, 64, "
            "128] and [batch, 64, 256]), `concat` of tensors that differ outside the joined dimension, a tie to a "
            "table of another shape, loss shapes that do not fit, or a block repeated more than once that changes "
            "its input's shape. The message shows both shapes."
        ),
    ),
    "E029": (
        "dtype mismatch",
        (
            "An integer tensor where a floating-point one is needed, or the reverse: an embedding given float "
            "features instead of integer token ids, cross-entropy targets that are not integers, mse targets that "
            "are. Change the input's `dtype` or the wiring."
        ),
    ),
    "E030": (
        "invalid operator arguments",
        (
            "The operator's arguments are inconsistent: heads not dividing the model width, kv_heads not dividing "
            "heads, an odd head_dim with rotary, a kernel larger than the padded input, `padding: same` with an "
            "even kernel, pool padding over half the kernel, a reshape changing the element count, seq longer "
            "than `max_len`, `tie` to a non-embedding or with `bias: true`, `add`/`mul`/`concat` with fewer than "
            "two inputs, a one-input operator given several, `split` sizes that do not add up to the dimension or "
            "an `index` past the last piece, a `dim` out of range, an embedding's `padding_idx` not below `vocab`."
        ),
    ),
    "E031": (
        "too many layers",
        (
            "A model has at most 10,000 layers once every `repeat` is expanded: its top-level layers plus, for "
            "each `repeat`, the block's layers times the repeat count (a 1000-layer GPT has about 6,000). "
            "Planning, building and the generated programs grow with that count; a larger one is almost always "
            "a typo (`repeat: 100000`). The position is the `repeat` that passes the limit."
        ),
    ),
    # ---- mesh and sharding
    "E040": (
        "unknown mesh axis",
        (
            "Mesh axes are `data`, `fsdp`, `tensor`, `pipe` and `expert` (their role is fixed: the targets map "
            "each to a framework feature). `mesh`, `meshes`, a rule or a `sharding.params` or `sharding.inputs` "
            "layout names an axis that is not one of them; the help suggests the closest. Axes absent from the "
            "selected mesh are simply size 1, so one spec serves every mesh. (An unknown axis in a `--mesh` "
            "override is a usage error, exit code 2.)"
        ),
    ),
    "E041": (
        "mesh axis used twice in one layout",
        (
            "A parameter's or input's layout shards two of its dimensions over the same mesh axis, which no "
            "framework can express, or one rule names an axis twice. Usually two logical axes of one parameter "
            "map to the same mesh axis (e.g. `vocab: tensor` and `embed: tensor` both apply to the embedding "
            "table): change a rule, or give that parameter an explicit layout under `sharding.params`."
        ),
    ),
    "E042": (
        "sharded size not divisible",
        (
            "A split dimension's size (in heads for attention projections) is not divisible by the product of its "
            "mesh axes' sizes (e.g. 6 heads over tensor=4). The position is the rule or layout that splits the "
            "dimension. Change the mesh, the size, or the rule."
        ),
    ),
    "E043": (
        "batch not divisible",
        (
            "The global batch must split evenly into `grad_accum` micro-batches and then over the data-parallel "
            "degree (the product of the mesh axes the batch is sharded over). The help gives a batch size that "
            "does."
        ),
    ),
    "E044": (
        "conflicting sharding rules",
        (
            "The list form of `sharding.rules` maps one logical axis to different mesh axes, or two "
            "`sharding.params` globs give one parameter different layouts. mithril-spec never picks one silently: "
            "keep one rule; make the globs disjoint or give them the same layout."
        ),
    ),
    "E045": (
        "glob matches nothing",
        (
            "A `sharding.params` glob matches no parameter, or a `sharding.inputs` key is not a model input. It "
            "is probably misspelt (the help suggests the closest); `mithril-spec plan` lists every parameter "
            "name."
        ),
    ),
    "E046": (
        "mesh size does not match the device count",
        (
            "The product of the mesh axes' sizes must equal the number of devices given with `--devices` or the "
            "spec's `devices:`. Choose sizes whose product is the device count. With `meshes:`, `validate` checks "
            "every named mesh."
        ),
    ),
    "E047": (
        "bad mesh definition",
        (
            "A spec gives either `mesh:` (one mesh) or `meshes:` (named meshes, the first is the default), "
            "not both; `meshes` must not be empty, and every mesh axis size is a positive integer "
            "(`mesh: {data: 0}` is E047, not E013). With neither, the spec plans for a single device. (A mesh "
            "whose size differs from the device count is E046.)"
        ),
    ),
    "E048": (
        "layout rank mismatch",
        (
            "An explicit layout under `sharding.params` or `sharding.inputs` must have one entry per dimension of "
            "the tensor (inputs: batch first); `null` or `[]` for a dimension that is not split."
        ),
    ),
    "E049": (
        "target cannot express the plan",
        (
            "`build` (and `validate`, for each target in the spec's `targets`) finds a plan the target cannot "
            "run: in torch, a layer name that clashes with `torch.nn.Module`, a parameter or input split over `data` beyond the batch, "
            "tensor parallelism that is not a column-parallel linear followed by a row-parallel one, "
            "`training.zero` with an axis other than `data`, `expert` splitting anything but the experts of moe "
            "layers on dimension 0 (over `expert`, or `expert` then `fsdp`); in mlx, "
            "`training.zero` or `precision.master_weights`, an attention's `qk_norm` with `tensor`; a model one "
            "target cannot pipeline (docs/program.md, pipeline stages). The message says what the target "
            "supports; docs/targets.md lists every target's capabilities and limits (generated from the "
            "target registry)."
        ),
    ),
    # ---- costs
    "E050": (
        "does not fit in device memory",
        (
            "With `--hardware NAME`, the cost model predicts each device's peak memory for one training step: "
            "parameters, gradients and optimizer state (by layout, with ZeRO and fsdp sharding), the activations "
            "saved for the backward pass of one micro-batch (under the spec's `training.remat`), and temporaries "
            "(gathered fsdp parameters, gradients in flight, the loss). The peak exceeds the profile's memory less "
            "what the runtime reserves. The help lists changes predicted to fit: shard the parameters and "
            "optimizer state over more devices (a larger `fsdp` axis, `training.zero`), recompute activations "
            "(`training.remat: selective` or `full`), smaller micro-batches (a larger `training.grad_accum`), or "
            "another mesh (`mithril-spec plan --auto --devices N --hardware NAME` searches them). "
            "docs/cost-model.md states the formulas and their assumptions."
        ),
    ),
    # ---- pipeline and experts
    "E051": (
        "too few micro-batches for the pipeline schedule",
        (
            "The 1F1B and interleaved schedules need at least as many micro-batches as pipeline stages "
            "(interleaved: a multiple of the pipe size); with fewer, ranks wait on each other forever after "
            "launch (the hang torchtitan users meet). GPipe accepts any number but idles (p-1)/(m+p-1) of the "
            "time. Raise `pipeline.microbatches`, or use `gpipe`."
        ),
    ),
    "E052": (
        "batch not divisible into pipeline micro-batches",
        (
            "Each optimizer step's micro-batch (batch_size / grad_accum) is split into `pipeline.microbatches` "
            "pieces, each then split over the data-parallel degree: `microbatches` x data-parallel degree must "
            "divide it. Adjust `batch_size` or `microbatches`."
        ),
    ),
    "E053": (
        "pipeline cannot be laid out as asked",
        (
            "Without explicit `stage:` fields, a repeated block is split evenly into pipe x virtual_stages "
            "stages: its repeat count must be divisible by that number (and a model needs exactly one repeat to "
            "split). A mesh with a `pipe` axis needs a `pipeline` section, and `virtual_stages` > 1 needs the "
            "`interleaved` schedule."
        ),
    ),
    "E054": (
        "pipeline stages out of order or not contiguous",
        (
            "Explicit `stage:` values must not decrease along the layer list, must start at 0 and cover every "
            "stage up to pipe x virtual_stages - 1 without gaps. `stage:` belongs to top-level layers and to a "
            "`repeat` (all its copies), not to a layer inside a block (every copy's layer on one stage). "
            "`device: K` (Mithril's device_id) places a layer on device K of the `pipe` axis instead: each run of "
            "consecutive layers on one device is a stage, and the schedules run stage s on device s % pipe, so the "
            "runs must go round the devices in order, pipe x virtual_stages of them; a block's layers (every "
            "copy's) share one device. The help names the nearest placement that runs."
        ),
    ),
    "E055": (
        "experts not divisible by the expert axis",
        (
            "An `moe` layer's experts are split evenly over the mesh axes of its experts dimension (the `expert` "
            "axis): their size must divide `experts`. Use a multiple of the axis size, or a smaller `expert` "
            "axis."
        ),
    ),
    "E056": (
        "top_k larger than the number of experts",
        "Each token goes to top_k distinct experts, so top_k cannot exceed `experts`.",
    ),
    # ---- importing a model (`mithril-spec import hf`)
    "E070": (
        "model setting not expressible in a spec",
        (
            "`mithril-spec import hf` found a setting in the model's config.json that the spec language cannot "
            "express exactly (a rope scaling kind, sliding-window attention shorter than the sequence, an "
            "activation or position embedding other than the supported ones, a field the import does not read, "
            "a family not imported yet such as Gemma 3, Helium, SmolLM3, OLMo 2 or Granite, ...). The import "
            "stops rather than approximate the model: the diagnostic names the field and what would import (often "
            "another value, or a shorter `--seq`)."
        ),
    ),
    "E071": (
        "not an importable model config",
        (
            "The config.json given to `mithril-spec import hf` is not one of the families that import (Llama, "
            "Mistral, Ministral, Qwen2, Qwen3, Gemma, Gemma 2, Phi-3, InternLM3, Seed-OSS, StarCoder2, Mixtral, "
            "Qwen2-MoE, Qwen3-MoE, GPT-2, BERT: its `model_type`), lacks a "
            "field that family needs (sizes such as `hidden_size` must be positive integers), or holds a value of the "
            "wrong kind (a number or `false` written as a string, a head count that does not divide "
            "`num_attention_heads`, `layer_types` not one per layer)."
        ),
    ),
    "E072": (
        "parameter without a checkpoint name",
        (
            "The spec has an `hf` section (it was imported with `mithril-spec import hf`), so its programs read "
            "and write that model's checkpoints by the transformers names of its parameters, which follow from "
            "the imported layer names. A parameter has none: a layer was renamed or added after the import. Keep "
            "the imported names, or remove the `hf` section to train the model without its checkpoints."
        ),
    ),
    # ---- the program
    "E073": (
        "copies of a repeated block laid out differently",
        (
            "A `repeat` is one block in the plan and in the generated programs: one table row per block "
            "parameter, and in JAX the copies stacked along a leading layer axis and run under `lax.scan`. So "
            "every copy of a block parameter must have the same layout. A `sharding.params` glob that matches "
            "some copies (`blocks.0.*`) but not the others breaks that. Match every copy (`blocks.*.mlp.*`), or "
            "change the rules instead."
        ),
    ),
    # ---- warnings
    "W001": (
        "large parameter fully replicated",
        (
            "On a mesh of more than one device, a parameter of 2^20 (1,048,576) elements or more is not split on "
            "any dimension: it is replicated on every device. That is legal but wastes memory; add a rule for one "
            "of its logical axes (the help lists them) or add an `fsdp` axis."
        ),
    ),
    "W002": (
        "unused sharding rule",
        (
            "A rule names a logical axis that no parameter or input has (nor `batch`). It has no effect; it may "
            "be misspelt (the help lists the logical axes that exist). Fix the spelling or remove the rule."
        ),
    ),
    "W010": (
        "model setting not imported",
        (
            "`mithril-spec import hf` leaves out a setting that changes training but not the model: dropout rates "
            "(`hidden_dropout_prob`, `resid_pdrop`, `attention_dropout`, ...). The imported spec trains without "
            "them and computes the same outputs as the original model in evaluation; add `dropout` layers to the "
            "spec where you want them (and a `dropout` rate on attention layers for their probabilities). A "
            "`pad_token_id` outside the vocabulary (transformers builds no model with it) is W010 too: the "
            "embedding trains every row."
        ),
    ),
    "W011": (
        "data file not found",
        (
            "A file or directory named in `data` (`path`, `tokenizer`) or `eval.path` does not exist where "
            "`validate` runs. A relative path is relative to the directory of the spec file that holds it (of a "
            "`--set`: the working directory). It is a warning because data often exists only on the training "
            "machine, and the program can be given another path (`--data`); with `--strict` it fails CI."
        ),
    ),
}


def _spec(text: str) -> str:
    return text.lstrip("\n")


# A small valid model, reused by the examples below (each shows its whole spec).
_MLP_HEAD = """
version: 1
name: example
dims: {features: 16, classes: 4}
model:
  inputs:
    x: {shape: [batch, features]}
    y: {shape: [batch], dtype: int32}
"""
_LM_HEAD = """
version: 1
name: example
dims: {vocab: 96, d: 64, heads: 4}
model:
  inputs:
    tokens: {shape: [batch, 8], dtype: int32}
  layers:
    - {op: embedding, name: wte, vocab: vocab, dim: d}
    - {op: attention, name: attn, heads: heads, causal: true}
    - {op: linear, name: lm_head, dimension: vocab}
  loss: {op: cross_entropy, logits: lm_head, targets: tokens}
training: {batch_size: 16, steps: 10, optimizer: {name: adamw, lr: 1.0e-3}}
"""
_PIPE_HEAD = """
version: 1
name: example
dims: {vocab: 64, d: 32, heads: 2}
targets: [jax]
model:
  inputs:
    tokens: {shape: [batch, 8], dtype: int32}
  blocks:
    layer:
      - {op: attention, name: attn, heads: heads}
      - {op: mlp, name: mlp, hidden: 64}
  layers:
    - {op: embedding, name: wte, vocab: vocab, dim: d}
    - {repeat: 4, block: layer, name: blocks}
    - {op: linear, name: lm_head, dimension: vocab}
  loss: {op: cross_entropy, logits: lm_head, targets: tokens}
training: {batch_size: 16, steps: 10, optimizer: {name: sgd, lr: 0.1}}
"""
_TRAIN = "training: {batch_size: 8, steps: 10, optimizer: {name: adamw, lr: 1.0e-3}}\n"
_MLP = (
    _MLP_HEAD
    + """  layers:
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
)

_EXAMPLES: dict[str, Example] = {
    "E001": Example(
        _spec("""
version: 1
name: example
dims: {features: 16, classes: [4}
""")
    ),
    "E002": Example(
        _spec("""
version = 1
name = "example"
dims = { features = 16, classes = 4
"""),
        file="example.toml",
    ),
    "E003": Example(
        _spec("""
version: 1
name: example
dims: {features: 16, classes: 4}
training:
  batch_size: 8
  steps: 10
  batch_size: 16
""")
    ),
    "E004": Example(
        _spec("""
extends: base.yaml
name: example
"""),
        files=(("base.yaml", "extends: example.yaml\nversion: 1\n"),),
    ),
    "E005": Example(
        _spec("""
- version: 1
- name: example
""")
    ),
    "E006": Example(
        _spec("""
version: 1
name: example
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
""")
    ),
    "E007": Example(_spec(_MLP + _TRAIN), args=("--set", "dims.featurs=32")),
    "E010": Example(
        _spec(
            _MLP
            + """
training:
  batch_size: 8
  steps: 10
  optimizer: {name: adamw, lr: 1.0e-3, weight_decy: 0.1}
"""
        )
    ),
    "E011": Example(
        _spec(
            _MLP
            + """
training:
  batch_size: 8
  optimizer: {name: adamw, lr: 1.0e-3}
"""
        )
    ),
    "E012": Example(
        _spec(
            _MLP
            + """
training:
  batch_size: eight
  steps: 10
  optimizer: {name: adamw, lr: 1.0e-3}
"""
        )
    ),
    "E013": Example(
        _spec(
            _MLP
            + """
training:
  batch_size: 8
  steps: 10
  remat: sometimes
  optimizer: {name: adamw, lr: 1.0e-3}
"""
        )
    ),
    "E014": Example(_spec("version: 2\n" + _MLP.removeprefix("\nversion: 1\n") + _TRAIN)),
    "E015": Example(
        _spec(
            _MLP
            + """
training:
  batch_size: 8
  steps: 10
  optimizer: {name: adamw, lr: 1e400}
"""
        )
    ),
    "E020": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: head, dimension: clases}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E021": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: hidden, dimension: features/3}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E022": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: head, dimension: classes, input: z}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E023": Example(
        _spec(
            _MLP_HEAD
            + """  blocks:
    decoder: [{op: mlp, hidden: 32}]
  layers:
    - {repeat: 2, name: body, block: decodr}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E024": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: layernorm, name: ln}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E025": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: fc, dimension: 32}
    - {op: relu, name: fc}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E026": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: relu, name: act, input: act}
    - {op: linear, name: head, dimension: classes, input: x}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E027": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: side, dimension: 8, input: x}
    - {op: linear, name: head, dimension: classes, input: x}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E028": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: wide, dimension: 32}
    - {op: add, name: res, inputs: [x, wide]}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E029": Example(
        _spec(
            """
version: 1
name: example
dims: {vocab: 100, d: 64}
model:
  inputs:
    tokens: {shape: [batch, 8]}
    targets: {shape: [batch, 8], dtype: int32}
  layers:
    - {op: embedding, name: wte, vocab: vocab, dim: d, input: tokens}
    - {op: linear, name: head, dimension: vocab}
  loss: {op: cross_entropy, logits: head, targets: targets}
"""
            + _TRAIN
        )
    ),
    "E030": Example(_spec(_LM_HEAD.replace("heads: 4}", "heads: 6}"))),
    "E031": Example(
        _spec(
            _MLP_HEAD
            + """  blocks:
    mlp:
      - {op: linear, name: fc, dimension: features}
      - {op: relu, name: act}
  layers:
    - {repeat: 100000, block: mlp, name: blocks}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "E040": Example(_spec(_LM_HEAD + "mesh: {data: 2, tensr: 2}\n")),
    "E041": Example(
        _spec(
            _LM_HEAD
            + """mesh: {data: 2, tensor: 2}
sharding:
  rules:
    vocab: tensor
    embed: tensor
"""
        )
    ),
    "E042": Example(
        _spec(
            _LM_HEAD.replace("heads: 4}", "heads: 6}").replace("d: 64", "d: 96")
            + """mesh: {tensor: 4}
sharding:
  rules: {heads: tensor}
"""
        )
    ),
    "E043": Example(_spec(_LM_HEAD + "mesh: {data: 3}\n")),
    "E044": Example(
        _spec(
            _LM_HEAD
            + """mesh: {fsdp: 2, tensor: 2}
sharding:
  rules:
    - [vocab, tensor]
    - [embed, fsdp]
    - [vocab, fsdp]
"""
        )
    ),
    "E045": Example(
        _spec(
            _LM_HEAD
            + """mesh: {tensor: 2}
sharding:
  params:
    "attn.qq.weight": [null, tensor]
"""
        )
    ),
    "E046": Example(_spec(_LM_HEAD + "mesh: {data: 2, tensor: 2}\n"), args=("--devices", "8")),
    "E047": Example(
        _spec(
            _LM_HEAD
            + """mesh: {data: 2}
meshes:
  big: {data: 4}
"""
        )
    ),
    "E048": Example(
        _spec(
            _LM_HEAD
            + """mesh: {tensor: 2}
sharding:
  params:
    wte.weight: [tensor]
"""
        )
    ),
    "E049": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: fc1, dimension: 64, axis: mlp}
    - {op: layer_norm, name: ln}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
mesh: {tensor: 2}
sharding:
  rules: {mlp: tensor}
targets: [torch]
"""
            + _TRAIN
        )
    ),
    "E050": Example(
        _spec("""
version: 1
name: example
dims: {d: 32768}
model:
  inputs:
    x: {shape: [batch, d]}
    y: {shape: [batch, d]}
  layers:
    - {op: linear, name: fc, dimension: d}
  loss: {op: mse, predictions: fc, targets: y}
training: {batch_size: 8, steps: 10, optimizer: {name: adam, lr: 1.0e-4}}
"""),
        args=("--hardware", "tpu-v5e"),
    ),
    "E051": Example(
        _spec(
            _PIPE_HEAD
            + """mesh: {pipe: 4}
pipeline: {schedule: 1f1b, microbatches: 2}
"""
        )
    ),
    "E052": Example(
        _spec(
            _PIPE_HEAD
            + """mesh: {pipe: 2}
pipeline: {microbatches: 3}
"""
        )
    ),
    "E053": Example(
        _spec(
            _PIPE_HEAD
            + """mesh: {pipe: 3}
pipeline: {microbatches: 3}
"""
        ).replace("batch_size: 16", "batch_size: 18")
    ),
    "E054": Example(
        _spec(
            _MLP_HEAD
            + """  layers:
    - {op: linear, name: fc1, dimension: 32, stage: 0}
    - {op: relu, name: act, stage: 1}
    - {op: linear, name: fc2, dimension: classes, stage: 0}
  loss: {op: cross_entropy, logits: fc2, targets: y}
targets: [jax]
mesh: {pipe: 2}
pipeline: {microbatches: 2}
"""
            + _TRAIN
        )
    ),
    "E055": Example(
        _spec(
            """
version: 1
name: example
dims: {features: 16, classes: 4}
targets: [jax]
model:
  inputs:
    x: {shape: [batch, 4, features]}
    y: {shape: [batch, 4], dtype: int32}
  layers:
    - {op: moe, name: moe, experts: 6, hidden: 32}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
mesh: {expert: 4}
sharding: {rules: {experts: expert}}
"""
            + _TRAIN
        )
    ),
    "E056": Example(
        _spec(
            """
version: 1
name: example
dims: {features: 16, classes: 4}
model:
  inputs:
    x: {shape: [batch, 4, features]}
    y: {shape: [batch, 4], dtype: int32}
  layers:
    - {op: moe, name: moe, experts: 2, hidden: 32, top_k: 3}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
            + _TRAIN
        )
    ),
    "W001": Example(
        _spec(
            _MLP_HEAD.replace("features: 16", "features: 1024")
            + """  layers:
    - {op: linear, name: fc, dimension: features}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
mesh: {data: 2}
"""
            + _TRAIN
        )
    ),
    "W002": Example(
        _spec(
            _LM_HEAD
            + """mesh: {data: 2, tensor: 2}
sharding:
  rules:
    haeds: tensor
"""
        )
    ),
}

_EXAMPLES["E073"] = Example(_spec("""
version: 1
name: example
dims: {features: 16}
model:
  inputs:
    x: {shape: [batch, features]}
    y: {shape: [batch, features]}
  blocks:
    res:
      - {op: linear, name: fc, dimension: features}
  layers:
    - {repeat: 2, block: res, name: blocks}
  loss: {op: mse, predictions: blocks, targets: y}
mesh: {data: 2}
sharding:
  params:
    "blocks.0.fc.weight": [data, null]
training: {batch_size: 8, steps: 10, optimizer: {name: adamw, lr: 1.0e-3}}
"""))

_IMPORT = ("import", "hf")
_EXAMPLES.update({
    "E072": Example(_spec("""
version: 1
name: example
dims: {vocab: 100, seq: 16, d: 32}
model:
  inputs:
    tokens: {shape: [batch, seq], dtype: int32}
    targets: {shape: [batch, seq], dtype: int32}
  layers:
    - {op: embedding, name: embed_tokens, vocab: vocab, dim: d, input: tokens}
    - {op: rms_norm, name: final_norm}
    - {op: linear, name: lm_head, dimension: vocab, bias: false}
  loss: {op: cross_entropy, logits: lm_head, targets: targets}
training: {batch_size: 8, steps: 10, optimizer: {name: adamw, lr: 1.0e-4}}
hf:
  model_type: llama
  architecture: LlamaForCausalLM
  config: {model_type: llama}
""")),
    "E070": Example(
        '{"model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,\n'
        ' "num_hidden_layers": 2, "num_attention_heads": 4,\n'
        ' "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}\n',
        args=("-o", "spec.yaml"), file="config.json", command=_IMPORT),
    "E071": Example('{"model_type": "t5", "d_model": 32}\n', args=("-o", "spec.yaml"), file="config.json",
                    command=_IMPORT),
    "W010": Example(
        '{"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4,\n'
        ' "n_positions": 64, "resid_pdrop": 0.1}\n', args=("-o", "spec.yaml"), file="config.json", command=_IMPORT),
    "W011": Example(
        _spec(
            """
version: 1
name: example
dims: {vocab: 512, d: 64, heads: 4}
model:
  inputs:
    tokens: {shape: [batch, 32], dtype: int32}
    targets: {shape: [batch, 32], dtype: int32}
  layers:
    - {op: embedding, name: wte, vocab: vocab, dim: d, input: tokens}
    - {op: attention, name: attn, heads: heads, causal: true}
    - {op: linear, name: lm_head, dimension: vocab}
  loss: {op: cross_entropy, logits: lm_head, targets: targets}
training: {batch_size: 8, steps: 10, optimizer: {name: adamw, lr: 1.0e-3}}
data: {kind: tokens, path: data/train.bin, dtype: uint16}
"""
        )
    ),
})
CATALOG: dict[str, Entry] = {code: Entry(title, text, _EXAMPLES[code]) for code, (title, text) in _TEXTS.items()}
assert set(_EXAMPLES) == set(CATALOG), "every code needs an example"


def title(code: str) -> str:
    return CATALOG[code].title


def severity(code: str) -> str:
    return "warning" if code.upper().startswith("W") else "error"


def explain(code: str) -> str | None:
    """The code, its title and its text (the `explain` command adds the example)."""
    entry = CATALOG.get(code.upper())
    if entry is None:
        return None
    return f"{code.upper()} ({severity(code)}): {entry.title}\n\n{entry.text}\n"


# Every code as a name, for the sites that raise it (`Diagnostic(codes.E049, ...)`): a misspelt name fails at
# import, a misspelt string would not (tests/test_codes_covered.py checks that these are the catalog).
E001 = "E001"
E002 = "E002"
E003 = "E003"
E004 = "E004"
E005 = "E005"
E006 = "E006"
E007 = "E007"
E010 = "E010"
E011 = "E011"
E012 = "E012"
E013 = "E013"
E014 = "E014"
E015 = "E015"
E020 = "E020"
E021 = "E021"
E022 = "E022"
E023 = "E023"
E024 = "E024"
E025 = "E025"
E026 = "E026"
E027 = "E027"
E028 = "E028"
E029 = "E029"
E030 = "E030"
E031 = "E031"
E040 = "E040"
E041 = "E041"
E042 = "E042"
E043 = "E043"
E044 = "E044"
E045 = "E045"
E046 = "E046"
E047 = "E047"
E048 = "E048"
E049 = "E049"
E050 = "E050"
E051 = "E051"
E052 = "E052"
E053 = "E053"
E054 = "E054"
E055 = "E055"
E056 = "E056"
E070 = "E070"
E071 = "E071"
E072 = "E072"
E073 = "E073"
W001 = "W001"
W002 = "W002"
W010 = "W010"
W011 = "W011"
