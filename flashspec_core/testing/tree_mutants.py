"""Planted bugs the tree exactness gate must catch (mutation testing of tree verification).

Verifier-side mutants run :func:`verify_tree_mutant`, a copy of
:func:`flashspec_core.tree.verify_tree_random` with the bug switched in (with no bug it
gives the same tokens from the same noise, which a test checks). Draft-side mutants
change what the drafter reports through the gate's ``report`` argument.
:data:`POWER_CASES` names the case each mutant is gated on: one whose tree and sibling
draws make the bug active.

``zero_probability_accepted`` cannot be caught by sampling (it needs a uniform of
exactly 0, which a float32 draw gives with probability ~2^-24); :func:`zero_uniform_inputs`
builds that case deterministically and
:func:`~flashspec_core.testing.tree_exactness.impossible_emissions` counts the damage.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import Noise, race
from flashspec_core.testing.tree_exactness import TreeCase, TreeReport
from flashspec_core.tree import (
    ROOT,
    TreeDraft,
    TreeVerdict,
    children,
    elder_siblings,
    emit_tree,
    residual,
    verify_tree_greedy,
    without_replacement_rows,
)

TREE_MUTANTS: dict[str, str] = {
    "sibling_residual_not_updated": "after an elder sibling is rejected the next one is tested against the "
    "parent's p, not norm(max(p - q, 0)); only the youngest sibling's rejection updates the residual",
    "with_replacement_verified_without": "siblings drawn i.i.d. (with replacement) are verified as drawn "
    "without replacement (q_i loses the elder siblings' tokens)",
    "deterministic_with_real_q": "a deterministic draft (the draft model's top-w tokens) is verified with "
    "the draft model's probabilities instead of one-hot",
    "zero_probability_accepted": "the accept test is u * q(x) <= p(x), so a node with p(x) = 0 is accepted when u = 0",
    "sampled_children_with_replacement": "a model draft's sampled children (tree_children = \"sample\") are "
    "drawn i.i.d. but report the laws of a draw without replacement (without_replacement_rows)",
    "sampled_children_report_group_q": "a model draft's sampled children are drawn without replacement but "
    "each reports its group's q, not its law given its elder siblings",
    "without_replacement_unnormalised": "without replacement, q_i is q with the elder siblings' tokens "
    "removed but not renormalised",
    "children_tested_with_parent_p": "after a node is accepted, its children (and the bonus) are tested "
    "against p at its parent instead of p at the node",
    "all_rejected_from_p": "when every child of the last accepted node is rejected, the recovered token is "
    "drawn from p at that node instead of the final residual",
}

_IN_VERIFIER = {
    "sibling_residual_not_updated",
    "zero_probability_accepted",
    "without_replacement_unnormalised",
    "children_tested_with_parent_p",
    "all_rejected_from_p",
}

S = SamplingParams
_W3_D2 = (-1, -1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2)
_W2_D2 = (-1, -1, 0, 0, 1, 1)
# The case each mutant is gated on (zero_probability_accepted: see zero_uniform_inputs).
POWER_CASES: dict[str, TreeCase] = {
    "sibling_residual_not_updated": TreeCase("power_iid_w3_d2_v6", 6, _W3_D2, S(1.0)),
    "with_replacement_verified_without": TreeCase(
        "power_iid_w3_d1_v4_peaked", 4, (-1, -1, -1), S(1.0), draft_scale=2.0
    ),
    "deterministic_with_real_q": TreeCase("power_det_w2_d2_v6", 6, _W2_D2, S(1.0), mode="deterministic"),
    "sampled_children_with_replacement": TreeCase(
        "power_iid_w3_d1_v4_peaked", 4, (-1, -1, -1), S(1.0), draft_scale=2.0
    ),
    "sampled_children_report_group_q": TreeCase(
        "power_sample_w3_d1_v4_peaked", 4, (-1, -1, -1), S(1.0), mode="sample", draft_scale=2.0
    ),
    "without_replacement_unnormalised": TreeCase("power_without_w3_d2_v5", 5, _W3_D2, S(1.0), mode="without"),
    "children_tested_with_parent_p": TreeCase("power_iid_w2_d2_v5", 5, _W2_D2, S(1.0)),
    "all_rejected_from_p": TreeCase("power_iid_w2_d2_v5", 5, _W2_D2, S(1.0)),
}


def _sibling_q(draft: TreeDraft, node: int, elder: Sequence[int], vocab: int, normalise: bool) -> torch.Tensor:
    """:func:`flashspec_core.tree.sibling_q`, optionally without the renormalisation."""
    if draft.q is None:
        return torch.nn.functional.one_hot(draft.tokens[:, node], vocab).float()
    q = draft.q[:, node].float()
    if not draft.without_replacement or not elder:
        return q
    q = q.scatter(1, draft.tokens[:, list(elder)], 0.0)
    return q / q.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) if normalise else q


def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.gather(1, index[:, None]).squeeze(1)


def verify_tree_mutant(p: torch.Tensor, draft: TreeDraft, noise: Noise, bug: str | None = None) -> TreeVerdict:
    """:func:`flashspec_core.tree.verify_tree_random` with the verifier-side ``bug`` planted."""
    batch, vocab = p.shape[0], p.shape[2]
    p = p.float()
    plist = draft.parents.tolist()
    depths, elder = draft.depths, elder_siblings(plist)
    youngest = {kids[-1] for kids in (children(plist, a) for a in [ROOT, *range(len(plist))]) if kids}
    cur = torch.full((batch,), ROOT, dtype=torch.int64)
    p_cur = p[:, 0]
    path = torch.full((batch, max(depths, default=0)), -1, dtype=torch.int64)
    for node, parent in enumerate(plist):
        x = draft.tokens[:, node]
        q_i = _sibling_q(draft, node, elder[node], vocab, bug != "without_replacement_unnormalised")
        u_q, p_x = noise.uniform[:, node] * _gather(q_i, x), _gather(p_cur, x)
        passed = u_q <= p_x if bug == "zero_probability_accepted" else u_q < p_x
        live = cur == parent
        accept, reject = live & passed, live & ~passed
        if bug != "sibling_residual_not_updated" or node in youngest:
            p_cur = torch.where(reject[:, None], residual(p_cur, q_i), p_cur)
        at = parent + 1 if bug == "children_tested_with_parent_p" else node + 1
        p_cur = torch.where(accept[:, None], p[:, at], p_cur)
        cur = torch.where(accept, node, cur)
        path[:, depths[node] - 1] = torch.where(accept, node, path[:, depths[node] - 1])
    if bug == "all_rejected_from_p":  # at a leaf this is the bonus's p anyway
        p_cur = p[torch.arange(batch), cur + 1]
    return emit_tree(draft.tokens, path, race(p_cur, noise.exponential))


@attrs.frozen
class TreeMutant:
    """A tree verifier with one planted bug, in the gate's calling convention."""

    bug: str | None

    def __call__(self, p: torch.Tensor, draft: TreeDraft, generator: torch.Generator, greedy: bool) -> TreeVerdict:
        if greedy:
            return verify_tree_greedy(p, draft)
        noise = Noise.draw(p.shape[0], draft.num_nodes, p.shape[2], generator, p.device)
        return verify_tree_mutant(p, draft, noise, self.bug if self.bug in _IN_VERIFIER else None)


def report_draft(bug: str | None) -> TreeReport | None:
    """For draft-side mutants: what the drafter reports, given its draft and true q rows."""
    if bug == "with_replacement_verified_without":
        return lambda draft, q: attrs.evolve(draft, without_replacement=True)
    if bug in ("deterministic_with_real_q", "sampled_children_report_group_q"):
        return lambda draft, q: attrs.evolve(draft, q=q)
    if bug == "sampled_children_with_replacement":
        return _rows_without_replacement
    return None


def _rows_without_replacement(draft: TreeDraft, q: torch.Tensor) -> TreeDraft:
    """Each sibling group's laws as :func:`~flashspec_core.tree.sample_children` reports them,
    whatever way its tokens were drawn. q: [B, N, V] each node's group distribution."""
    plist = draft.parents.tolist()
    rows = q.clone()
    for parent in [ROOT, *range(len(plist))]:
        kids = list(children(plist, parent))
        if kids:
            rows[:, kids] = without_replacement_rows(q[:, kids[0]], draft.tokens[:, kids])
    return attrs.evolve(draft, q=rows)


def tree_mutant(bug: str | None) -> tuple[TreeMutant, TreeReport | None]:
    """The verifier and the draft-report override that together plant ``bug`` (None: no bug)."""
    if bug is not None and bug not in TREE_MUTANTS:
        raise KeyError(f"unknown tree mutant {bug!r}; known: {', '.join(TREE_MUTANTS)}")
    return TreeMutant(bug), report_draft(bug)


def zero_uniform_inputs(batch: int = 64, vocab: int = 6) -> tuple[torch.Tensor, TreeDraft, Noise]:
    """A case where every drafted token has target probability 0 and every uniform is exactly 0.

    Deterministic drafts (``q = None``) on a width-2, depth-2 tree; p is random but
    zero at each node's token (at its parent's position), so a correct verifier rejects
    every node and emits from the root's residual, while ``u * q <= p`` accepts them all.
    """
    g = torch.Generator().manual_seed(0)
    parents = torch.tensor(_W2_D2, dtype=torch.int64)
    tokens = torch.randint(0, vocab, (batch, len(_W2_D2)), generator=g)
    p = torch.rand((batch, len(_W2_D2) + 1, vocab), generator=g)
    for node, parent in enumerate(_W2_D2):
        p[torch.arange(batch), parent + 1, tokens[:, node]] = 0.0
    p = p / p.sum(-1, keepdim=True)
    noise = Noise(torch.zeros((batch, len(_W2_D2))), torch.empty((batch, vocab)).exponential_(generator=g))
    return p, TreeDraft(tokens, parents), noise
