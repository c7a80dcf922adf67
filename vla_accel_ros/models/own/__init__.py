"""The package's own VLA family: its registration (:mod:`.family`), its configuration
(:mod:`.config`), the target VLA (:mod:`.modules`: patch-local vision, global vision layers, a
causal decoder over 7 action tokens) and its per-patch encoder (:mod:`.patch_encoder`), its draft
and contact heads (:mod:`.draft`), continuous action head (:mod:`.flow`) and world-aware prefill
(:mod:`.world`), the policy bundle the decoders drive (:mod:`.policy`), its incremental prefill
(:mod:`.incremental`), and checkpoint I/O (:mod:`.checkpoint`: ``model.json`` + safetensors)."""
