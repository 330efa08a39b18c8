"""The LLM proposer: Claude, through the Anthropic SDK, proposes host/runtime or kernel candidates.

Each `ask()` is one stateless Messages request: the system prompt holds the hardware notes, the
model's attention design, the policy and the prohibitions (cached between requests); the user
message holds the diagnosis and the trial history with every failure's reason. The model answers
through a tool call whose input schema comes from a pydantic model (tuner.proposers.llm.schemas); the same
model validates it. An unusable answer (no tool call, wrong tool, schema violation, cut off, a
reply that is not JSON) raises `ProposalRejected("malformed", ...)`, which the loop records as a
rejected trial, and the next request shows it to the model. Policy, guard, correctness and the
holistic gate judge everything else, exactly as for any other proposer.

Model: `model=` or METALTUNE_LLM_MODEL (default DEFAULT_MODEL); some models write poor kernels, so
switching is one option. Key: ANTHROPIC_API_KEY (never logged, never put in the prompt or trial).
Tokens and dollars of each answer go to Trial.cost (`trial_cost`), with the spend behind each
kept change.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Optional, Sequence

from tuner.errors import BadInput, OperationFailed
from tuner.proposers.base import Point, ProposalRejected, Proposer, SearchSpace
from tuner.proposers.llm import context as ctx
from tuner.proposers.llm import cost as costs
from tuner.proposers.llm.schemas import MODELS, HostProposal, KernelProposal, tools
from tuner.trial import Candidate, KernelChoice, Trial

log = logging.getLogger("metaltune.llm")

DEFAULT_MODEL = "claude-opus-5-5"
MODEL_ENV = "METALTUNE_LLM_MODEL"

# what the holistic Llama workload lets a candidate change (tuner.workloads.llama.Runtime)
DEFAULT_RUNTIME_OPTIONS: dict[str, list[Any]] = {
    "cuda_graphs": [True, False],
    "graph_capture_sizes": ["null (every batch)", "list of batch sizes"],
    "max_ctx_to_capture": ["null", "an integer context length"],
    "fuse_projections": [True, False],
    "attn_impl": ["sdpa", "split_kv"],
    "kv_split": [64, 128, 256, 512, 1024, 2048],
}


def _kernel_families() -> dict[str, str]:
    try:
        from kernelsearch.families import all_families
    except ImportError:
        return {}
    return {f.name: f.signature for f in all_families()}


class LLMProposer(Proposer):
    name = "llm"

    def __init__(self, space: SearchSpace, seed: int = 0, budget: Optional[int] = None, *,
                 model: Optional[str] = None, client: Any = None, api_key: Optional[str] = None,
                 base_url: Optional[str] = None, http_client: Any = None,
                 kinds: Sequence[str] = ("host",), gpu: Optional[str] = None,
                 models: Sequence[str] = ("llama-gqa",), policy_text: Optional[str] = None,
                 runtime_options: Optional[dict[str, list[Any]]] = None,
                 kernel_families: Optional[dict[str, str]] = None, diagnosis: Any = None,
                 history_limit: int = 30, max_tokens: int = 16000, timeout_s: float = 300.0,
                 max_retries: int = 2, ideas: Sequence[str] = (),
                 task: Optional[Callable[[], str]] = None, **_: Any):
        super().__init__(space, seed, budget)
        self.model = model or os.environ.get(MODEL_ENV) or DEFAULT_MODEL
        bad = [k for k in kinds if k not in ("host", "kernel")]
        if bad or not kinds:
            raise BadInput(f"llm proposer: kinds must be 'host' and/or 'kernel', got {list(kinds)}")
        self.kinds = tuple(kinds)
        self.kernel_families = (kernel_families if kernel_families is not None
                                else _kernel_families()) if "kernel" in kinds else {}
        if "kernel" in kinds and not self.kernel_families:
            raise BadInput("llm proposer: kernel candidates asked for but no kernel family is "
                           "available (kernelsearch.families)")
        self.runtime_options = (DEFAULT_RUNTIME_OPTIONS if runtime_options is None
                                else runtime_options) if "host" in kinds else {}
        for m in models:  # fail now, not at the first ask
            if not (ctx.CONTEXT_DIR / "models" / f"{m}.md").is_file():
                raise BadInput(f"llm proposer: model context {m!r} not found; expected one of "
                               f"{', '.join(ctx.available_models())}")
        self.gpu, self.models, self.policy_text = gpu, tuple(models), policy_text
        self.diagnosis = diagnosis
        self.ideas = [str(i) for i in ideas]  # the operator's directions (--idea), every prompt
        self.task = task  # the search's own section of the user message, rebuilt every ask
        self.history_limit = history_limit
        self.max_tokens = max_tokens
        self._client = client
        self._client_kw = {"api_key": api_key, "base_url": base_url, "http_client": http_client,
                           "timeout": timeout_s, "max_retries": max_retries}
        self.trials: list[Trial] = []
        self.ledger = costs.Ledger()
        self.last_cost: dict[str, float] = {}
        self.last_prompt: dict[str, str] = {}
        self.last_response: Any = None

    def __repr__(self) -> str:  # never the key
        return f"LLMProposer(model={self.model!r}, kinds={self.kinds})"

    # -- the API client ------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            import anthropic

            kw = {k: v for k, v in self._client_kw.items() if v is not None}
            if not (kw.get("api_key") or os.environ.get("ANTHROPIC_API_KEY")):
                raise BadInput("llm proposer: no API key; set ANTHROPIC_API_KEY")
            self._client = anthropic.Anthropic(**kw)
        return self._client

    # -- prompt --------------------------------------------------------------------------------
    def system(self) -> str:
        policy = ctx.policy_section(self.space.dims if "host" in self.kinds else (),
                                    self.policy_text, self.runtime_options, self.kernel_families)
        return ctx.system_prompt(self.gpu, self.models, policy)

    def request(self) -> dict[str, Any]:
        system = self.system()
        user = ctx.user_message(self.trials, self.diagnosis, self.kinds, self.history_limit,
                                ideas=self.ideas, task=self.task() if self.task else "")
        self.last_prompt = {"system": system, "user": user}
        return {
            "model": self.model,
            "max_tokens": self.max_tokens,
            # the static part is identical between trials: cache it
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            "tools": tools(self.kinds),
            "messages": [{"role": "user", "content": user}],
        }

    # -- ask / tell ----------------------------------------------------------------------------
    def ask_point(self) -> Point:  # pragma: no cover - ask() is overridden
        raise NotImplementedError

    def ask(self) -> Candidate:
        import anthropic

        req = self.request()
        self.last_cost = {}
        try:
            resp = self.client.messages.create(**req)
        except anthropic.APIResponseValidationError as e:
            raise ProposalRejected("malformed", f"the API reply did not parse: {e.message}") from None
        except anthropic.APIStatusError as e:
            raise OperationFailed(f"llm proposer: {self.model}: HTTP {e.status_code}: "
                                  f"{_error_message(e)}") from None
        except anthropic.APIConnectionError as e:
            raise OperationFailed(f"llm proposer: cannot reach the API: {type(e).__name__}") from None
        except ValueError as e:  # a 200 whose body is not JSON
            raise ProposalRejected("malformed", f"the API reply is not JSON: {e}") from None
        self.last_response = resp
        self.last_cost = costs.usage_cost(self.model, getattr(resp, "usage", None) or {})
        self.ledger.charge(self.last_cost)
        log.info("llm %s: %d in / %d out tokens, $%.4f", self.model,
                 self.last_cost.get("input_tokens", 0), self.last_cost.get("output_tokens", 0),
                 self.last_cost.get("usd", float("nan")))
        return self.parse(resp)

    def parse(self, resp: Any) -> Candidate:
        blocks = list(getattr(resp, "content", None) or [])
        uses = [b for b in blocks if getattr(b, "type", None) == "tool_use"]
        stop = getattr(resp, "stop_reason", None)
        if stop == "max_tokens":
            raise ProposalRejected("malformed", f"the answer was cut off at max_tokens={self.max_tokens}")
        if not uses:
            text = " ".join(getattr(b, "text", "") for b in blocks if getattr(b, "type", "") == "text")
            raise ProposalRejected("malformed", f"answered without a tool call (stop_reason {stop}): "
                                                f"{text.strip()[:300]!r}")
        use = uses[0]
        offered = {t["name"] for t in tools(self.kinds)}
        if use.name not in offered:
            raise ProposalRejected("malformed", f"called tool {use.name!r}; offered: {sorted(offered)}")
        from pydantic import ValidationError

        try:
            prop = MODELS[use.name].model_validate(use.input)
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(str(x) for x in er['loc']) or '(input)'}: {er['msg']}"
                             for er in e.errors()[:4])
            raise ProposalRejected("malformed", f"{use.name} input does not fit its schema: {errs}") from None
        if isinstance(prop, HostProposal):
            if not prop.knobs and not prop.runtime:
                raise ProposalRejected("malformed", "the host candidate changes nothing")
            return Candidate(knobs=dict(prop.knobs), runtime=dict(prop.runtime), proposer=self.name,
                             rationale=prop.rationale)
        assert isinstance(prop, KernelProposal)
        if prop.family not in self.kernel_families:
            raise ProposalRejected("malformed", f"kernel family {prop.family!r} was not offered; "
                                                f"expected one of {sorted(self.kernel_families)}")
        return Candidate(
            kernel=KernelChoice(family=prop.family, variant="llm", config=dict(prop.config),
                                shape_bucket=prop.shape_range, source=prop.source),
            proposer=self.name, rationale=prop.rationale,
        )

    def tell(self, trial: Trial) -> None:
        self.trials.append(trial)
        super().tell(trial)

    def trial_cost(self, trial: Trial) -> dict[str, float]:
        """Trial.cost for the trial built from the last answer (the loop calls it once)."""
        out = self.ledger.trial_cost(self.last_cost, kept=trial.verdict == "kept")
        out["model_" + self.model] = 1.0  # which model answered, as a countable key
        return out

    def set_diagnosis(self, diagnosis: Any) -> None:
        self.diagnosis = diagnosis


def _error_message(e: Any) -> str:
    """The API's own error message (never request headers, so never the key)."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error") or {}
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
    return json.dumps(getattr(e, "message", ""))[:300]
