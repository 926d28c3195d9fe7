"""Integrations with the programs users checkpoint through: Lightning's ``CheckpointIO``, torch
DCP's storage writer and reader.

Each module imports its program lazily: ``import retryfs`` never imports Lightning or torch.
"""
