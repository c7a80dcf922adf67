"""The MuJoCo scene, its pick-the-cube task environment, the scripted expert and demonstrations."""

# First, before any sim module imports mujoco: the OpenGL platform (EGL on a headless machine).
from vla_accel_ros.sim import gl  # noqa: F401
