"""OpenVLA-OFT (openvla-7b fine-tuned with parallel decoding, an L1 regression head and a proprio
projector), loaded natively from its directory on the OpenVLA loader: the chunk settings no file
stores (:mod:`.spec`), the ``.pt`` components and their conversion (:mod:`.components`), the head
and the projector (:mod:`.heads`), the policy and its parallel pass (:mod:`.policy`) and the
loader (:mod:`.checkpoint`)."""
