"""The parameter count `plan` prints equals that of the same model written by hand in PyTorch.

The models below are written out here (not generated), so they check the operators' parameter rules
against an independent implementation. Where names line up, shapes are compared parameter by parameter
(PyTorch stores linear weights [out, in]; mithril-spec's canonical layout is [in, out]).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.planner.plan_json import per_copy_params

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

ROOT = Path(__file__).resolve().parent.parent


def plan(capsys, name: str) -> dict:
    assert cli.main(["plan", str(ROOT / "specs" / name), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) parameters count once


def canonical(name: str, shape: tuple[int, ...], linear: set[str]) -> tuple[int, ...]:
    return tuple(reversed(shape)) if name in linear else tuple(shape)


def assert_same_params(model: nn.Module, j: dict, linear: set[str]) -> None:
    mine = {n: canonical(n, tuple(p.shape), linear) for n, p in model.named_parameters()}
    theirs = {p["name"]: tuple(p["shape"]) for p in per_copy_params(j) if "running_" not in p["name"]}
    assert mine == theirs


# ---------------------------------------------------------------- MLP


class Mlp(nn.Module):
    def __init__(self, features=64, hidden=256, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


def test_mlp_dp(capsys):
    j = plan(capsys, "mlp-dp.yaml")
    model = Mlp()
    assert model(torch.zeros(2, 64)).shape == (2, 10)
    assert numel(model) == j["totals"]["param_count"] == 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert_same_params(model, j, {"fc1.weight", "fc2.weight", "head.weight"})
    assert plan(capsys, "mlp-dp.toml")["totals"]["param_count"] == numel(model)


class MlpTp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(128, 1024)
        self.fc2 = nn.Linear(1024, 16)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def test_mlp_tp(capsys):
    j = plan(capsys, "mlp-tp.yaml")
    model = MlpTp()
    assert numel(model) == j["totals"]["param_count"]
    assert_same_params(model, j, {"fc1.weight", "fc2.weight"})


# ---------------------------------------------------------------- CNN


class Cnn(nn.Module):
    """The Mithril data-parallelism guide's CNN: conv -> relu -> max-pool -> flatten -> linear -> relu -> linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.fc1 = nn.Linear(32 * 15 * 15, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def test_cnn_dp(capsys):
    j = plan(capsys, "cnn-dp.yaml")
    model = Cnn()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert numel(model) == j["totals"]["param_count"]
    # conv weights are [filters, channels, kh, kw] in both
    assert_same_params(model, j, {"fc1.weight", "fc2.weight"})


# ---------------------------------------------------------------- GPT


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class MlpBlock(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.fc = nn.Linear(d, ff)
        self.proj = nn.Linear(ff, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Decoder(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MlpBlock(d, ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=256, seq=64, d=128, heads=4, ff=512, layers=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)  # learned positions, [seq, d]
        self.blocks = nn.ModuleList(Decoder(d, heads, ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: no parameters of its own

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def test_gpt_tiny(capsys):
    j = plan(capsys, "gpt-tiny.yaml")
    model = Gpt()
    assert model(torch.zeros(2, 64, dtype=torch.long)).shape == (2, 64, 256)
    assert numel(model) == j["totals"]["param_count"] == 832_256
    linear = {
        n
        for n, _ in model.named_parameters()
        if n.endswith("weight") and any(f".{k}." in n for k in ("q", "k", "v", "o", "fc", "proj"))
    }
    assert_same_params(model, j, linear)  # lm_head.weight is wte.weight: named once, as wte.weight


def test_gpt_tiny_toml_twin(capsys):
    rc = cli.main(["plan", str(ROOT / "tests" / "specs" / "twins" / "gpt-tiny.toml"), "--format", "json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["totals"]["param_count"] == numel(Gpt())


# ---------------------------------------------------------------- conv1d, split, concat


class Branches(nn.Module):
    """tests/specs/branches.yaml: conv1d -> two halves of the channels (relu | conv1d -> tanh) -> concat ->
    strided conv1d -> the second half of the length -> flatten -> linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 8, kernel_size=3, padding=1)
        self.right_conv = nn.Conv1d(4, 4, kernel_size=5, padding=2, bias=False)
        self.down = nn.Conv1d(8, 8, kernel_size=2, stride=2)
        self.head = nn.Linear(8 * 3, 5)

    def forward(self, x):
        left, right = torch.split(self.conv(x), [4, 4], dim=1)
        joined = torch.cat([F.relu(left), torch.tanh(self.right_conv(right))], dim=1)
        return self.head(torch.flatten(self.down(joined)[:, :, 3:6], 1))


def test_branches(capsys):
    assert cli.main(["plan", str(ROOT / "tests" / "specs" / "branches.yaml"), "--format", "json"]) == 0
    j = json.loads(capsys.readouterr().out)
    model = Branches()
    assert model(torch.zeros(2, 3, 12)).shape == (2, 5)
    assert numel(model) == j["totals"]["param_count"] == 421
    assert_same_params(model, j, {"head.weight"})  # conv1d weights are [filters, channels, k] in both
