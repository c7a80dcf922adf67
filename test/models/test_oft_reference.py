"""Agreement with OpenVLA-OFT's original forward (test/fixtures/oft/README.md): the model kept back,
rebuilt from its recipe, its ``.pt`` components converted, loaded by our loader in float32, gives
the original's prompt ids, normalised state, the hidden states its head read, and its chunk,
normalised and unnormalised, on the recorded observations (two images; two the processor resizes;
one image alone), within the tolerance calibrated on the original itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.load import load_policy
from vla_accel_ros.models.oft.weights import convert_directory

FIXTURES = Path(__file__).parents[1] / "fixtures" / "oft"
_spec = importlib.util.spec_from_file_location("oft_layout", FIXTURES / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)

# The original against itself: 0.0 on a float32 rerun and across thread counts; its own bfloat16
# run moves the normalised chunk by 0.039, and a causal mask (the stock transformers that OFT's
# fork patches) by 0.35 (README.md). Ours lands at 0.0 on the normalised chunk.
CHUNK_ATOL = 1e-4
HIDDEN_ATOL = 1e-4


@pytest.fixture(scope="module")
def recorded() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURES / "reference" / "recorded.npz"))


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory):
    directory = layout.write_reference_dir(tmp_path_factory.mktemp("oft_reference") / "model")
    convert_directory(directory, report=lambda line: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield load_policy(directory, unnorm_key=layout.REFERENCE_UNNORM_KEY, dtype="float32")
    finally:
        torch.set_num_threads(threads)


def test_chunks_are_the_originals(policy, recorded) -> None:
    frames = layout.openvla.reference_images()
    for case, (slots, instruction, state) in enumerate(layout.REFERENCE_CASES):
        obs = Observation(image=frames[slots[0]], extra_images=tuple(frames[s] for s in slots[1:]),
                          instruction=layout.openvla.REFERENCE_INSTRUCTIONS[instruction], joint_pos=np.zeros(7),
                          gripper=0.0, state=np.array(layout.REFERENCE_STATES[state]))
        ids = policy.prompt_ids(obs.instruction)[0].tolist()
        assert ids == [*recorded[f"input_ids{case}"].tolist(), 29871]  # the original appends 29871 itself
        np.testing.assert_allclose(policy.statistics.normalise_state(obs.state), recorded["state_normalized"][case],
                                   rtol=0, atol=1e-12)
        prediction = policy.predict_chunk(obs)
        np.testing.assert_allclose(prediction.action_hidden[0].numpy(), recorded["action_hidden"][case], rtol=0,
                                   atol=HIDDEN_ATOL, err_msg=f"case {case}")
        np.testing.assert_allclose(prediction.normalized, recorded["actions_normalized"][case], rtol=0,
                                   atol=CHUNK_ATOL, err_msg=f"case {case}")
        # the original unnormalises in float32, we in float64
        np.testing.assert_allclose(prediction.actions, recorded["actions"][case], rtol=0, atol=CHUNK_ATOL + 1e-6,
                                   err_msg=f"case {case}")
