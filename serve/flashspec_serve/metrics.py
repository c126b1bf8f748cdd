"""Prometheus metrics, named as vLLM names its own (``vllm:`` -> ``flashspec:``).

Each app has its own :class:`prometheus_client.CollectorRegistry`, so several servers (the
tests start many) never share counters. Counters are exposed with prometheus_client's
``_total`` suffix, as vLLM's are. Speculative counters follow vLLM's definitions: one
*draft* is one row's proposal in one step, so a step that drafts for 8 rows counts 8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.num_drafts = Counter("flashspec:spec_decode_num_drafts", "Row proposals verified", registry=r)
        self.num_draft_tokens = Counter("flashspec:spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.num_accepted_tokens = Counter("flashspec:spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                           registry=r)
        self.accepted_per_pos = Counter("flashspec:spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position (0 = first)", ["position"],
                                        registry=r)
        self.arm_selections = Counter("flashspec:spec_decode_arm_selections", "Steps played by each arm", ["arm"],
                                      registry=r)
        # Per arm, what its steps cost and brought: an operator reads each arm's tokens per second of
        # step (emitted / seconds) and per row (emitted / row_steps) against the selector's choices.
        self.arm_seconds = Counter("flashspec:arm_step_seconds", "Wall time of the steps each arm played", ["arm"],
                                   registry=r)
        self.arm_row_steps = Counter("flashspec:arm_row_steps", "Live rows summed over the steps each arm played",
                                     ["arm"], registry=r)
        self.arm_emitted = Counter("flashspec:arm_emitted_tokens",
                                   "Tokens emitted by the steps each arm played (accepted drafts and one per row)",
                                   ["arm"], registry=r)
        self.running = Gauge("flashspec:num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge("flashspec:num_requests_waiting", "Requests waiting to join the batch", registry=r)
        self.prompt_tokens = Counter("flashspec:prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("flashspec:generation_tokens", "Tokens generated", registry=r)
        self.rebuilds = Counter("flashspec:batch_rebuilds", "Batch rebuilds (every live row re-prefilled)",
                                registry=r)
        self.row_prefills = Counter("flashspec:batch_row_prefills",
                                    "Rows that joined the running batch prefilled alone, in a free slot", registry=r)
        self.rebuild_tokens = Counter("flashspec:batch_rebuild_prefill_tokens",
                                      "Tokens prefilled to start rows: every live row's at a rebuild, "
                                      "the joining row's alone at a per-row prefill", registry=r)
        self.prefill_seconds = Counter("flashspec:batch_prefill_seconds",
                                       "Wall time the decode loop spent starting rows between steps (per-row "
                                       "prefills and rebuilds, the wait for the device included)", registry=r)
        self.captures_while_serving = Counter("flashspec:graph_captures_while_serving",
                                              "CUDA graphs captured after the warm-up, each a stall inside a request, "
                                              "by graph cache (the log line graph_captured_while_serving names the key)",
                                              ["cache"], registry=r)
        self.rejected = Counter("flashspec:requests_rejected", "Requests refused with 429 (queue full)", registry=r)
        self.ttft = Histogram("flashspec:time_to_first_token_seconds", "Arrival to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("flashspec:inter_token_latency_seconds",
                             "Time between deliveries of tokens to a request (a step may deliver several)",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.step_time = Histogram("flashspec:step_time_seconds", "Wall time of one decode step",
                                   buckets=_LATENCY_BUCKETS, registry=r)
        self._arms: dict[str, tuple[Any, ...]] = {}  # arm name -> its children of the per-arm counters
        self._positions: list[Any] = []  # draft position -> its accepted_per_pos child

    def step(self, arm: str, width: int, accepted: Sequence[int], step_s: float) -> None:
        """One decode step: ``accepted`` holds the accepted draft tokens of each live row."""
        # A labelled child is looked up once: labels() takes a lock and builds a key each call.
        children = self._arms.get(arm)
        if children is None:
            children = self._arms[arm] = tuple(c.labels(arm=arm) for c in (
                self.arm_selections, self.arm_seconds, self.arm_row_steps, self.arm_emitted))
        steps, seconds, row_steps, emitted = children
        rows, got = len(accepted), sum(accepted)
        steps.inc()
        seconds.inc(step_s)
        row_steps.inc(rows)
        emitted.inc(got + rows)
        self.step_time.observe(step_s)
        if width == 0:
            return
        self.num_drafts.inc(rows)
        self.num_draft_tokens.inc(width * rows)
        self.num_accepted_tokens.inc(got)
        for pos in range(max(accepted, default=0)):
            while len(self._positions) <= pos:
                self._positions.append(self.accepted_per_pos.labels(position=str(len(self._positions))))
            self._positions[pos].inc(sum(n > pos for n in accepted))

    def render(self) -> bytes:
        return generate_latest(self.registry)
