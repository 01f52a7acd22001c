"""Maintainer tooling for the Megatron-core RL fork."""
