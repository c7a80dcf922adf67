"""The ``vla-accel`` commands: one thin module each (``add_arguments`` and ``run``) over the library, and
the flag groups several of them share (the ``*_options`` modules). Nothing but :mod:`vla_accel_ros.cli`
imports a command module."""
