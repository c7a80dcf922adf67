"""rosbag2 recording and replay: bag I/O, the deterministic lock-step core, the recorder, the replay's
node settings, the replayer, and the comparison of a bag's commands with the node's."""
