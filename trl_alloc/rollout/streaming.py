"""Event-driven filling over `rollout.events`, second piece of the event-driven rollout issue: DAPO's dynamic
sampling as events. Not wired into the trainer yet.

Whole groups of k rollouts are submitted, prompt after prompt, while the round lacks `target_groups` kept
groups and the budget allows; a group is judged the moment its k-th rollout arrives (kept when mixed); once
the target is reached, every rollout still running is aborted. Budget accounting is exact: a rollout counts
as spent when it is submitted (aborted ones included), so `spent` never exceeds `budget`, and every token
a rollout generated is counted. The order of events is recorded for audit.
"""

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StreamedRound:
    groups: list = field(default_factory=list)        # prompt ids of the kept (mixed) groups, in keeping order
    rejected: list = field(default_factory=list)      # prompt ids whose complete group was not mixed
    surplus: list = field(default_factory=list)       # mixed groups completed after the target was reached
    rollouts: dict = field(default_factory=dict)      # prompt id -> its finished or aborted Rollouts
    spent: int = 0                                    # rollouts submitted (aborted included)
    aborted: int = 0
    tokens: int = 0                                   # every generated token, aborted rollouts' included
    events: list = field(default_factory=list)        # ("submit"|"done"|"abort", prompt id, rollout id), in order


def dynamic_sampling_round(engine, prompts, group_size, target_groups, budget, success, max_tokens,
                           max_inflight=None, timeout=None):
    """Run one round of event-driven dynamic sampling.

    engine: a `rollout.events` backend; prompts: iterable of (prompt id, prompt token ids), the stream;
    success(rollout) -> 1.0, 0.0 or NaN (unscored); max_inflight: most rollouts running at once (default:
    as many as the budget allows). Returns a `StreamedRound`.
    """
    k, out = int(group_size), StreamedRound()
    window = int(budget) if max_inflight is None else max(int(max_inflight), k)
    stream, live, scores = iter(prompts), {}, {}  # live: rollout id -> prompt id

    def refill():
        while len(out.groups) < target_groups and out.spent + k <= budget and len(live) + k <= window:
            nxt = next(stream, None)
            if nxt is None:
                return
            pid, prompt_ids = nxt
            for rid in engine.submit(prompt_ids, n=k, max_tokens=max_tokens, tag=pid):
                live[rid] = pid
                out.events.append(("submit", pid, rid))
            out.spent += k
            out.rollouts[pid], scores[pid] = [], []

    refill()
    while live and len(out.groups) < target_groups:
        for r in engine.next_completed(timeout=timeout):
            pid = live.pop(r.rid)
            out.events.append(("done", pid, r.rid))
            out.tokens += len(r.token_ids)
            out.rollouts[pid].append(r)
            scores[pid].append(float(success(r)))
            if len(scores[pid]) == k:  # the group is complete: judge it now
                s = np.asarray(scores[pid])
                s = s[~np.isnan(s)]
                mixed = s.size >= 2 and 0 < s.sum() < s.size
                if not mixed:
                    out.rejected.append(pid)
                else:
                    (out.groups if len(out.groups) < target_groups else out.surplus).append(pid)
        refill()
    if live:  # the target is reached: the surplus stops using the engine
        for r in engine.abort(list(live)):  # (one that finished meanwhile comes back finished)
            pid = live.pop(r.rid)
            cut = r.finish_reason == "abort"
            out.events.append(("abort" if cut else "done", pid, r.rid))
            out.tokens += len(r.token_ids)
            out.rollouts[pid].append(r)
            out.aborted += int(cut)
    return out
