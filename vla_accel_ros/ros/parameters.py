"""Settings of the VLA node, the inference node and the sim bridge: frozen dataclasses, one mapping
to/from ROS parameters and YAML, validation with messages that name the parameter.

Every field carries its ROS documentation in ``metadata``: a ``description`` and either a numeric
``range`` (lo, hi) or a set of ``choices``. ``ros/node.py``, ``ros/inference_node.py`` and
``ros/sim_node.py`` declare their parameters from :func:`parameter_specs`, so the ROS interface, the
YAML files and the validation cannot drift apart. Two groups of parameters are settings dataclasses
of their own, nested flat into the nodes' configs: :class:`PolicySettings` (``checkpoint``,
``decoder``, ``kinematic_r_min``, ...: what chooses and configures the policy and its decoder, also
in the sim, record and replay options) and the incremental-vision parameters (``vision_reuse``,
``vision_threshold``, ...: :class:`~vla_accel_ros.models.configuration.VisionReuseConfig`,
``NodeConfig.vision``). Importable without rclpy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vla_accel_ros.core.chunks import ChunkSettings
from vla_accel_ros.core.controller import ControllerConfig
from vla_accel_ros.core.images import DEFAULT_MAX_IMAGE_PIXELS
from vla_accel_ros.core.settings import ConfigError, check_fields, nested, setting
from vla_accel_ros.decoding.specs import (
    DEFAULT,
    KINEMATIC_R_BOUNDS,
    names,
    names_with,
    shared_settings,
    spec_of,
)
from vla_accel_ros.models.configuration import (
    MAX_TEMPERATURE,
    VisionReuseConfig,
)
from vla_accel_ros.models.devices import is_device_name
from vla_accel_ros.runtime.builder import RunnerConfig

OUTPUT_FORMATS = ("forward_position", "joint_trajectory", "joint_state")
EXECUTORS = ("single", "multi")
INFERENCE_MODES = ("thread", "process", "remote")
IMAGE_TRANSPORTS = ("raw", "compressed")

FILL_CHECK = ", ".join(names_with(lambda spec: spec.fill_check))
KINEMATIC = ", ".join(names_with(lambda spec: spec.kinematic_threshold))
# A parameter at this value is left to the model (RunDefaults: its vla_spec.json's, else its family's).
MODEL_DEFAULT = -1
R_MIN_HELP = (f"{KINEMATIC}: lower bound of the kinematic acceptance threshold r, in token bins (a proposed "
              "token within r of the target's pick is accepted); -1 (both bounds) = the model's, and with them its "
              "kf_fill_check: its vla_spec.json's kinematic_r_bounds, else 5:15 for the package's policies and 2:6 "
              "with kf_fill_check for a model trained elsewhere; -1 for one bound alone = the decoder's own (5, 15)")
R_MAX_HELP = f"{KINEMATIC}: upper bound of the kinematic acceptance threshold r, in token bins; -1 = as kinematic_r_min"


@dataclass(frozen=True)
class PolicySettings:
    """The policy and its decoder: the checkpoint, the decoder and the settings every decoder is
    offered, checked together against the decoder registry (``decoding/specs.py``)."""

    checkpoint: str = setting("", "Policy checkpoint directory of any family (recognised by its own files; hf:DIR "
                              "also declares a Llava-style Hugging Face VLA), or openpi://HOST:PORT for a policy "
                              "server (docs/openpi.md); empty = the package's checkpoints/default")
    unnorm_key: str = setting("", "A token VLA with several datasets (OpenVLA, OpenVLA-OFT, a Hugging Face VLA): the "
                              "dataset in its statistics whose actions it unnormalises; empty = the only one")
    decoder: str = setting(DEFAULT, "Action decoder (see README, Decoders)", choices=names)
    temperature: float = setting(float(MODEL_DEFAULT), "Action-token sampling temperature, 0 = greedy (every decoder "
                                 "samples the same way; see README, The policy); -1 = the model's: its "
                                 "vla_spec.json's temperature, else 0.5 for the package's policies and 0 (greedy) "
                                 "for a model trained elsewhere", range=(float(MODEL_DEFAULT), MAX_TEMPERATURE))
    kf_fill_check: bool = setting(False, f"{FILL_CHECK}: check the Kalman filter's fill of a rejected suffix "
                                  "against the target's own picks from the same verify pass (a KF token more than r "
                                  "from the target's pick gives way to it); for a model whose tokens the KF predicts "
                                  "poorly, such as checkpoints/hf_small")
    kinematic_r_min: int = setting(MODEL_DEFAULT, R_MIN_HELP, range=(MODEL_DEFAULT, 255))
    kinematic_r_max: int = setting(MODEL_DEFAULT, R_MAX_HELP, range=(MODEL_DEFAULT, 255))
    rtc_horizon: int = setting(0, "flow10, flow2 with a chunked policy: real-time chunking, the steps of each chunk "
                               "guided towards what the previous chunk plans for the same times (its first steps, "
                               "those the inference takes, frozen); 0 = off", range=(0, 1000))
    rtc_guidance: float = setting(5.0, "Real-time chunking: the guidance's largest gain", range=(0.0, 100.0))
    device: str = setting("", "Where the policy runs: cuda or cuda:N = that GPU, for the families that run there "
                          "(the token VLAs: Hugging Face Llava-style, OpenVLA, OpenVLA-OFT; LeRobot's SmolVLA, pi0, "
                          "pi05); empty or cpu = the CPU. Refused at configure, in one line, for a family that runs "
                          "on the CPU only (the package's own model) or a GPU this torch does not see; with "
                          "inference_mode remote, vla_inference_node's device is the one that counts")
    draft_head: str = setting("", "A token VLA's draft head in a directory of its own (vla-accel train-draft --out "
                              "DIR, for a read-only model directory); empty = the one beside the weights, if any")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.device and not is_device_name(self.device):
            raise ConfigError(f"parameter 'device' must be empty, cpu, cuda or cuda:N, got {self.device!r}")
        if not self.decoder.strip():
            raise ConfigError("parameter 'decoder' must name a decoder")
        if self.temperature != MODEL_DEFAULT and not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ConfigError(f"parameter 'temperature' must be in [0, {MAX_TEMPERATURE}], or -1 for the model's, "
                              f"got {self.temperature}")
        try:
            shared_settings(self.decoder, fill_check=self.kf_fill_check, kinematic_r_bounds=self.kinematic_r_bounds,
                            rtc=(self.rtc_horizon, self.rtc_guidance))
        except ValueError as err:
            raise ConfigError(f"parameter {err}") from None

    @property
    def kinematic_r_bounds(self) -> tuple[int, int] | None:
        """(kinematic_r_min, kinematic_r_max) as the runner takes them: None when both are left to
        the model (-1); one left alone takes the decoder's own."""
        if self.kinematic_r_min == MODEL_DEFAULT and self.kinematic_r_max == MODEL_DEFAULT:
            return None
        r_min = KINEMATIC_R_BOUNDS[0] if self.kinematic_r_min == MODEL_DEFAULT else self.kinematic_r_min
        r_max = KINEMATIC_R_BOUNDS[1] if self.kinematic_r_max == MODEL_DEFAULT else self.kinematic_r_max
        return r_min, r_max

    def for_decoder(self, decoder: str) -> PolicySettings:
        """These settings with ``decoder``, and the shared settings it does not take
        (``kf_fill_check``, the kinematic bounds, real-time chunking) at their defaults."""
        spec = spec_of(decoder)
        r_min, r_max = ((self.kinematic_r_min, self.kinematic_r_max) if spec.kinematic_threshold
                        else (MODEL_DEFAULT, MODEL_DEFAULT))
        return replace(self, decoder=decoder, kf_fill_check=self.kf_fill_check and spec.fill_check,
                       kinematic_r_min=r_min, kinematic_r_max=r_max,
                       rtc_horizon=self.rtc_horizon if spec.flow_head else 0)

    def runner_config(self, **runtime: Any) -> RunnerConfig:
        """The runner's settings: these, and ``runtime``'s (periods, threads, vision) under
        :class:`~vla_accel_ros.runtime.builder.RunnerConfig`'s names."""
        return RunnerConfig(checkpoint=self.checkpoint, unnorm_key=self.unnorm_key, decoder=self.decoder,
                            temperature=None if self.temperature == MODEL_DEFAULT else self.temperature,
                            kf_fill_check=self.kf_fill_check,
                            kinematic_r_bounds=self.kinematic_r_bounds, rtc_horizon=self.rtc_horizon,
                            rtc_guidance=self.rtc_guidance, device=self.device, draft_head=self.draft_head,
                            **runtime)


@dataclass(frozen=True)
class NodeConfig:
    """Parameters of ``vla_accel_node`` (see config/vla_accel.yaml for a documented example)."""

    control_rate_hz: float = setting(20.0, "Control loop rate; one joint command is published per tick",
                                     range=(1.0, 500.0))
    output: str = setting("forward_position", "Command format: forward_position (Float64MultiArray on "
                     "<controller>/commands), joint_trajectory (<controller>/joint_trajectory) or "
                     "joint_state (sensor_msgs/JointState on joint_command_topic)", choices=OUTPUT_FORMATS)
    controller: str = setting("arm_controller", "ros2_control controller name of the arm (topic prefix, relative to "
                              "the node's namespace)")
    controller_joints: tuple[str, ...] = setting((), "Joint order of the arm controller (its 'joints' parameter); "
                                             "empty = the URDF arm order")
    gripper_controller: str = setting("gripper_controller", "Controller for the fingers (Float64MultiArray on "
                                 "<gripper_controller>/commands); empty = do not publish a gripper command")
    joint_command_topic: str = setting("joint_command", "Topic of the joint_state output format")
    image_topic: str = setting("camera/image_raw", "Camera topic (sensor_msgs/Image, or CompressedImage when "
                          "compressed_image is true)")
    compressed_image: bool = setting(False, "Subscribe to sensor_msgs/CompressedImage instead of Image")
    image_topics: tuple[str, ...] = setting((), "Camera topics in the order of the model's image slots (e.g. the scene "
                                            "camera, then the wrist camera); empty = image_topic alone")
    image_transports: tuple[str, ...] = setting((), "raw (sensor_msgs/Image) or compressed (CompressedImage) for each "
                                                "of image_topics, in order; empty = compressed_image for every one")
    allow_stand_in_images: bool = setting(False, "Run a checkpoint that reads more images (its image slots) than "
                                          "image_topics gives, each missing one a copy of the first camera's image "
                                          "(a standing warning on /diagnostics); false = refuse it at configure")
    camera_sync_tolerance_s: float = setting(0.025, "Largest difference of the header stamps of the images that make "
                                             "one observation; cameras further apart hold the arm",
                                             range=(0.0, 10.0))
    image_reliable: bool = setting(False, "Subscribe to the camera reliably: only reliable publishers match, and a "
                                   "large frame is not lost for one missing fragment; false (best effort) matches "
                                   "either kind of publisher")
    max_image_pixels: int = setting(DEFAULT_MAX_IMAGE_PIXELS, "Largest camera image (width x height) the node "
                                    "converts or decodes; a compressed image's size is read from its header first. "
                                    "A larger one is refused undecoded (WARN), and the camera stays as fresh as its "
                                    "last usable frame", range=(1, 100_000_000))
    joint_states_topic: str = setting("joint_states", "sensor_msgs/JointState topic (names in any order)")
    instruction: str = setting("", "Task instruction for the policy (also settable on ~/instruction)", dynamic=True)
    max_instruction_chars: int = setting(1000, "Longest instruction accepted; a longer one is refused (WARN) and the "
                                         "current one kept", range=(1, 1_000_000))
    robot_description: str = setting("", "URDF XML; empty = the robot_description topic, then urdf_file")
    robot_description_timeout_s: float = setting(2.0, "How long to wait for the robot_description topic when neither "
                                            "robot_description nor urdf_file is set", range=(0.0, 60.0))
    urdf_file: str = setting("", "URDF file; empty = the package's urdf/arm7.urdf (after the topic)")
    tcp_frame: str = setting("tcp", "URDF frame the policy's end-effector deltas refer to")
    # checkpoint, unnorm_key, decoder, temperature, kf_fill_check, kinematic_r_min, kinematic_r_max, rtc_horizon,
    # rtc_guidance, device, draft_head
    policy: PolicySettings = nested(PolicySettings())
    # vision_reuse (the on/off switch), vision_threshold, vision_refresh_steps, vision_max_drift, vision_reuse_kv
    vision: VisionReuseConfig = nested(VisionReuseConfig(enabled=False), prefix="vision_",
                                       names={"enabled": "vision_reuse"})
    # chunk_execution, chunk_refill_threshold, chunk_blend, chunk_verify_threshold_rad, chunk_anchor
    chunks: ChunkSettings = nested(ChunkSettings())
    inference: bool = setting(True, "Run the policy; false = bring-up mode that only tracks and holds")
    image_size: int = setting(0, "Model input size in pixels; 0 = from the checkpoint", range=(0, 2048))
    camera_timeout_s: float = setting(0.5, "Watchdog: hold the arm when the newest image is older", range=(0.001, 60.0))
    joint_state_timeout_s: float = setting(0.25, "Watchdog: hold the arm when the newest joint state is older",
                                      range=(0.001, 60.0))
    action_timeout_s: float = setting(0.5, "Drop a policy action whose observation is older than this at a tick",
                                 range=(0.0, 60.0))
    action_dt_s: float = setting(0.05, "Duration of one policy action step (the policy's training control period)",
                            range=(0.001, 1.0))
    fallback_max_s: float = setting(0.25, "Longest Kalman fallback after the last fresh policy action (its velocity "
                               "decays to 0 over it); then hold the measured position. 0 = hold at once",
                               range=(0.0, 10.0))
    deadline_tolerance: float = setting(0.5, "A tick later than this fraction of the period is a deadline miss",
                                   range=(0.0, 10.0))
    stall_after_periods: float = setting(3.0, "A tick later than this many periods is a stall of the control loop: "
                                         "WARN on /diagnostics naming the longest gap and its likely cause. The "
                                         "node's clock standing still this long, and at least 0.5 s, is a stopped "
                                         "clock (use_sim_time without /clock): ERROR, and a watchdog on the wall "
                                         "clock holds the arm", range=(1.5, 1000.0))
    stall_holdoff_s: float = setting(10.0, "How long /diagnostics keeps reporting a stall after it ended",
                                     range=(0.0, 3600.0))
    jump_confirm_s: float = setting(0.05, "A joint-state sample beyond what the velocity limits reach is an outlier "
                                    "(ignored) until agreeing ones have persisted this long: then it is a real jump "
                                    "(an episode reset, an arm moved by hand) and the commands ramp to it",
                                    range=(0.0, 10.0))
    joint_limit_tolerance: float = setting(0.1, "How far (rad or m) a measured arm joint may be past its URDF "
                                           "position limit; further is never followed: the arm holds its last valid "
                                           "position until a sample within the limits comes", range=(0.0, 1.0))
    future_stamp_tolerance_s: float = setting(0.05, "A joint state or image whose header stamp is further ahead of "
                                              "the node's clock than this is refused (WARN)", range=(0.0, 60.0))
    gripper_initial: float = setting(1.0, "Gripper command before the first action (1 = open, 0 = closed)",
                                range=(0.0, 1.0))
    gripper_velocity: float = setting(0.1, "Speed limit (m/s) of a finger joint whose URDF gives no velocity limit; "
                                      "each finger command moves at most its velocity limit x the period",
                                      range=(1e-4, 10.0))
    autostart: bool = setting(False, "Drive the lifecycle transitions at start-up (configure, then activate: the "
                         "node commands); otherwise the node waits unconfigured for a lifecycle manager")
    allow_unmatched_robot: bool = setting(False, "Run a checkpoint on an arm of its DOF that is not the robot it was "
                                     "made for (other joints, TCP frame, rate or image size); /diagnostics then "
                                     "says WARN. A different DOF never starts")
    executor: str = setting("single", "single: SingleThreadedExecutor + inference thread; multi: "
                       "MultiThreadedExecutor + inference thread", choices=EXECUTORS)
    switch_interval_s: float = setting(0.001, "Python thread switch interval (sys.setswitchinterval): smaller lets "
                                  "the control timer preempt inference sooner", range=(1e-5, 0.1))
    torch_threads: int = setting(1, "torch intra-op threads of the inference worker", range=(1, 256))
    inference_mode: str = setting("process", "Where the policy runs: thread (beside the control timer, sharing the "
                             "Python interpreter), process (a child process fed through shared memory; its "
                             "Python never delays a tick) or remote (vla_inference_node, on another machine, "
                             "over the ROS graph)", choices=INFERENCE_MODES)
    remote_compressed_image: bool = setting(False, "remote mode: send the observation image as JPEG "
                                       "(CompressedImage), a tenth of the bytes on a slow link")
    remote_lost_after_s: float = setting(0.5, "remote mode: an observation unanswered this long is counted lost and "
                                    "the next one is sent", range=(0.001, 60.0))
    realtime_priority: int = setting(20, "SCHED_FIFO priority (1-98) of the thread that spins the executor and so runs "
                                "the control timer; 0 = normal scheduling. Other busy processes otherwise delay "
                                "ticks by a scheduler slice (3-5 ms). Needs root, CAP_SYS_NICE or an rtprio limit; "
                                "when refused the node warns and runs with normal scheduling", range=(0, 98))
    inference_python: str = setting("", "process mode: the Python interpreter of the inference process, e.g. a "
                               "virtual environment with the packages a model's own code pins and this package "
                               "installed into it (pip install --no-deps); empty = the node's own")
    inference_restarts: int = setting(3, "process mode: how often a dead inference process is restarted (the arm "
                                 "holds meanwhile) before the node stays in hold and reports it", range=(0, 1000))
    stats_rate_hz: float = setting(1.0, "Rate of /diagnostics and ~/stats", range=(0.05, 50.0))
    stats_file: str = setting("", "If set, write the run's statistics and tick log (JSON) here at shutdown")

    def __post_init__(self) -> None:
        check_fields(self)
        period = 1.0 / self.control_rate_hz
        for name in ("camera_timeout_s", "joint_state_timeout_s"):
            if getattr(self, name) <= period:
                raise ConfigError(f"parameter '{name}' = {getattr(self, name)} must exceed one control period "
                                  f"({period:.4f} s at control_rate_hz={self.control_rate_hz}), else every tick holds")
        if self.output != "joint_state" and not self.controller.strip("/"):
            raise ConfigError(f"parameter 'controller' must name a controller for output '{self.output}'")
        if len(set(self.controller_joints)) != len(self.controller_joints):
            raise ConfigError(f"parameter 'controller_joints' has duplicates: {list(self.controller_joints)}")
        if len(self.instruction.strip()) > self.max_instruction_chars:
            raise ConfigError(f"parameter 'instruction' has {len(self.instruction.strip())} characters, more than "
                              f"max_instruction_chars = {self.max_instruction_chars}")
        if self.inference_python and self.inference_mode != "process":
            raise ConfigError("parameter 'inference_python' needs inference_mode: process (a thread shares the "
                              "node's interpreter)")
        if len(set(self.image_topics)) != len(self.image_topics) or any(not t.strip() for t in self.image_topics):
            raise ConfigError(f"parameter 'image_topics' must name distinct topics, got {list(self.image_topics)}")
        if self.image_transports and len(self.image_transports) != len(self.camera_topics):
            raise ConfigError(f"parameter 'image_transports' has {len(self.image_transports)} entries for "
                              f"{len(self.camera_topics)} camera topic(s) {list(self.camera_topics)}")
        if bad := [t for t in self.image_transports if t not in IMAGE_TRANSPORTS]:
            raise ConfigError(f"parameter 'image_transports': {bad[0]!r} is not one of {', '.join(IMAGE_TRANSPORTS)}")

    @property
    def period_s(self) -> float:
        return 1.0 / self.control_rate_hz

    def runner_config(self) -> RunnerConfig:
        """The runner's settings (checkpoint, decoder, sampling, vision, periods, threads)."""
        return self.policy.runner_config(vision=self.vision, action_dt_s=self.action_dt_s, period_s=self.period_s,
                                         torch_threads=self.torch_threads, stand_in_images=self.allow_stand_in_images)

    def controller_config(self) -> ControllerConfig:
        return ControllerConfig(
            period_s=self.period_s,
            camera_timeout_s=self.camera_timeout_s,
            joint_state_timeout_s=self.joint_state_timeout_s,
            action_timeout_s=self.action_timeout_s,
            action_dt_s=self.action_dt_s,
            deadline_tolerance=self.deadline_tolerance,
            gripper_initial=self.gripper_initial,
            fallback_max_s=self.fallback_max_s,
            expect_actions=self.inference,  # without a policy there is no late action to stand in for
            gripper_velocity=self.gripper_velocity,
            jump_confirm_s=self.jump_confirm_s,
            joint_limit_tolerance=self.joint_limit_tolerance,
            max_instruction_chars=self.max_instruction_chars,
            camera_names=self.camera_topics,
            camera_sync_tolerance_s=self.camera_sync_tolerance_s,
            chunks=self.chunks,
        )

    @property
    def camera_topics(self) -> tuple[str, ...]:
        """The camera topics in image-slot order: ``image_topics``, or ``image_topic`` alone."""
        return self.image_topics or (self.image_topic,)

    @property
    def camera_compressed(self) -> tuple[bool, ...]:
        """Whether each of :attr:`camera_topics` carries CompressedImage."""
        if self.image_transports:
            return tuple(t == "compressed" for t in self.image_transports)
        return (self.compressed_image,) * len(self.camera_topics)


@dataclass(frozen=True)
class InferenceNodeConfig:
    """Parameters of ``vla_inference_node``: the policy of one or more robots, on a GPU host."""

    robots: tuple[str, ...] = setting((), "Namespaces of the robots served (each one's control node runs with "
                                      "inference_mode: remote there); empty = the node's own namespace, one robot")
    # checkpoint, unnorm_key, decoder, temperature, kf_fill_check, kinematic_r_min, kinematic_r_max, rtc_horizon,
    # rtc_guidance, device, draft_head
    policy: PolicySettings = nested(PolicySettings())
    urdf_file: str = setting("", "URDF of the robots (the decoders' Kalman filter and IK); empty = the package's")
    tcp_frame: str = setting("tcp", "URDF frame the policy's end-effector deltas refer to")
    allow_unmatched_robot: bool = setting(False, "Run a checkpoint on a same-DOF arm it was not made for (WARN)")
    action_dt_s: float = setting(0.05, "Duration of one policy action step", range=(0.001, 1.0))
    control_period_s: float = setting(0.05, "The robots' control period: the time a decoder has for one action",
                                      range=(0.001, 1.0))
    torch_threads: int = setting(1, "torch intra-op threads", range=(1, 256))
    stats_rate_hz: float = setting(1.0, "Rate of /diagnostics and ~/stats", range=(0.05, 50.0))

    def __post_init__(self) -> None:
        check_fields(self)
        if len(set(self.robots)) != len(self.robots):
            raise ConfigError(f"parameter 'robots' has duplicates: {list(self.robots)}")

    def runner_config(self) -> RunnerConfig:
        return self.policy.runner_config(action_dt_s=self.action_dt_s, period_s=self.control_period_s,
                                         torch_threads=self.torch_threads)


@dataclass(frozen=True)
class SimBridgeConfig:
    """Parameters of ``sim_node`` (the MuJoCo bridge)."""

    joint_state_rate_hz: float = setting(100.0, "Physics stepping and joint_states rate", range=(10.0, 1000.0))
    camera_rate_hz: float = setting(20.0, "Camera image rate (camera/image_raw)", range=(1.0, 120.0))
    image_size: int = setting(128, "Rendered image size in pixels (square)", range=(16, 1024))
    real_time_factor: float = setting(1.0, "Sim seconds per wall second; 0 = as fast as possible (lock-step via "
                                 "/clock)", range=(0.0, 100.0))
    seed: int = setting(0, "Seed of the first episode", range=(0, 2**31 - 1))
    color: str = setting("", "Target cube colour of the first episode; empty = chosen by the seed")
    start_episode: bool = setting(True, "Start the first episode once the first arm command arrives (the policy node "
                             "is ready); otherwise wait for ~/reset")
    episode_duration_s: float = setting(6.0, "Episode time limit in sim seconds", range=(0.1, 3600.0))
    success_hold_s: float = setting(0.15, "How long the task must stay solved before the episode ends",
                               range=(0.0, 60.0))
    instruction_topic: str = setting("vla_accel_node/instruction", "Where the episode's instruction is published")
    controller: str = setting("arm_controller", "Arm controller name (listens on <controller>/commands and "
                         "<controller>/joint_trajectory)")
    controller_joints: tuple[str, ...] = setting((), "Joint order of <controller>/commands; empty = URDF arm order")
    gripper_controller: str = setting("gripper_controller", "Gripper controller name (<gripper_controller>/commands)")
    joint_command_topic: str = setting("joint_command", "JointState command topic")
    wrist_camera: bool = setting(False, "Render from the wrist camera instead of the scene camera")
    wrist_image_topic: str = setting("", "Also publish the wrist camera here (rgb8, stamped as the scene camera's "
                                     "image of the same instant), a second image slot; empty = none")

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def physics_dt(self) -> float:
        return 1.0 / self.joint_state_rate_hz
