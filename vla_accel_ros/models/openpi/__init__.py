"""openpi's policy-server protocol: its registration (:mod:`.family`), the keys and action semantics
of a server (:mod:`.config`) and a server as the node's policy (:mod:`.policy`, checkpoint
``openpi://HOST:PORT``). No weights: no modules, no checkpoint files."""
