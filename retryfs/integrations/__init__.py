"""Integrations with the programs users checkpoint through: Lightning's ``CheckpointIO``.

Each module imports its program lazily: ``import retryfs`` never imports Lightning or torch.
"""
