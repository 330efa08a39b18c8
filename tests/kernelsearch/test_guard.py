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
    assert "annotation_not_allowed" in rules(src + OK_FORWARD)
    src = JIT.format(body="    pass").replace(
        "@triton.jit\ndef _k", "@triton.heuristics({'B': lambda a: torch.os.getpid()})\n"
        "@triton.jit\ndef _k")
    assert "decorator_not_allowed" in rules(src + OK_FORWARD)


def test_module_passed_to_a_kernel_as_a_value():
    fwd = OK_FORWARD.replace("_k[(1,)](x, y,", "_k[(1,)](x, torch,")
    assert "module_as_value" in rules(HEAD + fwd)


def test_shipped_variants_pass_the_guard():
    from pathlib import Path

    from kernelsearch.families import all_families

    # library variants wrap compiled code: the judge checks they are the shipped files instead.
    # Gluon variants (gpu_only) are candidate source like the Triton ones: the guard reads them.
    variants = [v for f in all_families() for v in f.variants.values()]
    library = {v.file.resolve() for v in variants if v.kind == "library"}
    files = sorted({v.file.resolve() for v in variants} - library)
    assert len(files) >= 15 and library
    assert any(v.gpu_only for v in variants)
    assert all(Path(f).is_relative_to(Path(__file__).resolve().parents[2] / "kernelsearch")
               for f in files)
    for f in files:
        assert check_source(Path(f).read_text()) == [], f


# ---- issue 24: the allow-list (each hole a kernel-writing agent found, by rule) -------------
@pytest.mark.parametrize("prefix,body,rule", [
    ("import typing\n", "    m = typing.sys.modules\n", "import"),
    ("from typing import sys\n", "    m = sys.modules\n", "import"),
    ("", "    f = tl.core.builtins.eval\n", "attribute_not_allowed"),
    ("", "    f = tl.math.wraps\n", "attribute_not_allowed"),
    ("", "    f = triton.language.core.builtins\n", "attribute_not_allowed"),
    ("", "    f = torch.os.environ\n", "torch_compute"),
    ("", "    judged = __name__\n", "reflection"),
    ("", "    s = str(_k)\n", "reflection"),
    ("", "    s = f'{_k}'\n", "reflection"),
    ("", "    s = '%s' % (_k,)\n", "reflection"),
    ("", "    s = '{}'.format(x)\n", "reflection"),
    ("", "    s = repr(x)\n", "reflection"),
    ("", "    s = type(x)\n", "reflection"),
    ("", "    s = vars()\n", "reflection"),
    ("", "    s = _k.cache\n", "attribute_not_allowed"),
    ("", "    s = forward.calls\n", "attribute_not_allowed"),
    ("", "    s = x.grad_fn\n", "attribute_not_allowed"),
    ("", "    s = x.untyped_storage\n", "attribute_not_allowed"),
    ("", "    s = int.mro\n", "attribute_not_allowed"),
    ("", "    s = cond\n", "name_not_allowed"),
    ("", "    s = torch.is_grad_enabled()\n", "torch_compute"),
    ("", "    f = _k\n", "reflection"),
    ("PROBE: exec('import os') = 0\n", "", "annotation_not_allowed"),
    ("PROBE: 'exec(1)' = 0\n", "", "annotation_not_allowed"),
    ("import os as typing\n", "", "import"),
])
def test_allow_list_refusals(prefix, body, rule):
    src = prefix + HEAD + "\ndef forward(x):\n" + body + OK_FORWARD.split("def forward(x):\n")[1]
    r = rules(src)
    assert rule in r, r
    assert all(str(v).count("[guard:") == 1 for v in check_source(src))


@pytest.mark.parametrize("sig", [
    "def forward(x: exec('import os')):",
    "def forward(x) -> eval('1'):",
    "def forward(x: 'torch.Tensor'):",
])
def test_host_annotations_checked(sig):
    src = HEAD + OK_FORWARD.replace("def forward(x):", sig)
    assert "annotation_not_allowed" in rules(src), rules(src)
    assert rules(HEAD + OK_FORWARD.replace("def forward(x):",
                                           "def forward(x: torch.Tensor) -> torch.Tensor:")) == []


@pytest.mark.parametrize("deco,rule", [
    ("@triton.jit(repr=lambda *a: 0)", "decorator_not_allowed"),
    ("@triton.autotune(configs=[triton.Config({'B': 1}, num_warps=4)], key=['n'])\n@triton.jit",
     None),
    ("@triton.jit(do_not_specialize=['n'])", None),
    ("@triton.autotune(configs=CONFIGS(), key=['n'])\n@triton.jit", "decorator_not_allowed"),
])
def test_decorators_checked(deco, rule):
    src = HEAD.replace("@triton.jit", deco) + OK_FORWARD
    r = rules(src)
    assert (rule in r) if rule else r == [], r


GLUON = """
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma, mbarrier, fence_async_shared
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def _k(X, Y, n, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, BLOCK, layout=layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
{body}
    gl.store(Y + offs, gl.load(X + offs, mask=offs < n), mask=offs < n)


def forward(x):
    y = torch.empty_like(x)
    _k[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()), num_warps=4)
    return y
"""


@pytest.mark.parametrize("body,ok", [
    ("    acc = warpgroup_mma(X, Y, n, is_async=True)\n    acc = warpgroup_mma_wait(0, [acc])",
     True),
    ("    tma.async_copy_global_to_shared(X, [0, 0], bar, Y)\n    mbarrier.wait(bar, 0)", True),
    ("    v = gl.core.builtins.eval", False),
    ("    v = tma.ttgl", False),
    ("    v = mbarrier.builtin", False),
    ("    v = gl.nvidia.hopper.tma.os", False),
    ("    v = gl.inline_asm_elementwise('', '', [], gl.int32, True, 1)", False),
])
def test_gluon_kernels_same_rules(body, ok):
    r = rules(GLUON.format(body=body))
    assert (r == []) if ok else ("jit_body" in r), r


def test_gluon_names_only_inside_gluon_kernels():
    src = GLUON.format(body="    pass").replace("@gluon.jit", "@triton.jit")
    assert "jit_body" in rules(src), rules(src)


# ---- generative: nothing the allow-list accepts reaches a forbidden object -------------------
import builtins  # noqa: E402
import inspect  # noqa: E402
import types  # noqa: E402

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from kernelsearch.harness import guard_allow as G  # noqa: E402

ROOTS = {"torch": "torch", "triton": "triton", "tl": G.TL, "math": "math", "gl": G.GL,
         "tma": f"{G.HOPPER}.tma", "mbarrier": f"{G.HOPPER}.mbarrier", "hopper": G.HOPPER}
_WORDS = sorted({p for path in G.PATHS for p in path.split(".")} | {
    "os", "sys", "builtins", "core", "inspect", "modules", "environ", "eval", "exec",
    "__import__", "getattr", "compile", "typing", "semantic", "knobs", "runtime", "_C",
    "compiler", "functional", "nn", "ops", "wraps", "ttgl", "builtin", "cuda", "utils", "jit",
    "importlib", "pkgutil", "extra", "math", "libdevice", "language", "experimental"})
FORBIDDEN = {id(f) for f in (eval, exec, getattr, setattr, __import__, compile, open, globals,
                             vars, locals, builtins.input, builtins.breakpoint, type)}
BAD_MODULES = {"builtins", "os", "posix", "sys", "inspect", "importlib", "subprocess",
               "pkgutil", "typing", "functools", "ctypes"}


def _roots_ns() -> dict:
    import importlib

    return {k: importlib.import_module(v) for k, v in ROOTS.items()}


def _assert_harmless(obj, what):
    assert not isinstance(obj, types.ModuleType), what
    assert id(obj) not in FORBIDDEN, what
    assert not inspect.isframe(obj) and not inspect.iscode(obj), what
    mod = getattr(obj, "__module__", None) if callable(obj) else None
    assert mod is None or mod.split(".")[0] not in BAD_MODULES, (what, mod)
    import os
    assert obj is not os.environ, what


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(root=st.sampled_from(sorted(ROOTS)), chain=st.lists(st.sampled_from(_WORDS), min_size=1,
                                                           max_size=4),
       where=st.sampled_from(["host", "jit", "gluon"]))
def test_accepted_attribute_chains_reach_no_forbidden_object(root, chain, where):
    expr = ".".join([root] + chain)
    head = ("import torch\nimport triton\nimport math\nimport triton.language as tl\n"
            "from triton.experimental import gluon\n"
            "from triton.experimental.gluon import language as gl\n"
            "from triton.experimental.gluon.language.nvidia import hopper\n"
            "from triton.experimental.gluon.language.nvidia.hopper import tma, mbarrier\n")
    deco = "@gluon.jit" if where == "gluon" else "@triton.jit"
    kbody = f"    v = {expr}\n" if where != "host" else "    pass\n"
    fbody = f"    v = {expr}\n" if where == "host" else ""
    src = (head + f"\n{deco}\ndef _k(X):\n{kbody}\n\ndef forward(x):\n{fbody}"
           "    _k[(1,)](x)\n    return x\n")
    if check_source(src):
        return
    ns = _roots_ns()
    try:
        obj = eval(expr, {"__builtins__": {}}, ns)  # the test evaluates, never the guard
    except AttributeError:
        return  # a listed name this triton lacks
    _assert_harmless(obj, expr)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(mod=st.lists(st.sampled_from(_WORDS), min_size=1, max_size=5),
       name=st.one_of(st.none(), st.sampled_from(_WORDS)))
def test_accepted_imports_bind_no_forbidden_object(mod, name):
    path = ".".join(mod)
    line = f"import {path} as m" if name is None else f"from {path} import {name} as m"
    src = line + "\n" + HEAD + OK_FORWARD
    try:
        if check_source(src):
            return
    except RecursionError:
        return
    import importlib

    try:
        obj = importlib.import_module(path) if name is None else getattr(
            importlib.import_module(path), name)
    except (ImportError, AttributeError):
        return
    # an allowed module import is fine: it is bound as a module and every use is path-checked
    if name is None:
        assert path in G.MODULES
        return
    if isinstance(obj, types.ModuleType):
        assert f"{path}.{name}" in G.MODULES
        return
    _assert_harmless(obj, f"{path}.{name}")


def test_generative_chains_include_refusals_and_acceptances():
    """The strategies above are not vacuous: the word pool builds both kinds."""
    assert check_source(HEAD + OK_FORWARD.replace("    y = torch.empty_like(x)\n",
                                                  "    y = torch.empty_like(x)\n    d = torch.float32\n")) == []
    assert check_source(HEAD + OK_FORWARD.replace("    y = torch.empty_like(x)\n",
                                                  "    y = torch.empty_like(x)\n    d = torch.os\n"))
