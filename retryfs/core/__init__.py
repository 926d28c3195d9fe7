"""The retry engine, which knows no storage client: policies, error classification, the loop,
budgets, rate limits, timeouts and the watchdog, stats and their exporters, redaction, proofs.
"""
