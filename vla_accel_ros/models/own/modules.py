"""The target VLA: patch-local vision encoder, global vision transformer, byte-level instruction,
proprioception token and a causal decoder with a KV cache that emits 7 action tokens.

Decoder sequence (positions):  [vision (P) | text (T) | proprio (1) | BOS (1) | a0 .. a6]
The prefix ends with BOS, so the decoder's hidden state at the prefix's last position already
predicts the first action token. Every decoder hidden state returned here is the final-norm
output, i.e. exactly what the LM head reads (and what the draft head uses as its "feature").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from vla_accel_ros.models.kernels import dense, layer_norm
from vla_accel_ros.models.layers import Block, KeysValues, KVCache, extension_mask
from vla_accel_ros.models.own.config import VLAConfig
from vla_accel_ros.models.own.patch_encoder import PatchEncoder
from vla_accel_ros.models.tokenizer import BOS, N_BINS, TEXT_PAD, TEXT_VOCAB

AUX_OUTPUTS = 6


@dataclass(frozen=True, eq=False)
class PrefixState:
    """What a pass over the observation prefix leaves for a later frame's partial pass.

    vision_kv / decoder_kv: per layer the keys and values (2, 1, H, P or L, hd); vision: (1, P, d)
    patch tokens after the global layers; hidden: (1, L, d) final-norm decoder states of the prefix;
    trailing_positions: the positions of the tokens an image change always recomputes (the
    keypoint token, if any, proprioception, BOS).
    """

    vision_kv: tuple[KeysValues, ...]
    vision: torch.Tensor
    decoder_kv: tuple[KeysValues, ...]
    hidden: torch.Tensor
    trailing_positions: torch.Tensor


@dataclass(frozen=True, eq=False)
class PrefixPass:
    """One pass over an observation prefix (and the action tokens after it): action_hidden (B, k+1, d)
    the final-norm states at the prefix's end and at each action token; pooled (B, d) their mean over
    the prefix; kv per layer (k, v) over prefix and actions; prefix_len; state, for a later partial
    pass (None unless asked for)."""

    action_hidden: torch.Tensor
    pooled: torch.Tensor
    kv: KVCache
    prefix_len: int
    state: PrefixState | None = None


class VLATarget(nn.Module):
    def __init__(self, config: VLAConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.patch_encoder = PatchEncoder(config.patch_size, config.local_channels, d, config.keypoints)
        if config.keypoints:
            side = config.image_size // config.patch_size
            gy, gx = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
            self.register_buffer(
                "patch_xy", torch.stack([gx.flatten(), gy.flatten()], dim=-1).to(torch.float32), persistent=False
            )
            self.keypoint_mlp = nn.Sequential(nn.Linear(2 * config.keypoints, d), nn.GELU(), nn.Linear(d, d))
        self.vision_pos = nn.Parameter(torch.zeros(config.n_patches, d))
        self.vision_blocks = nn.ModuleList(
            Block(d, config.n_heads, config.mlp_ratio) for _ in range(config.vision_layers)
        )
        self.vision_ln = nn.LayerNorm(d)
        self.text_emb = nn.Embedding(TEXT_VOCAB, d)
        # The FiLM condition: a plain mean of byte embeddings lets the few bytes of the colour word
        # drown in the rest of the sentence (measured: the same grounding for every colour), so
        # a small encoder with byte positions first mixes the sentence, then it is pooled.
        if config.text_layers:
            self.text_pos = nn.Parameter(torch.zeros(config.max_text_len, d))
            self.text_blocks = nn.ModuleList(
                Block(d, config.n_heads, config.mlp_ratio) for _ in range(config.text_layers)
            )
            self.text_ln = nn.LayerNorm(d)
        self.proprio_proj = nn.Linear(config.proprio_dim, d)
        self.action_emb = nn.Embedding(N_BINS + 1, d)  # 256 bins + BOS
        self.pos_emb = nn.Parameter(torch.zeros(config.max_len, d))
        self.blocks = nn.ModuleList(Block(d, config.n_heads, config.mlp_ratio) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, N_BINS, bias=False)
        # Training-only auxiliary head on the hidden state at BOS: where the named cube is relative
        # to the gripper, and where the gripper is. Supervising it teaches the prefix to ground the
        # instruction in the image and the joints in space, which the action tokens then read.
        self.aux_head = nn.Linear(d, AUX_OUTPUTS)
        self.apply(self._init_weights)
        nn.init.zeros_(self.patch_encoder.film.weight)  # FiLM starts as the identity
        nn.init.zeros_(self.patch_encoder.film.bias)
        if config.keypoints:  # peaked enough at the start that each keypoint already has a location
            nn.init.normal_(self.patch_encoder.keypoint_logits.weight, std=config.local_channels**-0.5)
        nn.init.normal_(self.vision_pos, std=0.02)
        if config.text_layers:
            nn.init.normal_(self.text_pos, std=0.02)
        nn.init.normal_(self.pos_emb, std=0.02)
        for name, param in self.named_parameters():  # GPT-2 style scaled init of residual projections
            if name.endswith("proj.weight") and "patch_encoder" not in name and "proprio" not in name:
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    # --- vision -------------------------------------------------------------------------------
    def patch_bytes(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, H, W, 3) -> their patches (B, P, 3, ps, ps), still uint8, row-major."""
        c = self.config
        if images.dim() != 4 or tuple(images.shape[1:]) != (c.image_size, c.image_size, 3):
            raise ValueError(f"images must be (B, {c.image_size}, {c.image_size}, 3), got {tuple(images.shape)}")
        b, g, ps = images.shape[0], c.image_size // c.patch_size, c.patch_size
        x = images.view(b, g, ps, g, ps, 3).permute(0, 1, 3, 5, 2, 4)  # B, gy, gx, 3, ps, ps
        return x.reshape(b, g * g, 3, ps, ps)

    @staticmethod
    def patch_pixels(patch_bytes: torch.Tensor) -> torch.Tensor:
        """uint8 patches (any shape) -> float pixels in [-1, 1], the encoder's input scale (a float
        tensor on the 0..255 scale is scaled in place)."""
        return patch_bytes.to(torch.float32).mul_(2.0 / 255.0).sub_(1.0)

    def patch_cells(self, images: torch.Tensor, patches: torch.Tensor | None = None) -> torch.Tensor:
        """Images (B, H, W, 3), uint8 or float32 on the 0..255 scale -> the patch encoder's input
        (B, P', cells, 3*SUB*SUB) in [-1, 1] (``patch_encoder.cells(patchify(images))``), for every
        patch or only those numbered ``patches`` (P',). One gather straight from the image: the
        incremental encoder takes a few patches of each frame, and copying the whole image into
        patch order first cost more than encoding them."""
        c = self.config
        if images.dim() != 4 or tuple(images.shape[1:]) != (c.image_size, c.image_size, 3):
            raise ValueError(f"images must be (B, {c.image_size}, {c.image_size}, 3), got {tuple(images.shape)}")
        if images.dtype not in (torch.uint8, torch.float32):
            raise ValueError(f"images must be uint8 or float32, got {images.dtype}")
        b = images.shape[0]
        if patches is None:
            x = self._cell_order(images).reshape(b, c.n_patches, *self.patch_cell_shape)
        else:  # a gather through a table of pixel offsets: a third of the time of indexing the view
            if b != 1:
                raise ValueError(f"patch_cells takes a subset of patches of one image, got a batch of {b}")
            x = images.reshape(-1).index_select(0, self.cell_offsets(patches)).view(1, len(patches),
                                                                                    *self.patch_cell_shape)
        # a copy either way (gather, reshape of a permuted view or dtype change): scaled in place
        return self.patch_pixels(x)

    @property
    def patch_cell_shape(self) -> tuple[int, int]:
        """(cells per patch, values per cell): a patch's shape at the patch encoder's input."""
        return self.patch_encoder.grid**2, 3 * PatchEncoder.SUB**2

    def _cell_order(self, images: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) -> a view (B, patch row, patch column, cell row, cell column, channel, row
        in cell, column in cell): the order of ``patch_encoder.cells``."""
        side, g, s = self.config.image_size // self.config.patch_size, self.patch_encoder.grid, PatchEncoder.SUB
        return images.reshape(images.shape[0], side, g, s, side, g, s, 3).permute(0, 1, 4, 2, 5, 7, 3, 6)

    def cell_offsets(self, patches: torch.Tensor) -> torch.Tensor:
        """Where the stem inputs of the patches numbered ``patches`` (P',) lie in a flat image
        (H*W*3,): (P' * cells * 3*SUB*SUB,) long, in the order of :meth:`patch_cells`."""
        return self._cell_offsets(patches.device).index_select(0, patches).view(-1)

    def _cell_offsets(self, device: torch.device) -> torch.Tensor:
        """(P, cells * 3*SUB*SUB) long: where each of a patch's stem inputs lies in a flat image."""
        cached = self.__dict__.get("_cell_offsets_cache")
        if cached is None or cached.device != device:
            size = self.config.image_size
            with torch.inference_mode(False):  # a plain tensor, usable in and out of inference mode
                flat = torch.arange(size * size * 3, device=device).view(1, size, size, 3)
                cached = self._cell_order(flat).reshape(self.config.n_patches, -1)
            self.__dict__["_cell_offsets_cache"] = cached
        return cached

    def encode_images(self, images: torch.Tensor, film: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Local encodings (B, P, local_width) of images (B, H, W, 3) under an instruction's
        ``patch_encoder.film_params`` (inference: the fewest copies of the pixels)."""
        return self.patch_encoder.encode_cells(self.patch_cells(images), film=film)

    def encode_patches_of(self, pixels: torch.Tensor, patches: torch.Tensor,
                          film: tuple[torch.Tensor, torch.Tensor] | None, *,
                          reference: torch.Tensor | None = None) -> torch.Tensor:
        """Local encodings (1, P', local_width) of the patches numbered ``patches`` (P',) of one image's
        pixels (H, W, 3) on the 0..255 scale (float), under an instruction's FiLM; their pixels are
        also copied into ``reference`` (H, W, 3), when given (an incremental encoder's reference)."""
        offsets = self.cell_offsets(patches)
        values = pixels.reshape(-1).index_select(0, offsets)
        if reference is not None:
            reference.view(-1).index_copy_(0, offsets, values)
        cells = self.patch_pixels(values).view(1, len(patches), *self.patch_cell_shape)
        return self.patch_encoder.encode_cells(cells, film=film)

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, H, W, 3) -> patch pixels (B, P, 3, ps, ps) float in [-1, 1], row-major."""
        return self.patch_pixels(self.patch_bytes(images))

    def instruction_condition(self, text: torch.Tensor) -> torch.Tensor:
        """Instruction ids (B, T) -> FiLM condition (B, d): the mean over non-padding bytes of their
        embeddings, after ``text_layers`` transformer layers when there are any."""
        keep_mask = text != TEXT_PAD
        x = self.text_emb(text)
        if self.config.text_layers:
            x = x + self.text_pos[: text.shape[1]]
            attend = keep_mask | ~keep_mask.any(dim=1, keepdim=True)  # an all-padding text attends to all
            for block in self.text_blocks:
                x, _ = block(x, causal=False, key_mask=attend)
            x = self.text_ln(x)
        keep = keep_mask.unsqueeze(-1).to(torch.float32)
        return (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)

    def encode_patches(self, patch_pixels: torch.Tensor, text: torch.Tensor | None = None) -> torch.Tensor:
        """Per-patch local encodings (B, P', local_width) for any subset of patches (B, P', 3, ps, ps), conditioned
        on the instruction ids ``text`` (B, T) when given."""
        condition = None if text is None else self.instruction_condition(text)
        return self.patch_encoder(patch_pixels, condition)

    def keypoint_positions(self, local: torch.Tensor) -> torch.Tensor:
        """Local encodings (B, P, d + 3K) of all patches -> the K spatial-softmax keypoints (B, K, 2),
        image x and y in [-1, 1]."""
        c, d, k = self.config, self.config.d_model, self.config.keypoints
        b, p = local.shape[:2]
        patch_weight = torch.softmax(local[..., d : d + k], dim=1)  # (B, P, K): softmax over all patches
        offset = local[..., d + k :].reshape(b, p, 2, k)
        xy = (self.patch_xy[None, :, :, None] + offset) * (2.0 * c.patch_size / c.image_size) - 1.0
        return (patch_weight.unsqueeze(2) * xy).sum(dim=1).transpose(1, 2)  # (B, K, 2); einsum costs 5x more here

    def add_patch_bias(self, local_tokens: torch.Tensor, patch_bias: torch.Tensor | None) -> torch.Tensor:
        """Local encodings (B, P, local_width) with a bias (B, P, d) added to their token part only
        (the world-aware prefill, :mod:`vla_accel_ros.models.own.world`): keypoint channels, and so the
        keypoint token, stay as they are. A new tensor; ``local_tokens`` (maybe a cache) is untouched."""
        if patch_bias is None:
            return local_tokens
        d = self.config.d_model
        b, p = local_tokens.shape[:2]
        if tuple(patch_bias.shape) != (b, p, d):
            raise ValueError(f"patch_bias must be ({b}, {p}, {d}), got {tuple(patch_bias.shape)}")
        if local_tokens.shape[-1] == d:
            return local_tokens + patch_bias
        return torch.cat([local_tokens[..., :d] + patch_bias, local_tokens[..., d:]], dim=-1)

    def global_vision(self, local_tokens: torch.Tensor) -> torch.Tensor:
        """Local encodings (B, P, local_width) of all patches -> vision tokens (B, n_vision_tokens, d)
        (position embeddings added here; the keypoint token, if any, comes last)."""
        x, _ = self.vision_transformer(local_tokens)
        if not self.config.keypoints:
            return x
        return torch.cat([x, self.keypoint_token(local_tokens)], dim=1)

    def vision_transformer(
        self,
        local_tokens: torch.Tensor,
        patches: torch.Tensor | None = None,
        past: tuple[KeysValues, ...] | None = None,
    ) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor] | KeysValues, ...]]:
        """The patch tokens after the global vision layers and their norm (the keypoint token
        aside), and each layer's keys and values, from local encodings (B, P, local_width) of all
        patches: (B, P, d) and per layer (k, v), each (B, H, P, hd).

        With ``patches`` (P',) and ``past``, per layer the stacked keys and values (2, B, H, P, hd)
        of every patch as last computed, only the tokens of the patches numbered ``patches`` are
        computed, (B, P', d), attending to ``past`` for the others; the keys and values come back
        stacked, those patches' replaced (new tensors)."""
        d = self.config.d_model
        if patches is None:
            x = local_tokens[..., :d] + self.vision_pos
        else:
            x = local_tokens[:, patches, :d] + self.vision_pos[patches]
        kv = []
        for i, block in enumerate(self.vision_blocks):  # forward called directly, see Block.forward
            x, layer_kv = block.forward(x, None if past is None else past[i], causal=False, positions=patches)
            kv.append(layer_kv)
        return layer_norm(self.vision_ln, x), tuple(kv)

    def keypoint_token(self, local_tokens: torch.Tensor) -> torch.Tensor:
        """Local encodings (B, P, local_width) of all patches -> the keypoint token (B, 1, d)."""
        mlp = self.keypoint_mlp
        return dense(dense(self.keypoint_positions(local_tokens).flatten(1), mlp[0], gelu=True), mlp[2]).unsqueeze(1)

    # --- decoder ------------------------------------------------------------------------------
    def embed_prefix(self, vision: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """Decoder input embeddings (B, prefix_len, d): vision tokens, text ids (B, T), normalised proprio (B, 8)."""
        x = torch.cat([vision, self.text_emb(text), self.prefix_tail(proprio)], dim=1)
        return x + self.pos_emb[: x.shape[1]]

    def prefix_tail(self, proprio: torch.Tensor) -> torch.Tensor:
        """The prefix's last two tokens (B, 2, d), before position embeddings: proprioception and BOS."""
        return torch.cat(self.prefix_tail_tokens(proprio), dim=1)

    def prefix_tail_tokens(self, proprio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`prefix_tail` as its two tokens (B, 1, d) each, for a caller that concatenates more."""
        bos = self.action_emb.weight[BOS].expand(proprio.shape[0], 1, -1)
        return dense(proprio, self.proprio_proj).unsqueeze(1), bos

    def embed_at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Decoder input embeddings of prefix tokens x (B, s, d) (before position embeddings) placed
        at the decoder positions ``positions`` (s,)."""
        return x + self.pos_emb[positions]

    def embed_actions(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Embeddings of action tokens (B, k) placed at decoder positions start .. start+k-1."""
        end = start + tokens.shape[1]
        if end > self.config.max_len:
            raise ValueError(
                f"decoder positions {start}..{end - 1} exceed the maximum {self.config.max_len - 1} "
                f"(at most {self.config.n_action_tokens} action tokens after the prefix)"
            )
        return self.action_emb(tokens) + self.pos_emb[start:end]

    def decode(
        self,
        x: torch.Tensor,
        past: KVCache | tuple[KeysValues, ...] | None = None,
        positions: torch.Tensor | None = None,
        n_outputs: int | None = None,
    ) -> tuple[torch.Tensor, KVCache | tuple[KeysValues, ...]]:
        """Run the causal decoder over embeddings x (B, t, d) after an optional cache.
        Returns final-norm hidden states (B, t, d) and the extended cache.

        With ``positions`` (s,), x's first s rows are instead the tokens at those positions of a
        sequence whose keys and values, as last computed, are ``past`` (per layer stacked,
        (2, B, H, L, hd)), and x's other rows are new tokens after it. Each token attends causally:
        a recomputed one to the positions up to its own, a new one to the whole sequence and the
        new tokens up to itself. The last layer gives outputs for the last ``n_outputs`` rows only
        (all when None), so the hidden states are (B, n_outputs or t, d); the cache comes back per
        layer stacked, the selected tokens' keys and values replaced and the new ones appended."""
        mask = None
        if positions is not None:
            assert past is not None, "recomputing selected tokens needs the sequence's keys and values"
            length, n_new = past[0].shape[3], x.shape[1] - len(positions)
            causal = extension_mask(length + n_new, 0, x.device)  # the whole sequence's causal mask
            mask = causal.index_select(0, positions)
            if n_new:
                mask = torch.cat([mask, causal[length:]])
        last = len(self.blocks) - 1
        new_cache = []
        for i, block in enumerate(self.blocks):  # forward called directly, see Block.forward
            x, kv = block.forward(x, None if past is None else past[i], causal=True, positions=positions,
                                  attn_mask=mask, n_outputs=n_outputs if i == last else None)
            new_cache.append(kv)
        return layer_norm(self.ln_f, x), tuple(new_cache)

    # --- the pass over the observation prefix -------------------------------------------------
    def forward_prefix(self, local: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor,
                       tokens: torch.Tensor | None = None, *, patch_bias: torch.Tensor | None = None,
                       past: PrefixState | None = None, dynamic: torch.Tensor | None = None,
                       keep_state: bool = False) -> PrefixPass:
        """The whole pass over an observation prefix: local encodings (B, P, local_width) of the
        image, instruction ids (B, T) and normalised proprioception (B, 8), through the global
        vision layers and the decoder, then the action ``tokens`` (B, k), if any, after the prefix.
        ``patch_bias`` (B, P, d) is added to the patch tokens first (the world-aware prefill).

        With ``past`` (a batch of one), only the patches numbered ``dynamic`` (P',), the keypoint
        token, proprioception and BOS are recomputed, attending to ``past``'s keys and values for
        the rest (incremental vision with reused keys and values); in the last decoder layer the
        changed patches give keys and values only, their hidden states staying ``past``'s.
        ``keep_state`` (or ``past``) returns what a later frame's partial pass reuses."""
        if past is not None:
            if dynamic is None:
                raise ValueError("forward_prefix: a partial pass over past keys and values needs the dynamic patches")
            return self._partial_prefix(local, proprio, tokens, past, dynamic)
        local = self.add_patch_bias(local, patch_bias)
        vision, vision_kv = self.vision_transformer(local)
        keypoint = [self.keypoint_token(local)] if self.config.keypoints else []
        x = self.embed_prefix(torch.cat([vision, *keypoint], dim=1) if keypoint else vision, text, proprio)
        length = x.shape[1]
        if tokens is not None and tokens.shape[1]:
            x = torch.cat([x, self.embed_actions(tokens, length)], dim=1)
        hidden, kv = self.decode(x)
        state = None
        if keep_state:
            positions = torch.arange(length, device=x.device)
            p = vision.shape[1]
            trailing = torch.cat([positions[p : p + len(keypoint)], positions[-2:]])
            state = PrefixState(tuple(torch.stack(layer) for layer in vision_kv), vision,
                                tuple(torch.stack(layer)[..., :length, :] for layer in kv), hidden[:, :length],
                                trailing)
        return PrefixPass(action_hidden=hidden[:, length - 1 :], pooled=hidden[:, :length].mean(dim=1), kv=kv,
                          prefix_len=length, state=state)

    def _partial_prefix(self, local: torch.Tensor, proprio: torch.Tensor, tokens: torch.Tensor | None,
                        past: PrefixState, dynamic: torch.Tensor) -> PrefixPass:
        """:meth:`forward_prefix` recomputing the dynamic patches and the trailing tokens alone."""
        length = past.hidden.shape[1]
        tail = self.prefix_tail_tokens(proprio)  # proprioception, BOS
        if len(dynamic) == 0:
            # An unchanged image: the vision tokens, the keypoint token (a function of the patches
            # alone) and everything the decoder computed for them stand as they are, exactly.
            vision_kv, vision, recomputed = past.vision_kv, past.vision, [*tail]
            positions = past.trailing_positions[-2:]
            n_trailing = 2
        else:
            changed, vision_kv = self.vision_transformer(local, dynamic, past.vision_kv)
            vision = past.vision.index_copy(1, dynamic, changed)
            keypoint = [self.keypoint_token(local)] if self.config.keypoints else []
            n_trailing = len(keypoint) + 2
            positions = torch.cat([dynamic, past.trailing_positions])
            recomputed = [changed, *keypoint, *tail]
        x = self.embed_at(torch.cat(recomputed, dim=1), positions)
        n_actions = 0 if tokens is None else tokens.shape[1]
        if n_actions:  # the action tokens come after the prefix: they see all of it, the prefix none of them
            x = torch.cat([x, self.embed_actions(tokens, length)], dim=1)
        # In the last layer the patch tokens give only keys and values (for the action tokens): their
        # outputs would feed nothing but the pooled feature, which keeps them from their last full
        # computation. The trailing tokens (keypoint, proprioception, BOS) are computed in full.
        out, decoder_kv = self.decode(x, past.decoder_kv, positions, n_outputs=n_trailing + n_actions)
        hidden = past.hidden.index_copy(1, past.trailing_positions if len(dynamic) else positions, out[:, :n_trailing])
        prefix_kv = decoder_kv if not n_actions else [layer[..., :length, :] for layer in decoder_kv]
        state = PrefixState(tuple(vision_kv), vision, tuple(prefix_kv), hidden, past.trailing_positions)
        action_hidden = torch.cat([hidden[:, -1:], out[:, n_trailing:]], dim=1) if n_actions else hidden[:, -1:]
        return PrefixPass(action_hidden=action_hidden, pooled=hidden.mean(dim=1),
                          kv=tuple((layer[0], layer[1]) for layer in decoder_kv), prefix_len=length, state=state)

    def vision_tokens(self, images: torch.Tensor, text: torch.Tensor | None = None) -> torch.Tensor:
        return self.global_vision(self.encode_patches(self.patchify(images), text))

    def forward(
        self,
        images: torch.Tensor,
        text: torch.Tensor,
        proprio: torch.Tensor,
        actions: torch.Tensor,
        patch_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, 7, 256): logits[:, i] predicts actions[:, i] from actions[:, :i]."""
        return self.forward_with_aux(images, text, proprio, actions, patch_bias)[0]

    def forward_with_aux(
        self,
        images: torch.Tensor,
        text: torch.Tensor,
        proprio: torch.Tensor,
        actions: torch.Tensor,
        patch_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Teacher-forced logits (B, 7, 256), the auxiliary head's prediction (B, 6) at BOS, and the
        keypoints (B, K, 2) (None without keypoints). ``patch_bias`` (B, P, d), when given, is added
        to the patch tokens exactly as the policy's prefill adds it (:meth:`add_patch_bias`)."""
        local = self.add_patch_bias(self.encode_patches(self.patchify(images), text), patch_bias)
        keypoints = self.keypoint_positions(local) if self.config.keypoints else None
        prefix = self.embed_prefix(self.global_vision(local), text, proprio)
        x = torch.cat([prefix, self.embed_actions(actions[:, :-1], prefix.shape[1])], dim=1)
        hidden, _ = self.decode(x)
        action_hidden = hidden[:, prefix.shape[1] - 1 :]
        return self.lm_head(action_hidden), self.aux_head(action_hidden[:, 0]), keypoints


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
