"""The static guard: AST rules with names, on small sources."""
import pytest

from kernelsearch.harness.guard import check_source, ghost_source, launched_kernels

HEAD = """
import torch
import triton
import triton.language as tl


@triton.jit
def _k(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)

"""
OK_FORWARD = """
def forward(x):
    y = torch.empty_like(x)
    _k[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y.view(x.shape)
"""


def rules(src):
    return [v.rule for v in check_source(src)]


def test_clean_candidate_passes():
    assert rules(HEAD + OK_FORWARD) == []
    assert launched_kernels(HEAD + OK_FORWARD) == {"_k"}


@pytest.mark.parametrize("body,rule", [
    ("    y = x.exp()\n", "torch_compute"),
    ("    y = torch.nn.functional.softmax(x, -1)\n", "torch_compute"),
    ("    y = x @ x\n", "torch_compute"),
    ("    y = eval('x')\n", "dynamic_code"),
    ("    y = getattr(torch, 'soft' + 'max')(x)\n", "reflection"),
    ("    y = x.__class__\n", "reflection"),
    ("    torch.cuda.synchronize()\n", "stream"),
    ("    triton.testing.do_bench(lambda: None)\n", "timer"),
    ("    triton.knobs.x = 1\n", "monkey_patch"),
    ("    global Z\n", "module_state"),
    ("    try:\n        pass\n    except Exception:\n        pass\n", "try_except"),
    ("    x[0] = 1\n", "torch_compute"),
])
def test_rule_fires(body, rule):
    src = HEAD + "\ndef forward(x):\n" + body + OK_FORWARD.split("def forward(x):\n")[1]
    assert rule in rules(src), rules(src)


@pytest.mark.parametrize("line,rule", [
    ("import os", "import"),
    ("import threading", "thread"),
    ("from concurrent.futures import ThreadPoolExecutor", "thread"),
    ("import time", "timer"),
    ("import ctypes", "import"),
    ("from torch import softmax", "import"),
    ("CACHE = {}", "module_state"),
    ("CACHE = dict()", "module_state"),
    ("BLOCK = 128", None),
])
def test_module_level(line, rule):
    r = rules(line + "\n" + HEAD + OK_FORWARD)
    assert (rule in r) if rule else r == [], r


def test_structure_rules():
    assert "no_forward" in rules(HEAD)
    assert "no_launch" in rules(HEAD + "\ndef forward(x):\n    return torch.empty_like(x)\n")
    assert "syntax" in rules("def forward(:\n")
    assert "module_state" in rules(HEAD + "\nimport functools\n\n@functools.lru_cache\n"
                                   + OK_FORWARD.lstrip())
    assert "module_state" in rules(HEAD + OK_FORWARD.replace("def forward(x)",
                                                             "def forward(x, c={})"))


def test_ghost_replaces_kernel_bodies_only():
    g = ghost_source(HEAD + OK_FORWARD)
    assert "tl.store" not in g and "pass" in g
    assert "_k[1,](" in g and "def forward" in g
