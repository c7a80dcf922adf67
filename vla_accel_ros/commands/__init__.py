"""The ``vla-accel`` commands: one thin module each (``add_arguments`` and ``run``) over the library.
Nothing but :mod:`vla_accel_ros.cli` imports them."""
