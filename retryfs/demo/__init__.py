"""``retryfs demo`` (``make demo``): a checkpoint sent through injected faults, with and without
retryfs. Imported by that command only, never by ``import retryfs``.
"""
