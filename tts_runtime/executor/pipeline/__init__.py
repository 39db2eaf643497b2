"""Pipeline parallelism: stage worker processes, their messages, placement, layer split and the activation links between stages."""
