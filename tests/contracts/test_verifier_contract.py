"""The Verifier contract, for every registered verifier (see flashspec_core.testing.verifier_contract)."""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashspec_core.contracts import SamplingParams, Verifier, VerifiesWithNoise
from flashspec_core.testing import verifier_contract as vc

NAMES = vc.verifier_names()
DEVICE = os.environ.get("FLASHSPEC_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")

sampling_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.6, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 3, 50]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]),
)


@st.composite
def verify_inputs(draw: st.DrawFn, max_batch: int, max_gamma: int) -> tuple[vc.Inputs, list[str]]:
    gamma = draw(st.integers(0, max_gamma))
    vocab = draw(st.sampled_from([1, 2, 3, 7, 64, 1271]))
    kinds = [vc.ACCEPT, vc.RANDOM] + ([vc.REJECT] if vocab > 1 else [])
    pattern = draw(st.lists(st.sampled_from(kinds), min_size=gamma, max_size=gamma))
    inputs = vc.random_inputs(
        batch=draw(st.integers(1, max_batch)),
        gamma=gamma,
        vocab=vocab,
        seed=draw(st.integers(0, 2**31 - 1)),
        sampling=draw(sampling_params),
        deterministic=draw(st.booleans()),
        pattern=pattern,
        device=DEVICE,
    )
    return inputs, pattern


@functools.cache
def _budget(name: str) -> tuple[int, int, int]:
    """(examples, max batch, max gamma): fewer and smaller for a slow verifier, such as a
    Triton kernel in the CPU interpreter (about 0.1 s per row)."""
    verifier = vc.load_verifier(name, DEVICE)
    inputs = vc.random_inputs(4, 2, 64, 0, SamplingParams(), device=DEVICE)
    inputs.run(verifier, 0)  # compile / warm up
    start = time.perf_counter()
    inputs.run(verifier, 1)
    return (60, 9, 6) if time.perf_counter() - start < 0.2 else (8, 3, 4)


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    vc.load_verifier_or_skip(request.param, DEVICE)
    return request.param


def test_verdict_contract(name: str) -> None:
    verifier = vc.load_verifier(name, DEVICE)
    examples, max_batch, max_gamma = _budget(name)
    exact = vc.is_exact(verifier)

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=verify_inputs(max_batch, max_gamma), seed=st.integers(0, 2**31 - 1))
    def check(case: tuple[vc.Inputs, list[str]], seed: int) -> None:
        inputs, pattern = case
        verdict = inputs.run(verifier, seed)
        vc.check_verdict(verdict, inputs)
        if exact:
            vc.check_pattern(verdict, pattern)

    check()


def test_same_seed_same_verdict(name: str) -> None:
    examples, max_batch, max_gamma = _budget(name)

    @settings(max_examples=max(4, examples // 3), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=verify_inputs(max_batch, max_gamma), seed=st.integers(0, 2**31 - 1))
    def check(case: tuple[vc.Inputs, list[str]], seed: int) -> None:
        vc.check_deterministic(lambda: vc.load_verifier(name, DEVICE), case[0], seed)

    check()


@pytest.mark.parametrize("check", vc.EDGE_CASES, ids=lambda f: f.__name__.removeprefix("check_"))
def test_edge_case(name: str, check: object) -> None:
    verifier: Verifier = vc.load_verifier_or_skip(name, DEVICE, exact=True)
    check(verifier, DEVICE)  # type: ignore[operator]


@pytest.mark.parametrize("case", vc.BAD_INPUTS)
def test_refuses_bad_inputs(name: str, case: str) -> None:
    # a timing stand-in (exact = False) reads no values of its inputs; the pipeline's checks cover it
    vc.check_refuses_bad_inputs(vc.load_verifier_or_skip(name, DEVICE, exact=True), case, DEVICE)


def test_the_bad_input_check_catches_a_verifier_that_trusts_its_inputs() -> None:
    from flashspec_core.sampling import verify_random

    class Trusting:
        def verify(self, target_logits, draft_tokens, draft_probs, sampling, generator):  # type: ignore[no-untyped-def]
            noise = vc.Noise.draw(*draft_tokens.shape, target_logits.shape[-1], generator, target_logits.device)
            return verify_random(target_logits, draft_tokens.clamp(0, target_logits.shape[-1] - 1), draft_probs,
                                 SamplingParams(), noise)

    with pytest.raises(AssertionError, match="neither refused nor flagged"):
        vc.check_refuses_bad_inputs(Trusting(), "id-vocab")  # type: ignore[arg-type]


def test_verify_with_noise(name: str) -> None:
    verifier = vc.load_verifier(name, DEVICE)
    if not isinstance(verifier, VerifiesWithNoise):
        pytest.skip(f"verifier {name!r} does not declare VerifiesWithNoise")
    vc.check_noise_matches_reference(verifier, DEVICE)


def test_the_noise_check_catches_a_verifier_that_draws_its_own_noise() -> None:
    from flashspec_reference.plugin import ReferenceVerifier

    class OwnNoise(ReferenceVerifier):
        def verify_with_noise(self, target_logits, draft_tokens, draft_probs, sampling, noise):  # type: ignore[no-untyped-def]
            return self.verify(target_logits, draft_tokens, draft_probs, sampling, torch.Generator().manual_seed(99))

    with pytest.raises(AssertionError, match="the reference's"):
        vc.check_noise_matches_reference(OwnNoise())
