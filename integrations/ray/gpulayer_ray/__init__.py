"""gpulayer as Ray's environment layer: `runtime_env={"gpulayer": {...}}`."""

from gpulayer_ray.plugin import GpulayerPlugin, prepare_argv

__all__ = ["GpulayerPlugin", "prepare_argv"]
