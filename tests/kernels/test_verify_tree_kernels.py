"""Triton tree verification (flashspec_kernels.verify_tree) against the plain-torch reference
(flashspec_core.tree), and the ``triton`` verifier's VerifiesTrees capability.

Exact mode must emit the reference's tokens, path and accepted counts given the same
noise, over many random trees (widths, depths and ragged shapes drawn at random), every
way a sibling group is drawn, and odd vocabularies spanning several blocks. Without a GPU
the kernels run in Triton's interpreter (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from flashspec_core.config import MAX_GAMMA  # noqa: E402
from flashspec_core.contracts import Broken, LimitsTreeNodes, SamplingParams, VerifiesTrees  # noqa: E402
from flashspec_core.sampling import Noise  # noqa: E402
from flashspec_core.tree import TreeVerdict, chain_parents, grow_tree, node_depths  # noqa: E402
from flashspec_kernels import verify as ops  # noqa: E402
from flashspec_kernels import verify_tree as tree_ops  # noqa: E402
from flashspec_triton.plugin import TritonVerifier, TritonVerifierConfig  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S = SamplingParams
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
MODES = ("iid", "deterministic", "without", "mixed")


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 256 logits (64 in the walk): V=1271 spans several blocks and slices."""
    monkeypatch.setattr(ops, "PASS_CONFIG", {2: (256, 4), 4: (256, 4)})
    monkeypatch.setattr(ops, "ARGMAX_CONFIG", {2: (256, 4), 4: (256, 4)})
    monkeypatch.setattr(ops, "RACE_BLOCK_V", 256)


def random_parents(nodes: int, g: torch.Generator) -> tuple[int, ...]:
    """A random tree shape in topological order: each node's parent is the root or an earlier node."""
    return tuple(int(torch.randint(-1, n, (1,), generator=g)) if n else -1 for n in range(nodes))


def dynamic_parents(depth: int, expand: int, nodes: int, seed: int) -> tuple[int, ...]:
    """The shape of a dynamic tree (grow_tree, as a ``tree_depth``/``tree_expand`` arm grows it)
    over a confident draft's random log-probabilities (its best paths reach the last level)."""
    g = torch.Generator().manual_seed(seed)

    def logp(k: int) -> torch.Tensor:  # [1, k, 40]
        return torch.log_softmax(torch.randn((1, k, 40), generator=g) * 4, dim=-1)

    grown = grow_tree(logp(1)[:, 0], lambda feed: logp(feed.tokens.shape[1]), expand, depth, nodes)
    return tuple(grown.parents.tolist())


def tree_inputs(b: int, parents: tuple[int, ...], v: int, mode: str, seed: int, dtype: torch.dtype = torch.float32):
    """Logits, node tokens (half the target's argmax at the parent, half drawn from q, so both
    accepts and rejects happen), q with exact zeros (one-hot rows in "mixed"), and noise."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = len(parents)
    logits = torch.randn((b, n + 1, v), generator=g, device=DEV) * 3
    at_parent = logits[:, torch.tensor(parents, dtype=torch.long, device=DEV) + 1] if n else logits[:, :0]
    q = torch.softmax(at_parent + torch.randn((b, n, v), generator=g, device=DEV), dim=-1)
    q = torch.where(torch.rand(q.shape, generator=g, device=DEV) < 0.2, 0.0, q)
    q = (q + 1e-9) / (q + 1e-9).sum(-1, keepdim=True)
    drawn = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, n)
    best = torch.argmax(at_parent, dim=-1)
    tokens = torch.where(torch.rand((b, n), generator=g, device=DEV) < 0.5, best, drawn)
    if mode == "mixed":
        one_hot = torch.nn.functional.one_hot(tokens, v).float()
        q = torch.where(torch.rand((b, n, 1), generator=g, device=DEV) < 0.5, one_hot, q)
    probs = None if mode == "deterministic" else q
    noise = Noise.draw(b, n, v, g, DEV)
    return logits.to(dtype), tokens, probs, noise


def assert_same(got: TreeVerdict, want: TreeVerdict) -> None:
    assert torch.equal(got.num_accepted, want.num_accepted), (got.num_accepted, want.num_accepted)
    assert torch.equal(got.path, want.path), (got.path, want.path)
    assert torch.equal(got.tokens, want.tokens), (got.tokens, want.tokens)


def check_exact(logits, tokens, parents, probs, sampling, noise, mode: str, **kw) -> TreeVerdict:
    without = mode == "without"
    got = tree_ops.verify_tree_triton(logits, tokens, parents, probs, sampling, noise=noise,
                                      without_replacement=without, **kw)  # fmt: skip
    assert_same(got, tree_ops.verify_tree_ref(logits, tokens, parents, probs, sampling, noise, without))
    return got


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("b", "v"), [(1, 1271), (3, 37), (4, 3001), (2, 8)])
def test_exact_matches_reference_random_trees(small_blocks, mode: str, b: int, v: int) -> None:
    g = torch.Generator().manual_seed(b * 1000 + v)
    settings = [S(1.0), S(0.7, top_k=5), S(1.3, top_p=0.9)]
    accepted = rejected = 0
    for trial in range(6):
        parents = random_parents(int(torch.randint(1, 13, (1,), generator=g)), g)
        logits, tokens, probs, noise = tree_inputs(b, parents, v, mode, seed=trial)
        got = check_exact(logits, tokens, parents, probs, settings[trial % 3], noise, mode)
        accepted += int(got.num_accepted.sum())
        rejected += int((got.num_accepted < max(node_depths(parents))).sum())
    assert accepted > 0 and rejected > 0  # both branches of the walk ran


@pytest.mark.parametrize("mode", MODES)
def test_exact_matches_reference_bf16_and_wide_trees(small_blocks, mode: str) -> None:
    parents = (-1, -1, -1, -1, 0, 0, 0, 1, 1, 2, 4, 4, 4, 7, 10, 10)  # width 4 at the root, depth 4
    logits, tokens, probs, noise = tree_inputs(3, parents, 1271, mode, seed=5, dtype=torch.bfloat16)
    check_exact(logits, tokens, parents, probs, S(0.9), noise, mode)


# Trees past the 32 nodes the kernels once took: the d6-k6-n63 benchmark arm's dynamic shape, a
# random ragged tree and a chain of the most nodes (depth 64), and a fan of 64 children of the root.
BIG_TREES = {
    "dynamic-d6-k6-n63": dynamic_parents(6, 6, 63, seed=0),
    "random-64": random_parents(64, torch.Generator().manual_seed(64)),
    "chain-64": tuple(range(-1, 63)),
    "fan-64": (-1,) * 64,
}


def test_the_node_limit_takes_every_tree_a_config_allows() -> None:
    assert tree_ops.MAX_NODES >= MAX_GAMMA  # an arm's gamma bounds its trees' nodes
    assert max(map(len, BIG_TREES.values())) == tree_ops.MAX_NODES == 64
    assert max(node_depths(BIG_TREES["dynamic-d6-k6-n63"])) == 6


@pytest.mark.parametrize(
    ("tree", "mode"),
    [*(("dynamic-d6-k6-n63", m) for m in MODES), ("random-64", "without"), ("random-64", "iid"),
     ("chain-64", "deterministic"), ("fan-64", "mixed")],
)
def test_exact_matches_reference_up_to_the_node_limit(small_blocks, tree: str, mode: str) -> None:
    """Exact and greedy mode give the reference's verdict on trees of 63 and 64 nodes (not every
    mode on every tree: a 64-wide fan without replacement alone takes 16 s in the interpreter)."""
    parents = BIG_TREES[tree]
    logits, tokens, probs, noise = tree_inputs(2, parents, 300, mode, seed=len(parents))
    check_exact(logits, tokens, parents, probs, S(0.8), noise, mode)
    check_exact(logits, tokens, parents, probs, S(0.0), None, mode)


def test_plugin_verifies_a_dynamic_tree_of_63_nodes(small_blocks) -> None:
    """The verifier's own path (the one the d6-k6-n63 arm took): exact mode gives the reference
    verifier's verdict, philox mode runs and is deterministic given the generator."""
    from flashspec_reference.plugin import ReferenceVerifier

    parents = torch.tensor(BIG_TREES["dynamic-d6-k6-n63"], dtype=torch.int64)
    logits, tokens, _, noise = tree_inputs(2, tuple(parents.tolist()), 300, "deterministic", seed=63)
    exact, philox = TritonVerifier(TritonVerifierConfig(noise="exact"), DEV), TritonVerifier(TritonVerifierConfig(), DEV)
    assert isinstance(philox, LimitsTreeNodes) and philox.max_tree_nodes == tree_ops.MAX_NODES
    for sampling in (S(0.9), S(0.0)):
        given = None if sampling.greedy else noise
        assert_same(exact.verify_tree_with_noise(logits, tokens, parents, None, sampling, given),
                    ReferenceVerifier().verify_tree_with_noise(logits, tokens, parents, None, sampling, given))
    runs = [philox.verify_tree(logits, tokens, parents, None, S(0.9), torch.Generator(device=DEV).manual_seed(7))
            for _ in range(2)]  # fmt: skip
    assert_same(runs[0], runs[1])


def test_philox_accept_uniforms_are_distinct_across_rows_of_the_largest_tree() -> None:
    """Every (row, node) of a tree of ``MAX_NODES`` nodes draws its own accept uniform. The root's
    ``MAX_NODES`` children are distinct one-hot tokens of ``p = 1/128`` each, so a row accepts its
    first child ``I`` in ``0..N-1`` with probability 1/128 each (and none with 1/2), independently
    of the next row. Were row ``b``'s node ``s + k`` to share row ``b + 1``'s node ``k``'s uniform
    (rows ``s < N`` offsets apart), ``I_b = I_{b+1} + s`` would follow nearly whenever row
    ``b + 1`` accepts: ~160 pairs at ``s = 32`` instead of ~2."""
    rows, n, v = 1024, tree_ops.MAX_NODES, 256
    probs = torch.cat([torch.full((n,), 1 / 128), torch.full((v - n,), 0.5 / (v - n))])
    logits = torch.log(probs).expand(rows, n + 1, v).contiguous().to(DEV)
    tokens = torch.arange(n, device=DEV).expand(rows, n).contiguous()
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(8), DEV)
    out = tree_ops.verify_tree_triton(logits, tokens, (-1,) * n, None, S(1.0), state=state)
    first = torch.where(out.num_accepted > 0, out.path[:, 0], n).cpu()  # [B] the accepted child, n for none
    took = first[1:] < n
    lags = (first[:-1] - first[1:])[took & (first[:-1] > first[1:])]
    counts = torch.bincount(lags, minlength=n)
    assert 0.003 < float((first < n).double().mean()) / n < 0.013  # 1/128 per child
    assert int(counts.max()) < 20, counts  # independence: at most ~4 expected at any lag


def test_without_replacement_with_repeated_and_zero_mass_siblings(small_blocks) -> None:
    """Elder siblings sharing a token, and a node whose row is all on its elder siblings'
    tokens (its q_i is all zero, so it is accepted iff p_cur(x) > 0)."""
    parents = (-1, -1, -1, 0, 0)
    logits, tokens, probs, noise = tree_inputs(3, parents, 300, "without", seed=6)
    tokens[:, 1] = tokens[:, 0]
    probs = probs.clone()
    probs[:, 2] = 0.0
    probs[:, 2].scatter_(1, tokens[:, :2], 0.5)
    check_exact(logits, tokens, parents, probs, S(1.0), noise, "without")


def test_minus_inf_logits_and_zero_residual(small_blocks) -> None:
    """Whole blocks of -inf, a drafted token with p = 0 (never accepted, even at u = 0), and
    a deterministic sibling on a one-hot p whose rejection leaves an all-zero residual."""
    parents = (-1, -1, 0, 0, 1)
    logits, tokens, probs, noise = tree_inputs(4, parents, 1271, "deterministic", seed=7)
    logits[:, :, 256:768] = float("-inf")
    logits[0, 0, tokens[0, 0]] = float("-inf")
    noise = Noise(noise.uniform.clone(), noise.exponential)
    noise.uniform[0, 0] = 0.0
    logits[1, 0] = -1e4
    logits[1, 0, tokens[1, 0]] = 1e4  # p one-hot on node 0's token
    noise.uniform[1, 0] = 0.999999  # ... which is still rejected: p - one-hot = 0 everywhere
    got = check_exact(logits, tokens, parents, probs, S(1.0), noise, "deterministic")
    assert got.path[0, 0] != 0


@pytest.mark.parametrize("mode", ["iid", "deterministic"])
def test_width_one_tree_is_the_chain(small_blocks, mode: str) -> None:
    logits, tokens, probs, noise = tree_inputs(3, (-1, 0, 1, 2), 1271, mode, seed=8)
    got = tree_ops.verify_tree_triton(logits, tokens, chain_parents(4), probs, S(0.8), noise=noise)
    want = ops.verify_triton(logits, tokens, probs, S(0.8), noise=noise)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)


@pytest.mark.parametrize("mode", ["iid", "deterministic"])
def test_greedy_matches_reference_with_ties(small_blocks, mode: str) -> None:
    b, v = 5, 1271
    g = torch.Generator(device=DEV).manual_seed(9)
    parents = (-1, -1, 0, 0, 1, 2, 2, 3)
    logits = torch.randint(0, 4, (b, len(parents) + 1, v), generator=g, device=DEV).float()  # tied maxima
    logits[1, :, 300:] = float("-inf")
    best = torch.argmax(logits, dim=-1)[:, torch.tensor(parents) + 1]
    tokens = torch.where(torch.rand(best.shape, generator=g, device=DEV) < 0.7, best, 3)
    tokens[:, 1] = tokens[:, 0]  # a younger sibling with the eldest's token: its subtree is not searched
    probs = None if mode == "deterministic" else torch.softmax(logits[:, 1:], dim=-1)
    for sampling in (S(0.0), S(0.0, top_p=0.3), S(0.0, top_k=2)):
        check_exact(logits, tokens, parents, probs, sampling, None, mode)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_empty_tree_is_a_plain_sample(temperature: float) -> None:
    logits, tokens, _, noise = tree_inputs(3, (), 300, "iid", seed=10)
    got = check_exact(logits, tokens, (), None, S(temperature), noise, "iid")
    assert got.tokens.shape == (3, 1) and got.path.shape == (3, 0) and got.num_accepted.tolist() == [0, 0, 0]


@pytest.mark.parametrize("rows", [1, 2, 64])
def test_rows_per_program(small_blocks, monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Every ROWS (B = 3: the last tile partly empty) and the GPU's launch shapes give the
    reference's tokens; philox's stream does not depend on ROWS."""
    parents = (-1, -1, 0, 1, 1, 3)
    logits, tokens, probs, noise = tree_inputs(3, parents, 1271, "iid", seed=11)
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(1), DEV)
    want = tree_ops.verify_tree_triton(logits, tokens, parents, probs, S(1.0), state=state.clone())
    monkeypatch.setattr(ops, "_rows_per_program", lambda device, n, width: rows)
    if rows == 1:
        monkeypatch.setattr(ops, "_interpreting", lambda device: False)
    for mode in MODES:
        logits, tokens, probs, noise = tree_inputs(3, parents, 1271, mode, seed=12)
        check_exact(logits, tokens, parents, probs, S(0.9, top_k=40), noise, mode)
        check_exact(logits, tokens, parents, probs, S(0.0), None, mode)
    logits, tokens, probs, noise = tree_inputs(3, parents, 1271, "iid", seed=11)
    assert_same(tree_ops.verify_tree_triton(logits, tokens, parents, probs, S(1.0), state=state.clone()), want)


def test_philox_state_advances_and_replays(small_blocks) -> None:
    parents = (-1, -1, 0, 0)
    logits, tokens, probs, _ = tree_inputs(64, parents, 300, "iid", seed=13)
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(2), DEV)
    start = state.clone()
    first = tree_ops.verify_tree_triton(logits, tokens, parents, probs, S(1.0), state=state)
    assert state[0] == start[0] and state[1] == start[1] + 1
    again = tree_ops.verify_tree_triton(logits, tokens, parents, probs, S(1.0), state=start.clone())
    assert_same(again, first)
    second = tree_ops.verify_tree_triton(logits, tokens, parents, probs, S(1.0), state=state)
    assert not torch.equal(second.tokens, first.tokens)


def test_philox_root_token_follows_p() -> None:
    """Drafts with p = 0 are always rejected, so the first token is drawn from p at the
    root less the one-hot drafts: a chi-square check of philox's race and accept stream."""
    rows, v = 20_000, 6
    probs = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1, 0.0])
    logits = torch.log(probs).expand(rows, 3, v).contiguous().to(DEV)
    tokens = torch.full((rows, 2), 5, dtype=torch.int64, device=DEV)
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(3), DEV)
    out = tree_ops.verify_tree_triton(logits, tokens, (-1, -1), None, S(1.0), state=state)
    assert int(out.num_accepted.sum()) == 0
    counts = torch.bincount(out.tokens[:, 0].cpu(), minlength=v).double()
    expected = probs.double() * rows
    stat = float(((counts[:5] - expected[:5]) ** 2 / expected[:5]).sum())
    assert counts[5] == 0 and stat < 25.0, (counts, stat)  # chi-square, 4 dof: p ~ 5e-5


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("mode", ["iid", "deterministic", "without"])
def test_out_of_range_ids_are_masked_and_flagged(small_blocks, b: int, mode: str) -> None:
    """Ids -1 and V + 3 (V = 8) are never gathered: such a node is never accepted, even at
    u = 0, its row's flag is set, and otherwise the verdict is the reference's for the same
    tree with the clamped ids given probability 0."""
    v, parents = 8, (-1, -1, 0, 0, 1)
    logits, tokens, probs, noise = tree_inputs(b, parents, v, mode, seed=14 + b)
    logits[:, :, 0] = logits[:, :, v - 1] = float("-inf")
    if probs is not None:  # nor may q give the clamped ids mass: an invalid elder removes nothing
        probs = probs.clone()
        probs[:, :, 0] = probs[:, :, v - 1] = 0.0
        probs = probs / probs.sum(-1, keepdim=True)
    noise = Noise(torch.zeros_like(noise.uniform), noise.exponential)
    bad = tokens.clone()
    bad[0, 0], bad[-1, 3] = -1, v + 3
    out = torch.full((b,), 7, dtype=torch.int32, device=DEV)
    sampling = S(1.0)
    got = tree_ops.verify_tree_triton(logits, bad, parents, probs, sampling, noise=noise,
                                      without_replacement=mode == "without", flags=out)  # fmt: skip
    clamped = bad.clamp(0, v - 1)
    assert_same(got, tree_ops.verify_tree_ref(logits, clamped, parents, probs, sampling, noise, mode == "without"))
    flags = torch.zeros(b, dtype=torch.int32)
    flags[0] = flags[-1] = int(Broken.DRAFT_TOKENS)
    assert got.flags is out and out.cpu().tolist() == flags.tolist()
    greedy = tree_ops.verify_tree_triton(logits, bad, parents, probs, S(0.0), flags=out)
    assert_same(greedy, tree_ops.verify_tree_ref(logits, bad, parents, probs, S(0.0)))
    assert out.cpu().tolist() == flags.tolist()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf - inf
@pytest.mark.parametrize("case", ["nan", "inf", "all-neg-inf"])
def test_broken_logits_are_flagged(small_blocks, case: str) -> None:
    """NaN, +inf or an all -inf position flags its row alone (TARGET_LOGITS), in both noise
    modes and greedy, wherever the position is: the root, a node on the path or off it (a
    rejected branch, read by nobody); -inf logits elsewhere (the other rows) flag nothing."""
    parents = (-1, -1, 0, 1, 1)
    logits, tokens, probs, noise = tree_inputs(4, parents, 600, "iid", seed=17)
    logits[:, :, 100:300] = float("-inf")
    for position, row in ((0, 1), (3, 2), (5, 3)):
        broken = logits.clone()
        if case == "nan":
            broken[row, position, 500] = float("nan")
        elif case == "inf":
            broken[row, position, 5] = float("inf")
        else:
            broken[row, position] = float("-inf")
        state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(5), DEV)
        for sampling, kw in ((S(1.0), {"noise": noise}), (S(0.7), {"state": state}), (S(0.0), {})):
            got = tree_ops.verify_tree_triton(broken, tokens, parents, probs, sampling, **kw)
            want = [int(Broken.TARGET_LOGITS) if b == row else 0 for b in range(4)]
            assert got.flags is not None and got.flags.cpu().tolist() == want, (case, position, sampling, got.flags)


def test_bad_inputs_name_the_argument() -> None:
    logits, tokens, probs, noise = tree_inputs(2, (-1, 0), 64, "iid", seed=15)
    run = tree_ops.verify_tree_triton
    with pytest.raises(ValueError, match=r"draft_tokens must be \[B, N\] int64, got \(2, 2\) torch.int32"):
        run(logits, tokens.int(), (-1, 0), None, S(0.0))
    with pytest.raises(ValueError, match=r"parents has 3 nodes, draft_tokens \(2, 2\)"):
        run(logits, tokens, (-1, 0, 1), None, S(0.0))
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        run(logits, tokens, (-1, 1), None, S(0.0))
    with pytest.raises(ValueError, match=r"target_logits must be \[B, N \+ 1, V\] .* got \(2, 2, 64\)"):
        run(logits[:, :2], tokens, (-1, 0), None, S(0.0))
    with pytest.raises(ValueError, match=r"draft_probs must be \[B, N, V\] .* got \(2, 2, 63\)"):
        run(logits, tokens, (-1, 0), probs[..., :63], S(0.0))
    with pytest.raises(ValueError, match=r"noise must be uniform \[B, N\] = \(2, 2\)"):
        run(logits, tokens, (-1, 0), probs, S(1.0), noise=Noise(noise.uniform[:, :1], noise.exponential))
    with pytest.raises(ValueError, match=r"flags must be \[B\] int32 with B = 2, got \(3,\) torch.int64"):
        run(logits, tokens, (-1, 0), probs, S(1.0), noise=noise, flags=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="exactly one of noise"):
        run(logits, tokens, (-1, 0), probs, S(1.0))
    with pytest.raises(ValueError, match="without_replacement needs draft_probs"):
        run(logits, tokens, (-1, 0), None, S(1.0), noise=noise, without_replacement=True)
    with pytest.raises(ValueError, match=r"parents must be a \[N\] CPU tensor"):
        run(logits, tokens, torch.tensor([[-1, 0]]), None, S(0.0))
    big = tree_ops.MAX_NODES + 1
    logits, tokens, _, _ = tree_inputs(2, (-1,) * big, 64, "iid", seed=15)
    with pytest.raises(ValueError, match=rf"a tree has at most {tree_ops.MAX_NODES} nodes, .* has {big}"):
        run(logits, tokens, (-1,) * big, None, S(0.0))


def test_plugin_verifies_trees(small_blocks) -> None:
    from flashspec_reference.plugin import ReferenceVerifier

    exact = TritonVerifier(TritonVerifierConfig(noise="exact"), DEV)
    philox = TritonVerifier(TritonVerifierConfig(), DEV)
    assert isinstance(exact, VerifiesTrees) and isinstance(philox, VerifiesTrees)
    parents = torch.tensor([-1, -1, 0, 1, 1], dtype=torch.int64)
    logits, tokens, probs, noise = tree_inputs(3, tuple(parents.tolist()), 1271, "iid", seed=16)
    ref = ReferenceVerifier()
    for q in (probs, None):
        for sampling in (S(1.0), S(0.0), S(0.8, top_p=0.9)):
            given = None if sampling.greedy else noise
            assert_same(exact.verify_tree_with_noise(logits, tokens, parents, q, sampling, given),
                        ref.verify_tree_with_noise(logits, tokens, parents, q, sampling, given))  # fmt: skip
            gens = [torch.Generator(device=DEV).manual_seed(4) for _ in range(2)]
            assert_same(exact.verify_tree(logits, tokens, parents, q, sampling, gens[0]),
                        ref.verify_tree(logits, tokens, parents, q, sampling, gens[1]))  # fmt: skip
    runs = [philox.verify_tree(logits, tokens, parents, probs, S(1.0), torch.Generator(device=DEV).manual_seed(6))
            for _ in range(2)]  # fmt: skip
    assert_same(runs[0], runs[1])
    assert runs[0].flags is not None and runs[0].flags.tolist() == [0, 0, 0]
    assert runs[0].as_verdict().flags is runs[0].flags  # what the pipeline reads
    bad_q, bad_ids = probs.clone(), tokens.clone()
    bad_q[1, 2] *= 1.5  # not a distribution
    bad_ids[2, 4] = 1271
    for verify in (exact, philox):
        for sampling in (S(1.0), S(0.0)):
            got = verify.verify_tree(logits, bad_ids, parents, bad_q, sampling, torch.Generator(device=DEV))
            assert got.flags is not None
            assert got.flags.tolist() == [0, int(Broken.DRAFT_PROBS), int(Broken.DRAFT_TOKENS)], got.flags
    with pytest.raises(ValueError, match="noise is required"):
        exact.verify_tree_with_noise(logits, tokens, parents, probs, S(1.0), None)


def test_plugin_replays_tree_steps_from_graphs(small_blocks, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's tree step through StepGraphs (a fake graph re-runs the step on the captured
    tensors, as a CUDA graph re-reads its addresses): one capture per node count, replays give
    the direct launch's verdict and flags, and an earlier verdict is not overwritten by a replay."""
    from flashspec_triton import stepgraphs

    class FakeGraph:
        def __init__(self, step, args, out: TreeVerdict) -> None:
            self.step, self.args, self.out = step, list(args), out

        def pool(self) -> None:
            return None

        def replay(self) -> None:
            v = self.step(*self.args)
            for name in ("path", "num_accepted", "tokens", "flags"):
                getattr(self.out, name).copy_(getattr(v, name))

    captures: list[int] = []

    def fake_capture(step, args, pool, warmups):
        captures.append(1)
        out = step(*args)
        return FakeGraph(step, args, out), out

    monkeypatch.setattr(stepgraphs.StepGraphs, "usable", lambda self, logits: True)
    exact = TritonVerifier(TritonVerifierConfig(noise="exact"), DEV)
    exact._graphs = stepgraphs.StepGraphs(1 << 30, capture_fn=fake_capture)
    parents = torch.tensor([-1, -1, 0, 1], dtype=torch.int64)
    got, want = [], []
    for seed in range(3):
        logits, tokens, probs, noise = tree_inputs(2, tuple(parents.tolist()), 300, "iid", seed=20 + seed)
        tokens[seed % 2, 3] = -1 if seed else tokens[seed % 2, 3]  # flags change between replays
        got.append(exact.verify_tree_with_noise(logits, tokens, parents, probs, S(1.0), noise))
        want.append(tree_ops.verify_tree_triton(logits, tokens, parents, probs, S(1.0), noise=noise))
    assert len(captures) == 1
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
        assert g.flags is not None and torch.equal(g.flags, w.flags)
    assert got[1].flags.tolist() == [0, int(Broken.DRAFT_TOKENS)] and got[2].flags.tolist()[0] != 0
    other = exact.verify_tree_with_noise(logits, tokens, torch.tensor([-1, 0, 0, 1]), probs, S(1.0), noise)
    assert_same(other, tree_ops.verify_tree_triton(logits, tokens, (-1, 0, 0, 1), probs, S(1.0), noise=noise))
    assert len(captures) == 1  # another shape of 4 nodes: the same graph, the shape copied in as data
