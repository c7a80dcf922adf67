"""The runtime: the one runner from observation to action, the thread and process workers that serve
it beside the control loop, and the builder that makes a runner and a controller from settings."""
