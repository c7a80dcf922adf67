"""``vla-accel serve-openpi``: a policy of ours, with its decoder, behind openpi's policy-server protocol,
so that clients written for openpi (LIBERO and DROID evaluation scripts, ``openpi-client``'s
``WebsocketClientPolicy``, a node with ``checkpoint: openpi://HOST:PORT``) drive it.

It binds to 127.0.0.1 unless ``--host`` says otherwise. The keys are openpi's LIBERO example's
(``observation/image``, ``observation/wrist_image`` optional, ``observation/state``, ``prompt``)
unless ``--policy-spec`` maps others (:mod:`vla_accel_ros.models.openpi.config`).

``--engine ray`` serves the same protocol as a Ray Serve application (:mod:`vla_accel_ros.runtime.ray_serve`):
``--replicas`` copies of the policy, each batching the observations of its robots into one round
(``--max-batch``, ``--batch-wait-ms``), on ``--num-gpus-per-replica`` GPUs, on the cluster at
``--address ray://HOST:PORT`` or a local Ray. Ray is optional: ``pip install 'vla_accel_ros[fleet]'``.

``--api-key-file FILE`` (the key is the file's text) or ``--api-key-env NAME`` (an environment
variable), the settings a node's ``openpi://`` address has, make either engine refuse a connection
without ``Authorization: Api-Key KEY`` at the handshake (HTTP 401); ``/healthz`` stays open. The key
is never a flag's value. ``--max-queue N``: a request that finds N requests in flight already (Ray:
waiting on its replica) is answered ``busy`` at once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from vla_accel_ros.decoding.specs import DEFAULT, names
from vla_accel_ros.runtime.ray_options import FLEET_INSTALL, RayServeOptions

if TYPE_CHECKING:
    from vla_accel_ros.models.openpi.config import PolicySpec
    from vla_accel_ros.runtime.builder import RunnerConfig
    from vla_accel_ros.runtime.openpi_server import ApiKeyCheck

ENGINES = ("websockets", "ray")
RAY_FLAGS = {"replicas": "--replicas", "max_batch": "--max-batch", "batch_wait_ms": "--batch-wait-ms",
             "num_gpus_per_replica": "--num-gpus-per-replica", "address": "--address"}


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
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (of each Ray replica)")
    parser.add_argument("--api-key-file", type=Path, default=None,
                        help="refuse connections without 'Authorization: Api-Key KEY' (HTTP 401), KEY being this "
                             "file's text; /healthz stays open")
    parser.add_argument("--api-key-env", default="", metavar="NAME",
                        help="the same, KEY being this environment variable's value")
    parser.add_argument("--max-queue", type=int, default=None,
                        help="answer 'busy' at once to a request that finds this many in flight (websockets "
                             "default: no bound; ray: waiting per replica, default 4 x --max-batch)")
    parser.add_argument("--engine", default="websockets", choices=ENGINES,
                        help="websockets: one process, one request at a time (default); ray: a Ray Serve "
                             "application batching across robots (pip install 'vla_accel_ros[fleet]')")
    ray = RayServeOptions()  # the defaults, for the help
    parser.add_argument("--replicas", type=int, default=None, help=f"--engine ray: policy replicas "
                                                                   f"(default {ray.replicas})")
    parser.add_argument("--max-batch", type=int, default=None, help=f"--engine ray: most robots per batched round "
                                                                    f"(default {ray.max_batch})")
    parser.add_argument("--batch-wait-ms", type=float, default=None,
                        help=f"--engine ray: how long a round waits for more robots (default {ray.batch_wait_ms:g})")
    parser.add_argument("--num-gpus-per-replica", type=float, default=None,
                        help="--engine ray: GPUs per replica (default 0: the CPU)")
    parser.add_argument("--address", default=None, help="--engine ray: a running Ray cluster, ray://HOST:PORT "
                                                        "(default: start a local Ray)")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.models.openpi.config import LIBERO, PolicySpec
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
    from vla_accel_ros.runtime.openpi_server import OpenPIServer

    try:
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {args.port}")
        if args.max_queue is not None and args.max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {args.max_queue}")
        api_key = _api_key(args)
        ray_options = _ray_options(args)
        spec = LIBERO if args.policy_spec is None else PolicySpec.read(args.policy_spec)
        if spec.action_space != "ee_delta":
            raise ValueError(f"--policy-spec: our policies answer in ee_delta, not {spec.action_space}")
        config = RunnerConfig(checkpoint=args.checkpoint, decoder=args.decoder, unnorm_key=args.unnorm_key,
                              torch_threads=max(1, args.threads), device=args.device)
        if ray_options is not None:
            return _serve_ray(config, spec, ray_options, args.host, args.port, api_key)
        kin = ArmKinematics(default_urdf())
        runner = build_runner(config, kin)
    except ValueError as error:
        print(f"serve-openpi: error: {error}", file=sys.stderr, flush=True)
        return 2
    max_opening = float(kin.gripper_limits.upper.max()) if kin.gripper_joint_names else 1.0
    server = OpenPIServer(runner, spec, n_joints=kin.n, max_opening=max_opening,
                          metadata={"server": "vla_accel_ros", "checkpoint": config.checkpoint_source,
                                    "decoder": config.decoder}, api_key=api_key, max_queue=args.max_queue or 0)
    try:
        asyncio.run(_serve(server, args.host, args.port))
    except OSError as error:  # the port is taken, the address is not this machine's
        print(f"serve-openpi: error: cannot listen on {args.host}:{args.port} ({error})", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _api_key(args: argparse.Namespace) -> ApiKeyCheck | None:
    """The key ``--api-key-file`` or ``--api-key-env`` names (None: neither); ValueError when both
    are given, or the one given holds no key."""
    from vla_accel_ros.models.openpi.config import read_api_key
    from vla_accel_ros.runtime.openpi_server import ApiKeyCheck

    if args.api_key_file is not None and args.api_key_env:
        raise ValueError("give --api-key-file or --api-key-env, not both")
    if args.api_key_file is not None:
        key = read_api_key(file=args.api_key_file)
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file}: the file holds no key")
        return ApiKeyCheck(key)
    if args.api_key_env:
        if not os.environ.get(args.api_key_env, "").strip():
            raise ValueError(f"--api-key-env {args.api_key_env}: the environment variable is not set or empty")
        return ApiKeyCheck(read_api_key(env=args.api_key_env))
    return None


def _ray_options(args: argparse.Namespace) -> RayServeOptions | None:
    """The Ray engine's options (None: the websockets engine); ValueError on a Ray flag without it."""
    given = {name: getattr(args, name) for name in RAY_FLAGS if getattr(args, name) is not None}
    if args.engine != "ray":
        if given:
            raise ValueError(f"{', '.join(RAY_FLAGS[n] for n in given)} only apply with --engine ray")
        return None
    if args.max_queue is not None:
        given["max_queue"] = args.max_queue
    return RayServeOptions(**given)


def _serve_ray(config: RunnerConfig, spec: PolicySpec, options: RayServeOptions, host: str, port: int,
               api_key: ApiKeyCheck | None) -> int:
    try:
        from vla_accel_ros.runtime import ray_serve
    except ImportError as error:
        if error.name is None or error.name.split(".")[0] not in ("ray", "fastapi", "starlette"):
            raise
        raise ValueError(f"--engine ray needs Ray Serve, which is not installed ({FLEET_INSTALL})") from None
    deployed = replace(options, cpus_per_replica=float(config.torch_threads))
    metadata = {"server": "vla_accel_ros", "checkpoint": config.checkpoint_source, "decoder": config.decoder,
                "engine": "ray"}
    bound = ray_serve.start(config, spec, metadata, deployed, host=host, port=port, api_key=api_key)
    print(f"serve-openpi: serving {config.checkpoint_source} ({config.decoder}) on Ray Serve, "
          f"{options.replicas} replica(s), batches of <= {options.max_batch}, at ws://{host}:{bound} "
          f"(health: http://{host}:{bound}/healthz){_key_note(api_key)}", flush=True)
    # SIGTERM (a service manager, `kill`) ends it as Ctrl-C does: the application stopped and the local
    # Ray shut down at exit, not Ray's agents left behind
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        ray_serve.stop()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


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
          f"ws://{bound[0]}:{bound[1]} (health: http://{bound[0]}:{bound[1]}/healthz){_key_note(server.api_key)}",
          flush=True)
    await task


def _key_note(api_key: object) -> str:
    return "; connections need the API key" if api_key is not None else ""
