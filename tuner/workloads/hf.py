"""The holistic workload on Hugging Face transformers: `--workload hf:<config>[:layers=N]`.

The user's kind of model code: a transformers causal LM (Llama, Qwen2, Qwen3, Mistral) built from
a config shipped here as a small dict (no hub download; random weights, seeded), stepped the way
transformers documents its fast path: a `StaticCache` and the forward compiled with
`torch.compile(mode="reduce-overhead", fullgraph=True)` (CUDA graphs through inductor). Measures,
per context and batch, like `tuner.workloads.llama`:

- decode tokens/s: one token per sequence with `ctx` positions filled in a StaticCache of
  `ctx + 8` (random keys and values, so long contexts need no prefill; the fill counter is set
  before every step, so every step sees the same context);
- prefill tokens/s: batch x context tokens through the eager forward into a fresh StaticCache
  (contexts up to `max_prefill_ctx`, 32k by default: transformers builds a [q, kv] mask there).

Runtime settings (`Runtime`): `compile` (the fast path for decode, else eager) and `metaltune`
(the installed dispatch table applied with `kernelsearch.integrations.transformers.patch`; no
table installed: the plain model). Outputs of the patched model are checked against the plain
model (prefill logits and one decode step) before anything is timed.

No pydantic here (this module runs on the bare GPU machine); `HFWorkload.measure` builds a
`tuner.trial.Measurement` lazily, as LlamaWorkload does."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from tuner.workloads.holistic import (GridDefaults, HolisticWorkload, RuntimeSettings, SizeGrid,
                                      _sync, auto_device, size_grid, time_sizes)
from tuner.workloads.holistic import _Timer
from tuner.workloads.llama_runners import default_tolerance, rel_err

# Small dicts, as a config.json holds them (AutoConfig.for_model); `layers=N` overrides the depth.
PRESETS: dict[str, dict[str, Any]] = {
    # CPU tests: float32, shapes a covering table reaches under the Triton interpreter
    "tiny-llama": dict(model_type="llama", hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=256, max_position_embeddings=4096, rope_theta=500000.0,
                       dtype="float32"),
    "tiny-qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=256, max_position_embeddings=4096, dtype="float32"),
    "tiny-qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, vocab_size=256, max_position_embeddings=4096,
                       dtype="float32"),
    "tiny-mistral": dict(model_type="mistral", hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                         vocab_size=256, max_position_embeddings=4096, sliding_window=None,
                         dtype="float32"),
    # the shared facts' geometry: Llama-3-8B (d 4096, 32/8 heads, ffn 14336, vocab 128256)
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, max_position_embeddings=131072 + 1024,
                      rope_theta=500000.0, rms_norm_eps=1e-5, dtype="bfloat16"),
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936, max_position_embeddings=131072 + 1024,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, dtype="bfloat16"),
    "qwen2-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     vocab_size=152064, max_position_embeddings=131072 + 1024,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, dtype="bfloat16"),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=32768, max_position_embeddings=131072 + 1024,
                       rope_theta=1000000.0, sliding_window=None, rms_norm_eps=1e-5,
                       dtype="bfloat16"),
}
CACHE_SLACK = 8  # StaticCache length = ctx + this (the shared facts' method)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`<preset>[:layers=N]` (with or without the `hf:` prefix) -> (preset, overrides);
    ValueError naming what was expected."""
    body = spec[3:] if spec.startswith("hf:") else spec
    name, *opts = body.split(":")
    if name not in PRESETS:
        raise ValueError(f"--workload hf:{name}: unknown config; expected one of "
                         f"{', '.join(PRESETS)}")
    over: dict[str, Any] = {}
    for o in opts:
        k, _, v = o.partition("=")
        if k != "layers" or not v.isdigit() or int(v) < 1:
            raise ValueError(f"--workload hf:{body}: expected options like layers=N (N >= 1), "
                             f"got {o!r}")
        over["num_hidden_layers"] = int(v)
    return name, over


@dataclass
class Runtime(RuntimeSettings):
    """A candidate's runtime settings for this workload (Candidate.runtime)."""

    compile: bool = True  # decode through torch.compile(mode="reduce-overhead", fullgraph=True)
    metaltune: bool = True  # patch the model with the installed dispatch table

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> "Runtime":
        d = cls.known(d)
        for k, v in d.items():
            if not isinstance(v, bool):
                raise ValueError(f"runtime.{k}: expected true or false, got {v!r}")
        return cls(**d)


#: what a mixed search may change in this workload
RUNTIME_DIMS: dict[str, list[Any]] = {"compile": [True, False], "metaltune": [True, False]}


class HFModel:
    """A transformers causal LM with random weights and the patch state it is in."""

    def __init__(self, spec: str, device: str = "cpu", seed: int = 0,
                 parsed: Optional[tuple[str, dict[str, Any]]] = None):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        name, over = parsed if parsed is not None else parse_spec(spec)
        d = {**PRESETS[name], **over}
        self.spec, self.name = spec, name
        self.dtype_name = d.pop("dtype")
        self.dtype = getattr(torch, self.dtype_name)
        self.device = torch.device(device)
        self.config = AutoConfig.for_model(**d)
        self.config._attn_implementation = "sdpa"  # transformers' default where torch has SDPA
        torch.manual_seed(seed)
        with self.device:  # weights drawn where they live (GBs on a GPU: seconds)
            self.model = AutoModelForCausalLM.from_config(self.config, dtype=self.dtype).eval()
        self.vocab = self.config.vocab_size
        self.patched_with: Any = None  # the table object the model is patched with, or None

    def set_patch(self, on: bool, table: Any = None, only_covered: bool = True) -> bool:
        """Patch with `table` (on) or restore the plain model; True when the state changed."""
        from kernelsearch.integrations import transformers as mt

        want = table if on else None
        if want is self.patched_with:
            return False
        mt.unpatch(self.model)
        if want is not None:
            # patched and unpatched for every A/B pair: its "what I replaced" line (stderr when
            # logging is not set up) would flood a search; quiet here, logged where configured
            quiet = logging.NullHandler()
            logging.getLogger(mt.__name__).addHandler(quiet)
            try:
                mt.patch(self.model, want, only_covered=only_covered)
            finally:
                logging.getLogger(mt.__name__).removeHandler(quiet)
        self.patched_with = want
        return True

    def new_cache(self, batch: int, length: int, fill: str = "random", seed: int = 1) -> Any:
        """A StaticCache of `length` positions, initialised now (random keys/values: long
        contexts need no prefill and never run on zeros)."""
        import torch
        from transformers import StaticCache

        c = self.config
        cache = StaticCache(config=c, max_cache_len=length)
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        cache.early_initialization(batch, c.num_key_value_heads, hd, self.dtype, self.device)
        if fill == "random":
            g = torch.Generator(device=self.device).manual_seed(seed)
            for layer in cache.layers:
                for t in (layer.keys, layer.values):
                    t.copy_(torch.randn(t.shape, generator=g, device=self.device, dtype=t.dtype))
        return cache

    @staticmethod
    def set_filled(cache: Any, n: int) -> None:
        """Every layer's fill counter to `n` (in place: static addresses stay)."""
        for layer in cache.layers:
            layer.cumulative_length.fill_(n)

    def forward(self, tokens: Any, cache: Any) -> Any:
        """Logits of the last position only (a 128k prefill's full logits would be 33 GB)."""
        return self.model(input_ids=tokens, past_key_values=cache, use_cache=True,
                          logits_to_keep=1).logits


def _compiled(model: HFModel) -> Callable[..., Any]:
    """transformers' documented fast path for decode (one compile shared by every size: dynamo
    guards re-specialise where shapes change)."""
    import torch

    return torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)


class DecodeRunner:
    """One decode step at `ctx` filled positions of a StaticCache of ctx + CACHE_SLACK."""

    def __init__(self, model: HFModel, runtime: Runtime, batch: int, ctx: int,
                 cache: Any = None, seed: int = 0, compiled: Optional[Callable] = None):
        import torch

        self.model, self.rt, self.batch, self.ctx = model, runtime, batch, ctx
        self.cache = cache if cache is not None else model.new_cache(batch, ctx + CACHE_SLACK)
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.tokens = torch.randint(0, model.vocab, (batch, 1), generator=g).to(model.device)
        self._fn = compiled if (runtime.compile and compiled is not None) else (
            _compiled(model) if runtime.compile else model.forward)
        self.out: Any = None
        self.setup_s = 0.0

    def prepare(self, warmup: int = 2) -> "DecodeRunner":
        t0 = time.perf_counter()
        for _ in range(max(warmup, 3) if self.rt.compile else max(1, warmup)):
            self.step()  # compile, then cudagraph-tree warm-up and recording
        _sync(self.model.device)
        self.setup_s = time.perf_counter() - t0
        return self

    def step(self) -> Any:
        self.model.set_filled(self.cache, self.ctx - 1)
        self.out = self._fn(self.tokens, self.cache)
        return self.out

    def tokens_per_s(self, steps: int) -> float:
        return self.batch * steps / _Timer(self.model.device)(self.step, steps)


class PrefillRunner:
    """`batch` x `ctx` tokens through the eager forward into an emptied StaticCache."""

    def __init__(self, model: HFModel, runtime: Runtime, batch: int, ctx: int,
                 cache: Any = None, seed: int = 0, compiled: Optional[Callable] = None):
        import torch

        self.model, self.rt, self.batch, self.ctx = model, runtime, batch, ctx
        self.cache = cache if cache is not None else model.new_cache(batch, ctx + CACHE_SLACK,
                                                                     fill="zeros")
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.tokens = torch.randint(0, model.vocab, (batch, ctx), generator=g).to(model.device)
        self.setup_s = 0.0

    def prepare(self, warmup: int = 1) -> "PrefillRunner":
        t0 = time.perf_counter()
        for _ in range(max(1, warmup)):
            self.step()
        _sync(self.model.device)
        self.setup_s = time.perf_counter() - t0
        return self

    def step(self) -> Any:
        self.model.set_filled(self.cache, 0)
        return self.model.forward(self.tokens, self.cache)

    def tokens_per_s(self, steps: int = 1) -> float:
        return self.batch * self.ctx * steps / _Timer(self.model.device)(self.step, steps)


def check(model: HFModel, table: Any, batch: int = 2, ctx: int = 32, steps: int = 1,
          tol: Optional[float] = None, seed: int = 3) -> dict[str, Any]:
    """The patched model's logits against the plain model's on the same weights and tokens:
    prefill of `ctx` tokens, then `steps` greedy decode steps (StaticCache), eager."""
    import torch

    tol = default_tolerance(model.dtype_name) if tol is None else tol
    g = torch.Generator(device="cpu").manual_seed(seed)
    toks = torch.randint(0, model.vocab, (batch, ctx), generator=g).to(model.device)
    was = model.patched_with
    logits: dict[str, list[Any]] = {}
    try:
        with torch.no_grad():
            for side, on in (("plain", False), ("patched", True)):
                model.set_patch(on, table)
                cache = model.new_cache(batch, ctx + steps + CACHE_SLACK, fill="zeros")
                outs = [model.forward(toks, cache)[:, -1]]
                for _ in range(steps):  # both sides fed the plain model's greedy tokens
                    src = outs[-1] if side == "plain" else logits["plain"][len(outs) - 1]
                    outs.append(model.forward(src.argmax(-1, keepdim=True), cache)[:, -1])
                logits[side] = outs
    finally:
        model.set_patch(was is not None, was)
    errs = {("prefill" if i == 0 else f"decode{i}"): rel_err(b, a)
            for i, (a, b) in enumerate(zip(logits["plain"], logits["patched"]))}
    worst = max(errs.values())
    return {"ok": worst <= tol, "tol": tol, "errors": errs}


class Bench:
    """Prefill and decode tokens/s over a size grid, runtime by runtime; caches shared between
    runtimes, runners kept per runtime (a recompile or re-capture only on a table change)."""

    def __init__(self, model: HFModel, grid: SizeGrid, dispatch: Any = None,
                 max_prefill_ctx: Optional[int] = None):
        self.model, self.grid, self.dispatch = model, grid, dispatch
        self.max_prefill_ctx = max_prefill_ctx
        self._caches: dict[tuple[str, int, int], Any] = {}
        self._runners: dict[tuple[str, str, int, int], Any] = {}
        self._compiled: dict[str, Callable] = {}
        self.at: Optional[str] = None  # the size being prepared or timed (time_sizes)

    def _cache(self, kind: str, batch: int, length: int) -> Any:
        k = (kind, batch, length)
        if k not in self._caches:
            self._caches[k] = self.model.new_cache(batch, length,
                                                   fill="random" if kind == "decode" else "zeros")
        return self._caches[k]

    def _apply(self, rt: Runtime) -> None:
        table = self.dispatch.installed() if (rt.metaltune and self.dispatch is not None) else None
        if self.model.set_patch(table is not None, table):
            self._forget_compiled()  # graphs captured with the other forwards

    def _forget_compiled(self) -> None:
        """Drop the runners and compiled steps, and dynamo's caches with them: every patch
        switch compiles the same `forward` code again, and past dynamo's recompile limit (8)
        it silently runs eager, which on the H200 made an A/B's incumbent 8x slower after a
        few trials."""
        self._runners.clear()
        if self._compiled:
            import torch

            self._compiled.clear()
            torch._dynamo.reset()  # also frees the cudagraph trees of the dropped steps

    def runner(self, rt: Runtime, kind: str, batch: int, ctx: int) -> Any:
        self._apply(rt)
        k = (rt.key(), kind, batch, ctx)
        if k not in self._runners:
            comp = None
            if rt.compile and kind == "decode":
                comp = self._compiled.setdefault(rt.key(), _compiled(self.model))
            cls = DecodeRunner if kind == "decode" else PrefillRunner
            self._runners[k] = cls(self.model, rt, batch, ctx,
                                   self._cache(kind, batch, ctx + CACHE_SLACK),
                                   compiled=comp).prepare()
        return self._runners[k]

    def drop(self, rt: Optional[Runtime] = None) -> None:
        if rt is None:
            self._forget_compiled()
        else:
            for k in [k for k in self._runners if k[0] == rt.key()]:
                del self._runners[k]

    def sizes(self) -> list[tuple[str, int, int]]:
        """The grid's sizes; prefill only up to max_prefill_ctx (transformers builds a [q, kv]
        mask for a static-cache prefill: 17 GB of bools at 128k)."""
        return [s for s in self.grid.sizes() if not (
            s[0] == "prefill" and self.max_prefill_ctx is not None and s[2] > self.max_prefill_ctx)]

    def run(self, rt: Runtime, repeats: int = 5, deadline: Optional[float] = None,
            sizes: Optional[Sequence[tuple[str, int, int]]] = None) -> dict[str, Any]:
        sizes = self.sizes() if sizes is None else sizes
        if self.dispatch is not None and not hasattr(self.dispatch, "installed"):
            return self._trace(rt, sizes)
        return time_sizes(self, rt, sizes, repeats, deadline)

    def _trace(self, rt: Runtime, sizes: Optional[Sequence[tuple[str, int, int]]]) -> dict[str, Any]:
        """One eager pass over the grid with every replaceable module on the ops and `dispatch`
        (a recorder: tuner.search.mixed.space) standing in for kernelsearch.dispatch, so it sees each
        (family, dtype, shape) the patched model would call."""
        import torch

        from kernelsearch import dispatch as real
        from kernelsearch.table import DispatchTable

        rec = self.dispatch
        was, installed = self.model.patched_with, real.installed()
        saved = real.call, real.resolve
        real.call = rec.call
        def resolve(family: str, *args: Any) -> None:  # recorded; the op then runs torch
            rec.call(family, *args)

        real.resolve = resolve
        try:
            self.model.set_patch(True, DispatchTable(), only_covered=False)
            with torch.no_grad():
                for kind, b, ctx in (self.sizes() if sizes is None else sizes):
                    cls = DecodeRunner if kind == "decode" else PrefillRunner
                    cls(self.model, Runtime(compile=False, metaltune=True), b, ctx).step()
        finally:
            real.call, real.resolve = saved
            self.model.set_patch(False)
            real.install(installed)
            self.model.set_patch(was is not None, was)
            self._runners.clear()
        return {"per_size_samples": {}, "setup_s": {}, "skipped": []}


class HFWorkload(HolisticWorkload):
    """The holistic workload on transformers (tuner.workloads.base.Workload): tokens/s geometric
    mean over prefill and decode sizes with per-size results; `configure(runtime)`; `measure`
    checks the patched outputs against the plain model once per table (WorkloadFailed on a
    mismatch) and then times (tuner.workloads.holistic: a failure of the run is WorkloadFailed
    too)."""

    RUNTIME_DIMS = RUNTIME_DIMS
    # the patch's static-cache attention runs only flashdec (masked lengths read on the device;
    # kernelsearch.ops.decode_attention_cache): other variants' entries would leave it on torch
    KERNEL_VARIANTS = {"decode_attention": ("flashdec",)}
    Runtime = Runtime
    MISMATCH = "patched outputs differ from the plain model"
    CPU_GRID = GridDefaults(contexts=(16, 48), decode_batch=2, decode_steps=3)
    GPU_GRID = GridDefaults(contexts=(4096, 32768, 131072), decode_batch=8, decode_steps=20)

    def __init__(self, spec: str = "tiny-llama", contexts: Optional[Sequence[int]] = None,
                 decode_batches: Optional[Sequence[int]] = None,
                 prefill_batches: Optional[Sequence[int]] = None,
                 decode_steps: Optional[int] = None, device: Optional[str] = None, seed: int = 0,
                 runtime: Optional[Mapping[str, Any]] = None, prefill: bool = True,
                 decode: bool = True, check_outputs: bool = True,
                 max_prefill_ctx: Optional[int] = 32768,
                 parsed: Optional[tuple[str, dict[str, Any]]] = None):
        """`parsed`: `parse_spec(spec)` where the caller has it already (the factory)."""
        from tuner.workloads.llama_ops import load_dispatch

        dev = device or auto_device()
        self.name = spec if spec.startswith("hf:") else f"hf:{spec}"
        self.grid = size_grid(self.CPU_GRID, self.GPU_GRID, dev, contexts, decode_batches,
                              prefill_batches, decode_steps, prefill, decode)
        if dev == "cpu":  # inductor's CPU compile takes minutes on a shared machine: eager unless asked
            runtime = {"compile": False, **dict(runtime or {})}
            self.RUNTIME_DIMS = {"metaltune": [True, False]}
        self.model = HFModel(spec, dev, seed, parsed)
        self.dispatch = load_dispatch()
        self.bench = Bench(self.model, self.grid, self.dispatch, max_prefill_ctx)
        self._start(runtime, check_outputs)

    def dispatch_changed(self) -> None:
        """The installed table changed: re-patch (its coverage decides what is replaced) and
        re-capture."""
        super().dispatch_changed()
        self.model.set_patch(False)

    def _table(self) -> Any:
        return self.dispatch.installed() if self.dispatch is not None else None

    def _check_key(self) -> Optional[int]:
        table = self._table()
        return None if table is None or not self.runtime.metaltune else id(table)

    def _check_now(self) -> dict[str, Any]:
        return check(self.model, self._table())

    def _first_runner(self, kind: str, batch: int, ctx: int) -> Any:
        self.bench._apply(self.runtime)
        cls = DecodeRunner if kind == "decode" else PrefillRunner
        return cls(self.model, self.runtime, batch, ctx)

    def _compiles(self) -> bool:
        return self.runtime.compile

    def _extra(self) -> dict[str, Any]:
        from kernelsearch.integrations.transformers import patched

        return {"patched": patched(self.model.model), "model": self.model.spec,
                "device": str(self.model.device)}


def from_spec(spec: Any) -> HFWorkload:
    """`hf:<config>[:layers=N]` (tuner.workloads.factory)."""
    from tuner.errors import BadInput

    try:
        parsed = parse_spec(spec.text)
        import transformers  # noqa: F401
    except ValueError as e:
        raise BadInput(str(e)) from None
    except ImportError:
        raise BadInput("--workload hf:...: needs transformers (pip install 'metaltune[hf]')") from None
    return HFWorkload(spec.text, parsed=parsed)
