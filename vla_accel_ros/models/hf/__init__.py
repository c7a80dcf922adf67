"""Hugging Face VLAs in Llava's layout with OpenVLA's action tokens (``config.json`` with a Llava-style
``model_type``, safetensors weights, ``vla_spec.json`` optional): the policy, its direct forward,
its incremental prefill and its draft head."""
