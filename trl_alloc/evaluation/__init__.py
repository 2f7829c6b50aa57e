"""Held-out evaluation: avg@k, pass@k, maj@k and quality-head-weighted maj@k.

For every prompt, ``n`` completions are sampled (transformers ``generate`` or a vLLM server) and
scored with the task's reward. With ``c`` of the ``n`` samples correct (reward >= ``threshold``):

* **avg@k** -- expected mean reward of k samples. Its unbiased estimate does not depend on k: the
  mean reward over all n samples.
* **pass@k** -- probability that at least one of k samples is correct, by the unbiased estimator
  ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021), computed as a stable product.
* **maj@k** -- the final answers of k samples are extracted and grouped (equal answers form one
  group), the group with the most votes wins, and the prompt counts as solved when the winning
  group is correct. Ties go to the larger plain count, then to the answer seen first
  (``arrol.weighted_majority_vote``). Samples without an extractable answer do not vote; a block
  in which nobody votes scores 0. With n > k the n samples are cut into ``n // k`` disjoint
  blocks of k (in sampling order) and the blocks' outcomes are averaged (leftover samples are not
  used by maj@k).
* **head-maj@k** -- the same vote, each candidate weighted by ``arrol.rank_weights`` of its
  quality-head score within its block (the best-scored candidate weighs 1, the worst 0).

Answer extraction (``AnswerSpec``): arithmetic -- the first integer (``rewards.extract_int``);
countdown -- the expression (``rewards.extract_countdown_expression``, spaces removed); math --
``math_verify.parse``, grouped by ``math_verify.verify`` against each group's first member. A
winning group is correct when its first member (in the block) is correct.

``score_fn(prompts, completions, **kwargs) -> scores`` plugs in any per-candidate scorer; when it
accepts them, kwargs carry ``prompt_ids`` and ``completion_ids`` (token ids). ``head_score_fn``
builds one from a saved ``trl_alloc.rollout.quality_head.QualityHead``.
"""

from .backends import (Samples, TransformersBackend, VLLMEngineBackend, VLLMServerBackend, generate_samples,
                       tokenize_prompts)
from .core import EvalResult, evaluate, head_score_fn, markdown_table, regrade, score_samples, write_outputs
from .metrics import AnswerSpec, answer_spec, answer_type, compute_metrics, group_answers, maj_at_k, pass_at_k, vote

__all__ = [
    "AnswerSpec", "answer_spec", "answer_type", "pass_at_k", "group_answers", "vote", "maj_at_k", "compute_metrics",
    "Samples", "TransformersBackend", "VLLMEngineBackend", "VLLMServerBackend", "generate_samples", "tokenize_prompts",
    "score_samples", "evaluate", "EvalResult", "markdown_table", "write_outputs", "head_score_fn", "regrade",
]
