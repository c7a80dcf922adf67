"""fleet-bench --server: the figures from the robots' traces, and the server kinds compared in one run
(the unbatched openpi server, the Ray Serve application, the DDS inference node) on a tiny policy."""

from __future__ import annotations

import pytest

from vla_accel_ros.evaluation.fleet_bench import record_streams
from vla_accel_ros.evaluation.fleet_servers import (
    RobotTrace,
    ServerBenchOptions,
    plot_servers,
    run_label,
    server_bench,
    trace_summary,
)

DDS_DOMAIN_ID = 164


def test_the_summary_counts_the_ticks_that_got_no_answer():
    # two robots, 4 ticks of 0.1 s from t = 10: robot 0 answered in ticks 1, 2 and 4; robot 1 in tick 1 only
    fast = RobotTrace(sent=[10.00, 10.10, 10.32], answered=[10.05, 10.15, 10.38])
    slow = RobotTrace(sent=[10.00], answered=[10.09])
    summary = trace_summary([fast, slow], start=10.0, ticks=4, period_s=0.1)
    assert summary["ticks_without_fresh_action"] == 1 + 3
    assert summary["fresh_tick_fraction"] == pytest.approx(1 - 4 / 8)
    assert summary["actions_per_s"] == pytest.approx(4 / 0.4)
    assert summary["rtt_ms_p50"] == pytest.approx(55.0)
    with pytest.raises(ValueError, match="--server must list kinds among dds, openpi, ray"):
        ServerBenchOptions(servers=("grpc",))


def test_openpi_and_ray_are_measured_in_one_run(tmp_path, tiny_checkpoint):
    import ray

    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    opts = ServerBenchOptions(servers=("openpi", "ray"), robots=(2,), replicas=(1,), checkpoint=str(checkpoint),
                              decoder="ar", steps=3, ticks=10)
    streams = record_streams(2, opts.steps, opts.seed, 64)
    try:
        runs = server_bench(opts, streams, 0.04, dds=None, progress=False)
    finally:
        ray.shutdown()
    assert [(run_label(r), r["robots"]) for r in runs] == [("openpi", 2), ("ray x1", 2)]
    for run in runs:
        assert run["actions_per_s"] > 0 and 0 < run["rtt_ms_p50"] <= run["rtt_ms_p99"] < float("inf")
        assert 0 <= run["ticks_without_fresh_action"] <= 2 * opts.ticks
    plot_servers(runs, tmp_path / "servers.png")
    assert (tmp_path / "servers.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="--server dds needs ROS 2"):
        server_bench(ServerBenchOptions(servers=("dds",), robots=(1,)), streams, 0.04, dds=None, progress=False)


def test_the_dds_inference_node_is_measured_with_its_robots(tmp_path, tiny_checkpoint):
    pytest.importorskip("rclpy")
    from vla_accel_ros.ros.fleet_clients import dds_run

    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    opts = ServerBenchOptions(servers=("dds",), robots=(2,), checkpoint=str(checkpoint), decoder="ar", steps=3,
                              ticks=10)
    streams = record_streams(2, opts.steps, opts.seed, 64)

    def dds(robot_streams, o):
        return dds_run(robot_streams, checkpoint=o.checkpoint, decoder=o.decoder, threads=o.threads,
                       period_s=o.period_s, ticks=o.ticks, domain_id=DDS_DOMAIN_ID)

    (run,) = server_bench(opts, streams, 0.04, dds=dds, progress=False)
    assert run["server"] == "dds" and run["robots"] == 2
    assert run["actions_per_s"] > 0 and 0 < run["rtt_ms_p50"] <= run["rtt_ms_p99"] < float("inf")
