"""The stack model: the pin, the upstream source, the patch series, the work repo built from them
and the generated megatron/ tree."""
