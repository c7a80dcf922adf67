"""Training of a small Hugging Face VLA in OpenVLA's layout from demonstrations (``vla-accel train-hf``).

The model is built from Hugging Face classes only: ``LlavaForConditionalGeneration`` with a SigLIP
(or CLIP) vision tower at the demos' image size and a small Llama text model, a ``LlamaTokenizer``
whose BPE vocabulary covers the prompt's words (each a token, so the colour that picks the cube
is one token), and ``LlavaProcessor``. The text vocabulary's top 256 ids are reserved: they are the
action ids (bin b = id ``vocab_size - 1 - b``, :mod:`vla_accel_ros.models.token_vla.spec`). The
directory loads with :func:`vla_accel_ros.models.hf.checkpoint.load_hf_vla` (``hf:DIR``).

``--prompt-layout instruction_first`` writes a prompt whose ``{image}`` field puts the image tokens
after the instruction (``vla_spec.json``), so every image token attends to the instruction: the
grounding the built-in policy gets from its FiLM-conditioned encoder. ``instruction_first+proprio``
also gives the model the arm's state, as the built-in policy has it: the joints and the gripper
opening as one binned token each after the image (``{proprio}``, binned on the training data's
proprio q01/q99 in ``dataset_statistics.json``). A fine-tune (``--init``) keeps the model's layout.

Recipe (that of ``vla-accel train`` where it applies): teacher-forced cross-entropy over the 256
action rows of the LM head on the 7 action positions only (the prompt is not a target), plus the
built-in policy's auxiliary regression of where the named cube is from the gripper and where the
gripper is, read by a linear probe from the hidden state that predicts the first action token (the
probe grounds the instruction's colour in the image; it is a training aid and is not saved), and
with ``--keypoint-weight`` the built-in policy's keypoint loss on the image tokens: a linear head on
each image token's final hidden state gives, per keypoint (the named cube, the TCP), a log-mass
and an offset within its patch; the softmax-weighted mean over the patches is regressed onto where
the front camera sees that point (also a training aid, not saved).
AdamW, linear warm-up then cosine to 10%, gradient clipping at 1, optional image-shift
augmentation. The last episodes are held out (``--val-fraction``): their teacher-forced loss and
token accuracy are measured after every epoch.

Output: what ``save_pretrained`` writes (config, safetensors weights, tokenizer, processor),
``dataset_statistics.json`` in OpenVLA's layout (one dataset; q01/q99 of the training actions;
mask true except the gripper, which is an absolute command), ``vla_spec.json`` with the ``robot``
record (the package arm), ``loss_curves.png`` and ``training.json`` (command, recipe, metrics).

DAgger (``--dagger-episodes``): after training, the new model drives ``--dagger-share`` of the
steps of fresh sim episodes while the scripted expert labels every step
(:func:`vla_accel_ros.sim.demos.record_demos` with the model's greedy action), and the model is
fine-tuned on the old and new episodes together, ``--dagger-rounds`` times.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.models.configuration import TRAINED_HERE
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.models.load import check_checkpoint, require_family
from vla_accel_ros.models.token_vla.policy import HFTokenVLA
from vla_accel_ros.models.token_vla.spec import OPENVLA_PROMPT
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS
from vla_accel_ros.sim.env import INSTRUCTION_TEMPLATE, SimConfig
from vla_accel_ros.sim.scene import CUBE_COLORS
from vla_accel_ros.training.common import (
    KeypointHead,
    cosine_schedule,
    demo_robot,
    plot_loss_curve,
    plot_loss_panels,
    random_shift,
    seed_everything,
)
from vla_accel_ros.training.configs import PROMPT_LAYOUTS, HFTrainConfig
from vla_accel_ros.training.data import DemoDataset, load_demos
from vla_accel_ros.training.hf_draft import episode_instructions, greedy_rollout

DATASET_KEY = "sim_pick_cube"  # the one dataset of dataset_statistics.json
STATISTICS_FILE = "dataset_statistics.json"
SPEC_FILE = "vla_spec.json"
TRAINING_FILE = "training.json"
LOSS_PLOT = "loss_curves.png"
GRIPPER = ACTION_DIM - 1
UNUSED_TEXT_LEN = 1  # the prompt is tokenised from the instruction text; DemoDataset's byte ids are not read
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# Every character a prompt may hold (the space is "▁"); other characters become <unk>.
BASE_CHARS = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789?:.,'-!\n"


# --- building -----------------------------------------------------------------------------------
def prompt_words() -> list[str]:
    """The words of every prompt the sim asks (OpenVLA's template around each instruction)."""
    words: list[str] = []
    for color in CUBE_COLORS:
        text = OPENVLA_PROMPT.format(instruction=INSTRUCTION_TEMPLATE.format(color=color)).replace("\n", " ")
        words += [w for w in text.split() if w not in words]
    return words


def build_vocabulary(text_vocab: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE vocabulary and its merges: the specials, every character of ``BASE_CHARS``, each prompt
    word with and without its leading "▁" (chained merges from the left, so a word becomes one
    token), then unused tokens up to ``text_vocab`` (the top 256 are the action ids)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in BASE_CHARS:
        vocab.setdefault(char, len(vocab))
    merges: list[tuple[str, str]] = []
    # All "▁word" chains rank before the bare forms (a word after the newline): a bare form's
    # merge ("r", "e" of "red") would otherwise split a later "▁word" ("▁g" "re" of "▁green").
    for form in [*("▁" + w for w in prompt_words()), *prompt_words()]:
        for end in range(2, len(form) + 1):
            pair = (form[: end - 1], form[end - 1])
            if pair not in merges:
                merges.append(pair)
            vocab.setdefault(form[:end], len(vocab))
    if len(vocab) + N_BINS > text_vocab:
        raise ValueError(f"text_vocab {text_vocab} leaves no room for {len(vocab)} prompt tokens "
                         f"and {N_BINS} action ids")
    while len(vocab) < text_vocab:  # unused up to the top: the action ids
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    return vocab, merges


def build_hf_vla(path: Path, cfg: HFTrainConfig, image_size: int) -> Path:
    """Write a randomly initialised Llava VLA in OpenVLA's layout to ``path`` (``save_pretrained``
    of the model and its processor; the statistics come later). Returns ``path``."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlamaTokenizer,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    if image_size % cfg.patch_size:
        raise ValueError(f"image size {image_size} is not a multiple of patch_size {cfg.patch_size}")
    vocab, merges = build_vocabulary(cfg.text_vocab)
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges)
    # Added above the text vocabulary, so they never clash with the action ids at its top.
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"], "pad_token": "<pad>"})
    torch.manual_seed(cfg.seed)
    text = LlamaConfig(vocab_size=-(-len(tokenizer) // 8) * 8, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.layers,
                       num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                       max_position_embeddings=max(256, 2 * (image_size // cfg.patch_size) ** 2), bos_token_id=1,
                       eos_token_id=2, pad_token_id=tokenizer.pad_token_id)
    tower = {"image_size": image_size, "patch_size": cfg.patch_size, "hidden_size": cfg.vision_hidden,
             "intermediate_size": 4 * cfg.vision_hidden, "num_hidden_layers": cfg.vision_layers,
             "num_attention_heads": cfg.vision_heads}
    if cfg.vision == "siglip":
        # no attention-pooling head: Llava reads the patch features, a head would be dead weight
        vision_config, strategy, layer = SiglipVisionConfig(**tower, vision_use_head=False), "full", -1
        image_processor = SiglipImageProcessor(size={"height": image_size, "width": image_size})
    else:
        vision_config, strategy, layer = CLIPVisionConfig(**tower), "default", -1
        image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                             crop_size={"height": image_size, "width": image_size})
    n_patches = (image_size // cfg.patch_size) ** 2
    config = LlavaConfig(vision_config=vision_config, text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         image_seq_length=n_patches, vision_feature_select_strategy=strategy,
                         vision_feature_layer=layer)
    path.mkdir(parents=True, exist_ok=True)
    LlavaForConditionalGeneration(config).save_pretrained(path)
    LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=cfg.patch_size,
                   vision_feature_select_strategy=strategy, num_additional_image_tokens=0).save_pretrained(path)
    return path


def action_statistics(data: DemoDataset, idx: torch.Tensor) -> dict[str, Any]:
    """``dataset_statistics.json``'s content in OpenVLA's layout from the steps ``idx``: action
    quantiles for the bins, mask false on the gripper (an absolute command in [0, 1])."""
    actions = data.actions[idx].numpy().astype(np.float64)
    proprio = data.proprio[idx].numpy().astype(np.float64)

    def summary(values: np.ndarray) -> dict[str, list[float]]:
        return {"mean": values.mean(0).tolist(), "std": values.std(0).tolist(), "max": values.max(0).tolist(),
                "min": values.min(0).tolist(), "q01": np.quantile(values, 0.01, axis=0).tolist(),
                "q99": np.quantile(values, 0.99, axis=0).tolist()}

    action = summary(actions) | {"mask": [True] * GRIPPER + [False]}
    episodes = int(torch.unique(data.episode[idx]).numel())
    return {DATASET_KEY: {"action": action, "proprio": summary(proprio), "num_transitions": len(idx),
                          "num_trajectories": episodes}}


def write_side_files(out: Path, statistics: dict[str, Any], image_size: int, prompt: str = OPENVLA_PROMPT) -> None:
    """The statistics and the spec: the robot record (the package arm the demos were recorded on),
    the prompt template when it is not OpenVLA's, and how the model runs by default: as the
    package's own policies (``TRAINED_HERE``), since it is tuned in the same scene."""
    (out / STATISTICS_FILE).write_text(json.dumps(statistics, indent=2))
    spec: dict[str, Any] = {"robot": demo_robot(image_size).to_json(), **TRAINED_HERE.to_json()}
    if prompt != OPENVLA_PROMPT:
        spec["prompt"] = prompt
    (out / SPEC_FILE).write_text(json.dumps(spec, indent=2))


# --- training -----------------------------------------------------------------------------------
class HFTrainer:
    """Teacher-forced training of a loaded :class:`HFTokenVLA` on an in-memory demo set."""

    def __init__(self, cfg: HFTrainConfig, policy: HFTokenVLA, data: DemoDataset, instructions: list[str]) -> None:
        self.cfg = cfg
        self.policy = policy
        self.model = policy.model
        self.data = data
        self.train_idx, self.val_idx = data.split(cfg.val_fraction)
        if policy.config.image_size != data.image_size:
            raise ValueError(f"the model takes {policy.config.image_size} px images, "
                             f"the demos are {data.image_size} px")
        self.tokens = torch.from_numpy(policy.tokenizer.encode(data.actions.numpy().astype(np.float64)))
        # The prompt of every step; its ids are the inference prompt's exactly (policy.prompt_ids):
        # one per episode, or per step when the prompt holds the proprioception.
        if policy.spec.reads_proprio:
            proprio = data.proprio.numpy()
            self.prompt_of = [policy.prompt_ids(instructions[int(e)], proprio[i])[0]
                              for i, e in enumerate(data.episode.tolist())]
        else:
            prompts = [policy.prompt_ids(text)[0] for text in instructions]
            self.prompt_of = [prompts[int(e)] for e in data.episode]
        self.hf_ids = torch.from_numpy(policy.action_ids)
        mean = torch.tensor(policy.spec.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(policy.spec.image_std).view(1, 3, 1, 1)
        self.pixel_scale, self.pixel_shift = 1.0 / (255.0 * std), -mean / std
        d = policy.config.d_model
        # training aid only (not saved): where the named cube and the TCP are, from the state that
        # predicts the first action token
        self.aux_head = torch.nn.Linear(d, data.aux.shape[1])
        # training aid only: where the camera sees the named cube and the TCP, from the image tokens
        self.keypoint_head = KeypointHead(d, data.keypoint_targets.shape[1], math.isqrt(policy.config.n_image_tokens))
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.history: dict[str, list[float]] = {"loss": [], "ce": [], "val_loss": [], "val_step": []}

    def loss(self, idx: torch.Tensor, augment: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(total loss, action cross-entropy, argmax bins (B, 7)) of the steps ``idx``; the steps of
        one batch are grouped by prompt length, so no padding enters a forward."""
        groups: dict[int, list[int]] = {}
        for i in idx.tolist():
            groups.setdefault(len(self.prompt_of[i]), []).append(i)
        losses, ces, preds, order = [], [], [], []
        for length, members in groups.items():
            sel = torch.tensor(members)
            images = self.data.images[sel]
            keypoints = self.data.keypoint_targets[sel]
            if augment and self.cfg.augment_shift:
                images, moved = random_shift(images, self.cfg.augment_shift, self.generator)
                keypoints = keypoints + (moved * (2.0 / images.shape[1]))[:, None, :]  # labels move with the image
            pixels = images.permute(0, 3, 1, 2).float() * self.pixel_scale + self.pixel_shift
            tokens = self.tokens[sel]
            prompt = torch.stack([self.prompt_of[i] for i in members])
            # the first 6 action tokens are inputs; the 7th is only a target
            ids = torch.cat([prompt, self.hf_ids[tokens[:, :-1]]], dim=1)
            states = self.model.model(input_ids=ids, pixel_values=pixels).last_hidden_state
            hidden = states[:, length - 1:]  # (B, 7, d): the states that predict each action token
            head = self.model.get_output_embeddings()
            logits = hidden @ head.weight[self.hf_ids].T
            if getattr(head, "bias", None) is not None:
                logits = logits + head.bias[self.hf_ids]
            ce = F.cross_entropy(logits.reshape(-1, N_BINS), tokens.reshape(-1))
            total = ce
            aux = self.data.aux[sel]
            known = torch.isfinite(aux)
            if self.cfg.aux_weight > 0 and known.any():
                total = total + self.cfg.aux_weight * F.smooth_l1_loss(self.aux_head(hidden[:, 0])[known], aux[known])
            if self.cfg.keypoint_weight > 0:
                image_states = states[:, :length][:, prompt[0] == self.policy.image_token_id]
                total = total + self.cfg.keypoint_weight * self.keypoint_head.loss(image_states, keypoints)
            weight = len(members) / len(idx)
            losses.append(total * weight)
            ces.append(ce * weight)
            preds.append(logits.argmax(-1))
            order += members
        pred = torch.cat(preds)[torch.argsort(torch.tensor(order))]  # back to sorted-index order
        return torch.stack(losses).sum(), torch.stack(ces).sum(), pred

    def keypoint_positions(self, image_states: torch.Tensor) -> torch.Tensor:
        """(B, K, 2) image positions (x, y in [-1, 1]) of the K keypoints from the final hidden
        states (B, P, d) of the image tokens."""
        return self.keypoint_head.positions(image_states)

    def fit(self, epochs: int, lr: float, label: str = "target") -> None:
        """``epochs`` shuffled passes over the training steps with AdamW and the cosine schedule."""
        cfg = self.cfg
        if epochs == 0:
            return
        params = [*self.model.parameters(), *self.aux_head.parameters(), *self.keypoint_head.parameters()]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
        total = epochs * math.ceil(len(self.train_idx) / cfg.batch_size)
        warmup = min(cfg.warmup_steps, total // 5)
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_schedule(s, total, warmup))
        for epoch in range(epochs):
            self.model.train()
            order = self.train_idx[torch.randperm(len(self.train_idx), generator=self.generator)]
            bar = progress_bar(order.split(cfg.batch_size), desc=f"{label} {epoch + 1}/{epochs}",
                               disable=not cfg.progress, dynamic_ncols=True)
            for idx in bar:
                with self.autocast():
                    loss, ce, _ = self.loss(torch.sort(idx).values, augment=True)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                optimizer.step()
                sched.step()
                self.history["loss"].append(loss.item())
                self.history["ce"].append(ce.item())
                bar.set_postfix(ce=f"{ce.item():.3f}", lr=f"{sched.get_last_lr()[0]:.1e}")
            if len(self.val_idx):
                val = self.validate()
                self.history["val_loss"].append(val["val_loss"])
                self.history["val_step"].append(len(self.history["ce"]) - 1)
                tqdm.write(f"{label} epoch {epoch + 1}: val loss {val['val_loss']:.3f}, "
                           f"teacher-forced token accuracy {val['val_token_acc']:.3f}")
        self.model.eval()

    def autocast(self) -> torch.autocast:
        """The training forward's precision (``autocast``); validation stays in float32. On CPUs
        with AVX512-BF16 or AMX the matmuls run faster in bfloat16; a whole training step gains
        less, since the backward's other work and the optimizer stay float32."""
        device = next(self.model.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.cfg.autocast == "bfloat16")

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Teacher-forced cross-entropy and token accuracy (exact, within 2 bins, per dimension)
        on the held-out steps."""
        self.model.eval()
        total, n, exact, near = 0.0, 0, torch.zeros(ACTION_DIM), torch.zeros(ACTION_DIM)
        for idx in self.val_idx.split(self.cfg.eval_batch_size):
            _, ce, pred = self.loss(idx, augment=False)
            want = self.tokens[idx]
            total += ce.item() * len(idx)
            n += len(idx)
            exact += (pred == want).float().sum(0)
            near += ((pred - want).abs() <= 2).float().sum(0)
        self.model.train()
        return {"val_loss": total / n, "val_token_acc": float(exact.sum() / (n * ACTION_DIM)),
                "val_token_acc_within2": float(near.sum() / (n * ACTION_DIM)),
                "val_token_acc_per_dim": (exact / n).tolist(), "val_samples": n}


def plot_losses(history: dict[str, list[float]], path: Path) -> None:
    """The action cross-entropy per step with the held-out points, and the total loss."""
    def draw(ax: Any, key: str) -> None:
        held = (np.asarray(history["val_step"]), history["val_loss"]) if key == "ce" and history["val_loss"] else None
        plot_loss_curve(ax, history[key], held)

    plot_loss_panels(path, [("action cross-entropy", "ce"), ("total (with auxiliary)", "loss")], (11, 4), draw)


def hf_greedy_action(policy: HFTokenVLA) -> Callable[[Observation], np.ndarray]:
    """The model's greedy (AR) action of one observation: the DAgger driver."""
    def act(obs: Observation) -> np.ndarray:
        return policy.tokens_to_action(greedy_rollout(policy, obs)[1])

    return act


def save_model(policy: HFTokenVLA, out: Path, dtype: str) -> None:
    """``save_pretrained`` of the weights into ``out`` (the tokenizer and processor are already there)."""
    model = policy.model
    if dtype != "float32":
        model = model.to({"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype])
    model.save_pretrained(out)
    policy.model.float()


def train_hf_vla(cfg: HFTrainConfig) -> dict[str, Any]:
    """Build (or load ``--init``), train, optionally run DAgger rounds, and write ``cfg.out``
    (module docstring). Returns the metrics written to training.json."""
    from vla_accel_ros.sim.demos import record_demos

    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    start = time.perf_counter()
    out = Path(cfg.out)
    data = load_demos(cfg.data, UNUSED_TEXT_LEN, cfg.max_episodes, not cfg.include_failures, cfg.progress)
    train_idx, _ = data.split(cfg.val_fraction)
    earlier: dict[str, Any] | None = None  # the --init model's own training record: the full chain
    prompt = PROMPT_LAYOUTS[cfg.prompt_layout]
    if cfg.init is not None:
        source = CheckpointRef.parse(cfg.init).directory
        require_family(cfg.init, "hf", "--init")  # the model is named here, not its copy in cfg.out
        check_checkpoint(cfg.init)
        if source.resolve() != out.resolve():
            shutil.copytree(source, out, dirs_exist_ok=True)
        statistics = json.loads((out / STATISTICS_FILE).read_text())  # keep the bins the model learnt
        if (out / SPEC_FILE).is_file():  # and the layout it learnt
            prompt = json.loads((out / SPEC_FILE).read_text()).get("prompt", OPENVLA_PROMPT)
        if (out / TRAINING_FILE).is_file():
            earlier = json.loads((out / TRAINING_FILE).read_text())
    else:
        build_hf_vla(out, cfg, data.image_size)
        statistics = action_statistics(data, train_idx)
    write_side_files(out, statistics, data.image_size, prompt)
    policy = load_hf_vla(out, draft=False)
    trainer = HFTrainer(cfg, policy, data, episode_instructions(cfg.data, data))
    trainer.fit(cfg.epochs, cfg.lr)
    rounds: list[dict[str, Any]] = []
    dagger_dirs: list[Path] = []
    for r in range(cfg.dagger_rounds):
        folder = out.parent / f"{out.name}_dagger{r + 1}"
        dagger_dirs.append(folder)
        seed = cfg.dagger_seed + r * cfg.dagger_episodes
        sim = SimConfig(image_size=data.image_size)
        summary = record_demos(folder, cfg.dagger_episodes, seed, sim, progress=cfg.progress,
                               policy_action=hf_greedy_action(policy), policy_share=cfg.dagger_share)
        rounds.append({"folder": str(folder), "seed": seed, "success_rate": summary["success_rate"]})
        data, instructions = merge_demos(cfg, dagger_dirs)
        fresh = HFTrainer(cfg, policy, data, instructions)
        fresh.history = trainer.history
        fresh.aux_head, fresh.keypoint_head = trainer.aux_head, trainer.keypoint_head
        trainer = fresh
        trainer.fit(cfg.dagger_epochs, cfg.dagger_lr, label=f"dagger {r + 1}")
    metrics = trainer.validate() if len(trainer.val_idx) else {"val_samples": 0}
    n_params = sum(p.numel() for p in policy.model.parameters())
    metrics |= {"n_parameters": n_params, "train_seconds": round(time.perf_counter() - start, 1),
                "n_episodes": data.n_episodes, "n_train_samples": len(trainer.train_idx)}
    save_model(policy, out, cfg.save_dtype)
    plot_losses(trainer.history, out / LOSS_PLOT)
    record = {"command": cfg.command(), "recipe": {**asdict(cfg), "optimizer": "AdamW",
                                                   "schedule": "linear warm-up + cosine to 10%",
                                                   "loss": "cross-entropy on the 7 action positions + aux"},
              "dagger": rounds, "metrics": metrics, "init_training": earlier}
    (out / TRAINING_FILE).write_text(json.dumps(record, indent=2))
    print(json.dumps(metrics))
    print(f"model written to {out} (hf:{out}; {TRAINING_FILE}, loss plot {LOSS_PLOT})")
    return metrics


def merge_demos(cfg: HFTrainConfig, extra: list[Path]) -> tuple[DemoDataset, list[str]]:
    """The training demos followed by the DAgger folders' episodes as one dataset, and each
    episode's instruction. The held-out split then takes the newest DAgger episodes: the states
    the policy itself now visits."""
    parts = [load_demos(cfg.data, UNUSED_TEXT_LEN, cfg.max_episodes, not cfg.include_failures, False)]
    parts += [load_demos(folder, UNUSED_TEXT_LEN, None, True, False) for folder in extra]
    instructions: list[str] = []
    for folder, part in zip([Path(cfg.data), *extra], parts):
        instructions += episode_instructions(folder, part)
    return concat_demos(parts), instructions


def concat_demos(parts: list[DemoDataset]) -> DemoDataset:
    """Several datasets as one, episodes in order."""
    offsets = np.cumsum([0] + [p.n_episodes for p in parts[:-1]])
    return DemoDataset(
        images=torch.cat([p.images for p in parts]), text=torch.cat([p.text for p in parts]),
        proprio=torch.cat([p.proprio for p in parts]), actions=torch.cat([p.actions for p in parts]),
        near_contact=torch.cat([p.near_contact for p in parts]), aux=torch.cat([p.aux for p in parts]),
        keypoint_targets=torch.cat([p.keypoint_targets for p in parts]),
        episode=torch.cat([p.episode + int(o) for p, o in zip(parts, offsets)]),
        files=tuple(f for p in parts for f in p.files), success=torch.cat([p.success for p in parts]))
