"""`training.precision.tf32`: float32 matmuls on GPUs in TensorFloat-32 (docs/spec.md "Precision"). The plan
prices float32 compute at a GPU profile's TensorFloat-32 peak with it and at the float32 peak without; the
programs switch the matmul precision on GPUs only (the CPUs the tests run on keep full float32), and the
switch leaves the checkpoints' spec hash alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from program_files import program_text

from mithril_spec.frontend import compile_file
from mithril_spec.lowering.costing import costing
from mithril_spec.planner.hardware import lookup
from mithril_spec.render.build import render_files
from mithril_spec.template_files import runtime_files

GPT = Path(__file__).resolve().parent.parent / "specs" / "gpt-tiny.yaml"


def spec(tmp_path: Path, tf32: bool, compute: str = "float32") -> Path:
    text = GPT.read_text().replace("precision: {params: float32, compute: float32}",
                                   f"precision: {{params: float32, compute: {compute}, tf32: {str(tf32).lower()}}}")
    path = tmp_path / f"gpt-{tf32}-{compute}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("profile, tf32_tflops, fp32_tflops", [("h100-sxm-80gb", 494.7, 66.9), ("a100-80gb", 156, 19.5)])
def test_float32_compute_is_priced_at_the_tf32_peak_only_with_tf32(tmp_path, profile, tf32_tflops, fp32_tflops):
    for tf32, tflops in ((True, tf32_tflops), (False, fp32_tflops)):
        c = compile_file(spec(tmp_path, tf32), "single")
        t = costing(c.plan, "torch").on(lookup(profile, c.spec)).time
        assert t.peak_flops == pytest.approx(tflops * 1e12), (tf32, t.peak_flops)
    # 16-bit compute and a CPU profile (no tfloat32 entry): the dtype's own peak
    c = compile_file(spec(tmp_path, True, "bfloat16"), "single")
    assert costing(c.plan, "torch").on(lookup(profile, c.spec)).time.peak_flops == lookup(profile).flops["bfloat16"]
    c = compile_file(spec(tmp_path, True), "single")
    assert costing(c.plan, "torch").on(lookup("cpu", c.spec)).time.peak_flops == lookup("cpu").flops["float32"]


@pytest.mark.parametrize("target", ["torch", "jax"])
def test_programs_switch_matmul_precision_on_gpus_only(tmp_path, target):
    on, off = (program_text(render_files(compile_file(spec(tmp_path, tf32), "single"), target, "gpt.yaml"))
               for tf32 in (True, False))
    assert "TF32 = True" in on and "TF32 = False" in off
    if target == "torch":  # runtime/torch/ranks.py, inside `if cuda:`, on the TF32 the program passes it
        assert re.search(r"start_ranks\(\s*MESH, BATCH_AXES, TF32,", on)
        ranks = runtime_files("torch")["runtime/torch/ranks.py"]
        assert re.search(r"if cuda:\n(.*\n){1,4}\s+torch\.set_float32_matmul_precision\(\"high\" if tf32 else \"highest\"\)", ranks)
    else:  # passed to runtime/jax/devices.py's start_devices, which sets it on GPUs
        assert "start_devices(args, MESH, tf32=TF32)" in on
        devices = render_files(compile_file(spec(tmp_path, True), "single"), target, "gpt.yaml")["runtime/jax/devices.py"]
        assert re.search(r'if tf32 is not None and jax\.devices\(\)\[0\]\.platform == "gpu":.*\n\s+'
                         r'jax\.config\.update\("jax_default_matmul_precision", "tensorfloat32" if tf32 else', devices)
    hashes = [re.search(r'SPEC_HASH = "(\w+)"', text).group(1) for text in (on, off)]
    assert hashes[0] == hashes[1]  # a checkpoint resumes with the switch on or off
    # MFU's peak follows it: the TensorFloat-32 column
    assert 'TRAIN_COMPUTE = "tfloat32"' in on and 'TRAIN_COMPUTE = "float32"' in off
