"""The package's own VLA family: a small plain-PyTorch target (patch-local vision, global vision layers,
a causal decoder over 7 action tokens), its draft, contact, flow and world components, the policy
bundle the decoders drive, its incremental prefill, and checkpoint I/O (``model.json`` +
safetensors)."""
