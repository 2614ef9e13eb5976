"""tandemrl's requests to vLLM's inputs, and vLLM's outputs back to Rollouts: ``vllm.LLM``'s objects (colocated) and
the OpenAI server's JSON (server mode). Pure mapping, no engine state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tandemrl.engine.stopping import tokens_to_keep, truncate_at_stop, validate_stop
from tandemrl.types import Request, RequestStats, Rollout

_FINISH = {"stop": "stop", "length": "length"}  # anything else (abort, error) is an error rollout


@dataclass(frozen=True)
class Limits:
    """What a prompt must satisfy before it reaches vLLM (which would fail the whole batch on one bad request)."""

    vocab_size: int
    max_model_len: int


def request_error(req: Request, limits: Limits) -> str | None:
    """Why this request cannot run, or None."""
    try:
        req.params.validate()
        validate_stop(req.params.stop)
    except ValueError as exc:
        return str(exc)
    if len(req.prompt_ids) == 0:
        return "empty prompt"
    try:
        bad = [t for t in req.prompt_ids if not 0 <= int(t) < limits.vocab_size]
    except (TypeError, ValueError):
        return "prompt_ids must be integers"
    if bad:
        return f"prompt token ids out of range [0, {limits.vocab_size}): {bad[:5]}"
    if len(req.prompt_ids) + req.params.max_tokens > limits.max_model_len:
        return (f"prompt ({len(req.prompt_ids)} tokens) + max_tokens ({req.params.max_tokens}) exceeds "
                f"vLLM's max_model_len ({limits.max_model_len})")
    return None


def sampling_params(vllm: Any, req: Request, eos_ids: list[int], index: int) -> Any:
    """vLLM's SamplingParams for one request; ``index`` (the request's place in the call) offsets a seed, since
    vLLM seeds each request on its own: one seed for all would give a GRPO group identical samples."""
    p = req.params
    return vllm.SamplingParams(
        max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
        stop=list(validate_stop(p.stop)) or None, ignore_eos=p.ignore_eos,
        stop_token_ids=None if p.ignore_eos else list(eos_ids),
        seed=None if p.seed is None else int(p.seed) + index,
        logprobs=0,  # the sampled token's log-prob only (logprobs_mode decides which distribution)
    )


def to_rollout(req: Request, output: Any, decode: Callable[[Sequence[int]], str], policy_version: int,
               stats: RequestStats) -> Rollout:
    """One vLLM RequestOutput as a Rollout: tokens, the sampled tokens' log-probs, finish reason, text."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], ids)]
    cached = int(getattr(output, "num_cached_tokens", 0) or 0)
    return make_rollout(req, ids, logprobs, completion.finish_reason, cached, decode, policy_version, stats)


def completion_body(model: str, req: Request, eos_ids: list[int], index: int, n: int) -> dict[str, Any]:
    """The ``/v1/completions`` request (vLLM's OpenAI server) for ``n`` samples of one request; the same sampling
    as ``sampling_params`` (vLLM gives sample j of a seeded request seed + j, so ``index`` is the group's first)."""
    p = req.params
    return {"model": model, "prompt": [int(t) for t in req.prompt_ids], "n": n, "max_tokens": p.max_tokens,
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
            "stop": list(validate_stop(p.stop)) or None, "ignore_eos": p.ignore_eos,
            "stop_token_ids": None if p.ignore_eos else list(eos_ids),
            "seed": None if p.seed is None else int(p.seed) + index,
            "logprobs": 0, "return_token_ids": True}


def choice_to_rollout(req: Request, choice: dict[str, Any], decode: Callable[[Sequence[int]], str],
                      policy_version: int, stats: RequestStats) -> Rollout:
    """One choice of a ``/v1/completions`` response as a Rollout (ids from ``return_token_ids``)."""
    ids = [int(t) for t in choice.get("token_ids") or []]
    logprobs = [float(lp) for lp in (choice.get("logprobs") or {}).get("token_logprobs") or []]
    return make_rollout(req, ids, logprobs, choice.get("finish_reason"), 0, decode, policy_version, stats)


def make_rollout(req: Request, ids: list[int], logprobs: list[float], finish_reason: str | None, cached: int,
                 decode: Callable[[Sequence[int]], str], policy_version: int, stats: RequestStats) -> Rollout:
    if len(logprobs) != len(ids):
        return _error(req, policy_version, f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
    finish = _FINISH.get(finish_reason or "")
    if finish is None:
        return _error(req, policy_version, f"vLLM finished the request with {finish_reason!r}")
    stop = validate_stop(req.params.stop)
    keep = tokens_to_keep(ids, decode, stop) if stop else None
    if keep is not None:  # vLLM already ends at the stop string; this only guards the invariant
        ids, logprobs, finish = ids[:keep], logprobs[:keep], "stop"
    text, _ = truncate_at_stop(decode(ids), stop)
    stats.prompt_tokens, stats.generated_tokens = len(req.prompt_ids), len(ids)
    stats.cached_prompt_tokens = cached
    return Rollout(req.request_id, list(req.prompt_ids), ids, logprobs, finish, text=text,
                   policy_version=policy_version, stats=stats)


def _error(req: Request, policy_version: int, message: str) -> Rollout:
    return Rollout(req.request_id, list(req.prompt_ids), [], [], "error", policy_version=policy_version,
                   error=message)
