"""openpi's policy-server protocol: the keys and action semantics of a server (:mod:`.spec`) and a
server as the node's policy (:mod:`.client`, checkpoint ``openpi://HOST:PORT``)."""
