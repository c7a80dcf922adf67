"""Hugging Face VLAs in Llava's layout with OpenVLA's action tokens (``config.json`` with a Llava-style
``model_type``, safetensors weights, ``vla_spec.json`` optional): their registration
(:mod:`.family`), what their ``config.json`` must say (:mod:`.config`), the model half of the
token-VLA passes (:mod:`.modules`) and its direct forward (:mod:`.direct`), the policy
(:mod:`.policy`) and the loader (:mod:`.checkpoint`). The passes, the incremental prefill and the
draft head are the token VLAs' (:mod:`vla_accel_ros.models.token_vla`)."""
