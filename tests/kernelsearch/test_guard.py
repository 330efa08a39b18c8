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


JIT = """
import math
import torch
import triton
import triton.language as tl

SCALE = 2.0


@triton.jit
def _h(a):
    return a * 2


@triton.jit
def _k(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
{body}
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)

"""


@pytest.mark.parametrize("body,ok", [
    ("    v = tl.load(X + offs).to(tl.float32) * SCALE + math.pi", True),
    ("    v = tl.extra.cuda.libdevice.fast_expf(tl.load(X + offs))", True),
    ("    v = _h(tl.load(X + offs)).to(Y.dtype.element_ty)", True),
    ("    for i in tl.static_range(2):\n        v = tl.full((BLOCK,), float('inf'), tl.float32)", True),
    ("    torch.os.remove('/etc/passwd')", False),
    ("    tl.core.builtins.exec('1')", False),
    ("    tl.core.inspect.stack()", False),
    ("    tl.extra.pkgutil.walk_packages()", False),
    ("    v = X.fn", False),
    ("    v = (lambda: 1)()", False),
    ("    v = [i for i in range(2)]", False),
    ("    v = open('/x', 'w')", False),
    ("    v = n(1)", False),
    ("    v = _k.run", False),
])
def test_jit_body_rules(body, ok):
    r = rules(JIT.format(body=body) + OK_FORWARD)
    assert (r == []) if ok else ("jit_body" in r or "reflection" in r), r
    if not ok and "open" not in body:
        assert "jit_body" in r, r


def test_jit_signature_and_decorators_are_guarded():
    src = JIT.format(body="    pass").replace(
        "def _k(X, Y, n, BLOCK: tl.constexpr):",
        "def _k(X, Y, n, BLOCK: torch.os.system('id')):")
    assert "jit_body" in rules(src + OK_FORWARD)
    src = JIT.format(body="    pass").replace(
        "@triton.jit\ndef _k", "@triton.heuristics({'B': lambda a: torch.os.getpid()})\n"
        "@triton.jit\ndef _k")
    assert "torch_compute" in rules(src + OK_FORWARD)


def test_module_passed_to_a_kernel_as_a_value():
    fwd = OK_FORWARD.replace("_k[(1,)](x, y,", "_k[(1,)](x, torch,")
    assert "reflection" in rules(HEAD + fwd)


def test_shipped_variants_pass_the_guard():
    from pathlib import Path

    from kernelsearch.families import all_families

    # library variants wrap compiled code: the judge checks they are the shipped files instead
    library = {v.file.resolve() for f in all_families() for v in f.variants.values()
               if v.kind == "library"}
    files = [p for p in (Path(__file__).resolve().parents[2] / "kernelsearch" / "families").glob(
        "*/*.py") if p.name != "__init__.py" and p.resolve() not in library]
    assert len(files) >= 15 and library
    for f in files:
        assert check_source(f.read_text()) == [], f
