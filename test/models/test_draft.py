"""The parallel draft head and ``Policy.draft_tokens_parallel`` (tiny random models)."""

import numpy as np
import pytest
import torch

from vla_accel_ros.models import BOS, ParallelDraftHead, Policy, VLAConfig
from vla_accel_ros.models.tokenizer import N_BINS, ActionTokenizer

torch.set_num_threads(1)
TINY = dict(image_size=32, patch_size=8, d_model=32, n_heads=2, n_layers=2, vision_layers=1, max_text_len=8,
            local_channels=8, contact_hidden=8)


def perturb(module: torch.nn.Module, scale: float, seed: int) -> None:
    """Add seeded noise to every parameter: a fresh init's near-uniform logits hide differences."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def make_policy(parallel: bool = True) -> Policy:
    policy = Policy.create(VLAConfig(**TINY), ActionTokenizer(np.full(7, -1.0), np.full(7, 1.0)), seed=0)
    perturb(policy.target, 0.2, 1)
    if parallel:
        policy.parallel_draft = ParallelDraftHead.from_sequential(policy.config, policy.draft).eval()
        perturb(policy.parallel_draft, 0.3, 2)
    return policy


@pytest.fixture(scope="module")
def policy() -> Policy:
    return make_policy()


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8, generator=g),
            torch.randint(0, 257, (3, 8), generator=g), torch.randn(3, 8, generator=g))


def test_from_sequential_copies_the_weights(policy: Policy) -> None:
    head = ParallelDraftHead.from_sequential(policy.config, policy.draft)
    for name, tensor in policy.draft.state_dict().items():
        assert torch.equal(head.state_dict()[name], tensor)
    assert head.config == policy.config


def test_first_token_is_the_targets_greedy_token_and_shapes(policy: Policy, batch) -> None:
    prefix = policy.prefill_tensors(*batch).prefix
    greedy = policy.greedy_decode(prefix)
    for n in (1, 2, 7):
        tokens, logits = policy.draft_tokens_parallel(prefix, n)
        assert tokens.shape == (3, n) and tokens.dtype == torch.long and logits.shape == (3, n, N_BINS)
        assert torch.equal(tokens, logits.argmax(-1))
        assert torch.equal(tokens[:, 0], greedy[:, 0])
    # the same first token and logits as the sequential draft: both are the target's LM head
    sequential = policy.draft_tokens(prefix, 7)[1]
    assert torch.equal(policy.draft_tokens_parallel(prefix, 7)[1][:, 0], sequential[:, 0])
    empty, empty_logits = policy.draft_tokens_parallel(prefix, 0)
    assert empty.shape == (3, 0) and empty_logits.shape == (3, 0, N_BINS)
    with pytest.raises(ValueError, match="n must be >= 0"):
        policy.draft_tokens_parallel(prefix, -1)


def test_deterministic_and_independent_of_n(policy: Policy, batch) -> None:
    """Each position is its own query: asking for fewer tokens gives the leading ones unchanged."""
    prefix = policy.prefill_tensors(*batch).prefix
    tokens, logits = policy.draft_tokens_parallel(prefix, 7)
    again, again_logits = policy.draft_tokens_parallel(prefix, 7)
    assert torch.equal(tokens, again) and torch.equal(logits, again_logits)
    short, short_logits = policy.draft_tokens_parallel(prefix, 4)
    assert torch.equal(short, tokens[:, :4])
    torch.testing.assert_close(short_logits, logits[:, :4], atol=1e-5, rtol=0)


def test_one_call_of_the_head_reading_the_prefix_end(policy: Policy, batch) -> None:
    """Every later proposal is the LM head of ONE head call whose queries all read (greedy token,
    feature) at the prefix end and differ only by the position index."""
    prefix = policy.prefill_tensors(*batch).prefix
    calls: list[tuple[int, ...]] = []
    hook = policy.parallel_draft.register_forward_hook(lambda m, args, out: calls.append(tuple(out.shape)))
    try:
        tokens, logits = policy.draft_tokens_parallel(prefix, 7)
    finally:
        hook.remove()
    assert calls == [(3, 6, 32)]
    with torch.inference_mode():
        target = policy.target
        first = target.lm_head(prefix.hidden_last).argmax(-1)
        want = target.lm_head(policy.parallel_draft(
            target.action_emb(first)[:, None].expand(3, 6, -1), prefix.hidden_last[:, None].expand(3, 6, -1),
            torch.arange(1, 7), prefix.cache.layers[-1]))
    torch.testing.assert_close(logits[:, 1:], want, atol=1e-5, rtol=0)
    assert not torch.equal(tokens, policy.draft_tokens(prefix, 7)[0])  # not the sequential head's chain


def test_after_consumed_tokens_and_last_token_checks(policy: Policy, batch) -> None:
    prefix = policy.prefill_tensors(*batch).prefix
    consumed = torch.randint(0, N_BINS - 1, (3, 4), generator=torch.Generator().manual_seed(9))
    mid = policy.score(prefix, consumed).prefix.truncate(3)
    tokens, logits = policy.draft_tokens_parallel(mid, 4, consumed[:, 2])
    assert tokens.shape == (3, 4)
    assert torch.equal(tokens[:, 0], policy.score(mid, consumed[:, :0]).logits[:, 0].argmax(-1))
    with pytest.raises(ValueError, match="last_token"):
        policy.draft_tokens_parallel(mid, 4, (consumed[:, 2] + 1) % 255)
    with pytest.raises(ValueError, match="start of the action"):
        policy.draft_tokens_parallel(mid, 4)
    assert torch.equal(policy.draft_tokens_parallel(prefix, 3, torch.full((3,), BOS))[0],
                       policy.draft_tokens_parallel(prefix, 3)[0])


def test_without_a_parallel_head(batch) -> None:
    bare = make_policy(parallel=False)
    assert bare.parallel_draft is None and "parallel_draft" not in bare.n_parameters()
    prefix = bare.prefill_tensors(*batch).prefix
    for n in (0, 1, 7):
        with pytest.raises(ValueError, match="no parallel draft head"):
            bare.draft_tokens_parallel(prefix, n)
    bare.draft_tokens(prefix, 7)  # the sequential head works as ever


def test_parameters_counted_and_moved(policy: Policy) -> None:
    counts = policy.n_parameters()
    assert counts["parallel_draft"] == counts["draft"] > 0  # the same architecture
    assert policy.to("cpu") is policy and policy.parallel_draft.fc.weight.device.type == "cpu"
