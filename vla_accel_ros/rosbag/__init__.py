"""rosbag2 recording and replay: bag I/O, the deterministic lock-step core, the recorder and the
replayer that diffs a bag's commands against the node's."""
