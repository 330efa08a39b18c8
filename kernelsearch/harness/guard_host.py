"""The guard's rules for host code: the module level (imports, constants, functions, their
signatures and decorators) and every plain function (`forward` and its helpers). A kernel's
body is handed to `guard_jit`."""
from __future__ import annotations

import ast

from kernelsearch.harness.guard_allow import (ANNOT, ANNOT_NAMES, BUILTINS_ALLOWED, DYNAMIC, GLUON,
                                              HOST, JIT_DECORATORS, METHOD_ALLOWED, MODULES,
                                              PATHS, REFLECTION, STREAM_WORDS, THREAD_MODULES,
                                              TIMER_MODULES, TIMER_WORDS, VALUE_ATTRS)
from kernelsearch.harness.guard_ast import (Violation, attr_chain, decorator_path, dotted_name,
                                            import_aliases, is_const, is_literal, jit_kind,
                                            resolve_path)
from kernelsearch.harness.guard_jit import jit_body_violations


class Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module):
        self.v: list[Violation] = []
        self.tree = tree
        self.aliases = import_aliases(tree)
        self.jit_names: set[str] = set()
        self.module_funcs: set[str] = set()
        self.constants: set[str] = set()
        self.launched: set[str] = set()
        self.local: set[str] = set()
        self.attr_bases: set[int] = set()

    def add(self, rule: str, node: ast.AST, msg: str) -> None:
        self.v.append(Violation(rule, getattr(node, "lineno", 0), msg))

    # ---- module level -------------------------------------------------------------------
    def run(self) -> list[Violation]:
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                self.module_funcs.add(node.name)
                if jit_kind(node, self.aliases):
                    self.jit_names.add(node.name)
            elif isinstance(node, ast.Assign) and is_const(node.value, self.aliases):
                self.constants |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and node.value is not None \
                    and isinstance(node.target, ast.Name) \
                    and is_const(node.value, self.aliases):
                self.constants.add(node.target.id)
        shadow = (self.module_funcs | self.constants) & (set(self.aliases) | BUILTINS_ALLOWED)
        for n in sorted(shadow):
            self.add("name_not_allowed", self.tree, f"{n} rebinds an import or a builtin")
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import_stmt(node)
            elif isinstance(node, ast.FunctionDef):
                self._function(node)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # docstring
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                value = node.value
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if isinstance(node, ast.AnnAssign):
                    self._annotation(node.annotation)
                if not all(isinstance(t, ast.Name) for t in targets) or value is None \
                        or not is_const(value, self.aliases):
                    self.add("module_state", node, "module-level state other than constants "
                             "(caches and registries are not allowed)")
            elif isinstance(node, ast.ClassDef):
                self.add("module_state", node, f"class {node.name} at module level")
            else:
                self.add("module_state", node,
                         f"module-level {type(node).__name__} statement (only imports, "
                         "functions and constants)")
        if "forward" not in self.module_funcs:
            self.add("no_forward", self.tree, "the module defines no forward(...)")
        elif "forward" in self.jit_names:
            self.add("no_forward", self.tree, "forward must be a plain Python function")
        if not self.launched:
            self.add("no_launch", self.tree,
                     "no module-level @triton.jit kernel is launched (kernel[grid](...))")
        return self.v

    def _import_stmt(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                self._import(node, a.name, a.name in MODULES)
            return
        mod = node.module or ""
        if node.level:
            self.add("import", node, "relative import")
            return
        for a in node.names:
            full = f"{mod}.{a.name}"
            if mod == "__future__" and a.name == "annotations":
                continue
            if a.name == "*":
                self.add("import", node, f"from {mod} import *")
            elif full in MODULES or full in PATHS:
                continue
            elif mod in MODULES and mod == "torch":
                self.add("import", node, f"from torch import {a.name}: only allocation and "
                         "dtypes may be named from torch")
            else:
                self._import(node, full, False)

    def _import(self, node: ast.AST, name: str, ok: bool) -> None:
        root = name.split(".")[0]
        if root in THREAD_MODULES:
            self.add("thread", node, f"import of {name}: candidates may not start threads")
        elif root in TIMER_MODULES or name.startswith("triton.testing"):
            self.add("timer", node, f"import of {name}: candidates may not touch timers")
        elif not ok:
            self.add("import", node, f"import of {name} (allowed: {sorted(MODULES)[:12]} ...; "
                     "typing, os, sys and the rest are not)")

    # ---- annotations and decorators -------------------------------------------------------
    def _annotation(self, node: ast.AST | None, jit: bool = False) -> None:
        """An annotation is evaluated at import unless `from __future__ import annotations`
        (and triton reads a kernel's): only a short list of types, nothing computed."""
        if node is None:
            return
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute):
                path = resolve_path(sub, self.aliases, set())
                if path is not None and ANNOT in PATHS.get(path, ()):
                    self.attr_bases |= {id(x) for x in ast.walk(sub) if x is not sub}
                    continue
                if id(sub) in self.attr_bases:
                    continue
                self.add("annotation_not_allowed", sub,
                         f"annotation {ast.unparse(sub)[:60]}: only int, float, bool, "
                         "tl.constexpr, torch.Tensor and the like")
                self.attr_bases |= {id(x) for x in ast.walk(sub) if x is not sub}
            elif isinstance(sub, ast.Name):
                if id(sub) in self.attr_bases:
                    continue
                if sub.id not in ANNOT_NAMES:
                    self.add("annotation_not_allowed", sub, f"annotation names {sub.id}")
            elif isinstance(sub, ast.Constant):
                if sub.value is not None:
                    self.add("annotation_not_allowed", sub,
                             "string annotations are not allowed (they are evaluated later)")
            elif not isinstance(sub, (ast.Subscript, ast.Tuple, ast.BinOp, ast.BitOr,
                                      ast.Load, ast.Index if hasattr(ast, "Index") else ast.Load)):
                self.add("annotation_not_allowed", sub,
                         f"annotation contains {type(sub).__name__} (only types)")

    def _signature(self, fn: ast.FunctionDef, jit: bool) -> None:
        a = fn.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
            self._annotation(arg.annotation, jit)
        self._annotation(fn.returns, jit)
        for default in a.defaults + [d for d in a.kw_defaults if d is not None]:
            if not is_const(default, self.aliases):
                self.add("module_state", default, f"mutable or computed default in {fn.name}")

    def _decorators(self, fn: ast.FunctionDef, kind: str | None) -> None:
        for d in fn.decorator_list:
            path = decorator_path(d, self.aliases)
            if kind is None or path not in JIT_DECORATORS:
                self.add("module_state", d, f"decorator {dotted_name(d)} on {fn.name} "
                         "(only triton.jit, gluon.jit, triton.autotune, triton.heuristics)")
                continue
            if not isinstance(d, ast.Call):
                continue
            for arg in list(d.args) + [k.value for k in d.keywords]:
                if not self._decorator_arg(arg):
                    self.add("decorator_not_allowed", arg,
                             f"decorator argument {ast.unparse(arg)[:60]} on {fn.name}: only "
                             "constants and triton.Config(constants)")
            if any(k.arg is None for k in d.keywords):
                self.add("decorator_not_allowed", d, f"**kwargs in a decorator on {fn.name}")

    def _decorator_arg(self, node: ast.AST) -> bool:
        if is_literal(node):
            return True
        if isinstance(node, (ast.List, ast.Tuple)):
            return all(self._decorator_arg(e) for e in node.elts)
        if isinstance(node, ast.Call) and resolve_path(node.func, self.aliases, set()) == \
                "triton.Config":
            return all(self._decorator_arg(x) for x in list(node.args)
                       + [k.value for k in node.keywords if k.arg is not None]) \
                and all(k.arg is not None for k in node.keywords)
        return False

    # ---- functions ------------------------------------------------------------------------
    def _function(self, fn: ast.FunctionDef) -> None:
        kind = jit_kind(fn, self.aliases)
        self._decorators(fn, kind)
        self._signature(fn, kind is not None)
        if kind is not None:
            self.v += jit_body_violations(fn, self.aliases, self.jit_names, self.constants,
                                          gluon=(kind == GLUON))
            return
        a = fn.args
        params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        params |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        stored = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                  and isinstance(n.ctx, (ast.Store, ast.Del))}
        stored |= {n.name for n in ast.walk(fn) if isinstance(n, ast.FunctionDef) and n is not fn}
        bad = (params | stored) & (set(self.aliases) | self.jit_names | self.module_funcs
                                   | DYNAMIC | REFLECTION)
        for n in sorted(bad):
            self.add("name_not_allowed", fn, f"{fn.name} rebinds {n}")
        prev, self.local = self.local, params | stored
        for stmt in fn.body:
            self.visit(stmt)
        self.local = prev

    # ---- host statements ------------------------------------------------------------------
    def visit_Import(self, node: ast.AST) -> None:
        self.add("import", node, "import inside a function")

    visit_ImportFrom = visit_Import

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.add("module_state", node, f"nested function {node.name}")

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.add("module_state", node, "lambda inside a candidate")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.add("module_state", node, f"class {node.name} inside a candidate")

    def visit_Try(self, node: ast.AST) -> None:
        self.add("try_except", node, "try/except (a fallback path) is not allowed")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_With(self, node: ast.With) -> None:
        self.generic_visit(node)  # a stream in the header is reported as such first
        self.add("context_manager", node, "with-statements are not allowed (streams, suppress)")

    def visit_Global(self, node: ast.AST) -> None:
        self.add("module_state", node, "global/nonlocal state")

    visit_Nonlocal = visit_Global

    def visit_Yield(self, node: ast.AST) -> None:
        self.add("module_state", node, "generators are not allowed")

    visit_YieldFrom = visit_Await = visit_Yield

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if any(isinstance(v, ast.FormattedValue) for v in node.values):
            self.add("reflection", node, "f-string formatting (the text of an object is "
                     "introspection)")
        self.generic_visit(node)

    def _targets(self, targets: list[ast.AST], node: ast.AST) -> None:
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    self.add("monkey_patch", node, f"assignment to attribute {dotted_name(sub)}")
                    self.attr_bases.add(id(sub))
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    self.add("torch_compute", node,
                             f"write into {dotted_name(sub.value)}[...] outside a kernel")
            self.visit(t)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node.targets, node)
        self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets([node.target], node)
        self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self._targets([node.target], node)
        if node.value is not None:
            self.visit(node.value)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._targets(node.targets, node)

    # ---- host expressions -----------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) in self.attr_bases:
            self.generic_visit(node)
            return
        base, names = attr_chain(node)
        sub: ast.AST = node
        while isinstance(sub, ast.Attribute):  # the chain's own links, not its base's insides
            self.attr_bases.add(id(sub))
            sub = sub.value
        dotted = dotted_name(node)
        under = [n for n in names if n.startswith("_")]
        path = resolve_path(node, self.aliases, self.local)
        if under:
            self.add("reflection", node, f"private or dunder attribute .{under[0]}")
        elif any(any(w in n.lower() for w in STREAM_WORDS) for n in names):
            self.add("stream", node, f"{dotted}: streams, events, graphs and syncs belong to "
                     "the harness")
        elif set(names) & TIMER_WORDS:
            self.add("timer", node, f"{dotted}: candidates may not touch timers")
        elif path is not None:
            if path.startswith("torch.cuda"):
                self.add("stream", node, f"{dotted}: torch.cuda API inside a candidate")
            elif HOST not in PATHS.get(path, ()):
                rule = "torch_compute" if path.startswith("torch.") else "attribute_not_allowed"
                self.add(rule, node, f"{dotted} ({path}) is not on the host allow-list "
                         "(allocation, dtypes, triton.cdiv/next_power_of_2/jit)")
        elif isinstance(base, ast.Name) and (base.id in self.module_funcs
                                              or base.id in BUILTINS_ALLOWED) \
                and base.id not in self.local:
            self.add("attribute_not_allowed", node,
                     f"{dotted}: attributes of a function, kernel or builtin")
        else:
            bad = [n for n in names if n not in VALUE_ATTRS]
            if bad:
                call_parent = False  # a method call on a tensor is compute
                self.add("attribute_not_allowed" if not call_parent else "torch_compute", node,
                         f"{dotted}: .{bad[0]} is not a tensor view/metadata attribute")
        if not isinstance(base, ast.Name):
            self.visit(base)
        elif base.id not in self.aliases or base.id in self.local:
            self.visit(base)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.add("torch_compute", node, "matrix product (@) outside a kernel")
        if isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str):
            self.add("reflection", node, "%-formatting (the text of an object)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name):
            if f.id in DYNAMIC:
                self.add("dynamic_code", node, f"{f.id}(...) is not allowed")
            elif f.id in REFLECTION:
                self.add("reflection", node, f"{f.id}(...) is not allowed")
            elif f.id in self.jit_names:
                self.add("no_launch", node, f"{f.id} called without a launch grid")
            elif f.id in self.local:
                self.add("call_not_allowed", node, f"call of {f.id}(...), a parameter or local")
            elif f.id not in BUILTINS_ALLOWED | self.module_funcs and f.id not in self.aliases:
                self.add("dynamic_code", node, f"call of unknown name {f.id}")
            self.attr_bases.add(id(f))
            for a in node.args:
                self.visit(a)
            for k in node.keywords:
                self.visit(k.value)
            if f.id in self.aliases and f.id not in self.local:
                path = self.aliases[f.id]
                if HOST not in PATHS.get(path, ()):
                    self.add("call_not_allowed", node, f"call of {f.id} ({path})")
            return
        if isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) \
                and f.value.id in self.jit_names and f.value.id not in self.local:
            self.launched.add(f.value.id)
            self.visit(f.slice)
            for a in node.args:
                self.visit(a)
            for k in node.keywords:
                self.visit(k.value)
            return
        if isinstance(f, ast.Attribute):
            path = resolve_path(f, self.aliases, self.local)
            if isinstance(f.value, ast.Constant):
                self.add("reflection", node, f"method .{f.attr}(...) of a constant (formatting "
                         "an object is introspection)")
                self.attr_bases.add(id(f))
            elif path is None and f.attr not in METHOD_ALLOWED and not f.attr.startswith("_") \
                    and not any(w in f.attr.lower() for w in STREAM_WORDS) \
                    and f.attr not in TIMER_WORDS:
                base, _ = attr_chain(f)
                if not (isinstance(base, ast.Name) and base.id in self.module_funcs
                        and base.id not in self.local):
                    self.add("torch_compute", node, f".{f.attr}(...): only allocation, views "
                             "and metadata are allowed outside kernels")
                    self.attr_bases.add(id(f))
        elif not isinstance(f, ast.Attribute):
            self.add("call_not_allowed", node, f"call of a computed value "
                     f"{ast.unparse(f)[:40]}(...)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load) or id(node) in self.attr_bases:
            return
        n = node.id
        if n in DYNAMIC:
            self.add("dynamic_code", node, f"reference to {n}")
        elif n in REFLECTION:
            self.add("reflection", node, f"reference to {n}")
        elif n in self.local:
            return
        elif n in self.aliases:
            if HOST not in PATHS.get(self.aliases[n], ()):
                self.add("module_as_value" if self.aliases[n] in MODULES else
                         "reflection", node, f"module {n} used as a value")
        elif n in self.module_funcs:
            self.add("reflection", node, f"function {n} used as a value (only called or "
                     "launched)")
        elif n not in self.constants | BUILTINS_ALLOWED:
            self.add("name_not_allowed", node, f"name {n!r} is not a parameter, a local, an "
                     "import, this file's function or constant, or an allowed builtin")
