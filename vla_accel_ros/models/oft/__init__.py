"""OpenVLA-OFT (openvla-7b fine-tuned with parallel decoding, an L1 regression head and a proprio
projector), loaded natively from its directory on the OpenVLA loader: its registration
(:mod:`.family`), the chunk settings no file stores and the chunk's statistics (:mod:`.config`), the
head and the projector (:mod:`.modules`), the ``.pt`` components and their conversion
(:mod:`.weights`), the policy and its parallel pass (:mod:`.policy`) and the loader
(:mod:`.checkpoint`)."""
