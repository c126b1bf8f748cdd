"""Tiny random causal LMs for tests and tools, and the exact law of their first tokens.

* :func:`tiny_lm` / :func:`perturbed_lm` save a Qwen2-shaped model (with a word-level
  tokenizer ``t0 .. t{V-1}``) to disk, so that the HF and fast back-ends load it like a real
  checkpoint; :func:`pipeline_dict` builds a ``build_pipeline()`` dict over them.
* :func:`law_of` enumerates the target's law of its first :data:`LENGTH` tokens in float64
  and :func:`gate` tests a pipeline's samples against it (the pipeline-level exactness gate,
  chi-square at :data:`ALPHA`); :class:`Adversaries` registers two legal but adversarial
  selectors, :class:`PeekingDraft` is an illegal one (it peeks at this step's draft), which
  the gate must catch.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from flashspec_core import ComponentSpec, Draft, DraftProvider, hookimpl
from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import probs_from_logits

Law = dict[tuple[int, ...], float]  # a token sequence -> its probability

N = 12_000
BATCH = 2000
ALPHA = 1e-3  # per gate: a clean gate fails with probability <= 1e-3, so k gates raise a false alarm in <= k per mille of clean runs
PROMPT = [1, 2, 3, 1, 2]
LENGTH = 3
EOS = 15


def tiny_tokenizer(vocab: int, prefix: str = "t") -> PreTrainedTokenizerFast:
    words = {f"{prefix}{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token=f"{prefix}0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"{prefix}{vocab - 1}", unk_token=f"{prefix}0")


def tiny_lm(
    path: Path,
    vocab: int = 16,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float64,
    tokenizer_prefix: str = "t",
    embed_vocab: int | None = None,
    init: float = 0.02,
) -> Path:
    """Save a random Qwen2-shaped model (logits scaled by ``scale``) under ``path``."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=embed_vocab or vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=init,  # ~0.3 makes the next token depend strongly on the context
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.to(dtype).save_pretrained(path)  # type: ignore[arg-type]  # transformers types .to oddly
    _save_tokenizer(tiny_tokenizer(vocab, tokenizer_prefix), path)
    return path


def _save_tokenizer(tok: PreTrainedTokenizerFast, path: Path) -> None:
    tok.save_pretrained(path)
    # AutoTokenizer would otherwise pick the model type's tokenizer class (Qwen2's BPE).
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg))


def perturbed_lm(src: Path, path: Path, noise: float, seed: int = 0, layers: int | None = None) -> Path:
    """A draft correlated with ``src``: its weights plus Gaussian noise of relative size ``noise``."""
    model = Qwen2ForCausalLM.from_pretrained(src, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * p.std().clamp_min(1e-3))
    model.save_pretrained(path)
    _save_tokenizer(PreTrainedTokenizerFast.from_pretrained(src), path)
    return path


def pipeline_dict(
    target: Path, drafts: list[Path], selector: str = "fixed", gamma: int = 3, dtype: str = "float64", **sel: object
) -> dict[str, Any]:
    """A build_pipeline() dict: one hf arm per draft plus lookup arms: one padded to gamma,
    one proposing only what a bigram match gives (0 to gamma tokens), and, with a draft,
    one that falls back to the first draft's proposal where it has no match; in ``dtype``."""
    arms: list[dict[str, Any]] = [
        {"use": "hf", "model": str(d), "gamma": gamma, "dtype": dtype, "name": f"d{i}"} for i, d in enumerate(drafts)
    ]
    arms.append({"use": "prompt_lookup", "gamma": gamma + 1, "name": "lookup"})
    arms.append({"use": "prompt_lookup", "gamma": gamma, "min_ngram": 2, "fill": False, "name": "lookup-match"})
    if drafts:
        arms.append({"use": "prompt_lookup", "gamma": gamma, "min_ngram": 2, "fill": False, "fallback": "d0",
                     "name": "lookup-or-d0"})
    return {
        "target": {"model": str(target), "dtype": dtype, "chat_template": False},
        "arm": arms,
        "verifier": {"use": "reference"},
        "selector": {"use": selector, **sel},
    }


def one_arm_dict(target: Path, arm: dict[str, Any]) -> dict[str, Any]:
    """A build_pipeline() dict: float32 ``target`` (no chat template), the one ``arm``, the
    reference verifier and the fixed selector."""
    return {
        "target": {"model": str(target), "dtype": "float32", "chat_template": False},
        "arm": [arm],
        "verifier": {"use": "reference"},
        "selector": {"use": "fixed"},
    }


def tiny_family(root: Path) -> dict[str, Path]:
    """A peaked V = 16 target, a close draft (its perturbed copy) and an unrelated one-layer draft."""
    target = tiny_lm(root / "target", vocab=16, seed=0, scale=8.0)
    return {
        "target": target,
        "close": perturbed_lm(target, root / "close", noise=0.05, seed=1),
        "far": tiny_lm(root / "far", vocab=16, seed=2, scale=8.0, layers=1),
    }


# --- the law of the first tokens, and the gate -------------------------------------------


def sequence_law(model_dir: Path, prompt: list[int], length: int, sampling: SamplingParams, eos: int) -> Law:
    """P(first ``length`` tokens = s) under autoregressive sampling from the target.

    Sequences that hit ``eos`` early end there. Computed in float64.
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    law: Law = {}
    frontier: Law = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            prefixes = list(frontier)
            ids = torch.tensor([prompt + list(p) for p in prefixes])
            probs = probs_from_logits(model(ids).logits[:, -1].double(), sampling).double()
            nxt: Law = {}
            for i, prefix in enumerate(prefixes):
                for tok in torch.nonzero(probs[i] > 0).flatten().tolist():
                    seq = (*prefix, tok)
                    (law if tok == eos else nxt)[seq] = frontier[prefix] * float(probs[i, tok])
            frontier = nxt
    law.update(frontier)
    return law


def chi_square_pvalue(samples: list[tuple[int, ...]], law: Law, min_expected: float = 5.0) -> float:
    """Goodness of fit of observed sequences to ``law``; cells under ``min_expected`` merged."""
    n = len(samples)
    counts = Counter(samples)
    if any(s not in law for s in counts):
        return 0.0  # a sequence the target cannot produce
    obs: list[float] = []
    exp: list[float] = []
    rest_o = rest_e = 0.0
    for s in sorted(law, key=law.__getitem__, reverse=True):
        e = law[s] * n
        if e >= min_expected:
            obs.append(counts.get(s, 0))
            exp.append(e)
        else:
            rest_o += counts.get(s, 0)
            rest_e += e
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    exp_arr = np.array(exp) * (n / np.sum(exp))
    return float(stats.chisquare(np.array(obs, dtype=float), exp_arr).pvalue)


def generate_sequences(pipe: Any, prompt: list[int], n: int, length: int, batch: int, seed: int,
                       **sampling: Any) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for i in itertools.count():
        if len(out) >= n:
            break
        result = pipe.generate([prompt] * batch, max_new_tokens=length, seed=seed * 1000 + i, **sampling)
        out.extend(tuple(ids) for ids in result.token_ids)
    return out[:n]


def law_of(setup: dict[str, Any], sampling: dict[str, Any]) -> Law:
    """The law of the first tokens of ``setup["target"]`` after :data:`PROMPT`."""
    return sequence_law(setup["target"], PROMPT, LENGTH, SamplingParams(**sampling), EOS)


def gate(pipe: Any, law: Law, sampling: dict[str, Any], seed: int = 0) -> float:
    """The p-value of the pipeline's first-3-token law against the target's."""
    return chi_square_pvalue(generate_sequences(pipe, PROMPT, N, LENGTH, BATCH, seed, **sampling), law)


class AlternateOnRejection:
    """Legal but adversarial: switch arm whenever the last step had a rejection."""

    def __init__(self, config: Any, num_arms: int) -> None:
        self.num_arms, self.arm = num_arms, 0

    def select(self) -> int:
        return self.arm

    def update(self, arm: int, reward: float) -> None:
        if reward < 1.0:
            self.arm = (self.arm + 1) % self.num_arms


class StrangeParity:
    """Legal but strange: arm = parity of the running count of sub-0.5 rewards, plus a rotation."""

    def __init__(self, config: Any, num_arms: int) -> None:
        self.num_arms, self.low, self.t = num_arms, 0, 0

    def select(self) -> int:
        return (self.low % 2 + self.t // 3) % self.num_arms

    def update(self, arm: int, reward: float) -> None:
        self.t += 1
        self.low += reward < 0.5


class Adversaries:
    """A plugin with the two selectors above (``alternate_on_rejection``, ``strange_parity``)."""

    @hookimpl
    def flashspec_arm_selectors(self) -> list[ComponentSpec[Any]]:
        return [
            ComponentSpec("alternate_on_rejection", "selector", AlternateOnRejection),
            ComponentSpec("strange_parity", "selector", StrangeParity),
        ]


class PeekingDraft:
    """What a selector that peeks at the current draft amounts to, per row: use the
    model arm's proposal only where its first token is ``token``, else fall back to
    prompt lookup. The choice depends on this step's draft, which the theorem forbids."""

    def __init__(self, model: DraftProvider, lookup: DraftProvider, token: int) -> None:
        self.model, self.lookup, self.token = model, lookup, token
        self._use_model: list[bool] = []

    def reset(self) -> None:
        self.model.reset()
        self.lookup.reset()

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: Any) -> Draft:
        a = self.model.propose(tokens, lengths, gamma, sampling, generator)
        b = self.lookup.propose(tokens, lengths, gamma, sampling, generator)
        assert a.probs is not None
        use = a.tokens[:, 0].cpu() == self.token
        self._use_model = use.tolist()
        one_hot = torch.nn.functional.one_hot(b.tokens, a.probs.shape[-1]).to(a.probs)
        return Draft(
            tokens=torch.where(use[:, None], a.tokens.cpu(), b.tokens),
            probs=torch.where(use[:, None, None].to(a.probs.device), a.probs, one_hot.to(a.probs.device)),
        )

    def rollback(self, num_accepted: Sequence[int]) -> None:
        self.model.rollback([n if u else 0 for n, u in zip(num_accepted, self._use_model, strict=True)])
