"""``vla-accel serve-openpi``: a policy of ours, with its decoder, behind openpi's policy-server protocol,
so that clients written for openpi (LIBERO and DROID evaluation scripts, ``openpi-client``'s
``WebsocketClientPolicy``, a node with ``checkpoint: openpi://HOST:PORT``) drive it.

It binds to 127.0.0.1 unless ``--host`` says otherwise. The keys are openpi's LIBERO example's
(``observation/image``, ``observation/wrist_image`` optional, ``observation/state``, ``prompt``)
unless ``--policy-spec`` maps others (:mod:`vla_accel_ros.models.openpi.config`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from vla_accel_ros.decoding.specs import DEFAULT, names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default="", help="policy checkpoint directory, or hf:DIR (default: the "
                                                         "package's)")
    parser.add_argument("--decoder", default=DEFAULT, choices=names(), help=f"the decoder (default: {DEFAULT})")
    parser.add_argument("--port", type=int, required=True, help="TCP port (0: any free one, printed)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine "
                                                           "only)")
    parser.add_argument("--policy-spec", type=Path, default=None,
                        help="JSON file naming the observation keys and action scale (default: LIBERO's keys)")
    parser.add_argument("--unnorm-key", default="", help="hf:DIR only: the dataset of its dataset_statistics.json")
    parser.add_argument("--device", default="", help="where the policy runs: cpu, cuda or cuda:N (default: the CPU); "
                                                     "a device this torch cannot use is refused before loading")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.models.openpi.config import LIBERO, PolicySpec
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
    from vla_accel_ros.runtime.openpi_server import OpenPIServer

    try:
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {args.port}")
        spec = LIBERO if args.policy_spec is None else PolicySpec.read(args.policy_spec)
        if spec.action_space != "ee_delta":
            raise ValueError(f"--policy-spec: our policies answer in ee_delta, not {spec.action_space}")
        config = RunnerConfig(checkpoint=args.checkpoint, decoder=args.decoder, unnorm_key=args.unnorm_key,
                              torch_threads=max(1, args.threads), device=args.device)
        kin = ArmKinematics(default_urdf())
        runner = build_runner(config, kin)
    except ValueError as error:
        print(f"serve-openpi: error: {error}", file=sys.stderr, flush=True)
        return 2
    max_opening = float(kin.gripper_limits.upper.max()) if kin.gripper_joint_names else 1.0
    server = OpenPIServer(runner, spec, n_joints=kin.n, max_opening=max_opening,
                          metadata={"server": "vla_accel_ros", "checkpoint": config.checkpoint_source,
                                    "decoder": config.decoder})
    try:
        asyncio.run(_serve(server, args.host, args.port))
    except OSError as error:  # the port is taken, the address is not this machine's
        print(f"serve-openpi: error: cannot listen on {args.host}:{args.port} ({error})", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(server: object, host: str, port: int) -> None:
    from vla_accel_ros.runtime.openpi_server import OpenPIServer

    assert isinstance(server, OpenPIServer)
    ready: asyncio.Future = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(server.serve(host, port, ready))
    done, _ = await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # it failed to listen: raise why
    bound = ready.result().sockets[0].getsockname()
    print(f"serve-openpi: serving {server.metadata['checkpoint']} ({server.metadata['decoder']}) on "
          f"ws://{bound[0]}:{bound[1]} (health: http://{bound[0]}:{bound[1]}/healthz)", flush=True)
    await task
