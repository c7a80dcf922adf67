"""Training of a small SmolVLA-structured policy from demonstrations (``vla-accel train-smolvla``).

SmolVLA is a pretrained VLM (SmolVLM2) cut to its first layers plus a fresh action expert, trained
by flow matching on the robot's demonstrations. This trainer builds the same thing at a small
size: the VLM is a Hugging Face VLA trained here in Llava's layout (``--vlm-from``, e.g.
``checkpoints/hf_small`` from ``vla-accel train-hf``), whose SigLIP tower becomes SmolVLM's vision
model and whose first ``--vlm-layers`` Llama layers its text model; the connector (pixel shuffle
by ``--scale-factor``, one linear map), the state projection and the action expert are new.

Recipe (LeRobot's SmolVLA where it applies): the vision tower frozen (``freeze_vision_encoder``), so
its features are computed once per demo image; the connector, the text layers (at ``--vlm-lr-scale``
of the learning rate), the state projection and the expert trained; flow time t ~ Beta(1.5, 1) on
[0.001, 1], x_t = t noise + (1 - t) a, the loss |v(x_t, t) - (noise - a)|^2 over every padded action
dimension; ``--noise-samples`` (noise, t) draws share one prefix pass, whose keys and values the
expert reads as at inference. With ``--aux-weight``, a linear probe on the state token's hidden
state at the last VLM layer's input (the deepest states whose keys and values the expert reads; the
last layer's output feeds nothing) regresses where the named cube is and where the gripper is: the
token sees the images and the instruction, and the cube's place is a fact of the scene that only the
images give, so the probe makes the prefix ground the instruction's colour in the image (a training
aid; the probe is not saved). ``--state-dropout`` zeroes the state of that share of the samples:
along a demonstration the arm's joints reveal where it is heading, and a policy that learns to
continue that motion instead of looking at the scene never finds the cube from the start pose (a
training aid; the state is always given at inference). With ``--keypoint-weight``, a head on the
front camera's image tokens' states there places the named cube and the gripper in that image (as
``train-hf`` does; a training aid, not saved): a dense signal for where the instruction's cube is.
The language embeddings are the VLA's divided by sqrt(width) (SmolVLA multiplies them back); with
``--scale-factor 1`` the connector starts as the least-squares fit of the VLA's projector, so that
the prefix begins as the VLA saw its inputs. ``--init DIR`` starts from a policy this command wrote
(same VLM layers, pixel shuffle and chunk) and keeps its statistics. State and action are mean/std
normalised with the training episodes' statistics; targets are chunks of ``--chunk-size``
consecutive actions (the episode's last repeated past its end). AdamW, linear warm-up then cosine to
10%, gradient norm clipped at 1. The last episodes are held out: their flow loss after every epoch,
and at the end the 10-step chunk's error against the expert's actions.

Output, in LeRobot's published layout (:mod:`vla_accel_ros.models.lerobot.layout`): ``config.json``
(``type: smolvla``, the front and wrist cameras, state 8 = joints + gripper, action 7),
``model.safetensors``, the processor pipelines and statistics; ``vlm/`` holding the VLM's config
and the tokenizer, which ``vlm_model_name: vlm`` names (a name that is a folder of the policy
directory is read from there); ``vla_spec.json`` with the robot record; ``loss_curves.png`` and
``training.json`` (command, recipe, metrics).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.api import CheckpointRef
from vla_accel_ros.models.lerobot.config import parse_config
from vla_accel_ros.models.lerobot.layout import write_policy_directory
from vla_accel_ros.models.lerobot.processor import tokenize
from vla_accel_ros.models.lerobot.smolvla import PrefixKV, SmolVLAModel
from vla_accel_ros.models.load import check_checkpoint, require_family
from vla_accel_ros.training.common import KeypointHead, cosine_schedule, demo_robot, plot_loss_panels, seed_everything
from vla_accel_ros.training.configs import SmolVLATrainConfig
from vla_accel_ros.training.data import DemoDataset, action_windows, load_demos
from vla_accel_ros.training.hf_draft import episode_instructions

VLM_DIR = "vlm"
CAMERAS = ("observation.images.front", "observation.images.wrist")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
WARMUP_STEPS = 50


# --- the VLM from a Llava-layout VLA -----------------------------------------------------------
def smolvlm_config(llava: dict[str, Any], scale_factor: int) -> Any:
    """SmolVLM's config with the Llava VLA's vision tower and text model sizes."""
    from transformers import SmolVLMConfig

    vision = {k: v for k, v in llava["vision_config"].items() if k not in ("model_type", "vision_use_head", "dtype")}
    text = dict(llava["text_config"])
    side = vision["image_size"] // vision["patch_size"]
    if side % scale_factor:
        raise ValueError(f"--scale-factor {scale_factor} does not divide the tower's {side} patches per side")
    return SmolVLMConfig(vision_config=vision, text_config=text, scale_factor=scale_factor,
                         image_token_id=int(llava.get("image_token_index", llava.get("image_token_id", 0))),
                         pad_token_id=text.get("pad_token_id"))


def llava_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """The Llava VLA's vision tower and text model under SmolVLM's names (``vision_model.*``,
    ``text_model.*``); its projector and LM head are not used."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        for name in handle.keys():
            for prefix, ours in (("vision_tower.vision_model.", "vision_model."), ("vision_tower.", "vision_model."),
                                 ("model.vision_tower.", "vision_model."), ("language_model.model.", "text_model."),
                                 ("model.language_model.", "text_model.")):
                if name.startswith(prefix):
                    out.setdefault(ours + name[len(prefix):], handle.get_tensor(name).to(torch.float32))
                    break
    return out


def policy_config(cfg: SmolVLATrainConfig, image_size: int, state_dim: int, action_dim: int) -> dict[str, Any]:
    """The ``config.json`` of the trained policy (LeRobot's SmolVLA fields this package reads)."""
    visual = {"type": "VISUAL", "shape": [3, image_size, image_size]}
    return {
        "type": "smolvla", "n_obs_steps": 1,
        "input_features": {"observation.state": {"type": "STATE", "shape": [state_dim]},
                           **{name: dict(visual) for name in CAMERAS}},
        "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
        "device": "cpu", "chunk_size": cfg.chunk_size, "n_action_steps": cfg.chunk_size,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "max_state_dim": 32, "max_action_dim": 32, "resize_imgs_with_padding": [image_size, image_size],
        "empty_cameras": 0, "tokenizer_max_length": cfg.tokenizer_max_length, "num_steps": 10,
        "freeze_vision_encoder": True, "train_expert_only": False, "train_state_proj": True,
        "vlm_model_name": VLM_DIR, "load_vlm_weights": True, "add_image_special_tokens": False,
        "attention_mode": "cross_attn", "prefix_length": 0, "pad_language_to": "max_length",
        "num_expert_layers": 0, "num_vlm_layers": cfg.vlm_layers, "self_attn_every_n_layers": 2,
        "expert_width_multiplier": 0.75, "min_period": 4e-3, "max_period": 4.0, "optimizer_lr": cfg.lr,
    }


def build_model(cfg: SmolVLATrainConfig, out: Path, config: dict[str, Any]) -> tuple[SmolVLAModel, Any]:
    """The model with the VLM's trained parts loaded, and the tokenizer; writes ``out/vlm``."""
    from transformers import AutoTokenizer

    require_family(cfg.vlm_from, "hf", "--vlm-from")
    check_checkpoint(cfg.vlm_from)  # its files complete, its statistics present: a VLA trained with train-hf
    source = CheckpointRef.parse(cfg.vlm_from).directory
    llava_path = source / "config.json"
    llava = json.loads(llava_path.read_text())
    if llava.get("model_type") != "llava":
        raise ValueError(f"{llava_path}: model_type {llava.get('model_type')!r}, where --vlm-from needs a Llava VLA")
    vlm_config = smolvlm_config(llava, cfg.scale_factor)
    available = vlm_config.text_config.num_hidden_layers
    if cfg.vlm_layers > available:
        raise ValueError(f"--vlm-layers {cfg.vlm_layers}: {llava_path} has {available} text layers")
    vlm_dir = out / VLM_DIR
    vlm_dir.mkdir(parents=True, exist_ok=True)
    vlm_config.save_pretrained(str(vlm_dir))
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, vlm_dir / name)
    tokenizer = AutoTokenizer.from_pretrained(str(vlm_dir), local_files_only=True)
    model = SmolVLAModel(parse_config(out / "config.json", config), vlm_config)
    trained = llava_tensors(source)
    vlm_state = model.vlm.state_dict()
    loaded = {k: v for k, v in trained.items() if k in vlm_state and vlm_state[k].shape == v.shape}
    missing = [k for k in vlm_state if k.startswith(("vision_model.", "text_model.")) and k not in loaded]
    if missing:
        raise ValueError(f"{source / 'model.safetensors'}: no tensor for {missing[0]} "
                         f"(and {len(missing) - 1} more) of the VLM")
    model.vlm.load_state_dict(loaded, strict=False)
    with torch.no_grad():  # SmolVLA scales language embeddings by sqrt(width); the VLA fed them unscaled
        embeddings = model.vlm.text_model.get_input_embeddings().weight
        embeddings /= math.sqrt(embeddings.shape[1])
    return model.to(torch.float32), tokenizer


def fit_connector(model: SmolVLAModel, source: Path, images: torch.Tensor, n_images: int = 256) -> float:
    """Start the connector (one linear map, scale factor 1) as the least-squares fit of the VLA's
    projector on ``n_images`` demo images, so that SmolVLA's image embeddings (connector output
    times sqrt(width)) begin as the VLA's; returns the fit's relative residual."""
    from safetensors import safe_open

    with safe_open(str(source / "model.safetensors"), framework="pt") as handle:
        names = [n for n in handle.keys() if ".multi_modal_projector." in f".{n}"]
        projector = {n.split("multi_modal_projector.")[1]: handle.get_tensor(n).to(torch.float32) for n in names}
    if set(projector) != {"linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"}:
        raise ValueError(f"{source / 'model.safetensors'}: no two-layer multi_modal_projector to fit the connector to")
    pick = torch.linspace(0, len(images) - 1, min(n_images, len(images))).long()
    pixels = images[pick].permute(0, 3, 1, 2).to(torch.float32) / 127.5 - 1.0
    with torch.inference_mode():
        out = model.vlm.vision_model(pixel_values=pixels, patch_attention_mask=None, output_hidden_states=True)
        tower, llava_input = out.last_hidden_state.flatten(0, 1), out.hidden_states[-1].flatten(0, 1)
        hidden = F.gelu(F.linear(llava_input, projector["linear_1.weight"], projector["linear_1.bias"]))
        want = F.linear(hidden, projector["linear_2.weight"], projector["linear_2.bias"]) / math.sqrt(hidden.shape[1])
        weight = torch.linalg.lstsq(tower, want).solution.T
        model.vlm.connector.modality_projection.proj.weight.copy_(weight)
        return float((tower @ weight.T - want).norm() / want.norm())


def start_from(model: SmolVLAModel, stats: dict[str, dict[str, torch.Tensor]], cfg: SmolVLATrainConfig,
               config: dict[str, Any]) -> None:
    """Load ``cfg.init``'s weights into ``model`` and its mean/std into ``stats`` (``--init``)."""
    from vla_accel_ros.models.lerobot.checkpoint import load_lerobot

    path = Path(cfg.init) / "config.json"
    require_family(cfg.init, "lerobot", "--init")
    given = json.loads(path.read_text())
    for key in ("type", "num_vlm_layers", "chunk_size", "input_features", "output_features"):
        if given.get(key) != config[key]:
            raise ValueError(f"{path}: {key} {given.get(key)!r}, where this run builds {config[key]!r}")
    policy = load_lerobot(cfg.init, dtype="float32")
    if policy.model.vlm.config.scale_factor != cfg.scale_factor:
        raise ValueError(f"{path}: its VLM's pixel shuffle is {policy.model.vlm.config.scale_factor}, "
                         f"where --scale-factor is {cfg.scale_factor}")
    model.load_state_dict(policy.model.state_dict())
    for feature, normaliser in (("observation.state", policy.statistics.state), ("action", policy.statistics.action)):
        stats[feature].update({k: normaliser.stats[k] for k in ("mean", "std")})


# --- data --------------------------------------------------------------------------------------
def vision_features(model: SmolVLAModel, images: torch.Tensor, batch_size: int = 128,
                    progress: bool = True, desc: str = "vision features") -> torch.Tensor:
    """The frozen tower's features (N, patches, width) of (N, H, W, 3) uint8 images, in [-1, 1] as
    SmolVLA feeds them; kept in bfloat16 (half the memory of a large demo set), read in float32."""
    out = []
    with torch.inference_mode():
        for start in progress_bar(range(0, len(images), batch_size), desc=desc, unit="batch", disable=not progress):
            pixels = images[start:start + batch_size].permute(0, 3, 1, 2).to(torch.float32) / 127.5 - 1.0
            out.append(model.vlm.vision_model(pixel_values=pixels, patch_attention_mask=None).last_hidden_state
                       .to(torch.bfloat16))
    return torch.cat(out)


def moments(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"mean": x.mean(dim=0), "std": x.std(dim=0).clamp_min(1e-6), "min": x.min(dim=0).values,
            "max": x.max(dim=0).values}


class FlowBatches:
    """The demo set as the trainer reads it: cached vision features, tokenized instructions,
    normalised padded states and action chunks."""

    def __init__(self, model: SmolVLAModel, data: DemoDataset, instructions: list[str], tokenizer: Any,
                 settings: dict[str, Any], stats: dict[str, dict[str, torch.Tensor]], chunk: int,
                 progress: bool) -> None:
        if data.wrist_images is None:
            raise ValueError("the demos hold no wrist_images: record them with vla-accel demos --wrist")
        self.features = [vision_features(model, data.images, progress=progress, desc="front camera features"),
                         vision_features(model, data.wrist_images, progress=progress, desc="wrist camera features")]
        ids, masks = zip(*(tokenize(tokenizer, text, settings) for text in instructions), strict=True)
        self.lang_ids = torch.cat(ids)[data.episode]
        self.lang_masks = torch.cat(masks)[data.episode]
        state = (data.proprio - stats["observation.state"]["mean"]) / stats["observation.state"]["std"]
        self.state = F.pad(state, (0, 32 - state.shape[1]))
        # the probe's targets: where the named cube is (a fact of the scene, read from the images
        # alone) and where the gripper is, in AUX_SCALE_M units (data.aux holds cube - gripper, gripper)
        self.aux = torch.cat([data.aux[:, :3] + data.aux[:, 3:], data.aux[:, 3:]], dim=1)
        self.keypoints = data.keypoint_targets  # (N, 2, 2): the named cube and the TCP in the front image
        self.front_tokens = self.features[0].shape[1] // model.vlm.config.scale_factor ** 2  # after the pixel shuffle
        actions = (data.actions - stats["action"]["mean"]) / stats["action"]["std"]
        windows = action_windows(actions, data.episode, chunk).reshape(len(actions), chunk, -1)
        self.actions = F.pad(windows, (0, 32 - windows.shape[2]))


def prefix_of(model: SmolVLAModel, batches: FlowBatches, idx: torch.Tensor,
              state_dropout: float = 0.0, generator: torch.Generator | None = None) -> PrefixKV:
    """The prefix keys and values of demo steps ``idx`` (the connector and text layers with grad),
    the state of a ``state_dropout`` share of them zeroed."""
    state = batches.state[idx]
    if state_dropout > 0:
        keep = torch.rand(len(idx), generator=generator) >= state_dropout
        state = state * keep[:, None]
    tokens = []
    for features in batches.features:
        embedded = model.vlm.connector(features[idx].float())
        tokens.append(embedded * math.sqrt(embedded.shape[-1]))
    masks = [torch.ones(len(idx), dtype=torch.bool) for _ in tokens]
    return model.run_prefix(*model.embed_prefix(tokens, masks, batches.lang_ids[idx], batches.lang_masks[idx], state))


def repeat_prefix(prefix: PrefixKV, n: int) -> PrefixKV:
    def rep(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(n, dim=0)

    return PrefixKV(tuple(map(rep, prefix.keys)), tuple(map(rep, prefix.values)), rep(prefix.pad_masks),
                    rep(prefix.n_valid))


class TrainingAids(torch.nn.Module):
    """What trains beside the policy and is not saved: the probe on the state token (where the named
    cube and the gripper are) and the keypoint head on the front camera's tokens."""

    def __init__(self, width: int, aux_dim: int, n_keypoints: int, grid: int, aux_weight: float,
                 keypoint_weight: float) -> None:
        super().__init__()
        self.probe = torch.nn.Linear(width, aux_dim)
        self.keypoints = KeypointHead(width, n_keypoints, grid)
        self.aux_weight, self.keypoint_weight = aux_weight, keypoint_weight

    def loss(self, prefix: PrefixKV, batches: FlowBatches, idx: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(())
        if self.aux_weight > 0:
            total = total + self.aux_weight * probe_loss(prefix, batches.aux[idx], self.probe)
        if self.keypoint_weight > 0:
            total = total + self.keypoint_weight * keypoint_loss(prefix, batches, idx, self.keypoints)
        return total


def probe_loss(prefix: PrefixKV, want: torch.Tensor, probe: torch.nn.Module) -> torch.Tensor:
    """The auxiliary probe's squared error on the state token's state at the last layer's input (rows with targets)."""
    known = torch.isfinite(want).all(dim=1)
    if prefix.last_input is None or not known.any():
        return torch.zeros(())
    return F.mse_loss(probe(prefix.last_input[:, -1].to(torch.float32))[known], want[known])


def keypoint_loss(prefix: PrefixKV, batches: FlowBatches, idx: torch.Tensor, head: KeypointHead) -> torch.Tensor:
    """The keypoint head's loss on the front camera's image tokens (the prefix's first ones)."""
    if prefix.last_input is None:
        return torch.zeros(())
    states = prefix.last_input[:, :batches.front_tokens].to(torch.float32)
    return head.loss(states, batches.keypoints[idx])


def flow_loss(model: SmolVLAModel, batches: FlowBatches, idx: torch.Tensor, n_noise: int,
              generator: torch.Generator, aids: TrainingAids | None = None,
              state_dropout: float = 0.0) -> torch.Tensor:
    """LeRobot's flow-matching loss over ``n_noise`` (noise, t) draws per prefix (module docstring),
    plus the training aids' weighted losses."""
    prefix = prefix_of(model, batches, idx, state_dropout, generator)
    aux = aids.loss(prefix, batches, idx) if aids is not None else torch.zeros(())
    prefix = repeat_prefix(prefix, n_noise)
    actions = batches.actions[idx].repeat_interleave(n_noise, dim=0)
    noise = torch.randn(actions.shape, generator=generator)
    beta = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0))
    t = beta.sample((len(actions),)) * 0.999 + 0.001
    x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
    return F.mse_loss(model.velocity(prefix, x_t, t), noise - actions) + aux


def sample_chunks(model: SmolVLAModel, batches: FlowBatches, idx: torch.Tensor, steps: int,
                  generator: torch.Generator) -> torch.Tensor:
    """Normalised chunks (B, H, 32) by ``steps`` Euler steps from noise, as the policy samples."""
    with torch.inference_mode():
        prefix = prefix_of(model, batches, idx)
        x = torch.randn(batches.actions[idx].shape, generator=generator)
        for step in range(steps):
            t = torch.full((len(idx),), 1.0 - step / steps)
            x = x - model.velocity(prefix, x, t) / steps
    return x


def evaluate(model: SmolVLAModel, batches: FlowBatches, val_idx: torch.Tensor, action_dim: int, seed: int,
             batch_size: int, aids: TrainingAids) -> dict[str, float]:
    """Held-out flow loss, the 10- and 2-step chunks' mean |error| against the expert (normalised
    units), the auxiliary probe's squared error and the keypoint head's loss."""
    generator = torch.Generator().manual_seed(seed + 1)
    model.eval()
    losses, errors10, errors2, aux, keypoints = [], [], [], [], []
    with torch.inference_mode():
        for idx in val_idx.split(batch_size):
            losses.append(float(flow_loss(model, batches, idx, 1, generator)) * len(idx))
            prefix = prefix_of(model, batches, idx)
            aux.append(float(probe_loss(prefix, batches.aux[idx], aids.probe)) * len(idx))
            keypoints.append(float(keypoint_loss(prefix, batches, idx, aids.keypoints)) * len(idx))
            want = batches.actions[idx][..., :action_dim]
            errors10.append(float((sample_chunks(model, batches, idx, 10, generator)[..., :action_dim] - want)
                                  .abs().mean()) * len(idx))
            errors2.append(float((sample_chunks(model, batches, idx, 2, generator)[..., :action_dim] - want)
                                 .abs().mean()) * len(idx))
    model.train()
    n = max(1, len(val_idx))
    return {"val_flow_loss": sum(losses) / n, "val_abs_error_10_steps": sum(errors10) / n,
            "val_abs_error_2_steps": sum(errors2) / n, "val_aux_loss": sum(aux) / n,
            "val_keypoint_loss": sum(keypoints) / n}


def plot_losses(history: dict[str, list[float]], path: Path) -> None:
    def draw(ax: Any, key: str) -> None:
        ax.plot(history[key], alpha=0.6)
        ax.set_yscale("log")

    plot_loss_panels(path, (("flow matching (train, per step)", "train"), ("held-out flow loss (per epoch)", "val")),
                     (10, 3.5), draw)


# --- the run -----------------------------------------------------------------------------------
def train_smolvla(cfg: SmolVLATrainConfig) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_demos(cfg.data, 64, cfg.max_episodes, progress=cfg.progress)
    instructions = episode_instructions(cfg.data, data)
    train_idx, val_idx = data.split(cfg.val_fraction)
    state_dim, action_dim = data.proprio.shape[1], data.actions.shape[1]
    config = policy_config(cfg, data.image_size, state_dim, action_dim)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    model, tokenizer = build_model(cfg, out, config)
    stats = {"observation.state": moments(data.proprio[train_idx]), "action": moments(data.actions[train_idx])}
    if cfg.init:
        start_from(model, stats, cfg, config)
    settings = {"max_length": cfg.tokenizer_max_length, "truncation": True, "padding": "max_length",
                "padding_side": "right"}
    if cfg.scale_factor == 1 and not cfg.init:
        residual = fit_connector(model, CheckpointRef.parse(cfg.vlm_from).directory, data.images)
        print(f"connector fitted to {cfg.vlm_from}'s projector (relative residual {residual:.3f})", flush=True)
    batches = FlowBatches(model, data, instructions, tokenizer, settings, stats, cfg.chunk_size, cfg.progress)

    model.vlm.vision_model.requires_grad_(False)
    grid = math.isqrt(batches.front_tokens)
    aids = TrainingAids(model.vlm.text_model.config.hidden_size, batches.aux.shape[1], batches.keypoints.shape[1],
                        grid, cfg.aux_weight, cfg.keypoint_weight)
    text_params = list(model.vlm.text_model.parameters())
    text_ids = {id(p) for p in text_params}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in text_ids] + list(aids.parameters())
    optimizer = torch.optim.AdamW([{"params": rest, "lr": cfg.lr},
                                   {"params": text_params, "lr": cfg.lr * cfg.vlm_lr_scale}], weight_decay=1e-4)
    base = [group["lr"] for group in optimizer.param_groups]
    generator = torch.Generator().manual_seed(cfg.seed)
    steps_per_epoch = math.ceil(len(train_idx) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    history: dict[str, list[float]] = {"train": [], "val": []}
    epochs: list[dict[str, float]] = []
    trainable = [p for p in model.parameters() if p.requires_grad] + list(aids.parameters())
    model.train()
    step = 0
    with progress_bar(total=total, desc="smolvla flow matching", disable=not cfg.progress) as bar:
        for epoch in range(cfg.epochs):
            for batch in train_idx[torch.randperm(len(train_idx), generator=generator)].split(cfg.batch_size):
                scale = cosine_schedule(step, total, WARMUP_STEPS)
                for group, lr in zip(optimizer.param_groups, base, strict=True):
                    group["lr"] = lr * scale
                loss = flow_loss(model, batches, batch, cfg.noise_samples, generator, aids, cfg.state_dropout)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optimizer.step()
                history["train"].append(float(loss.detach()))
                bar.update(1)
                bar.set_postfix(loss=f"{history['train'][-1]:.4f}")
                step += 1
            if len(val_idx):
                metrics = evaluate(model, batches, val_idx, action_dim, cfg.seed, 256, aids)
                history["val"].append(metrics["val_flow_loss"])
                epochs.append({"epoch": epoch + 1, **metrics})
                print(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)

    model.eval()
    write_policy_directory(out, config, model, {k: {s: v[s] for s in ("mean", "std", "min", "max")}
                                                for k, v in stats.items()}, VLM_DIR)
    (out / "vla_spec.json").write_text(json.dumps({"robot": demo_robot(data.image_size).to_json()}, indent=2))
    plot_losses(history, out / "loss_curves.png")
    metrics = {**(epochs[-1] if epochs else {}), "train_seconds": round(time.perf_counter() - start, 1),
               "n_train_steps": int(len(train_idx)), "n_val_steps": int(len(val_idx)),
               "n_parameters": sum(p.numel() for p in model.parameters())}
    recipe = {**{k: v for k, v in asdict(cfg).items() if k != "progress"}, "data": str(Path(cfg.data).resolve()),
              "optimizer": "AdamW", "schedule": "linear warm-up + cosine to 10%",
              "loss": "flow matching, t ~ Beta(1.5, 1), every padded action dimension"}
    record = {"command": "vla-accel " + " ".join(sys.argv[1:]), "recipe": recipe, "epochs": epochs, "metrics": metrics}
    (out / "training.json").write_text(json.dumps(record, indent=2))
    print(f"SmolVLA-structured policy written to {out} (loss plot loss_curves.png)")
    return metrics
