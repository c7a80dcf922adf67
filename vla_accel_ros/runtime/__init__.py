"""The runtime: the one runner from observation to action, the thread, process and remote workers that
serve it beside the control loop, the builder that makes a runner and a controller from settings, and
the control node's health as /diagnostics reports it."""
